"""The CUDA side of the call paths: torch through DLPack's C exchange API and CuPy through its
own arrays — outputs from the frameworks' allocators, the caller's stream, CUDA-graph capture
with and without out=, torch.compile (fullgraph, reduce-overhead), many threads on many
streams (opcheck on CUDA: test_torch.py). Every result against the CPU reference. Skipped without a CUDA device."""
import threading

import numpy as np
import pytest

import fusedk
from oracle import assert_close_gpu as assert_close, np_of  # GPU vs the CPU reference

if not fusedk.kernel_info()["cuda"].get("devices"):
    pytest.skip("no CUDA device (or fusedk built without its GPU half)", allow_module_level=True)

try:
    import torch
    _torch_ok = torch.cuda.is_available() and hasattr(torch.Tensor, "__dlpack_c_exchange_api__")
except ImportError:  # pragma: no cover
    torch, _torch_ok = None, False
needs_torch = pytest.mark.skipif(not _torch_ok, reason="torch >= 2.11 with CUDA not installed")
try:
    import cupy
except ImportError:  # pragma: no cover
    cupy = None
needs_cupy = pytest.mark.skipif(cupy is None, reason="CuPy not installed")


def torch_inputs(B=2, L=300, D=1152, dtype=None):
    dtype = dtype or torch.bfloat16
    x = torch.randn(B, L, D, device="cuda", dtype=dtype)
    r = torch.randn(B, L, D, device="cuda", dtype=dtype)
    w = 1 + 0.2 * torch.randn(D, device="cuda", dtype=dtype)
    mod = torch.randn(B, 6 * D, device="cuda", dtype=dtype)
    sh, sc, g = mod.chunk(6, 1)[:3]
    return x, r, w, sc, sh, g


