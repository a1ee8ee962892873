"""PyTorch through fusedk's fast call path (DLPack's C exchange API) and fusedk.torch (custom
operators for torch.compile), on CPU tensors: runs wherever torch is installed, GPU or not. The
CUDA side of the same paths is in test_gpu_paths.py."""
import numpy as np
import pytest

import fusedk
from oracle import np_of

torch = pytest.importorskip("torch")
if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
    pytest.skip("this torch has no DLPack C exchange API (torch >= 2.11)", allow_module_level=True)
import fusedk.torch as fkt  # noqa: E402
from fusedk import _core  # noqa: E402

DT = [torch.float32, torch.float16, torch.bfloat16]


def calls(x, w, r, sc, sh, g):
    """Every op, as users call them (keyword forms included)."""
    return {
        "rmsnorm": lambda f, m: f.rmsnorm(m(x), m(w)),
        "rmsnorm_residual": lambda f, m: f.rmsnorm(m(x), weight=m(w), residual=m(r)),
        "layernorm": lambda f, m: f.layernorm(m(x), m(w), m(w), eps=1e-5),
        "adaln": lambda f, m: f.adaln(m(x), m(sc), m(sh), norm="rms", weight=m(w)),
        "mochi": lambda f, m: f.residual_tanh_gated_rmsnorm(m(x), m(r), m(g), exact=True),
    }


def inputs(dtype, B=2, L=33, D=160, device="cpu"):
    x, r = torch.randn(B, L, D, dtype=dtype, device=device), torch.randn(B, L, D, dtype=dtype, device=device)
    w, mod = torch.randn(D, dtype=dtype, device=device), torch.randn(B, 6 * D, dtype=dtype, device=device)
    sh, sc, g = mod.chunk(6, 1)[:3]  # strided views
    return x, w, r, sc, sh, g


@pytest.mark.parametrize("dtype", DT, ids=str)
def test_exchange_path_is_the_cpu_reference(dtype):
    # torch CPU tensors take the exchange-API path and must give exactly what NumPy gets
    args = inputs(dtype)
    for name, fn in calls(*args).items():
        got, want = fn(fusedk, lambda t: t), fn(fusedk, np_of)
        got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
        for a, b in zip(got, want):
            assert isinstance(a, torch.Tensor) and a.dtype == dtype and a.is_contiguous(), name
            assert np.array_equal(np_of(a).view(np.uint8), b.view(np.uint8)), name


def test_the_fast_path_is_taken():
    x = torch.randn(4, 64)
    assert _core.path_of(torch.Tensor).__name__ == "run"  # the exchange-API closure
    assert _core.path_of(torch.nn.Parameter).__name__ == "run"
    p = torch.nn.Parameter(torch.ones(64))  # a subclass, requires_grad
    assert torch.equal(fusedk.rmsnorm(x, p), fusedk.rmsnorm(x))


def test_out_and_in_place_residual():
    x, w, r, *_ = inputs(torch.bfloat16)
    out = torch.empty_like(x)
    assert fusedk.rmsnorm(x, w, out=out) is out
    want_y, want_r = fusedk.rmsnorm(np_of(x), np_of(w), residual=np_of(r))
    y, r2 = fusedk.rmsnorm(x, w, residual=r, residual_out=r)
    assert r2 is r and np.array_equal(np_of(r), want_r) and np.array_equal(np_of(y), want_y)


def test_mixed_frameworks_fall_back_and_errors_keep_their_status():
    x = torch.randn(4, 64)
    # a NumPy weight with a torch x: the generic path (same CPU device) still runs
    assert torch.equal(fusedk.rmsnorm(x, np.ones(64, np.float32)), fusedk.rmsnorm(x, torch.ones(64)))
    with pytest.raises(fusedk.Error) as e:
        fusedk.rmsnorm(x, torch.ones(63))
    assert e.value.status == "FUSEDK_ERR_SHAPE" and "weight has shape [63]" in e.value.reason
    with pytest.raises(fusedk.Error) as e:
        fusedk.rmsnorm(x.double())
    assert e.value.status == "FUSEDK_ERR_DTYPE" and "x has dtype float64" in e.value.reason
    with pytest.raises(fusedk.Error) as e:
        fusedk.rmsnorm(x[:, ::2])
    assert e.value.status == "FUSEDK_ERR_LAYOUT"
    out = torch.full_like(x, 7.0)
    with pytest.raises(fusedk.Error):
        fusedk.rmsnorm(x, torch.ones(64, dtype=torch.float16), out=out)
    assert (out == 7).all()  # nothing written on failure
    with pytest.raises(fusedk.Error, match="x is NULL"):
        fusedk.layernorm(None)


