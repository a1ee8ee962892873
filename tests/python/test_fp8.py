"""[linear] FP8: quantize_fp8 and dequantize_fp8 bit for bit against a NumPy oracle of fusedk.h's
rule (float32 arithmetic, ml_dtypes' e4m3fn rounding), linear_fp8's reference against float64 on
the dequantized values, its error against float64 of the unquantized inputs (the accuracy
contract's families: N(0,1), 0.1 % of x's entries x20), bad input, torch and JAX on the CPU; on a
GPU, the kernels against the reference, against torch._scaled_mm with torchao's per-row scales
(the contract), and under torch.compile and a CUDA graph."""
import ml_dtypes
import numpy as np
import pytest

import fusedk
import oracle
from oracle import DTYPES

rng = np.random.default_rng()
F32, E4M3 = np.float32, np.dtype(ml_dtypes.float8_e4m3fn)


def scaled_rows(x, qmax, of_scale=False):
    """The 8-bit rows' rule of fusedk.h in NumPy: amax (a NaN wins), x * float32(qmax / amax) in
    float32 (of_scale, int8's: x * float32(1 / scale)), 0 where that factor is not finite, and
    the scale amax / qmax"""
    x = np.asarray(x).astype(F32)
    amax = np.abs(x).max(-1, keepdims=True)
    amax = np.where(np.isnan(x).any(-1, keepdims=True), F32(np.nan), amax).astype(F32)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        scale = (amax / F32(qmax)).astype(F32)
        d = scale if of_scale else amax
        r = ((F32(1) if of_scale else F32(qmax)) / d).astype(F32)
        inv = np.where((d > 0) & np.isfinite(r), r, F32(0)).astype(F32)
        return (x * inv).astype(F32), scale[..., 0]


def quantize_oracle(x):
    """fusedk.h's quantize_fp8 in NumPy: scaled_rows to 448, rounded to e4m3 (ties to even, saturating)"""
    v, scale = scaled_rows(x, 448)
    v = np.where(np.isnan(v), v, np.clip(v, -448, 448))  # ml_dtypes does not saturate
    return v.astype(E4M3), scale


def rel_l2(a, b):
    a, b = np.asarray(a, np.float64), np.asarray(b, np.float64)
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def same_bits(a, b):
    a, b = np.asarray(a), np.asarray(b)
    return a.shape == b.shape and a.dtype == b.dtype and np.array_equal(a.view(f"u{a.dtype.itemsize}"),
                                                                        b.view(f"u{b.dtype.itemsize}"))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 33), (2, 5, 64), (4, 1, 3072)], ids=str)
def test_quantize_matches_the_oracle(shape, dtype):
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, shape[:-1] + (1,)))).astype(dtype)
    q = fusedk.quantize_fp8(x)
    want, scale = quantize_oracle(x)
    assert isinstance(q, fusedk.ScaledTensor) and q.data.dtype == E4M3 and q.scale.dtype == F32
    assert q.scale.shape == (shape[:-1] or (1,))
    assert same_bits(q.data, want), "data"
    assert same_bits(q.scale.reshape(scale.shape), scale), "scale"
    # dequantized: within half an e4m3 step of x (2^-4 relative; subnormals 2^-10 of the scale)
    d = fusedk.dequantize_fp8(q, out_dtype="float32").astype(np.float64)
    x64, s = x.astype(np.float64), q.scale.reshape(shape[:-1] + (1,)).astype(np.float64)
    assert np.all(np.abs(d - x64) <= np.maximum(np.abs(x64) * 2.0 ** -4, s * 2.0 ** -10) * (1 + 1e-6) + 1e-30)


