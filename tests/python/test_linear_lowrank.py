"""[lowrank] lowrank_prepare and linear_lowrank (a LoRA folded into its base linear: y = act(x w^T +
bias + ((x a^T) codes) (s b)^T) as one GEMM over [x | h]) and fusedk.LoRA: the CPU reference against
a float64 NumPy oracle over every dtype, ranks 1-128 (not multiples of 8 too), codes, bias and every
act, strided views; a bad value for every argument; torch (eager, compile) and JAX (jit) on the CPU.
On the GPU: every dtype against the oracle, error no larger than peft's unfused chain, torch.compile
and CUDA graphs."""
import re

import numpy as np
import pytest

import fusedk
import oracle
from oracle import DTYPES, EPS, gemm_close

rng = np.random.default_rng()
ACTS = ["none", "relu", "gelu_tanh", "gelu", "silu"]


def rand(shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def operands(dtype, lead, K, r, N):
    """x, w, a, b, bias, codes as a LoRA'd nn.Linear has them (peft: a = lora_A.weight [r, K], b =
    lora_B.weight [N, r])"""
    return (rand(lead + (K,), dtype), rand((N, K), dtype, K ** -0.5), rand((r, K), dtype, K ** -0.5),
            rand((N, r), dtype, r ** -0.5), rand((N,), dtype, 0.5), rand(lead + (r,), dtype))


def check(got, x, w, a, b, s, bias, codes, act, what, gpu=False, ids=None):
    dtype = np.asarray(oracle.np_of(got) if gpu else got).dtype
    want, s1, sh = oracle.linear_lowrank(x, w, a, b, s, bias, codes, act, dtype, ids)
    g = 1.0 if act in ("none", "relu") else 1.13  # |act'| bounds how far an error in z moves y
    e = EPS[dtype]  # an ulp: h and scaling b rounded once each (float32 too)
    extra = g * e * sh
    if act in ("gelu", "silu"):  # z rounded to the dtype before the act: an ulp of z either way
        extra = extra + g * e * np.abs(oracle.linear_lowrank(x, w, a, b, s, bias, codes, ids=ids)[0])
    gemm_close(oracle.np_of(got) if gpu else got, want, dtype, g * s1, what, extra=extra, gpu=gpu)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("r", [1, 7, 8, 16, 64, 128])
@pytest.mark.parametrize("act,with_codes,with_bias", [("none", False, False), ("none", True, True),
                                                      ("relu", True, False), ("gelu_tanh", False, True),
                                                      ("gelu", True, True), ("silu", False, True)], ids=str)
def test_reference(r, act, with_codes, with_bias, dtype):
    x, w, a, b, bias, codes = operands(dtype, (2, 5), 24, r, 40)
    bias, codes = bias if with_bias else None, codes if with_codes else None
    w_cat = fusedk.lowrank_prepare(w, b, 0.75)
    assert w_cat.shape == (40, 24 + (r + 7) // 8 * 8) and w_cat.dtype == dtype
    got = fusedk.linear_lowrank(x, w_cat, a, bias, codes, act)
    assert got.shape == (2, 5, 40) and got.dtype == dtype
    check(got, x, w, a, b, 0.75, bias, codes, act, f"r={r} act={act} codes={with_codes} bias={with_bias}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("A,r", [(2, 8), (3, 5), (16, 8), (1, 128)], ids=str)
@pytest.mark.parametrize("ids", ["none", "mixed"])
def test_adapters(A, r, ids, dtype):
    """A stacked adapters: with ids each row takes its own (-1 and out-of-range ids: none, repeats,
    runs), without ids all of them on every row (peft's several active adapters)"""
    x, w, _, _, bias, codes = operands(dtype, (3, 7), 24, r, 40)
    a, b = rand((A, r, 24), dtype, 24 ** -0.5), rand((A, 40, r), dtype, r ** -0.5)
    w_cat = fusedk.lowrank_prepare(w, b, 0.5)
    assert w_cat.shape == (40, 24 + A * ((r + 7) // 8 * 8))
    idv = None if ids == "none" else np.array([(i // 3) % (A + 1) - 1 if i % 5 else A + 3 for i in range(21)], np.int32)
    got = fusedk.linear_lowrank(x, w_cat, a, bias, codes, "gelu_tanh", adapter_ids=idv)
    check(got, x, w, a, b, 0.5, bias, codes, "gelu_tanh", f"A={A} r={r} ids={ids}", ids=idv)
    if idv is not None:  # a row whose id names no adapter is the base linear's
        base = fusedk.linear(x, w, bias, act="gelu_tanh").reshape(21, 40)
        off = (idv < 0) | (idv >= A)
        assert np.array_equal(got.reshape(21, 40)[off], base[off])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prepare_columns(dtype):
    """w_cat = [w | scaling b | 0]: w's bits, scaling b rounded once, zeros up to a multiple of 8"""
    w, b = rand((6, 16), dtype), rand((6, 5), dtype)
    w_cat = fusedk.lowrank_prepare(w, b, -2.0)  # a power of two: the product is exact in every dtype
    assert w_cat.shape == (6, 24)
    assert np.array_equal(oracle.bits(w_cat[:, :16]), oracle.bits(w))
    assert np.array_equal(oracle.bits(w_cat[:, 16:21]), oracle.bits((-2.0 * b.astype(np.float64)).astype(dtype)))
    assert not w_cat[:, 21:].astype(np.float32).any()
    w32, b32 = rand((3, 8), np.float32), rand((3, 2), np.float32)
    got = fusedk.lowrank_prepare(w32, b32, 0.3)[:, 8:10]
    assert np.array_equal(got, (np.float64(np.float32(0.3)) * b32.astype(np.float64)).astype(np.float32))


def test_lora_object():
    """fusedk.LoRA keeps w_cat and a: its call is linear_lowrank's; prepare() again after b changes"""
    x, w, a, b, bias, codes = operands(np.float32, (3,), 32, 4, 12)
    lora = fusedk.LoRA(w, a, b, scaling=0.5, bias=bias, act="gelu_tanh")
    want = fusedk.linear_lowrank(x, fusedk.lowrank_prepare(w, b, 0.5), a, bias, act="gelu_tanh")
    assert np.array_equal(lora(x), want)
    assert np.array_equal(lora(x, codes), fusedk.linear_lowrank(x, lora.w_cat, a, bias, codes, "gelu_tanh"))
    b *= 2.0
    lora.prepare()
    check(lora(x), x, w, a, b, 0.5, bias, None, "gelu_tanh", "after prepare()")
    out = np.zeros((3, 12), np.float32)
    assert lora(x, out=out) is out


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_views(dtype):
    M, K, r, N = 9, 20, 6, 12
    x = rand((M, 2 * K), dtype)[:, 3:3 + K]  # strided rows
    w = rand((N, K + 4), dtype)[:, :K]
    a = rand((r, K + 2), dtype)[:, 1:1 + K]
    b = rand((N, r), dtype)
    codes = rand((M, r + 3), dtype)[:, 2:2 + r]
    w_cat = np.zeros((N, K + 8 + 3), dtype)[:, 3:]  # a padded prepared weight
    assert fusedk.lowrank_prepare(w, b, 0.5, out=w_cat) is w_cat
    out = np.zeros((M, N + 1), dtype)[:, 1:]
    assert fusedk.linear_lowrank(x, w_cat, a, codes=codes, out=out) is out
    check(out, x, w, a, b, 0.5, None, codes, "none", "views")


def test_empty():
    x, w, a, b = rand((0, 8), np.float32), rand((5, 8), np.float32), rand((3, 8), np.float32), rand((5, 3), np.float32)
    w_cat = fusedk.lowrank_prepare(w, b)
    assert fusedk.linear_lowrank(x, w_cat, a).shape == (0, 5)
    assert fusedk.lowrank_prepare(w[:0], b[:0]).shape == (0, 16)
    assert fusedk.lowrank_prepare(w, rand((3, 5, 4), np.float32)).shape == (5, 32)


def test_bad_arguments():
    x, w, a, b = rand((4, 8), np.float32), rand((5, 8), np.float32), rand((3, 8), np.float32), rand((5, 3), np.float32)
    w_cat = fusedk.lowrank_prepare(w, b)
    prep = [
        (dict(b=rand((6, 3), np.float32)), fusedk.ShapeError, "b has shape [6, 3], expected [N, r] with N (w's rows) = 5"),
        (dict(b=rand((5, 129), np.float32)), fusedk.ShapeError, "rank r of 1..128"),
        (dict(b=rand((5, 3), np.float16)), fusedk.DTypeError, "b has dtype float16, expected float32"),
        (dict(scaling=float("nan")), fusedk.InvalidArgumentError, "scaling is nan"),
        (dict(out=np.zeros((5, 12), np.float32)), fusedk.ShapeError, "out has shape [5, 12], expected [5, 16]"),
    ]
    for over, err, says in prep:
        args = dict(w=w, b=b)
        args.update(over)
        with pytest.raises(err, match=re.escape(says)):
            fusedk.lowrank_prepare(**args)
    cases = [
        (dict(a=rand((3, 7), np.float32)), fusedk.ShapeError, "a has shape [3, 7], expected [r, K] with K"),
        (dict(a=rand((9, 8), np.float32)), fusedk.ShapeError, "w_cat has shape [5, 16], expected [N, 24]"),
        (dict(w_cat=w), fusedk.ShapeError, "w_cat has shape [5, 8], expected [N, 16]"),
        (dict(bias=rand((4,), np.float32)), fusedk.ShapeError, "bias has shape [4], expected [5]"),
        (dict(codes=rand((4, 2), np.float32)), fusedk.ShapeError, "codes has shape"),
        (dict(act="tanh"), fusedk.InvalidArgumentError, "act is 'tanh', expected"),
        (dict(a=rand((3, 8), np.float16)), fusedk.DTypeError, "a has dtype float16, expected float32"),
        (dict(x=rand((4, 16), np.float32)[:, ::2]), fusedk.LayoutError, "x has stride 2 in its last dim"),
        (dict(out=np.zeros((4, 6), np.float32)), fusedk.ShapeError, "out has shape"),
        (dict(adapter_ids=np.zeros(3, np.int32)), fusedk.ShapeError, "adapter_ids has shape [3], expected [4]"),
        (dict(adapter_ids=np.zeros(4, np.float32)), fusedk.DTypeError, "adapter_ids has dtype float32, expected int32"),
        (dict(adapter_ids=np.zeros(8, np.int32)[::2]), fusedk.LayoutError, "adapter_ids has stride 2"),
        (dict(adapter_ids=np.array([2 ** 32, 0, 0, 0])), fusedk.InvalidArgumentError,
         "adapter_ids holds values outside int32"),
        (dict(a=rand((9, 16, 8), np.float32)), fusedk.ShapeError, "9 adapters of rank 16 make 144 columns of h, "
                                                                  "expected at most 128"),
    ]
    for over, err, says in cases:
        args = dict(x=x, w_cat=w_cat, a=a)
        args.update(over)
        out = args.get("out")
        with pytest.raises(err, match=re.escape(says)):
            fusedk.linear_lowrank(**args)
        if out is not None:
            assert not out.any()
    with pytest.raises(fusedk.LayoutError, match="out overlaps x"):
        fusedk.linear_lowrank(x[:, :5], fusedk.lowrank_prepare(rand((5, 5), np.float32), b), rand((3, 5), np.float32),
                              out=x[:, 3:8])
    with pytest.raises(ValueError):  # fusedk.Error is what NumPy users already catch
        fusedk.linear_lowrank(x, w, a)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("A,r", [(1, 5), (2, 8)], ids=str)
def test_x_with_room(A, r, dtype):
    """x in the first K columns of a [..., K + A rp] buffer: the same y as x alone, x's columns
    kept, h = (x a^T) * codes (zeros past r) in the last ones; a strided view of such a buffer too"""
    x, w, a, b, bias, codes = operands(dtype, (3, 4), 24, r, 16)
    a = rand((A, r, 24), dtype, 24 ** -0.5) if A > 1 else a
    b = rand((A, 16, r), dtype, r ** -0.5) if A > 1 else b
    w_cat = fusedk.lowrank_prepare(w, b, 0.5)
    W = A * ((r + 7) // 8 * 8)
    want = fusedk.linear_lowrank(x, w_cat, a, bias, codes, "relu")
    for pad in (0, 5):
        xr = np.full((3, 4, 24 + W + pad), 7, dtype)
        xr[..., :24] = x
        xr = xr[..., :24 + W]
        got = fusedk.linear_lowrank(xr, w_cat, a, bias, codes, "relu")
        assert np.array_equal(got, want) and np.array_equal(xr[..., :24], x)
        h = np.einsum("mk,qjk->mqj", x.reshape(12, 24).astype(np.float64), a.reshape(A, r, 24).astype(np.float64))
        h = (h * codes.reshape(12, 1, r).astype(np.float64)).astype(dtype).astype(np.float64)
        tail = np.zeros((12, A, (r + 7) // 8 * 8))
        tail[..., :r] = h
        assert np.array_equal(xr[..., 24:].reshape(12, W).astype(np.float64), tail.reshape(12, W)), f"pad {pad}"
        with pytest.raises(fusedk.Error, match="a has shape .* x with room for h"):  # neither K nor K + A rp
            fusedk.linear_lowrank(np.zeros((3, 4, 24 + W + 1), dtype), w_cat, a)


def test_x_with_room_refused_where_inputs_stay():
    """autograd, torch.compile and JAX keep inputs unchanged: x with room is refused there, by name"""
    torch = pytest.importorskip("torch")
    import fusedk.torch as fkt
    x, w, a, b, bias, codes = operands(np.float32, (2, 5), 16, 4, 12)
    t = [torch.from_numpy(v) for v in (w, a, b)]
    w_cat = fusedk.lowrank_prepare(t[0], t[2], 0.5)
    xr = torch.zeros(2, 5, 24)
    xr[..., :16] = torch.from_numpy(x)
    with torch.no_grad():  # the plain call: taken
        assert torch.equal(fusedk.linear_lowrank(xr, w_cat, t[1]), fusedk.linear_lowrank(xr[..., :16], w_cat, t[1]))
    with pytest.raises(fusedk.Error, match="room for h"):
        fkt.linear_lowrank(xr, w_cat, t[1])
    with pytest.raises(fusedk.Error, match="room for h"):
        fusedk.linear_lowrank(xr.requires_grad_(), w_cat, t[1].requires_grad_())
    jax = pytest.importorskip("jax")
    import fusedk.jax as _registers  # noqa: F401 - the custom calls
    cpu = jax.devices("cpu")[0]
    with pytest.raises(fusedk.Error, match="room for h"):
        fusedk.linear_lowrank(jax.device_put(xr.detach().numpy(), cpu), jax.device_put(w_cat.numpy(), cpu),
                              jax.device_put(t[1].detach().numpy(), cpu))


def test_torch_cpu_eager_and_compile():
    """fusedk.torch's custom ops on CPU tensors: eager and torch.compile(fullgraph) give the NumPy
    path's bits, fusedk.LoRA included"""
    torch = pytest.importorskip("torch")
    x, w, a, b, bias, codes = operands(np.float32, (2, 5), 16, 4, 12)
    want = fusedk.linear_lowrank(x, fusedk.lowrank_prepare(w, b, 0.5), a, bias, codes, "relu")
    t = [torch.from_numpy(v) for v in (x, w, a, b, bias, codes)]
    lora = fusedk.LoRA(t[1], t[2], t[3], 0.5, t[4], "relu")
    assert isinstance(lora.w_cat, torch.Tensor) and np.array_equal(lora(t[0], t[5]).numpy(), want)
    f = torch.compile(lambda x, w, a, b, bias, c: fusedk.linear_lowrank(x, fusedk.lowrank_prepare(w, b, 0.5), a, bias,
                                                                         c, "relu") * 2, fullgraph=True)
    assert np.array_equal(f(*t).numpy(), want * 2)


def test_jax_cpu_jit():
    jax = pytest.importorskip("jax")
    import fusedk.jax  # noqa: F401 - registers the custom calls
    x, w, a, b, bias, codes = operands(np.float32, (2, 5), 16, 4, 12)
    want = fusedk.linear_lowrank(x, fusedk.lowrank_prepare(w, b, 0.5), a, bias, codes, "gelu_tanh")
    cpu = jax.devices("cpu")[0]
    j = [jax.device_put(v, cpu) for v in (x, w, a, b, bias, codes)]
    f = jax.jit(lambda x, w, a, b, bias, c: fusedk.linear_lowrank(x, fusedk.lowrank_prepare(w, b, 0.5), a, bias, c,
                                                                  "gelu_tanh"))
    assert np.array_equal(np.asarray(f(*j)), want)


# --- the GPU kernels, through torch ------------------------------------------------------------
torch, _gpu = oracle.torch_cuda()
needs_gpu = pytest.mark.skipif(not _gpu, reason="no CUDA device, torch or fusedk GPU half")


def gpu_operands(dt, M, K, r, N):
    g = torch.Generator(device="cuda").manual_seed(M * 7 + r)
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, device="cuda", generator=g)).to(dt)  # noqa: E731
    return mk(M, K), mk(N, K, scale=K ** -0.5), mk(r, K, scale=K ** -0.5), mk(N, r, scale=r ** -0.5), mk(N, scale=0.5), \
        mk(M, r)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("M,K,r,N,act", [(1, 8, 1, 8, "none"), (130, 200, 7, 136, "relu"), (300, 768, 8, 768, "none"),
                                         (77, 1000, 12, 4095, "gelu_tanh"), (500, 512, 64, 520, "silu"),
                                         (257, 1024, 128, 1032, "gelu"), (4100, 3072, 32, 256, "none")], ids=str)
def test_gpu_against_float64(M, K, r, N, act, dtype):
    """the GPU against the float64 oracle (float32 accumulation, h and scaling b rounded once to the
    dtype), with and without codes and bias"""
    x, w, a, b, bias, codes = gpu_operands(getattr(torch, dtype), M, K, r, N)
    n = [oracle.np_of(t) for t in (x, w, a, b, bias, codes)]
    lora = fusedk.LoRA(w, a, b, scaling=1.5, bias=bias, act=act)
    check(lora(x, codes), n[0], n[1], n[2], n[3], 1.5, n[4], n[5], act, f"M{M} K{K} r{r} N{N} {act} {dtype}", gpu=True)
    got = fusedk.linear_lowrank(x, lora.w_cat, a, act=act)
    check(got, n[0], n[1], n[2], n[3], 1.5, None, None, act, f"M{M} K{K} r{r} N{N} {act} {dtype} plain", gpu=True)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("M,K,r,N", [(300, 768, 8, 768), (4100, 3072, 32, 256), (77, 1000, 12, 130)], ids=str)
def test_gpu_x_with_room(M, K, r, N, dtype):
    """x with room for h on the GPU: y against the float64 oracle as the plain call's (the GEMM's
    lda differs, and with it cuBLASLt's choice: not the same bits), x's columns kept, h's columns
    one rounding of a float32 sum, zeros past r"""
    x, w, a, b, bias, codes = gpu_operands(getattr(torch, dtype), M, K, r, N)
    n = [oracle.np_of(t) for t in (x, w, a, b, bias, codes)]
    lora = fusedk.LoRA(w, a, b, scaling=1.5, bias=bias, act="gelu_tanh")
    W = lora.w_cat.shape[1] - K
    xr = torch.full((M, K + W + 8), 3.0, device="cuda", dtype=x.dtype)[:, :K + W]
    xr[:, :K] = x
    check(lora(xr, codes), n[0], n[1], n[2], n[3], 1.5, n[4], n[5], "gelu_tanh", f"M{M} K{K} r{r} N{N} {dtype}",
          gpu=True)
    assert torch.equal(xr[:, :K], x)
    h = (x.double() @ a.double().T) * codes.double()
    s_abs = (x.double().abs() @ a.double().abs().T) * codes.double().abs()
    e = oracle.EPS[oracle.np_of(x[:1, :1]).dtype]
    tiny = 2.0 ** -24 if dtype == "float16" else 0.0  # float16's subnormal spacing: h's rounding near 0
    err = (xr[:, K:K + r].double() - h).abs() - (e * h.abs() + 2.0 ** -16 * s_abs + tiny)
    assert (err <= 0).all(), f"h's columns off by up to {err.max().item():.3g} past the bound"
    assert not xr[:, K + r:].any()


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_no_less_accurate_than_peft(dtype):
    """against float64, the folded LoRA's error is no larger than peft's unfused chain's (base
    linear + scaling * lora_B(lora_A(x)) in the dtype)"""
    dt = getattr(torch, dtype)
    x, w, a, b, bias, _ = gpu_operands(dt, 4096, 3072, 32, 3072)
    F = torch.nn.functional
    got = fusedk.LoRA(w, a, b, scaling=2.0, bias=bias)(x)
    chain = F.linear(x, w, bias) + F.linear(F.linear(x, a), b) * 2.0
    xd = x.double()
    want = xd @ w.double().T + bias.double() + (xd @ a.double().T) @ b.double().T * 2.0
    e, f = (got.double() - want).abs(), (chain.double() - want).abs()
    print(f"fused max {e.max().item():.3e} mean {e.mean().item():.3e}; chain max {f.max().item():.3e} "
          f"mean {f.mean().item():.3e}")
    assert e.mean() <= f.mean() and e.max() <= f.max()


@needs_gpu
def test_gpu_compile_and_cuda_graph():
    """fusedk.torch under torch.compile(fullgraph) and inside a captured CUDA graph (a fresh side
    stream: its [x | h] buffer made during the capture) give the eager call's bits"""
    import fusedk.torch as fkt
    x, w, a, b, bias, codes = gpu_operands(torch.bfloat16, 333, 256, 16, 264)
    lora = fusedk.LoRA(w, a, b, scaling=0.5, bias=bias, act="gelu_tanh")
    want = lora(x, codes)
    f = torch.compile(lambda x, wc, a, bias, c: fkt.linear_lowrank(x, wc, a, bias, c, act="gelu_tanh") * 2,
                      fullgraph=True)
    assert torch.equal(f(x, lora.w_cat, a, bias, codes), want * 2)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g, stream=s):
        out = lora(x, codes)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@needs_gpu
@pytest.mark.parametrize("K", [64, 60], ids=["tensor cores", "cuda cores"])
def test_gpu_inf_in_x_with_padded_rank(K):
    """h's columns past r are zeros, not x times a's zero rows: an inf in x stays inf (the CPU's
    result), it does not become NaN through inf * 0 in the padding"""
    x = torch.ones(4, K, device="cuda", dtype=torch.float16)
    x[0, 0] = float("inf")
    w, a, b = torch.ones(8, K, device="cuda", dtype=torch.float16), torch.ones(5, K, device="cuda",
                                                                                dtype=torch.float16), \
        torch.ones(8, 5, device="cuda", dtype=torch.float16)
    got = fusedk.LoRA(w, a, b)(x)
    want = fusedk.LoRA(*(oracle.np_of(t) for t in (w, a, b)))(oracle.np_of(x))
    assert np.isinf(want[0]).all() and np.array_equal(oracle.np_of(got), want)


def test_lora_ranks_must_agree():
    """w_cat's width tells only r rounded up to 8: LoRA checks a's and b's ranks itself"""
    w, a, b = rand((8, 16), np.float32), rand((8, 16), np.float32), rand((8, 5), np.float32)
    with pytest.raises(fusedk.ShapeError, match=r"a has shape \(8, 16\) and b \(8, 5\), expected"):
        fusedk.LoRA(w, a, b)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("A,r,M,K,N", [(4, 16, 1000, 512, 520), (3, 5, 77, 1000, 136), (16, 8, 300, 768, 256)],
                         ids=str)
def test_gpu_adapters(A, r, M, K, N, dtype):
    """stacked adapters on the GPU against the float64 oracle: ids at random (-1 and past A: none),
    ids in runs (a batch of requests), and no ids (all adapters summed)"""
    dt = getattr(torch, dtype)
    x, w, _, _, bias, codes = gpu_operands(dt, M, K, r, N)
    g = torch.Generator(device="cuda").manual_seed(A * 31 + r)
    a = (torch.randn(A, r, K, device="cuda", generator=g) * K ** -0.5).to(dt)
    b = (torch.randn(A, N, r, device="cuda", generator=g) * r ** -0.5).to(dt)
    lora = fusedk.LoRA(w, a, b, scaling=0.5, bias=bias)
    n = [oracle.np_of(t) for t in (x, w, a, b, bias, codes)]
    ids_random = torch.randint(-1, A + 1, (M,), device="cuda", generator=g, dtype=torch.int32)
    ids_runs = (torch.arange(M, device="cuda", dtype=torch.int32) // 64) % (A + 1) - 1
    for name, ids in (("random", ids_random), ("runs", ids_runs), ("none", None)):
        got = lora(x, codes, adapter_ids=ids)
        check(got, n[0], n[1], n[2], n[3], 0.5, n[4], n[5], "none", f"A{A} r{r} M{M} K{K} N{N} {dtype} ids {name}",
              gpu=True, ids=None if ids is None else ids.cpu().numpy())