def test_empty_and_huge_ndim():
    assert fusedk.rmsnorm(torch.empty(0, 8)).shape == (0, 8)
    with pytest.raises(fusedk.Error, match="ndim 9"):
        fusedk.rmsnorm(torch.randn([1] * 8 + [4]))


@pytest.mark.parametrize("dtype", DT, ids=str)
def test_fusedk_torch_matches_the_fast_path(dtype):
    args = inputs(dtype)
    for name, fn in calls(*args).items():
        a, b = fn(fkt, lambda t: t), fn(fusedk, lambda t: t)
        a, b = (a, b) if isinstance(a, tuple) else ((a,), (b,))
        assert len(a) == len(b) and all(torch.equal(p, q) for p, q in zip(a, b)), name


_CUDA = torch.cuda.is_available() and bool(fusedk.kernel_info()["cuda"].get("devices"))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _CUDA, reason="no CUDA"))])
def test_opcheck_every_op(device):
    from torch.library import opcheck
    x, w, r, sc, sh, g = inputs(torch.float32, 2, 5, 64, device)
    o = torch.empty_like(x)
    cases = [
        (torch.ops.fusedk.rmsnorm, (x, r, w, 1e-6)), (torch.ops.fusedk.rmsnorm, (x, None, None, 1e-6)),
        (torch.ops.fusedk.rmsnorm_out, (x, r, w, 1e-6, o.clone(), o.clone())),
        (torch.ops.fusedk.rmsnorm_out, (x, None, w, 1e-6, o.clone(), None)),
        (torch.ops.fusedk.layernorm, (x, w, w, 1e-5)), (torch.ops.fusedk.layernorm_out, (x, None, w, 1e-5, o.clone())),
        (torch.ops.fusedk.layernorm_out, (x, None, None, 1e-5, o.clone())),
        (torch.ops.fusedk.adaln_out, (x, sc, sh, w, None, 1, 1e-6, o.clone())),
        (torch.ops.fusedk.adaln, (x, sc, sh, w, w, 0, 1e-6)), (torch.ops.fusedk.adaln_out, (x, sc, sh, None, None, 1, 1e-6, o.clone())),
        (torch.ops.fusedk.residual_tanh_gated_rmsnorm, (x, r, g, 1e-6, 1)),
        (torch.ops.fusedk.residual_tanh_gated_rmsnorm_out, (x, r, g, 1e-6, 0, o.clone())),
        (torch.ops.fusedk.act, (x, 0)), (torch.ops.fusedk.act_out, (x, 2, o.clone())),
        (torch.ops.fusedk.silu_fma, (x, r, x)), (torch.ops.fusedk.silu_fma_out, (x, r, x, o.clone())),
        (torch.ops.fusedk.gated_residual, (x, r, g)), (torch.ops.fusedk.gated_residual_out, (x, r, g, o.clone())),
        (torch.ops.fusedk.glu, (x, 2, 0)), (torch.ops.fusedk.glu_out, (x, 0, 1, o[..., :32].clone())),
        (torch.ops.fusedk.glu_pair, (x, r, 1)), (torch.ops.fusedk.glu_pair_out, (x, r, 2, o.clone())),
    ]
    for op, a in cases:
        res = opcheck(op, a)
        assert all(v == "SUCCESS" for v in res.values()), (op, res)


def test_backward_raises_a_clear_error():
    x = torch.randn(4, 64, requires_grad=True)
    y = fkt.rmsnorm(x)
    with pytest.raises(RuntimeError, match="fusedk.torch.rmsnorm is forward-only"):
        y.sum().backward()


def test_compile_fullgraph_dit_block_matches_eager_bitwise():
    x, w, r, sc, sh, g = inputs(torch.bfloat16, 2, 16, 128)

    def block(x, r, w, sc, sh, g):
        h, res = fkt.rmsnorm(x, w, residual=r)
        h = fkt.adaln(h, sc, sh, norm="layer")
        return fkt.residual_tanh_gated_rmsnorm(res, h, g)

    want = block(x, r, w, sc, sh, g)
    got = torch.compile(block, fullgraph=True)(x, r, w, sc, sh, g)
    assert torch.equal(got, want)
    # out= and residual_out= under compile: declared mutations, functionalized
    def inplace(x, r, w):
        y = torch.empty_like(x)
        fkt.rmsnorm(x, w, residual=r, out=y, residual_out=r)
        return y, r
    r1, r2 = r.clone(), r.clone()
    a = inplace(x, r1, w)
    b = torch.compile(inplace, fullgraph=True)(x, r2, w)
    assert torch.equal(a[0], b[0]) and torch.equal(r1, r2)