def test_quantize_ties_zero_nan_inf_rows():
    x = np.array([[448, 17, 19, 2.0 ** -10, 3 * 2.0 ** -10, -17, 1, -448],
                  [0] * 8, [1, 2, np.nan, 4, 5, 6, 7, 8], [1, 2, 3, np.inf, 5, 6, 7, 8]], F32)
    q = fusedk.quantize_fp8(x)
    d = q.data.astype(np.float64)
    assert list(d[0]) == [448, 16, 20, 0, 2.0 ** -8, -16, 1, -448]  # ties to even, subnormals
    assert np.all(d[1] == 0) and q.scale[1] == 0
    assert np.isnan(d[2, 2]) and np.all(d[2, [0, 1, 3]] == 0) and np.isnan(q.scale[2])
    assert np.isinf(q.scale[3])
    y = fusedk.dequantize_fp8(q, out_dtype=np.float32)
    assert np.all(y[1] == 0) and np.all(np.isnan(y[2])) and np.all(np.isnan(y[3]) | (y[3] == 0) | np.isinf(y[3]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_dequantize_and_out(dtype):
    x = rng.standard_normal((3, 4, 40)).astype(F32)
    q = fusedk.quantize_fp8(x)
    want = (q.data.astype(F32) * q.scale[..., None]).astype(dtype)
    got = fusedk.dequantize_fp8(q, out_dtype=dtype)
    assert same_bits(got, want)
    out = np.zeros_like(want)
    assert fusedk.dequantize_fp8(q, out=out) is out and same_bits(out, want)  # out's dtype
    buf = fusedk.ScaledTensor(np.zeros((3, 4, 40), E4M3), np.zeros((3, 4), F32))
    r = fusedk.quantize_fp8(x, out=buf)
    assert r.data is buf.data and same_bits(buf.data, q.data) and same_bits(buf.scale, q.scale)


def fp8_oracle(x, w, bias=None, act="none"):
    """linear_fp8 in float64 on the dequantized values"""
    xd = x.data.astype(np.float64) * x.scale.astype(np.float64)[..., None]
    wd = w.data.astype(np.float64) * w.scale.astype(np.float64)[..., None]
    z = xd @ wd.T + (0 if bias is None else np.asarray(bias).astype(np.float64))
    return oracle.act(z, act) if act != "none" else z


@pytest.mark.parametrize("out_dtype", [np.dtype(np.float16), oracle.BF16], ids=str)
@pytest.mark.parametrize("act", ["none", "relu", "gelu_tanh", "gelu", "silu"])
def test_linear_fp8_reference(act, out_dtype):
    x = fusedk.quantize_fp8(rng.standard_normal((2, 9, 48)).astype(F32))
    w = fusedk.quantize_fp8((rng.standard_normal((24, 48)) / 7).astype(F32))
    b = rng.standard_normal(24).astype(out_dtype)
    y, z = fusedk.linear(x, w, b, act=act, aux=True)  # out_dtype: bias's
    assert y.dtype == out_dtype and y.shape == (2, 9, 24) and z.dtype == out_dtype
    zw = fp8_oracle(x, w, b)
    eps = 2.0 ** -10 if out_dtype == np.float16 else 2.0 ** -7
    np.testing.assert_allclose(z.astype(np.float64), zw, rtol=eps, atol=1e-6)
    # GELU and SILU see z rounded to the dtype (linear's act pass), the others z itself
    zin = z.astype(np.float64) if act in ("gelu", "silu") else zw
    yw = oracle.act(zin, act) if act != "none" else zin
    np.testing.assert_allclose(y.astype(np.float64), yw, rtol=eps, atol=1e-6)


@pytest.mark.parametrize("family", ["normal", "offset", "outliers"])
def test_linear_fp8_error_against_float64(family):
    """the contract's families at a DiT GEMM's K: per-row FP8 as torchao's, in the CPU reference
    (the GPU tests compare the GPU with torch._scaled_mm); e4m3's 3 mantissa bits put per-row
    scaling near 0.037 on both (bench/fp8_emulate.py models it in float64)"""
    M, K, N = 64, 3072, 64
    x = rng.standard_normal((M, K))
    if family == "offset":  # a mean per channel, as DiT activations carry
        x += rng.uniform(-2, 2, (1, K))
    if family == "outliers":
        i = rng.random((M, K)) < 0.001
        x[i] *= 20
    w = rng.standard_normal((N, K)) / np.sqrt(K)
    want = x @ w.T
    got = fusedk.linear(fusedk.quantize_fp8(x.astype(F32)), fusedk.quantize_fp8(w.astype(F32)))
    e = rel_l2(got, want)
    assert 0.02 < e < 0.045, e
    torch = pytest.importorskip("torch")  # the peer: torchao's per-row quantization, product in float64

    def q(t):
        t = torch.from_numpy(t.astype(F32))
        s = t.abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448
        return (t / s).clamp(-448, 448).to(torch.float8_e4m3fn).double() * s.double()
    assert e <= 1.01 * rel_l2((q(x) @ q(w).T).numpy(), want) + 1e-3


def test_out_dtype_follows_out_then_aux_out_then_bias():
    x = fusedk.quantize_fp8(rng.standard_normal((4, 32)).astype(F32))
    w = fusedk.quantize_fp8(rng.standard_normal((8, 32)).astype(F32))
    aux = np.zeros((4, 8), np.float16)
    y, z = fusedk.linear_fp8(x, w, act="gelu_tanh", aux_out=aux)
    assert y.dtype == np.float16 and z is aux
    assert fusedk.linear_fp8(x, w, np.zeros(8, np.float16)).dtype == np.float16
    assert fusedk.linear_fp8(x, w).dtype == oracle.BF16


def test_bad_input():
    x = fusedk.quantize_fp8(rng.standard_normal((4, 32)).astype(F32))
    w = fusedk.quantize_fp8(rng.standard_normal((8, 32)).astype(F32))
    with pytest.raises(fusedk.InvalidArgumentError, match="linear_fp8: w is a ndarray, expected a fusedk.ScaledTensor"):
        fusedk.linear_fp8(x, np.zeros((8, 32), F32))
    with pytest.raises(TypeError, match="linear_fp8: x has dtype bfloat16, expected float8_e4m3fn"):
        fusedk.linear(fusedk.ScaledTensor(x.data.astype(oracle.BF16), x.scale), w)
    with pytest.raises(ValueError, match=r"linear_fp8: w has shape \[8, 16\], expected \[N, 32\]"):
        fusedk.linear(x, fusedk.ScaledTensor(w.data[:, :16], w.scale))
    with pytest.raises(ValueError, match=r"x_scale has shape \[3\], expected \[4\]"):
        fusedk.linear(fusedk.ScaledTensor(x.data, x.scale[:3]), w)
    with pytest.raises(fusedk.LayoutError, match="w_scale has stride 2 in its last dim, expected 1"):
        fusedk.linear(x, fusedk.ScaledTensor(w.data, np.zeros(16, F32)[::2]))
    with pytest.raises(TypeError, match="out_dtype is 'int8', expected float32, float16 or bfloat16"):
        fusedk.linear(x, w, out_dtype="int8")
    with pytest.raises(TypeError, match="linear_fp8: out has dtype float32, expected float16 or bfloat16"):
        fusedk.linear(x, w, out_dtype=np.float32)
    with pytest.raises(TypeError, match=r"linear_fp8: bias has dtype float16, expected bfloat16 \(out_dtype\)"):
        fusedk.linear(x, w, np.zeros(8, np.float16), out=np.zeros((4, 8), oracle.BF16))
    with pytest.raises(fusedk.InvalidArgumentError, match="quantize_fp8: out is a tuple, expected a fusedk.ScaledTensor"):
        fusedk.quantize_fp8(np.zeros((2, 8), F32), out=(1, 2))
    with pytest.raises(ValueError, match=r"out_scale has shape \[2, 1\], expected \[2\]"):
        fusedk.quantize_fp8(np.zeros((2, 8), F32), out=fusedk.ScaledTensor(np.zeros((2, 8), E4M3),
                                                                            np.zeros((2, 1), F32)))
    with pytest.raises(TypeError, match="quantize_fp8: x has dtype int8"):
        fusedk.quantize_fp8(np.zeros((2, 8), np.int8))


def test_torch_and_jax_cpu():
    torch = pytest.importorskip("torch")
    x = torch.randn(3, 5, 64, dtype=torch.bfloat16)
    w = torch.randn(16, 64) / 8
    qx, qw = fusedk.quantize_fp8(x), fusedk.quantize_fp8(w)
    assert qx.data.dtype == torch.float8_e4m3fn and qx.scale.shape == (3, 5) and qw.scale.shape == (16,)
    want, want_s = quantize_oracle(x.float().numpy())
    assert same_bits(qx.data.view(torch.uint8).numpy(), want.view(np.uint8)) and same_bits(qx.scale.numpy(), want_s)
    y = fusedk.linear(qx, qw, act="gelu_tanh")
    assert y.dtype == torch.bfloat16 and y.shape == (3, 5, 16)
    ref = fusedk.linear(fusedk.ScaledTensor(qx.data.view(torch.uint8).numpy().view(E4M3), qx.scale.numpy()),
                        fusedk.ScaledTensor(qw.data.view(torch.uint8).numpy().view(E4M3), qw.scale.numpy()),
                        act="gelu_tanh")
    assert same_bits(y.view(torch.int16).numpy(), ref.view(np.int16))
    f = torch.compile(lambda a, b: fusedk.linear(fusedk.quantize_fp8(a), b, out_dtype=torch.float16), fullgraph=True)
    assert f(x, qw).dtype == torch.float16
    jax = pytest.importorskip("jax")
    jnp = jax.numpy
    xj = jnp.asarray(x.float().numpy()).astype(jnp.bfloat16)
    g = jax.jit(lambda a: fusedk.linear(fusedk.quantize_fp8(a), fusedk.ScaledTensor(jnp.asarray(qw.data.view(
        torch.uint8).numpy().view(E4M3)), jnp.asarray(qw.scale.numpy())), act="gelu_tanh"))
    yj = g(xj)
    assert yj.dtype == jnp.bfloat16 and same_bits(np.asarray(yj), ref)


# --- GPU -------------------------------------------------------------------------------------------
needs_torch_gpu = pytest.mark.skipif(not oracle.torch_cuda()[1], reason="no CUDA device, torch or fusedk GPU half")


@needs_torch_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1,), (3, 33), (5, 3072), (2, 700, 5120), (1, 13824)], ids=str)
def test_gpu_quantize_against_the_reference(shape, dtype):
    torch = oracle.torch_cuda()[0]
    x = (torch.randn(shape) * torch.exp(torch.empty(shape[:-1] + (1,)).uniform_(-3, 3))).to(getattr(torch, dtype))
    q, c = fusedk.quantize_fp8(x.cuda()), fusedk.quantize_fp8(x)
    assert torch.equal(q.data.cpu().view(torch.uint8), c.data.view(torch.uint8))
    assert torch.equal(q.scale.cpu(), c.scale)
    for dt in (torch.float32, torch.float16, torch.bfloat16):
        g, h = fusedk.dequantize_fp8(q, out_dtype=dt), fusedk.dequantize_fp8(c, out_dtype=dt)
        assert g.dtype == dt and torch.equal(g.cpu(), h)