def ops(x, r, w, sc, sh, g, out=None):
    """(name, call(fusedk-like module, tensor map), tensors whose outputs are written) per op."""
    o = (lambda k: None) if out is None else out
    B, L, D = x.shape
    hd = (B, L, 8, D // 8)  # rope: [B, S, H, Dh] views of the rows; tables [S, 48] for rotary_dim 96
    qkv = (B, L, 3, 4, D // 12)  # qk_norm_rope: [B, S, 3, H, Dh] with Dh 96
    gen = torch.Generator(device=x.device).manual_seed(0)
    cs, sn = (torch.randn(L, 48, device=x.device, generator=gen) for _ in range(2))
    pos = torch.arange(L, device=x.device, dtype=torch.float32)
    kv_len = torch.tensor([L // 3, L + 5] * B, device=x.device, dtype=torch.int32)[:B]
    # the device clamps kv_len past Sk (no host sync); the host reference refuses it: clamped there
    kv = lambda m: m(kv_len) if m is not np_of else np.minimum(np_of(kv_len), L)  # noqa: E731
    return [
        ("rmsnorm", lambda f, m: f.rmsnorm(m(x), m(w), out=o(0))),
        ("rmsnorm+res", lambda f, m: f.rmsnorm(m(x), m(w), residual=m(r), out=o(0), residual_out=o(1))),
        ("layernorm", lambda f, m: f.layernorm(m(x), m(w), m(w), out=o(0))),
        ("adaln", lambda f, m: f.adaln(m(x), m(sc), m(sh), out=o(0))),
        ("mochi", lambda f, m: f.residual_tanh_gated_rmsnorm(m(x), m(r), m(g), exact=False, out=o(0))),
        ("act", lambda f, m: f.act(m(x), "gelu_tanh", out=o(0))),
        ("silu_fma", lambda f, m: f.silu_fma(m(x), m(r), m(x), out=o(0))),
        ("gated_residual", lambda f, m: f.gated_residual(m(x), m(r), m(g), out=o(0))),
        ("glu", lambda f, m: f.glu(m(x), "gelu", "second", out=None if out is None else o(0)[..., :x.shape[-1] // 2])),
        ("glu_pair", lambda f, m: f.glu_pair(m(x), m(r), out=o(0))),
        ("rope", lambda f, m: f.rope(m(x).reshape(hd), m(r).reshape(hd), m(cs), m(sn), style="half", rotary_dim=96,
                                     q_out=None if out is None else o(0).reshape(hd),
                                     k_out=None if out is None else o(1).reshape(hd))),
        ("rope_table_1d", lambda f, m: f.rope_table_1d(m(pos), 144)),
        # qk_norm_rope: x as a packed [B, L, 3, 4, D/12] projection (head dim 96: cs, sn are its full
        # tables), full-row norm with [4 * 96] weights, out= strided [B, 4, L, 96] views of one buffer
        ("qk_norm_rope", lambda f, m: f.qk_norm_rope(m(x).reshape(qkv), m(cs), m(sn), q_weight=m(w[:D // 3]),
                                                     k_weight=m(w[D // 3:2 * D // 3]), norm="full", style="half",
                                                     out=None if out is None else tuple(
                                                         o(0).view(qkv)[:, :, j].transpose(1, 2) for j in range(3)))),
        # attention: q [B, L, 8, 144] (a head size between the tile widths), k and v the heads 0-1
        # and 6-7 of other rows (GQA 4, strided heads), causal, kv_len {L / 3, past L: clamped to L}
        ("attention", lambda f, m: f.attention(m(x).reshape(hd), m(r).reshape(hd)[:, :, :2], m(x).reshape(hd)[:, :, 6:],
                                               causal=True, kv_len=kv(m),
                                               out=None if out is None else o(0).reshape(hd))),
        ("diffusion_step", lambda f, m: f.diffusion_step(m(x), m(r), uncond=m(x[:, :1].expand_as(x)), guidance=3.0,
                                                         sampler="ddim", alpha_bar=0.5, alpha_bar_prev=0.7,
                                                         clamp_x0=2.0, prev=m(r), blend=0.9, out=o(0))),
    ]


def check_against_reference(name, got, fn, aux=None):
    want = fn(fusedk, np_of)
    got, want = (got, want) if isinstance(got, tuple) else ((got,), (want,))
    for a, b in zip(got, want):
        assert isinstance(a, torch.Tensor) and a.is_cuda
        extra = None
        if name == "mochi":
            extra = np.abs(np_of(aux).astype(np.float64))
        if name == "attention":  # P rounds to the dtype before P v: eps_T max |v| on top
            extra = np.full(b.shape, np.abs(np_of(aux).astype(np.float64)).max())
        assert_close(np_of(a), b, b.dtype, aux=extra, what=name)


@needs_torch
@pytest.mark.parametrize("with_out", [False, True], ids=["new", "out="])
def test_torch_graph_capture_every_op(with_out):
    args = torch_inputs()
    outs = [torch.empty_like(args[0]), torch.empty_like(args[0])] if with_out else None
    refs = dict(ops(*args))  # the same calls without out=, for the CPU reference
    for name, fn in ops(*args, out=(lambda k: outs[k]) if with_out else None):
        s = torch.cuda.Stream()
        s.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(s):
            fn(fusedk, lambda t: t)  # warm-up on the side stream (the allocator's pool)
        torch.cuda.current_stream().wait_stream(s)
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            got = fn(fusedk, lambda t: t)  # outputs from the graph's private pool when new
        for t in got if isinstance(got, tuple) else (got,):
            t.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_against_reference(name, got, refs[name], aux=args[0])


@needs_torch
def test_torch_outputs_come_from_the_caching_allocator_on_the_current_stream():
    x, *_ = torch_inputs()
    torch.cuda.synchronize()
    before = torch.cuda.memory_allocated()
    y = fusedk.rmsnorm(x)
    assert torch.cuda.memory_allocated() - before >= y.numel() * y.element_size()  # torch's allocator
    del y
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = fusedk.rmsnorm(x)  # allocated and computed on s, no sync needed for s's consumers
        z = y.float().sum()
    s.synchronize()
    assert torch.isfinite(z)
    for _ in range(300):  # freed through torch, never leaked
        fusedk.layernorm(x)
    torch.cuda.synchronize()
    assert torch.cuda.memory_allocated() - before < 4 * x.numel() * x.element_size()


@needs_torch
def test_torch_compile_reduce_overhead_dit_block():
    import fusedk.torch as fkt
    x, r, w, sc, sh, g = torch_inputs(2, 1024, 1152)

    def block(x, r, w, sc, sh, g):
        h, res = fkt.rmsnorm(x, w, residual=r)
        h = fkt.adaln(h, sc, sh, norm="layer")
        return fkt.residual_tanh_gated_rmsnorm(res, h, g)

    want = block(x, r, w, sc, sh, g)
    full = torch.compile(block, fullgraph=True)
    assert torch.equal(full(x, r, w, sc, sh, g), want)
    ro = torch.compile(block, fullgraph=True, mode="reduce-overhead")
    for _ in range(4):  # warm-up, record, replay
        got = ro(x, r, w, sc, sh, g).clone()
    torch.cuda.synchronize()
    assert torch.equal(got, want)


@needs_torch
def test_threads_and_streams_match_serial():
    # 8 threads, each on its own stream, 8 calls each: bitwise what one thread gets serially
    sets = [torch_inputs(1, 513, 2048) for _ in range(8)]
    want = [[fusedk.rmsnorm(x, w, residual=r)[0] for _ in range(2)] + [fusedk.adaln(x, sc, sh)]
            for x, r, w, sc, sh, g in sets]
    torch.cuda.synchronize()
    got, errors = [None] * 8, []

    def work(i):
        try:
            x, r, w, sc, sh, g = sets[i]
            s = torch.cuda.Stream()
            with torch.cuda.stream(s):
                res = []
                for _ in range(4):
                    res = [fusedk.rmsnorm(x, w, residual=r)[0] for _ in range(2)] + [fusedk.adaln(x, sc, sh)]
            s.synchronize()
            got[i] = res
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)

    th = [threading.Thread(target=work, args=(i,)) for i in range(8)]
    for t in th:
        t.start()
    for t in th:
        t.join()
    assert not errors, errors
    for a, b in zip(got, want):
        assert all(torch.equal(p, q) for p, q in zip(a, b))


@needs_cupy
@pytest.mark.parametrize("with_out", [False, True], ids=["new", "out="])
def test_cupy_graph_capture(with_out):
    x = cupy.random.standard_normal((300, 3072), dtype=cupy.float32).astype(cupy.float16)
    w = (1 + 0.2 * cupy.random.standard_normal(3072, dtype=cupy.float32)).astype(cupy.float16)
    want = fusedk.rmsnorm(cupy.asnumpy(x), cupy.asnumpy(w))
    s = cupy.cuda.Stream(non_blocking=True)
    with s:
        out = cupy.empty_like(x) if with_out else None
        y = fusedk.rmsnorm(x, w, out=out)  # warm-up: the pool now holds a block of this size
        assert isinstance(y, cupy.ndarray)
        del y
        s.begin_capture()
        y = fusedk.rmsnorm(x, w, out=out)
        graph = s.end_capture()
        y.fill(float("nan"))
        graph.launch(s)
        s.synchronize()
    assert_close(cupy.asnumpy(y), want, np.dtype(np.float16), what="cupy graph replay")


@needs_cupy
def test_cupy_outputs_from_the_pool_on_the_current_stream():
    pool = cupy.get_default_memory_pool()
    x = cupy.random.standard_normal((64, 1024), dtype=cupy.float32)
    used = pool.used_bytes()
    y = fusedk.layernorm(x)
    assert pool.used_bytes() - used >= y.nbytes and isinstance(y, cupy.ndarray)
    with cupy.cuda.Stream(non_blocking=True) as s:
        z = fusedk.layernorm(x)
        s.synchronize()
    assert_close(cupy.asnumpy(z), fusedk.layernorm(cupy.asnumpy(x)), np.dtype(np.float32), what="cupy side stream")