def test_no_torch_import_without_asking():
    import subprocess
    import sys
    code = "import sys, fusedk; print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip() == "False", r.stderr


@pytest.mark.parametrize("order", ["fusedk first", "torch._dynamo first"])
def test_plain_functions_compile_fullgraph_whatever_the_import_order(order):
    # fusedk registers its Dynamo substitution when torch._dynamo is imported (after fusedk, or
    # before it): a fresh interpreter for each order
    import subprocess
    import sys
    first = "import fusedk, torch" if order == "fusedk first" else "import torch, torch._dynamo, fusedk"
    code = f"""{first}
x, w = torch.randn(3, 40), torch.randn(40)
big = torch.zeros(3, 80)
def f(x, w, big):
    fusedk.linear(x, torch.ones(24, 40), act="gelu_tanh", out=big[:, 8:32])  # an out= column slice
    return fusedk.rmsnorm(x, w) * 2, fusedk.qk_norm_rope(x.view(1, 3, 1, 1, 40).expand(1, 3, 3, 1, 40),
                                                         torch.ones(3, 20), torch.zeros(3, 20))[0]
a = torch.compile(f, fullgraph=True)(x, w, big.clone())
b = f(x, w, big.clone())
assert all(torch.equal(p, q) for p, q in zip(a, b))
print("ok")
"""
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0 and r.stdout.strip().endswith("ok"), r.stderr[-3000:]


def test_eager_calls_autograd_records_get_a_grad_fn():
    x = torch.randn(4, 64, requires_grad=True)
    y = fusedk.rmsnorm(x)  # the plain function: autograd records it through the custom operator
    assert y.grad_fn is not None
    with pytest.raises(RuntimeError, match="fusedk.torch.rmsnorm is forward-only"):
        y.sum().backward()
    with torch.no_grad():
        assert fusedk.rmsnorm(x).grad_fn is None  # no_grad: the fast C path
    w = torch.randn(32, 64, requires_grad=True)
    fusedk.linear(x, w, act="gelu_tanh").square().sum().backward()  # linear trains
    x2, w2 = x.detach().clone().requires_grad_(), w.detach().clone().requires_grad_()
    torch.nn.functional.gelu(x2 @ w2.T, approximate="tanh").square().sum().backward()
    assert torch.allclose(w.grad, w2.grad, rtol=1e-4, atol=1e-4) and torch.allclose(x.grad, x2.grad, rtol=1e-4, atol=1e-4)


def test_op_exists_agrees_with_the_c_rule():
    from fusedk._ffi import ffi, lib
    given = ffi.new("fusedk_tensor *")
    for o in _core.OPS:
        for mask in range(1 << len(o.inputs)):
            args = [None] * len(o.tensors)
            ptrs = ffi.new("fusedk_tensor *[]", len(o.tensors))
            for b, i in enumerate(o.inputs):
                if mask >> b & 1:
                    args[i], ptrs[i] = 1, given
            for flags in ([0.0] * max(1, len(o.attrs)), [1.0] * max(1, len(o.attrs))):
                for i, _, _ in o.outputs:
                    want = bool(lib.fusedk_op_out_exists(o.id, i, ptrs, ffi.new("double[]", flags)))
                    assert o.exists(i, args, flags) == want, (o.name, i, mask, flags)