def _torchao_rowwise(torch, t):
    """torchao's dynamic per-row quantization as its Float8 PerRow path computes it"""
    s = t.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / 448.0
    return (t.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn), s


@needs_torch_gpu
@pytest.mark.parametrize("family", ["normal", "offset", "outliers"])
@pytest.mark.parametrize("M,K,N", [(4608, 3072, 3072), (1024, 12288, 3072), (2048, 5120, 13824)], ids=str)
def test_gpu_error_against_scaled_mm(M, K, N, family):
    """the accuracy contract per op: rel. L2 against float64 of the unquantized inputs no larger
    than torch._scaled_mm's with torchao's per-row scales on the same inputs"""
    torch = oracle.torch_cuda()[0]
    if torch.cuda.get_device_capability() < (8, 9):
        pytest.skip("FP8 tensor cores: sm_89 and later")
    g = torch.Generator(device="cuda").manual_seed(M + K + N)
    x = torch.randn(M, K, device="cuda", generator=g)
    if family == "offset":
        x = x + torch.rand(1, K, device="cuda", generator=g) * 4 - 2
    if family == "outliers":
        x = torch.where(torch.rand(M, K, device="cuda", generator=g) < 0.001, x * 20, x)
    w = torch.randn(N, K, device="cuda", generator=g) / K ** 0.5
    x, w = x.to(torch.bfloat16), w.to(torch.bfloat16)
    rows = torch.arange(0, M, 7, device="cuda")  # float64 on a subsample of rows
    want = x[rows].double() @ w.double().t()
    y = fusedk.linear(fusedk.quantize_fp8(x), fusedk.quantize_fp8(w))
    (xq, sx), (wq, sw) = _torchao_rowwise(torch, x), _torchao_rowwise(torch, w)
    ys = torch._scaled_mm(xq, wq.t(), sx, sw.t(), out_dtype=torch.bfloat16)
    e, es = ((t[rows].double() - want).norm() / want.norm() for t in (y, ys))
    assert e <= es * 1.01 + 1e-4, (float(e), float(es))
    assert e < 0.045


