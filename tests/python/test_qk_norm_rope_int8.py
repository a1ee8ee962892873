"""[position] qk_norm_rope_int8 (qk_norm_rope's q' and k' written as int8 ScaledTensors, what
attention_int8_scaled takes): the CPU reference against the float64 oracle (oracle.qk_norm_rope,
rounded to float32, then the quantization fusedk.h states) over every dtype, norm, style and form
(packed, GQA, partial rotary, per-head tables); strided out=, zero and NaN rows, refusals;
attention on its outputs; fusedk.torch (eager, torch.compile) and fusedk.jax (jit) on the CPU;
then the GPU kernel through torch and CuPy against the CPU reference, under torch.compile and in a
CUDA graph, and the fused path's error against float64 attention (the contract's input families: N(0,1), offset, outliers)."""
import numpy as np
import pytest

import fusedk
import oracle
from oracle import DTYPES, quantize_rows, table_shape, tables

rng = np.random.default_rng()
F32 = np.float32

CASES = {  # (B, S, Hq, Hk, Dh, rotary_dim, table kind, packed)
    "packed": (2, 7, 4, 4, 64, None, "SR", True),
    "packed-partial": (1, 5, 3, 3, 64, 32, "SR", True),
    "per-head": (2, 5, 3, 3, 16, None, "SHR", True),
    "gqa": (2, 6, 8, 2, 32, None, "SR", False),
    "mqa-partial": (1, 9, 6, 1, 24, 8, "S1R", False),
    "per-batch": (2, 5, 3, 3, 16, 12, "BSHR", False),
    "minimal": (1, 1, 1, 1, 2, None, "SR", True),
    "odd-Dh9-R4": (2, 3, 2, 1, 9, 4, "SR", False),
    "Dh256": (1, 3, 2, 2, 256, None, "SR", True),
}
NORMS = ["head", "full", "none"]


def make(case, dtype, norm, weighted=True):
    """(qkv argument, q, k, cos, sin, q_weight, k_weight, rotary_dim) of a case"""
    return inputs(*CASES[case], dtype, norm, weighted)


