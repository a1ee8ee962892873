"""[linear] linear and linear_backward: the CPU references (NumPy arrays) against float64 NumPy
oracles over every dtype and act, with and without bias, 3-d inputs, odd sizes and strided
views; a bad value for every argument; on a GPU, the cuBLASLt path through torch and CuPy
against the reference, torch autograd and torch.compile through fusedk.torch, CUDA graphs."""
import numpy as np
import pytest

import fusedk
import oracle
from oracle import DTYPES
from oracle import gemm_close as close

rng = np.random.default_rng()
ACTS = ["none", "relu", "gelu_tanh", "gelu", "silu"]


def rand(shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def operands(lead, N, K, dtype, bias=True):
    return (rand(lead + (K,), dtype), rand((N, K), dtype, 1 / np.sqrt(K)), rand((N,), dtype, 0.5) if bias else None)


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,N,K", [((2, 5), 7, 16), ((1,), 1, 1), ((3, 1, 4), 33, 70), ((9,), 64, 128)], ids=str)
def test_forward_and_backward(lead, N, K, dtype, act):
    x, w, b = operands(lead, N, K, dtype)
    y, z = fusedk.linear(x, w, b, act=act, aux=True)
    assert y.dtype == z.dtype == dtype and y.shape == z.shape == lead + (N,)
    want_y, want_z = oracle.linear(x, w, b, act, dtype)
    s1 = np.abs(oracle.f64(x)) @ np.abs(oracle.f64(w)).T + np.abs(oracle.f64(b))
    close(z, want_z, dtype, s1, "aux (z)")
    # GELU/SILU act on z rounded: the oracle does too; a double-rounding flip of z moves y by
    # at most one ulp of z times |act'| (< 1.13)
    flip = 1.13 * oracle.EPS[np.dtype(dtype)] * np.abs(want_z) if act in ("gelu", "silu") else 0.0
    close(y, want_y, dtype, s1, f"y ({act})", flip)
    y2 = fusedk.linear(x, w, b, act=act)  # without aux: the same y
    assert np.array_equal(oracle.bits(y2), oracle.bits(y)) or act in ("gelu", "silu", "relu")
    close(y2, want_y, dtype, s1, f"y without aux ({act})", flip)
    dy = rand(lead + (N,), dtype)
    dx, dw, db = fusedk.linear_backward(dy, x, w, z if act != "none" else None, act=act)
    wdx, wdw, wdb = oracle.linear_backward(dy, x, w, z, act, dtype)
    g = np.abs(oracle.f64(dy)) * (1.13 if act in ("gelu", "gelu_tanh", "silu") else 1.0)
    K2, N2 = x.reshape(-1, K), g.reshape(-1, N)
    # dz rounded to the dtype on both sides, from act' in double by two implementations (C's and
    # NumPy's erf, exp, tanh): a term whose dz lies within an ulp of double of a rounding tie may
    # round the other way, one ulp of dz times its partner
    s_dx, s_dw, s_db = (g @ np.abs(oracle.f64(w))).reshape(x.shape), N2.T @ np.abs(oracle.f64(K2)), N2.sum(0)
    flips = (lambda s, n: 2 * oracle.EPS[np.dtype(dtype)] * s / np.sqrt(n)) if act != "none" else (lambda s, n: 0.0)
    close(dx, wdx, dtype, s_dx, "dx", flips(s_dx, N))
    close(dw, wdw, dtype, s_dw, "dw", flips(s_dw, N2.shape[0]))
    close(db, wdb, dtype, s_db, "db", flips(s_db, N2.shape[0]))


def test_backward_outputs_are_optional_and_strided_views_work():
    x = rand((4, 2, 128), np.float32)[..., :64]  # rows of 64 at a stride of 128: one row stride
    w, b = rand((24, 64), np.float32, 0.125), rand((24,), np.float32)
    y, z = fusedk.linear(x, w, b, act="silu", aux=True)
    want, _ = oracle.linear(x, w, b, "silu", np.float32)
    close(y, want, np.float32, np.abs(x) @ np.abs(w).T + np.abs(b), "strided x", 1e-6 * np.abs(want))
    dy = rand(y.shape, np.float32)
    dx, dw, db = fusedk.linear_backward(dy, x, w, z, act="silu", dx=False, db=False)
    assert dx is None and db is None and dw.shape == w.shape
    assert fusedk.linear_backward(dy, x, w, z, act="silu", dx=False, dw=False, db=False) == (None, None, None)
    out = np.empty((4, 2, 24), np.float32)
    assert fusedk.linear(x, w, b, out=out) is out
    wt = rand((64, 24), np.float32).T  # w with a column stride: not contiguous in its last dim
    with pytest.raises(fusedk.Error, match="linear: w has stride 24 in its last dim, expected 1"):
        fusedk.linear(x, wt)


def test_k_zero_and_m_zero():
    x, w, b = np.zeros((3, 0), np.float32), np.zeros((5, 0), np.float32), rand((5,), np.float32)
    y = fusedk.linear(x, w, b, act="relu")
    assert np.array_equal(y, np.broadcast_to(np.maximum(b, 0), (3, 5)))
    x = np.zeros((0, 8), np.float32)
    w = rand((5, 8), np.float32)
    dx, dw, db = fusedk.linear_backward(np.zeros((0, 5), np.float32), x, w)
    assert dx.shape == (0, 8) and not dw.any() and not db.any()


def test_tf32_flag_is_exact_on_the_cpu():
    x, w, b = operands((6,), 9, 20, np.float32)
    assert np.array_equal(fusedk.linear(x, w, b, tf32=True), fusedk.linear(x, w, b))


def test_bad_arguments():
    x, w, b = operands((2, 3), 8, 16, np.float32)
    cases = [
        (lambda: fusedk.linear(x, rand((8, 15), np.float32)), "FUSEDK_ERR_SHAPE",
         r"linear: w has shape \[8, 15\], expected \[N, 16\] \(K = the last dim of x\)"),
        (lambda: fusedk.linear(x, w, rand((7,), np.float32)), "FUSEDK_ERR_SHAPE",
         r"linear: bias has shape \[7\], expected \[8\]"),
        (lambda: fusedk.linear(x, w[None]), "FUSEDK_ERR_SHAPE", r"linear: w has shape \[1, 8, 16\]"),
        (lambda: fusedk.linear(x, w.astype(np.float16)), "FUSEDK_ERR_DTYPE",
         "linear: w has dtype float16, expected float32"),
        (lambda: fusedk.linear(x, w, act="tanh"), "FUSEDK_ERR_INVALID_ARGUMENT", "linear: act is 'tanh', expected"),
        (lambda: fusedk.linear(x, w, out=np.empty((2, 3, 7), np.float32)), "FUSEDK_ERR_SHAPE",
         r"linear: out has shape \[2, 3, 7\], expected \[2, 3, 8\]"),
        (lambda: fusedk.linear(x.astype(np.float64), w), "FUSEDK_ERR_DTYPE", "linear: x has dtype float64"),
        (lambda: fusedk.linear_backward(rand((2, 3, 8), np.float32), x, w, act="gelu"),
         "FUSEDK_ERR_INVALID_ARGUMENT", "linear_backward: aux is NULL, expected the forward's aux_out"),
        (lambda: fusedk.linear_backward(rand((2, 3, 9), np.float32), x, w), "FUSEDK_ERR_SHAPE",
         r"linear_backward: dy has shape \[2, 3, 9\], expected \[2, 3, 8\]"),
        (lambda: fusedk.linear_backward(rand((2, 3, 8), np.float32), x, w, rand((2, 3, 7), np.float32), "relu"),
         "FUSEDK_ERR_SHAPE", r"linear_backward: aux has shape \[2, 3, 7\]"),
        (lambda: fusedk.linear(np.zeros((3, 2, 16), np.float32).transpose(1, 0, 2), w), "FUSEDK_ERR_LAYOUT",
         "linear: the leading dims of x .* do not flatten to one row stride"),
    ]
    for fn, status, msg in cases:
        with pytest.raises(fusedk.Error, match=msg) as e:
            fn()
        assert e.value.status == status, (msg, e.value.status)
    buf = rand((2, 3, 16), np.float32)  # y over x: nothing written
    keep = buf.copy()
    with pytest.raises(fusedk.Error, match="linear: output out overlaps x in memory"):
        fusedk.linear(buf, rand((16, 16), np.float32), out=buf)
    assert np.array_equal(buf, keep)


# --- GPU --------------------------------------------------------------------------------------
_TO_GPU = {name: to for name, to, *_ in oracle.gpu_frameworks()}  # NumPy array -> device tensor
torch_gpu = pytest.mark.skipif("torch" not in _TO_GPU, reason="no CUDA device with torch")


@torch_gpu
@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("lead,N,K", [((2, 64), 96, 128), ((1, 17), 4095, 1000), ((3,), 8, 8)], ids=str)
def test_torch_gpu_against_the_reference(lead, N, K, dtype, act):
    import torch
    x, w, b = operands(lead, N, K, dtype)
    dev = [_TO_GPU["torch"](a) for a in (x, w, b)]
    y, z = fusedk.linear(*dev, act=act, aux=True)
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.shape == lead + (N,)
    ry, rz = fusedk.linear(x, w, b, act=act, aux=True)
    s1 = np.abs(oracle.f64(x)) @ np.abs(oracle.f64(w)).T + np.abs(oracle.f64(b))
    flip = 1.13 * oracle.GPU_EPS[np.dtype(dtype)] * np.abs(oracle.f64(rz)) if act in ("gelu", "silu") else 0.0
    close(oracle.np_of(y), ry, dtype, s1 * 1.13, f"y {act}", flip, gpu=True)
    close(oracle.np_of(z), rz, dtype, s1, "aux", gpu=True)
    dy = rand(lead + (N,), dtype)
    grads = fusedk.linear_backward(_TO_GPU["torch"](dy), dev[0], dev[1],
                                   _TO_GPU["torch"](rz) if act != "none" else None, act=act)
    want = fusedk.linear_backward(dy, x, w, rz if act != "none" else None, act=act)
    g = np.abs(oracle.f64(dy)).reshape(-1, N) * 1.13
    bounds = [(g @ np.abs(oracle.f64(w))).reshape(x.shape), g.T @ np.abs(oracle.f64(x)).reshape(-1, K), g.sum(0)]
    for name, got, ref, s, n in zip(("dx", "dw", "db"), grads, want, bounds, (N, g.shape[0], g.shape[0])):
        extra = 4 * oracle.GPU_EPS[np.dtype(dtype)] * s / np.sqrt(n) if act != "none" else 0.0
        close(oracle.np_of(got), ref, dtype, s, f"{name} {act}", extra, gpu=True)


@torch_gpu
@pytest.mark.parametrize("act", ["relu", "gelu_tanh", "gelu", "silu", "none"])
def test_torch_autograd_and_compile(act):
    import torch
    import fusedk.torch as fkt
    torch.manual_seed(0)
    x = torch.randn(4, 33, 256, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    w = (torch.randn(384, 256, device="cuda", dtype=torch.bfloat16) / 16).requires_grad_()
    b = torch.randn(384, device="cuda", dtype=torch.bfloat16).requires_grad_()
    f = {"none": lambda t: t, "relu": torch.relu, "gelu": torch.nn.functional.gelu, "silu": torch.nn.functional.silu,
         "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[act]
    ref = [t.detach().float().requires_grad_() for t in (x, w, b)]
    yr = f(torch.nn.functional.linear(*ref))
    dy = torch.randn_like(yr)
    yr.backward(dy)

    def check(fn, what):
        for t in (x, w, b):
            t.grad = None
        y = fn(x, w, b)
        y.backward(dy.to(y.dtype))
        assert torch.allclose(y.float(), yr, atol=0.03, rtol=0.02), what
        for t, r in zip((x, w, b), ref):
            assert torch.allclose(t.grad.float(), r.grad, atol=0.05 * r.grad.abs().max().item(), rtol=0.02), what

    check(lambda x, w, b: fkt.linear(x, w, b, act=act), f"fusedk.torch.linear {act} eager")
    y, z = fkt.linear(x, w, b, act=act, aux=True)  # aux is for a hand-written backward: no gradient
    assert y.requires_grad and not z.requires_grad
    assert fkt.linear_backward(y.detach(), x.detach(), w.detach(), z, act=act, dx=False, dw=False, db=False) == \
        (None, None, None)
    assert fusedk.linear_backward(y.detach(), x.detach(), w.detach(), z, act=act, dx=False, dw=False, db=False) == \
        (None, None, None)
    compiled = torch.compile(lambda x, w, b: fkt.linear(x, w, b, act=act), fullgraph=True)
    check(compiled, f"fusedk.torch.linear {act} compiled")


@torch_gpu
def test_torch_cuda_graph_capture():
    import torch
    x = torch.randn(64, 512, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(256, 512, device="cuda", dtype=torch.bfloat16) / 23
    b = torch.randn(256, device="cuda", dtype=torch.bfloat16)
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fusedk.linear(x, w, b, act="gelu_tanh")  # warm: the plan and the workspace
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        y = fusedk.linear(x, w, b, act="gelu_tanh")
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    want = torch.nn.functional.gelu(torch.nn.functional.linear(x.float(), w.float(), b.float()), approximate="tanh")
    assert torch.allclose(y.float(), want, atol=0.03, rtol=0.02)


def test_cupy_gpu():
    cupy = pytest.importorskip("cupy")
    if not fusedk.kernel_info()["cuda"].get("devices"):
        pytest.skip("no CUDA device")
    x, w, b = operands((5, 40), 72, 96, np.float16)
    y = fusedk.linear(cupy.asarray(x), cupy.asarray(w), cupy.asarray(b), act="silu")
    assert isinstance(y, cupy.ndarray)
    want, z = oracle.linear(x, w, b, "silu", np.float16)
    s1 = np.abs(oracle.f64(x)) @ np.abs(oracle.f64(w)).T + np.abs(oracle.f64(b))
    close(cupy.asnumpy(y), want, np.float16, s1 * 1.13, "cupy linear silu", 1.13 * 2.0 ** -10 * np.abs(z), gpu=True)


def test_jax_jit():
    jax = pytest.importorskip("jax")
    import fusedk.jax as fkj
    x, w, b = operands((3, 16), 24, 32, np.float32)
    y = jax.jit(lambda x, w, b: fkj.linear(x, w, b, act="gelu_tanh"))(x, w, b)
    assert isinstance(y, jax.Array) and y.shape == (3, 16, 24)
    want = fusedk.linear(np.asarray(jax.device_get(jax.device_put(x, jax.devices("cpu")[0]))), w, b, act="gelu_tanh")
    assert np.allclose(np.asarray(y), want, atol=1e-4, rtol=1e-4)
    y, z = jax.jit(lambda x, w: fusedk.linear(x, w, act="relu", aux=True))(x, w)
    dx, dw, db = jax.jit(lambda dy, x, w, z: fkj.linear_backward(dy, x, w, z, act="relu"))(np.ones(y.shape, np.float32), x, w, z)
    assert dx.shape == x.shape and dw.shape == w.shape and db.shape == (24,)