@needs_torch_gpu
@pytest.mark.parametrize("act", ["none", "relu", "gelu_tanh", "gelu", "silu"])
@pytest.mark.parametrize("M,K,N", [(1, 16, 8), (300, 128, 256), (17, 1008, 4095), (64, 1000, 128), (3, 3, 8)],
                         ids=str)
def test_gpu_linear_fp8_against_the_reference(M, K, N, act):
    torch = oracle.torch_cuda()[0]
    x = fusedk.quantize_fp8(torch.randn(M, K))
    w = fusedk.quantize_fp8(torch.randn(N, K) / K ** 0.5)
    b = torch.randn(N, dtype=torch.bfloat16)
    y, z = fusedk.linear(x, w, b, act=act, aux=True)
    cx, cw = (fusedk.ScaledTensor(t.data.cuda(), t.scale.cuda()) for t in (x, w))
    yg, zg = fusedk.linear(cx, cw, b.cuda(), act=act, aux=True)
    # bound: the same GEMM on |data| (the tensor cores accumulate in fewer bits between promotions)
    def mag(t):  # |data| (torch has no abs for float8): the sign bit cleared
        return fusedk.ScaledTensor((t.data.view(torch.uint8) & 0x7F).view(torch.float8_e4m3fn), t.scale)
    s1 = fusedk.linear(mag(x), mag(w), b.abs()).double()
    # GELU and SILU act on z rounded to bf16 (linear's act pass): a z an ulp apart moves y by |act'| ulps
    zr = z.double().abs() * 2.0 ** -7 * 1.13 if act in ("gelu", "silu") else 0.0
    for got, want, extra in ((zg, z, 0.0), (yg, y, zr)):
        tol = want.double().abs() * 2.0 ** -7 + s1 * 2.0 ** -10 + 1e-6 + extra
        assert torch.all((got.cpu().double() - want.double()).abs() <= tol * 1.2), (M, K, N, act)


@needs_torch_gpu
def test_gpu_compile_graph_and_strided():
    torch = oracle.torch_cuda()[0]
    x = torch.randn(2, 300, 256, device="cuda", dtype=torch.bfloat16)
    w = fusedk.quantize_fp8(torch.randn(512, 256, device="cuda") / 16)
    b = torch.randn(512, device="cuda", dtype=torch.bfloat16)
    eager = fusedk.linear(fusedk.quantize_fp8(x), w, b, act="gelu_tanh")
    f = torch.compile(lambda t: fusedk.linear(fusedk.quantize_fp8(t), w, b, act="gelu_tanh"), fullgraph=True)
    assert torch.equal(f(x), eager)
    g, s = torch.cuda.CUDAGraph(), torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        f(x)
        with torch.cuda.graph(g, stream=s):
            out = fusedk.linear(fusedk.quantize_fp8(x), w, b, act="gelu_tanh")
    torch.cuda.current_stream().wait_stream(s)
    x.copy_(torch.randn_like(x))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, fusedk.linear(fusedk.quantize_fp8(x), w, b, act="gelu_tanh"))
    # a strided x (every other row of a wider buffer) and a byte-offset out
    big = torch.randn(600, 384, device="cuda", dtype=torch.bfloat16)
    xs = big[::2, 64:320]
    q = fusedk.quantize_fp8(xs)
    assert torch.equal(q.data.view(torch.uint8), fusedk.quantize_fp8(xs.contiguous()).data.view(torch.uint8))
    buf = torch.zeros(300 * 512 + 8, device="cuda", dtype=torch.bfloat16)
    o = buf[8:].view(300, 512)
    fusedk.linear(q, w, b, out=o)
    assert torch.equal(o, fusedk.linear(q, w, b)) and torch.all(buf[:8] == 0)


# --- the norms' FP8 forms ---------------------------------------------------------------------------
def _norm_calls(x, fp8):
    B, L, D = x.shape
    w = (1 + 0.1 * rng.standard_normal(D)).astype(x.dtype)
    b = (0.1 * rng.standard_normal(D)).astype(x.dtype)
    r = rng.standard_normal(x.shape).astype(x.dtype)
    sc = (0.2 * rng.standard_normal((B, D))).astype(x.dtype)
    sh = rng.standard_normal((B, D)).astype(x.dtype)
    f = {"rmsnorm": lambda t, **k: (fusedk.rmsnorm_fp8 if fp8 else fusedk.rmsnorm)(t, w, residual=r, **k),
         "layernorm": lambda t, **k: (fusedk.layernorm_fp8 if fp8 else fusedk.layernorm)(t, w, b, **k),
         "adaln": lambda t, **k: (fusedk.adaln_fp8 if fp8 else fusedk.adaln)(t, sc, sh, **k),
         "adaln_rms": lambda t, **k: (fusedk.adaln_fp8 if fp8 else fusedk.adaln)(t, sc, sh, norm="rms", **k)}
    return f


def within_a_step(got, want):
    """e4m3 data (as float64) against the exact values it rounds: at most one e4m3 step apart"""
    got, want = np.asarray(got, np.float64), np.asarray(want, np.float64)
    step = np.maximum(2.0 ** (np.floor(np.log2(np.maximum(np.abs(want), 2.0 ** -6))) - 3), 2.0 ** -9)
    return np.all(np.abs(got - want) <= step * 1.0001)