def test_python_output_shapes_agree_with_the_c_rule():
    qkv = (2, 5, 3, 16)
    cases = {  # op: (shapes in registry order of the inputs, attrs)
        "rmsnorm": ({"x": (3, 7, 16)}, ()), "glu": ({"x": (2, 3, 10)}, ()),
        "rope": ({"q": (2, 5, 3, 16), "k": (2, 5, 1, 16), "cos": (5, 8), "sin": (5, 8)}, ()),
        "rope_table_1d": ({"positions": (9,)}, (12, 10000.0)),
        "rope_table_axes": ({"ids": (9, 3)}, (10000.0, 16, 56, 56, 0)),
        "rope_table_ltx": ({"coords": (9, 3)}, (30, 10000.0)),
        "rope_table_mixed": ({"pos": (9, 3), "freqs": (3, 4, 6)}, ()),
        "linear": ({"x": (2, 3, 8), "w": (5, 8)}, (0, 0, 1)),
        "linear_backward": ({"dy": (6, 5), "x": (6, 8), "w": (5, 8), "aux": (6, 5)}, (0, 0, 1, 1, 1)),
        "attention": ({"q": (2, 7, 6, 16), "k": (2, 9, 3, 16), "v": (2, 9, 3, 16)}, (0.0, 1, 1)),
        "attention_int8": ({"q": (2, 7, 6, 16), "k": (2, 9, 3, 16), "v": (2, 9, 3, 16)}, (0.0, 1, 1)),
        "attention_int8_scaled": ({"q": (2, 7, 6, 16), "q_scale": (2, 7, 6), "k": (2, 9, 3, 16), "k_scale": (2, 9, 3),
                                   "v": (2, 9, 3, 16)}, (0.0, 1, 1)),
        "lowrank_update": ({"x": (2, 3, 8), "v": (8, 4), "u_t": (4, 5)}, (0.5, 1.0)),
        "lowrank_prepare": ({"w": (5, 8), "b": (5, 3)}, (0.5,)),
        "linear_lowrank": ({"x": (2, 3, 8), "w_cat": (5, 16), "a": (3, 8)}, (4, 1)),
        "lowrank_update_backward": ({"dout": (2, 3, 5), "x": (2, 3, 8), "v": (8, 4), "codes": (2, 3, 4),
                                     "u_t": (4, 5)}, (0.5, 1, 1, 1)),
        "linear_lowrank_backward": ({"dy": (2, 3, 5), "x": (2, 3, 8), "w_cat": (5, 24), "a": (2, 3, 8),
                                     "codes": (2, 3, 3)}, (4, 0.5, 1, 1, 1, 1)),
        "conv": ({"x": (2, 9, 7, 5), "w": (6, 3, 3, 5)}, (2, 1)),
        "fold_batchnorm": ({"w": (6, 3, 3, 5), "mean": (6,), "var": (6,)}, ()),
        "group_norm": ({"x": (2, 5, 4, 8)}, (4,)), "channel_rmsnorm": ({"x": (2, 3, 5, 4, 8)}, ()),
    }
    for i, v in enumerate(((1, 0, 1, 0, 0), (2, 1, 2, 2, 1), (1, 1, 1, 2, 0), (1, 1, 1, 2, 0, 0, 0, 2))):
        cases[f"conv#{i}"] = ({"x": (1, 7, 9, 8, 4), "w": (3, 3, 3, 1, 4)}, v)  # videos: stride, pad, time, upsample
    cases["conv#4"] = ({"x": (2, 9, 7, 5), "w": (6, 3, 3, 5)}, (1, 1, 1, 0, 0, 0, 0, 2))  # nearest 2x input
    for layout in (0, 1):
        cases[f"qk_norm_rope#{layout}"] = ({"q": qkv, "k": qkv, "v": qkv, "cos": (5, 8), "sin": (5, 8)},
                                          (1e-6, 0, 0, layout, 0))
    for key, (named, attrs) in cases.items():
        o = _core.OPS[next(i for i, op in enumerate(_core.OPS) if op.name == key.split("#")[0])]
        shapes = [named.get(t[0]) for t in o.tensors]
        values = o.values(attrs)
        for i, _, _ in o.outputs:
            if shapes[o.tensors[i][2]] is not None and o.exists(i, shapes, values):
                assert tuple(o.sym_shape(i, shapes, values)) == tuple(o.out_shape(i, shapes, attrs)), (key, i)


def test_compile_with_changing_shapes():
    f = torch.compile(lambda x, w: fusedk.linear(x, w, act="gelu_tanh", aux=True), fullgraph=True, dynamic=True)
    for n in (6, 8, 10):
        x, w = torch.randn(2, n, 16), torch.randn(12, 16)
        y, z = f(x, w)
        want, wz = fusedk.linear(x, w, act="gelu_tanh", aux=True)
        assert y.shape == (2, n, 12) and torch.equal(y, want) and torch.equal(z, wz)
    g = torch.compile(lambda qkv, c, s: fusedk.qk_norm_rope(qkv, c, s), fullgraph=True, dynamic=True)
    for S in (4, 6, 9):
        qkv, c = torch.randn(1, S, 3, 2, 8), torch.randn(S, 4)
        assert all(torch.equal(a, b) for a, b in zip(g(qkv, c, c), fusedk.qk_norm_rope(qkv, c, c)))


def test_compile_ties_rope_tables_to_the_positions():
    """A table whose positions are not q's S fails when traced, naming both (not at run time)."""
    g = torch.compile(lambda qkv, c: fusedk.torch.qk_norm_rope(qkv, c, c), fullgraph=True, dynamic=True)
    with pytest.raises(Exception, match="qk_norm_rope: cos has .* positions, q has"):
        g(torch.randn(1, 6, 3, 2, 8), torch.randn(5, 4))