def inputs(B, S, Hq, Hk, Dh, R, kind, packed, dtype, norm, weighted=True):
    if packed:
        qkv = (0.3 + 2 * rng.standard_normal((B, S, 3, Hq, Dh))).astype(dtype)
        q, k = qkv[:, :, 0], qkv[:, :, 1]
    else:
        q, k = ((0.3 + 2 * rng.standard_normal((B, S, H, Dh))).astype(dtype) for H in (Hq, Hk))
        qkv = (q, k, None)
    cos, sin = tables(table_shape(kind, B, S, Hq, (R or Dh) // 2))
    wq = wk = None
    if weighted and norm != "none":
        n = (Hq * Dh, Hk * Dh) if norm == "full" else (Dh, Dh)
        wq, wk = ((1 + 0.2 * rng.standard_normal(m)).astype(dtype) for m in n)
    return qkv, q, k, cos, sin, wq, wk, R


def want_int8(q, k, cos, sin, wq, wk, norm, style, R):
    """the oracle's q', k' (float64) rounded to float32, then quantized a row (fusedk.h's rule)"""
    qo, ko = oracle.qk_norm_rope(q, k, None, cos, sin, wq, wk, 1e-6, norm, style, "bshd", R)
    return [quantize_rows(x.astype(F32)) for x in (qo, ko)]


def assert_int8_close(got, want, what):
    """ScaledTensor got against (int8, scale [..., 1]) want: scales to float32's rounding of a few
    operations, data within one step (x * 127 / amax within a rounding of a half) on at most
    n / 1000 + 2 elements"""
    d, s = np.asarray(got.data), np.asarray(got.scale)
    assert d.dtype == np.int8 and s.dtype == F32 and d.shape == want[0].shape and s.shape == want[1].shape[:-1], what
    np.testing.assert_allclose(s, want[1][..., 0], rtol=2e-6, atol=0, err_msg=what)
    diff = np.abs(d.astype(int) - want[0].astype(int))
    assert diff.max(initial=0) <= 1 and (diff > 0).sum() <= diff.size // 1000 + 2, (what, diff.max(), (diff > 0).sum())


@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("norm", NORMS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_reference_matches_the_oracle(case, dtype, norm, style):
    qkv, q, k, cos, sin, wq, wk, R = make(case, dtype, norm)
    gq, gk, v = fusedk.qk_norm_rope_int8(qkv, cos, sin, wq, wk, norm=norm, style=style, rotary_dim=R)
    wq8, wk8 = want_int8(q, k, cos, sin, wq, wk, norm, style, R)
    assert_int8_close(gq, wq8, f"{case} q")
    assert_int8_close(gk, wk8, f"{case} k")
    assert np.shares_memory(v, qkv) if CASES[case][7] else v is None  # v: the projection's view, as given


def test_equals_qk_norm_rope_quantized():
    """bit for bit: qk_norm_rope's float32 reference, quantized here (the same double math)"""
    qkv, q, k, cos, sin, wq, wk, R = make("gqa", F32, "full")
    gq, gk, _ = fusedk.qk_norm_rope_int8(qkv, cos, sin, wq, wk, norm="full", style="half")
    fq, fk = fusedk.qk_norm_rope(qkv, cos, sin, wq, wk, norm="full", style="half", layout="bshd")
    for g, f in ((gq, fq), (gk, fk)):
        d, s = quantize_rows(f)
        assert np.array_equal(g.data, d) and np.array_equal(g.scale, s[..., 0])


def test_out_zero_and_nan_rows_and_refusals():
    qkv, q, k, cos, sin, wq, wk, R = make("packed", np.float16, "head")
    qkv[0, 0, 0, 1] = 0  # q row (0, 0, 1): zeros; q row (0, 1, 2): a NaN
    qkv[0, 1, 0, 2, 5] = np.nan
    B, S, H, D = q.shape
    buf8 = np.full((B, S, H, D + 16), -128, np.int8)  # padded rows
    bufs = np.full((B, S, H + 3), np.nan, F32)
    k8, ks = np.empty(k.shape, np.int8), np.empty(k.shape[:3], F32)
    out = (fusedk.ScaledTensor(buf8[..., 8:8 + D], bufs[..., :H]), fusedk.ScaledTensor(k8, ks))
    gq, gk, _ = fusedk.qk_norm_rope_int8(qkv, cos, sin, wq, wk, out=out)
    assert gq.data.base is buf8 and gk.data is k8
    assert (buf8[..., :8] == -128).all() and (buf8[..., 8 + D:] == -128).all() and np.isnan(bufs[..., H:]).all()
    wq8, wk8 = want_int8(q, k, cos, sin, wq, wk, "head", "interleaved", None)
    assert_int8_close(gq, wq8, "strided out q")
    assert_int8_close(gk, wk8, "out k")
    assert not gq.data[0, 0, 1].any() and gq.scale[0, 0, 1] == 0
    assert not gq.data[0, 1, 2].any() and np.isnan(gq.scale[0, 1, 2])
    with pytest.raises(fusedk.InvalidArgumentError, match="out is not"):
        fusedk.qk_norm_rope_int8(qkv, cos, sin, out=(k8, ks))
    with pytest.raises(fusedk.DTypeError, match="k_out has dtype float16, expected int8"):
        fusedk.qk_norm_rope_int8(qkv, cos, sin, out=(out[0], fusedk.ScaledTensor(k8.astype(np.float16), ks)))
    with pytest.raises(fusedk.ShapeError, match="k_out_scale has shape"):
        fusedk.qk_norm_rope_int8(qkv, cos, sin, out=(out[0], fusedk.ScaledTensor(k8, ks[:, :, :1])))
    with pytest.raises(fusedk.InvalidArgumentError, match="norm"):
        fusedk.qk_norm_rope_int8(qkv, cos, sin, norm="layer")
    with pytest.raises(fusedk.ShapeError, match="expected \\[B, S, 3, H, Dh\\]"):
        fusedk.qk_norm_rope_int8(qkv[:, :, :2], cos, sin)


def test_attention_on_its_outputs():
    """attention(q', k', v) through attention_int8_scaled: equal to attention on the dequantized q'
    and k' (the scaled op's reference), v the packed projection's view"""
    qkv, q, k, cos, sin, wq, wk, R = make("packed", F32, "head")
    gq, gk, v = fusedk.qk_norm_rope_int8(qkv, cos, sin, wq, wk)
    got = fusedk.attention(gq, gk, v)
    cut = (gk.scale.view(np.uint32) & np.uint32(0xFFFFFFFC)).view(F32)
    want, _ = oracle.attention(gq.data * gq.scale[..., None].astype(np.float64),
                               gk.data * cut[..., None].astype(np.float64), v.astype(np.float64))
    oracle.assert_close(got, want, F32)


def test_torch_and_jax_cpu():
    qkv, q, k, cos, sin, wq, wk, R = make("gqa", F32, "full")
    want = fusedk.qk_norm_rope_int8(qkv, cos, sin, wq, wk, norm="full")
    torch = pytest.importorskip("torch")
    import fusedk.torch as ft
    t = torch.from_numpy
    args = (t(q), t(k), t(cos), t(sin), t(wq), t(wk))

    def call(f):
        def g(q, k, c, s, a, b):
            x, y, _ = f.qk_norm_rope_int8((q, k, None), c, s, a, b, norm="full")
            return x.data, x.scale, y.data, y.scale
        return g
    flat = [want[0].data, want[0].scale, want[1].data, want[1].scale]
    for got in (call(ft)(*args), torch.compile(call(fusedk), fullgraph=True)(*args)):
        assert all(np.array_equal(g.numpy(), w) for g, w in zip(got, flat))
    jax = pytest.importorskip("jax")
    pytest.importorskip("fusedk.jax")
    got = jax.jit(call(fusedk))(q, k, cos, sin, wq, wk)
    assert all(np.array_equal(np.asarray(g), w) for g, w in zip(got, flat))


# --- the GPU kernel ---------------------------------------------------------------------------
GPU_CASES = {  # (B, S, Hq, Hk, Dh, rotary_dim, norm, style, packed)
    "flux": (1, 300, 24, 24, 128, None, "head", "interleaved", True),
    "wan": (1, 200, 12, 12, 128, None, "full", "interleaved", True),
    "ltx-gqa": (2, 77, 8, 2, 64, None, "full", "half", False),
    "Dh256": (1, 64, 4, 4, 256, None, "head", "half", True),
    "partial-96": (2, 33, 3, 3, 96, 64, "head", "half", True),
    "none": (1, 40, 2, 2, 64, None, "none", "interleaved", True),
    # 12 items a head (not a power of two): the portable kernel's shared-memory amax, with each norm
    "head-96": (2, 33, 3, 3, 96, None, "head", "interleaved", True),
    "full-96": (1, 33, 6, 6, 96, None, "full", "interleaved", True),
    "none-96": (1, 20, 3, 3, 96, None, "none", "interleaved", True),
    "chunks": (1, 7, 400, 400, 96, None, "head", "interleaved", True),  # heads in chunks
}


@pytest.mark.skipif(not oracle.gpu_frameworks(), reason="no CUDA device with torch or CuPy")
@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "float32"])
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_against_the_reference(case, dtype):
    B, S, Hq, Hk, Dh, R, norm, style, packed = GPU_CASES[case]
    dt = oracle.BF16 if dtype == "bfloat16" else np.dtype(dtype)
    qkv, q, k, cos, sin, wq, wk, R = inputs(B, S, Hq, Hk, Dh, R, "SR", packed, dt, norm)
    want = fusedk.qk_norm_rope_int8(qkv, cos, sin, wq, wk, norm=norm, style=style, rotary_dim=R)
    for fw, to_dev, to_host, _ in oracle.gpu_frameworks():
        if dt == oracle.BF16 and fw == "cupy":
            continue
        dev = tuple(None if x is None else to_dev(x) for x in qkv) if not packed else to_dev(qkv)
        got = fusedk.qk_norm_rope_int8(dev, to_dev(cos), to_dev(sin), None if wq is None else to_dev(wq),
                                       None if wk is None else to_dev(wk), norm=norm, style=style, rotary_dim=R)
        for g, w, n in zip(got[:2], want[:2], "qk"):
            host = fusedk.ScaledTensor(to_host(g.data), to_host(g.scale))
            assert_int8_close(host, (w.data, w.scale[..., None]), f"{fw} {case} {dtype} {n}")
        if packed and dtype == "float16" and Dh in (64, 128, 256) and _sm90():  # attention on them, as they are
            o = to_host(fusedk.attention(*got)).astype(np.float64)
            ref = fusedk.attention(*want).astype(np.float64)
            tol = 3 * 2.0 ** -10 * np.abs(want[2].astype(np.float64)).max()  # P in f16; a few data a step off
            assert np.abs(o - ref).max() <= tol, (fw, case, np.abs(o - ref).max(), tol)


def _sm90():
    torch, ok = oracle.torch_cuda()
    return ok and torch.cuda.get_device_capability() == (9, 0)


@pytest.mark.skipif(not oracle.torch_cuda()[1], reason="no CUDA device, torch or fusedk GPU half")
@pytest.mark.parametrize("offset", [0, 1], ids=["aligned", "byte-offset-out"])
def test_gpu_zero_nan_rows_and_misaligned_out(offset):
    """a zero head (0, scale 0), a NaN and an Inf (0, scale non-finite), as the reference; out= at a
    byte offset (the kernels' byte stores), its padding untouched"""
    torch = oracle.torch_cuda()[0]
    qkv = torch.randn(2, 50, 3, 4, 128, dtype=torch.bfloat16)
    qkv[0, 3, 0, 1] = 0
    qkv[1, 7, 0, 2, 9] = float("nan")
    qkv[1, 8, 1, 3, 100] = float("inf")
    cos, sin = (torch.from_numpy(t) for t in tables((50, 64)))
    want = fusedk.qk_norm_rope_int8(qkv, cos, sin)
    buf = torch.full((2, 50, 4, 128 + 16), -128, dtype=torch.int8, device="cuda")
    q8 = buf[..., offset:offset + 128]
    out = (fusedk.ScaledTensor(q8, torch.empty(2, 50, 4, device="cuda")),
           fusedk.ScaledTensor(torch.empty(2, 50, 4, 128, dtype=torch.int8, device="cuda"),
                               torch.empty(2, 50, 4, device="cuda")))
    got = fusedk.qk_norm_rope_int8(qkv.cuda(), cos.cuda(), sin.cuda(), out=out)
    assert got[0].data.data_ptr() == q8.data_ptr()
    for g, w, n in zip(got[:2], want[:2], "qk"):
        host = fusedk.ScaledTensor(g.data.cpu().numpy(), g.scale.cpu().numpy())
        ws = w.scale.numpy()
        fin = np.isfinite(ws)
        assert np.array_equal(np.isnan(host.scale), np.isnan(ws)) and np.array_equal(np.isinf(host.scale), np.isinf(ws))
        assert_int8_close(fusedk.ScaledTensor(host.data[fin], host.scale[fin]),
                          (w.data.numpy()[fin], ws[fin][..., None]), f"{n} offset {offset}")
        assert not host.data[~fin].any()
    assert got[0].scale[0, 3, 1] == 0 and not got[0].data[0, 3, 1].any()
    assert got[0].scale[1, 7, 2].isnan() and not got[1].scale[1, 8, 3].isfinite()  # (k: its rms Inf, Inf x 0 NaN)
    pad = torch.cat([buf[..., :offset].flatten(), buf[..., offset + 128:].flatten()])
    assert (pad == -128).all()


@pytest.mark.skipif(not oracle.torch_cuda()[1], reason="no CUDA device, torch or fusedk GPU half")
def test_gpu_compile_and_graph():
    torch = oracle.torch_cuda()[0]
    import fusedk.torch as ft
    qkv = torch.randn(1, 500, 3, 8, 128, device="cuda", dtype=torch.bfloat16)
    cos, sin = (torch.from_numpy(t).cuda() for t in tables((500, 64)))
    w = torch.ones(128, device="cuda", dtype=torch.bfloat16)

    def f(x):
        q, k, v = ft.qk_norm_rope_int8(x, cos, sin, w, w)
        return q.data, q.scale, k.data, k.scale
    want = f(qkv)
    got = torch.compile(f, fullgraph=True)(qkv)
    assert all(torch.equal(a, b) for a, b in zip(got, want))
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f(qkv)
        with torch.cuda.graph(g, stream=s):
            out = f(qkv)
    torch.cuda.current_stream().wait_stream(s)
    g.replay()
    torch.cuda.synchronize()
    assert all(torch.equal(a, b) for a, b in zip(out, want))