@pytest.mark.parametrize("name", ["rmsnorm", "layernorm", "adaln", "adaln_rms"])
@pytest.mark.parametrize("shape", [(1, 1, 8), (2, 5, 64), (2, 33, 3072)], ids=str)
def test_norm_fp8_is_the_norm_quantized(shape, name):
    x = rng.standard_normal(shape).astype(F32)
    rng_state = rng.bit_generator.state
    plain = _norm_calls(x, False)[name]
    rng.bit_generator.state = rng_state  # the same weights for both
    q8 = _norm_calls(x, True)[name]
    y, y8 = plain(x), q8(x)
    if name == "rmsnorm":
        (y, r), (y8, r8) = y, y8
        assert same_bits(r, r8)
    want, scale = quantize_oracle(y)  # the float32 result, quantized
    assert isinstance(y8, fusedk.ScaledTensor) and y8.data.dtype == E4M3 and y8.scale.shape == shape[:-1]
    np.testing.assert_allclose(y8.scale, scale, rtol=2e-7)
    assert within_a_step(y8.data.astype(np.float64), y.astype(np.float64) / y8.scale[..., None])


@needs_torch_gpu
@pytest.mark.parametrize("name", ["rmsnorm", "layernorm", "adaln", "adaln_rms"])
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 1, 8), (2, 33, 3072), (1, 4608, 3072), (1, 700, 5120), (2, 7, 24), (1, 3, 20000)],
                         ids=str)
def test_gpu_norm_fp8_against_the_reference(shape, dtype, name):
    torch = oracle.torch_cuda()[0]
    x = rng.standard_normal(shape).astype(F32)
    dt = getattr(torch, dtype)
    B, L, D = shape
    w = torch.from_numpy((1 + 0.1 * rng.standard_normal(D)).astype(F32)).to(dt)
    b = torch.from_numpy((0.1 * rng.standard_normal(D)).astype(F32)).to(dt)
    r = torch.from_numpy(rng.standard_normal(shape).astype(F32)).to(dt)
    sc = torch.from_numpy((0.2 * rng.standard_normal((B, D))).astype(F32)).to(dt)
    sh = torch.from_numpy(rng.standard_normal((B, D)).astype(F32)).to(dt)
    xt = torch.from_numpy(x).to(dt)
    calls = {"rmsnorm": lambda t, dev: fusedk.rmsnorm_fp8(t, w.to(dev), residual=r.to(dev))[0],
             "layernorm": lambda t, dev: fusedk.layernorm_fp8(t, w.to(dev), b.to(dev)),
             "adaln": lambda t, dev: fusedk.adaln_fp8(t, sc.to(dev), sh.to(dev)),
             "adaln_rms": lambda t, dev: fusedk.adaln_fp8(t, sc.to(dev), sh.to(dev), norm="rms")}
    c, g = calls[name](xt, "cpu"), calls[name](xt.cuda(), "cuda")
    if name == "rmsnorm":  # residual_out: x + residual rounded once, on both sides; then in place over residual
        (c, cr), (g, gr) = fusedk.rmsnorm_fp8(xt, w, residual=r), fusedk.rmsnorm_fp8(xt.cuda(), w.cuda(),
                                                                                       residual=r.cuda())
        assert torch.equal(gr.cpu(), cr)
        rin = r.cuda()
        gi, gir = fusedk.rmsnorm_fp8(xt.cuda(), w.cuda(), residual=rin, residual_out=rin)
        assert gir.data_ptr() == rin.data_ptr() and torch.equal(rin.cpu(), cr)
        assert torch.equal(gi.data.view(torch.uint8), g.data.view(torch.uint8)) and torch.equal(gi.scale, g.scale)
    _assert_fp8_as_cpu(torch, g, c)


def _assert_fp8_as_cpu(torch, g, c):
    """a GPU ScaledTensor against the CPU reference's: the scales to float32 rounding, the data within
    one e4m3 step (the GPU's float32 math may land the other side of a tie) and 99 % the same bytes"""
    gs, cs = g.scale.cpu().double(), c.scale.double()
    assert torch.allclose(gs, cs, rtol=1e-5, atol=0)
    gd = g.data.cpu().float().double() * gs[..., None]
    cd = c.data.float().double() * cs[..., None]
    # one e4m3 step of the CPU's value where the GPU's float32 math lands the other side of a tie
    step = torch.clamp(2.0 ** (torch.floor(torch.log2(torch.clamp(cd.abs() / cs[..., None], min=2.0 ** -6))) - 3),
                       min=2.0 ** -9) * cs[..., None]
    assert torch.all((gd - cd).abs() <= step * 1.0001 + 1e-30)
    assert (g.data.cpu().view(torch.uint8) != c.data.view(torch.uint8)).float().mean() < 0.01


@needs_torch_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
@pytest.mark.parametrize("shape", [(1, 1000, 3072), (2, 300, 1536), (1, 40, 1001)], ids=str)
def test_gpu_norm_fp8_kernel_paths(shape, dtype):
    """the paths a row of the _fp8 kernels takes: every other row far from zero (mean 50, sd 0.01:
    LayerNorm's second statistics pass) beside rows that are not; adaln with its affine inside the
    norm and with float32 scale and shift; rows cached a vector a thread (past one wave of rows),
    and odd D (one element an access) with rmsnorm's residual written as it goes"""
    torch = oracle.torch_cuda()[0]
    dt = getattr(torch, dtype)
    B, L, D = shape
    x = rng.standard_normal(shape).astype(F32)
    x[:, ::2] = 50 + 0.01 * x[:, ::2]
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a, F32)).to(dt)  # noqa: E731
    xt, w, b, r = t(x), t(1 + 0.1 * rng.standard_normal(D)), t(0.1 * rng.standard_normal(D)), t(rng.standard_normal(shape))
    sc, sh = 0.2 * rng.standard_normal((B, D)), rng.standard_normal((B, D))
    calls = {"layernorm": lambda x, dev: fusedk.layernorm_fp8(x, w.to(dev), b.to(dev)),
             "adaln affine": lambda x, dev: fusedk.adaln_fp8(x, t(sc).to(dev), t(sh).to(dev), weight=w.to(dev),
                                                             bias=b.to(dev)),
             "adaln": lambda x, dev: fusedk.adaln_fp8(x, t(sc).to(dev), t(sh).to(dev))}
    if dtype != "float32":  # 16-bit rows with float32 modulation (Wan's)
        m32 = lambda a, dev: torch.from_numpy(a.astype(F32)).to(dev)  # noqa: E731
        calls["adaln f32 modulation"] = lambda x, dev: fusedk.adaln_fp8(x, m32(sc, dev), m32(sh, dev))
    for name, f in calls.items():
        _assert_fp8_as_cpu(torch, f(xt.cuda(), "cuda"), f(xt, "cpu"))
    (g, gr), (c, cr) = fusedk.rmsnorm_fp8(xt.cuda(), w.cuda(), residual=r.cuda()), fusedk.rmsnorm_fp8(xt, w, residual=r)
    assert torch.equal(gr.cpu(), cr)
    _assert_fp8_as_cpu(torch, g, c)


# --- glu_fp8 ----------------------------------------------------------------------------------------
def glu_oracle(x, act, act_half):
    """glu in float64, then the rows quantized by quantize_oracle (what fusedk.h's CPU reference does)"""
    x = np.asarray(x, np.float64)
    a, b = np.split(x, 2, -1)
    g, v = (a, b) if act_half == "first" else (b, a)
    f = {"silu": lambda t: t / (1 + np.exp(-t)), "relu": lambda t: np.maximum(t, 0),
         "gelu_tanh": lambda t: 0.5 * t * (1 + np.tanh(0.7978845608028654 * (t + 0.044715 * t ** 3))),
         "gelu": lambda t: 0.5 * t * (1 + np.vectorize(__import__("math").erf)(t / np.sqrt(2)))}[act]
    return f(g) * v


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act,act_half", [("silu", "first"), ("gelu_tanh", "second"), ("gelu", "first"),
                                          ("relu", "second")])
@pytest.mark.parametrize("shape", [(2,), (3, 34), (2, 5, 128)], ids=str)
def test_glu_fp8_is_glu_quantized(shape, act, act_half, dtype):
    x = (2 * rng.standard_normal(shape)).astype(dtype)
    q = fusedk.glu_fp8(x, act, act_half)
    want = glu_oracle(x, act, act_half)
    assert isinstance(q, fusedk.ScaledTensor) and q.data.dtype == E4M3 and q.data.shape == shape[:-1] + (shape[-1] // 2,)
    scale = np.abs(want).max(-1) / 448
    np.testing.assert_allclose(q.scale.reshape(scale.shape), scale, rtol=1e-6)
    s = q.scale.reshape(scale.shape + (1,)).astype(np.float64)
    assert within_a_step(q.data.astype(np.float64), want / np.where(s == 0, 1, s))  # a row of zeros: relu
    if dtype == F32:  # the float32 glu quantized: the same bytes (both in double on the CPU)
        g = fusedk.glu(x, act, act_half)
        assert same_bits(q.data, fusedk.quantize_fp8(g).data) and same_bits(q.scale, fusedk.quantize_fp8(g).scale)


def test_glu_fp8_bad_input():
    x = rng.standard_normal((3, 9)).astype(F32)
    with pytest.raises(fusedk.ShapeError, match="glu_fp8: x has last dim 9, expected an even size"):
        fusedk.glu_fp8(x)
    with pytest.raises(fusedk.InvalidArgumentError, match="glu_fp8: act_half is 'third'"):
        fusedk.glu_fp8(x[:, :8], act_half="third")
    with pytest.raises(fusedk.InvalidArgumentError, match="glu_fp8: out is a ndarray, expected a fusedk.ScaledTensor"):
        fusedk.glu_fp8(x[:, :8], out=x)


@needs_torch_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("shape", [(3, 34), (2, 700, 6144), (1, 300, 16384), (1, 44, 2 * 9000)], ids=str)
def test_gpu_glu_fp8_against_the_reference(shape, dtype):
    """the GPU's float32 values quantized against the CPU reference's: scales to float32 rounding,
    data within a step where a value lands the other side of a rounding boundary (under 1 %); and
    what Mochi's MLP runs: glu_fp8 into linear against glu then linear_fp8 on quantize_fp8"""
    torch = oracle.torch_cuda()[0]
    x = (2 * torch.randn(shape)).to(getattr(torch, dtype))
    g, c = fusedk.glu_fp8(x.cuda(), "silu", "second"), fusedk.glu_fp8(x, "silu", "second")
    gs, cs = g.scale.cpu().double(), c.scale.double()
    assert torch.allclose(gs, cs, rtol=1e-5, atol=0)
    gd, cd = g.data.cpu().double() * gs[..., None], c.data.double() * cs[..., None]
    step = torch.clamp(2.0 ** (torch.floor(torch.log2(torch.clamp(cd.abs() / cs[..., None], min=2.0 ** -6))) - 3),
                       min=2.0 ** -9) * cs[..., None]
    assert torch.all((gd - cd).abs() <= step * 1.0001 + 1e-30)
    assert (g.data.cpu().view(torch.uint8) != c.data.view(torch.uint8)).float().mean() < 0.01
    if dtype == "bfloat16" and shape[-1] % 32 == 0:
        w = fusedk.quantize_fp8(0.02 * torch.randn(256, shape[-1] // 2, device="cuda", dtype=torch.bfloat16))
        h = fusedk.glu(x.cuda(), "silu", "second")
        y, y2 = fusedk.linear(g, w), fusedk.linear(fusedk.quantize_fp8(h), w)
        assert rel_l2(y.float().cpu().numpy(), y2.float().cpu().numpy()) < 0.02


# --- int8 weights: quantize_int8 and linear_w8 (weight-only, for few rows) ----------------------
def quantize_int8_oracle(x):
    """fusedk.h's quantize_int8 in NumPy: scaled_rows to 127.5 (x * (1 / scale)), rounded to
    nearest even within [-128, 127] (NaN and Inf rows 0)"""
    v, scale = scaled_rows(x, 127.5, of_scale=True)
    return np.where(np.isnan(v), 0, np.clip(np.rint(v), -128, 127)).astype(np.int8), scale


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 33), (2, 5, 64), (4, 1, 3072)], ids=str)
def test_quantize_int8_matches_the_oracle(shape, dtype):
    x = (rng.standard_normal(shape) * np.exp(rng.uniform(-3, 3, shape[:-1] + (1,)))).astype(dtype)
    if len(shape) > 1 and shape[-2] >= 3:  # a zero row, a NaN row, an Inf row
        x[..., 0, :], x[..., 1, 0], x[..., 2, -1] = 0, np.nan, np.inf
    q = fusedk.quantize_int8(x)
    want, scale = quantize_int8_oracle(x)
    assert isinstance(q, fusedk.ScaledTensor) and q.data.dtype == np.int8 and q.scale.dtype == F32
    assert same_bits(q.data, want), "data"
    assert same_bits(q.scale.reshape(scale.shape), scale), "scale"
    fin = np.isfinite(scale)[..., None] & np.ones(shape, bool)
    d = q.data.astype(np.float64) * q.scale.reshape(shape[:-1] + (1,))
    assert np.all(np.abs(d - x.astype(np.float64))[fin] <= np.broadcast_to(q.scale.reshape(shape[:-1] + (1,)), shape)[fin]
                  * (0.5 + 1e-4) + 1e-30)  # within half a step (and float32 products' ulps)


def w8_oracle(x, w, bias=None, act="none", dtype=F32):
    """linear_w8 in float64 on x as given and the dequantized weight; GELU and SILU of z rounded
    to dtype (y's), as linear's"""
    z = np.asarray(x, np.float64) @ (w.data.astype(np.float64) * w.scale.astype(np.float64)[:, None]).T
    z = z + (0 if bias is None else np.asarray(bias, np.float64))
    if act in ("gelu", "silu"):
        z = z.astype(dtype).astype(np.float64)
    return oracle.act(z, act) if act != "none" else z


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ["none", "relu", "gelu_tanh", "gelu", "silu"])
@pytest.mark.parametrize("M,K,N", [(1, 16, 8), (5, 40, 33), (2, 3, 4)], ids=str)
def test_linear_w8_reference(M, K, N, act, dtype):
    x = rng.standard_normal((M, K)).astype(dtype)
    w = fusedk.quantize_int8((rng.standard_normal((N, K)) / np.sqrt(K)).astype(F32))
    b = rng.standard_normal(N).astype(dtype)
    y, z = fusedk.linear(x, w, b, act=act, aux=True)
    assert y.dtype == x.dtype and y.shape == (M, N)
    tol = 2.0 ** -7 if dtype != np.float32 else 2.0 ** -20
    for got, want in ((z, w8_oracle(x, w, b)), (y, w8_oracle(x, w, b, act, x.dtype))):
        assert np.all(np.abs(got.astype(np.float64) - want) <= np.abs(want) * tol * 1.01 + 1e-6)


def test_linear_w8_error_against_float64():
    """the modulation's case: int8 weights against e4m3 on the same N(0, 1/K) weight, x in float32"""
    x, w = rng.standard_normal((2, 3072)).astype(F32), (rng.standard_normal((3072, 3072)) / 55.4).astype(F32)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    e8 = rel_l2(fusedk.linear_w8(x, fusedk.quantize_int8(w)), want)
    e4 = rel_l2(fusedk.linear(fusedk.quantize_fp8(x), fusedk.quantize_fp8(w), out_dtype="bfloat16").astype(F32), want)
    assert e8 < 0.012 and e8 < e4 / 2, (e8, e4)


@pytest.mark.parametrize("family", ["normal", "offset", "outliers", "w outliers"])
def test_linear_w8_error_against_torchao_int8_weight_only(family):
    """the contract's families (x: N(0,1), a mean per channel, 0.1 % of entries x20; and 0.1 % of
    w's entries x20, the weight-only path's own risk) against float64 of the unquantized inputs,
    beside the peer: torchao's Int8WeightOnlyConfig (per channel, symmetric: scale amax / 127.5 and
    data round(w * (1 / scale)) in [-128, 127], in float32), its product in float64; quantize_int8
    stores the peer's bits, so the errors differ by linear_w8's float32 sums alone"""
    M, K, N = 64, 3072, 256
    x, w = rng.standard_normal((M, K)), rng.standard_normal((N, K)) / np.sqrt(K)
    if family == "offset":
        x += rng.uniform(-2, 2, (1, K))
    if family == "outliers":
        x[rng.random((M, K)) < 0.001] *= 20
    if family == "w outliers":
        w[rng.random((N, K)) < 0.001] *= 20
    x, w = x.astype(F32), w.astype(F32)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    w8 = fusedk.quantize_int8(w)
    e = rel_l2(fusedk.linear_w8(x, w8), want)
    s = (np.abs(w).max(1, keepdims=True) / F32(127.5)).astype(F32)  # torchao's rule, float32 throughout
    q = np.clip(np.rint(w * (F32(1) / s)), -128, 127)
    assert same_bits(w8.data, q.astype(np.int8)) and same_bits(w8.scale, s[:, 0])
    ep = rel_l2(x.astype(np.float64) @ (q.astype(np.float64) * s).T, want)
    assert e <= 1.001 * ep + 1e-6, (e, ep)
    # per-channel int8 beats e4m3 where w has no outliers (a uniform step against 3 mantissa
    # bits), and loses to it where 0.1 % of w is 20 times the rest (the step grows with amax)
    e4 = rel_l2(fusedk.linear(fusedk.quantize_fp8(x), fusedk.quantize_fp8(w)).astype(F32), want)
    assert (e < e4 / 3) if family != "w outliers" else (e4 < e < 2 * e4), (e, e4)


def test_linear_w8_bad_input():
    x, w = np.ones((2, 16), F32), fusedk.quantize_int8(np.ones((4, 16), F32))
    with pytest.raises(fusedk.DTypeError, match="linear_w8: w has dtype float8_e4m3fn, expected int8"):
        fusedk.linear_w8(x, fusedk.quantize_fp8(np.ones((4, 16), F32)))
    with pytest.raises(fusedk.InvalidArgumentError, match="linear_w8: w is a ndarray, expected a fusedk.ScaledTensor"):
        fusedk.linear_w8(x, np.ones((4, 16), np.int8))
    with pytest.raises(fusedk.ShapeError, match="linear_w8: w has shape \\[4, 16\\], expected \\[N, 8\\]"):
        fusedk.linear_w8(np.ones((2, 8), F32), w)
    with pytest.raises(fusedk.InvalidArgumentError, match="linear_w8: act is 'tanh'"):
        fusedk.linear_w8(x, w, act="tanh")
    with pytest.raises(fusedk.InvalidArgumentError, match="linear: out_dtype is 'bfloat16' with int8 weights"):
        fusedk.linear(x, w, out_dtype="bfloat16")  # y takes x's dtype
    with pytest.raises(fusedk.DTypeError, match="quantize_int8"):
        fusedk.quantize_int8(np.ones((2, 4), np.int32))


@needs_torch_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("M,K,N", [(1, 3072, 18432), (2, 3072, 9216), (5, 40, 33), (4, 3, 8), (17, 256, 100)], ids=str)
def test_gpu_linear_w8_and_quantize_int8_against_the_reference(M, K, N, dtype):
    torch = oracle.torch_cuda()[0]
    dt = getattr(torch, dtype)
    wf = (torch.randn(N, K) / K ** 0.5).to(dt)
    w, wg = fusedk.quantize_int8(wf), fusedk.quantize_int8(wf.cuda())
    assert torch.equal(wg.data.cpu(), w.data) and torch.equal(wg.scale.cpu(), w.scale)
    x, b = torch.randn(M, K).to(dt), torch.randn(N).to(dt)
    for act in ("none", "silu"):
        y, yg = fusedk.linear(x, w, b, act=act), fusedk.linear(x.cuda(), wg, b.cuda(), act=act)
        want = torch.from_numpy(w8_oracle(x.double().numpy(), fusedk.ScaledTensor(w.data.numpy(), w.scale.numpy()),
                                          b.double().numpy(), act))
        mag = x.double().abs() @ (w.data.double().abs() * w.scale.double()[:, None]).t()
        eps = 2.0 ** -7 if dt != torch.float32 else 2.0 ** -20
        # silu acts on z rounded to dt (linear's act pass): a z a rounding apart moves y by |act'| roundings
        zr = (mag + b.double().abs()) * eps * 1.13 if act == "silu" else 0.0
        tol = want.abs() * eps + mag * 2.0 ** -20 + 1e-6 + zr
        assert torch.all((yg.cpu().double() - want).abs() <= tol * 1.2), act
        assert torch.all((y.double() - want).abs() <= tol * 1.2), act
    # strided x and y (rows padded), in a CUDA graph, under torch.compile
    xs = torch.randn(M, K + 8, device="cuda", dtype=dt)[:, :K]
    out = torch.empty(M, N + 4, device="cuda", dtype=dt)[:, :N]
    fusedk.linear_w8(xs, wg, out=out)
    assert torch.equal(out, fusedk.linear_w8(xs.contiguous(), wg))
    gr = torch.cuda.CUDAGraph()
    with torch.cuda.graph(gr):
        yc = fusedk.linear_w8(xs, wg)
    gr.replay()
    torch.cuda.synchronize()
    assert torch.equal(yc, out)
    if dtype == "bfloat16":  # under torch.compile (a fresh cache: the other cases' graphs count against its limit)
        torch._dynamo.reset()
        f = torch.compile(lambda a: fusedk.linear_w8(a, wg, act="silu"), fullgraph=True)
        assert torch.equal(f(xs), fusedk.linear_w8(xs, wg, act="silu"))
