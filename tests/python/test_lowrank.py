"""[lowrank] lowrank_update (out = beta y + scaling ((x v) codes) u_t): the CPU reference against a
float64 NumPy oracle over every dtype, ranks 1-128 (not multiples of 8 too), codes and y present
or absent, in place, beta 0 over a NaN y, K1 = 0, strided views; a bad value for
every argument; torch (eager, compile) and JAX (jit) on the CPU. On the GPU: every dtype and
rank class against the oracle, error no larger than the unfused chain's, torch.compile and CUDA
graphs, in place."""
import numpy as np
import pytest

import fusedk
import oracle
from oracle import DTYPES, EPS, gemm_close

rng = np.random.default_rng()


def rand(shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def operands(dtype, lead, K1, r, K2):
    return rand(lead + (K1,), dtype), rand((K1, r), dtype, K1 ** -0.5 if K1 else 1.0), rand(lead + (r,), dtype), \
        rand((r, K2), dtype), rand(lead + (K2,), dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("r", [1, 7, 8, 16, 64, 128])
@pytest.mark.parametrize("with_codes,with_y", [(True, True), (False, False), (True, False), (False, True)],
                         ids=["codes,y", "plain", "codes", "y"])
def test_reference(r, with_codes, with_y, dtype):
    x, v, codes, u_t, y = operands(dtype, (2, 5), 24, r, 40)
    codes, y = codes if with_codes else None, y if with_y else None
    got = fusedk.lowrank_update(x, v, u_t, codes, scaling=0.75, y=y, beta=-0.5)
    want, s1 = oracle.lowrank_update(x, v, u_t, codes, 0.75, y, -0.5)
    assert got.shape == (2, 5, 40) and got.dtype == dtype
    gemm_close(got, want, dtype, s1, f"r={r} codes={with_codes} y={with_y}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_in_place_beta_zero_and_no_k(dtype):
    x, v, codes, u_t, y = operands(dtype, (3, 7), 32, 8, 16)
    want, s1 = oracle.lowrank_update(x, v, u_t, codes, 2.0, y, 1.0)
    yy = y.copy()
    assert fusedk.lowrank_update(x, v, u_t, codes, scaling=2.0, y=yy, out=yy) is yy  # in place
    gemm_close(yy, want, dtype, s1, "in place")
    nan_y = np.full_like(y, np.nan)  # beta 0: y is not read, its NaN does not propagate
    got = fusedk.lowrank_update(x, v, u_t, codes, scaling=2.0, y=nan_y, beta=0.0)
    assert np.array_equal(got, fusedk.lowrank_update(x, v, u_t, codes, scaling=2.0))
    got = fusedk.lowrank_update(x[..., :0], v[:0], u_t, y=y, beta=3.0)  # K1 = 0: out = beta y
    gemm_close(got, 3.0 * oracle.f64(y), dtype, 0.0, "K1 = 0")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_views(dtype):
    M, K1, r, K2 = 9, 20, 6, 12
    x = rand((M, 2 * K1), dtype)[:, 3:3 + K1]  # strided rows
    v = rand((K1, 2 * r), dtype)[:, :r]
    codes = rand((M, r + 3), dtype)[:, 2:2 + r]  # codes as a slice of a wider generator output
    u_t = rand((r, K2 + 5), dtype)[:, :K2]
    y = rand((2 * M, K2), dtype)[::2]
    out = np.zeros((M, K2 + 1), dtype)[:, 1:]
    got = fusedk.lowrank_update(x, v, u_t, codes, scaling=0.5, y=y, out=out)
    want, s1 = oracle.lowrank_update(x, v, u_t, codes, 0.5, y)
    assert got is out
    gemm_close(out, want, dtype, s1, "views")


def test_empty():
    x, v, u_t = np.zeros((0, 8), np.float32), rand((8, 4), np.float32), rand((4, 5), np.float32)
    assert fusedk.lowrank_update(x, v, u_t).shape == (0, 5)
    assert fusedk.lowrank_update(rand((3, 8), np.float32), v, u_t[:, :0]).shape == (3, 0)


def test_bad_arguments():
    x, v, u_t, y = rand((4, 8), np.float32), rand((8, 3), np.float32), rand((3, 5), np.float32), rand((4, 5), np.float32)
    cases = [
        (dict(v=rand((7, 3), np.float32)), fusedk.ShapeError, "v has shape [7, 3], expected [K1, r] with K1 = 8"),
        (dict(v=rand((8, 0), np.float32), u_t=rand((0, 5), np.float32)), fusedk.ShapeError, "rank r of 1..128"),
        (dict(v=rand((8, 129), np.float32), u_t=rand((129, 5), np.float32)), fusedk.ShapeError, "rank r of 1..128"),
        (dict(u_t=rand((4, 5), np.float32)), fusedk.ShapeError, "u_t has shape [4, 5], expected [r, K2] with r = 3"),
        (dict(codes=rand((4, 2), np.float32)), fusedk.ShapeError, "codes has shape"),
        (dict(y=rand((4, 6), np.float32)), fusedk.ShapeError, "y has shape"),
        (dict(v=rand((8, 3), np.float16)), fusedk.DTypeError, "v has dtype float16, expected float32"),
        (dict(scaling=float("inf")), fusedk.InvalidArgumentError, "scaling is inf"),
        (dict(beta=float("nan")), fusedk.InvalidArgumentError, "beta is nan"),
        (dict(x=rand((4, 16), np.float32)[:, ::2]), fusedk.LayoutError, "x has stride 2 in its last dim"),
        (dict(out=np.zeros((4, 5), np.float16)), fusedk.DTypeError, "out has dtype float16"),
        (dict(out=np.zeros((4, 6), np.float32)), fusedk.ShapeError, "out has shape"),
    ]
    for over, err, says in cases:
        args = dict(x=x, v=v, u_t=u_t, y=y)
        args.update(over)
        out = args.get("out")
        with pytest.raises(err, match=says.replace("[", r"\[")):
            fusedk.lowrank_update(**args)
        if out is not None:
            assert not out.any()
    with pytest.raises(fusedk.LayoutError, match="out overlaps x"):
        fusedk.lowrank_update(x, v, rand((3, 8), np.float32), out=x)
    big = rand((4, 10), np.float32)
    with pytest.raises(fusedk.LayoutError, match="out overlaps y in memory, expected separate buffers or the same "
                       "view"):
        fusedk.lowrank_update(x, v, u_t, y=big[:, :5], out=big[:, 1:6])
    with pytest.raises(ValueError):  # fusedk.Error is what NumPy users already catch
        fusedk.lowrank_update(x, rand((7, 3), np.float32), u_t)


def test_torch_cpu_eager_and_compile():
    """fusedk.torch's custom op on CPU tensors: eager and torch.compile(fullgraph) give the NumPy
    path's bits"""
    torch = pytest.importorskip("torch")
    x, v, codes, u_t, y = operands(np.float32, (2, 5), 16, 4, 12)
    want = fusedk.lowrank_update(x, v, u_t, codes, scaling=0.5, y=y)
    t = [torch.from_numpy(a) for a in (x, v, codes, u_t, y)]
    got = fusedk.lowrank_update(t[0], t[1], t[3], t[2], scaling=0.5, y=t[4])
    assert isinstance(got, torch.Tensor) and np.array_equal(got.numpy(), want)
    f = torch.compile(lambda x, v, c, u, y: fusedk.lowrank_update(x, v, u, c, scaling=0.5, y=y) * 2, fullgraph=True)
    assert np.array_equal(f(*t).numpy(), want * 2)


def test_jax_cpu_jit():
    jax = pytest.importorskip("jax")
    import fusedk.jax  # noqa: F401 - registers the custom calls
    x, v, codes, u_t, y = operands(np.float32, (2, 5), 16, 4, 12)
    want = fusedk.lowrank_update(x, v, u_t, codes, scaling=0.5, y=y)
    cpu = jax.devices("cpu")[0]
    j = [jax.device_put(a, cpu) for a in (x, v, codes, u_t, y)]
    f = jax.jit(lambda x, v, c, u, y: fusedk.lowrank_update(x, v, u, c, scaling=0.5, y=y))
    assert np.array_equal(np.asarray(f(*j)), want)


# --- the GPU kernels, through torch ------------------------------------------------------------
torch, _gpu = oracle.torch_cuda()
needs_gpu = pytest.mark.skipif(not _gpu, reason="no CUDA device, torch or fusedk GPU half")


def gpu_operands(dt, M, K1, r, K2):
    g = torch.Generator(device="cuda").manual_seed(M * 7 + r)
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, device="cuda", generator=g)).to(dt)  # noqa: E731
    return mk(M, K1), mk(K1, r, scale=K1 ** -0.5), mk(M, r), mk(r, K2), mk(M, K2)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("M,K1,r,K2", [(1, 8, 1, 8), (130, 200, 7, 136), (300, 768, 8, 768), (77, 1000, 12, 4095),
                                       (500, 512, 64, 520), (257, 1024, 128, 1032)], ids=str)
def test_gpu_against_float64(M, K1, r, K2, dtype):
    """the GPU against the float64 oracle: eps_T |want| + (eps_T + 2^-19) S1 (h rounded once to
    the dtype on the tensor-core path, float32 accumulation); with and without codes and y"""
    dt = getattr(torch, dtype)
    x, v, codes, u_t, y = gpu_operands(dt, M, K1, r, K2)
    np_ = [oracle.np_of(t) for t in (x, v, codes, u_t, y)]
    e = 1e-5 if dtype == "float32" else EPS[oracle.np_of(x).dtype]
    for c, yy, beta in ((codes, y, 0.5), (None, None, 1.0)):
        got = fusedk.lowrank_update(x, v, u_t, c, scaling=1.5, y=yy, beta=beta)
        want, s1 = oracle.lowrank_update(np_[0], np_[1], np_[3], None if c is None else np_[2], 1.5,
                                         None if yy is None else np_[4], beta)
        gemm_close(oracle.np_of(got), want, oracle.np_of(x).dtype, s1, f"M{M} K1{K1} r{r} K2{K2} {dtype}",
                   extra=(0.0 if dtype == "float32" else e) * s1, gpu=True)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_no_less_accurate_than_the_unfused_chain(dtype):
    """BEM's accuracy check: against float64, the fused update's error is no larger than the unfused
    chain's (x @ v, * codes, @ u_t, * scaling, + y in the dtype)"""
    dt = getattr(torch, dtype)
    x, v, codes, u_t, y = gpu_operands(dt, 4096, 768, 8, 768)
    got = fusedk.lowrank_update(x, v, u_t, codes, scaling=2.0, y=y)
    chain = y + ((x @ v) * codes @ u_t) * 2.0
    want = y.double() + ((x.double() @ v.double()) * codes.double() @ u_t.double()) * 2.0
    e, f = (got.double() - want).abs(), (chain.double() - want).abs()
    print(f"fused max {e.max().item():.3e} mean {e.mean().item():.3e}; chain max {f.max().item():.3e} "
          f"mean {f.mean().item():.3e}")
    assert e.mean() <= f.mean() and e.max() <= f.max()


@needs_gpu
def test_gpu_in_place_compile_and_cuda_graph():
    """in place on the GPU; fusedk.torch under torch.compile(fullgraph) and inside a captured CUDA
    graph give the eager call's bits"""
    import fusedk.torch as fkt
    x, v, codes, u_t, y = gpu_operands(torch.bfloat16, 333, 256, 16, 264)
    want = fusedk.lowrank_update(x, v, u_t, codes, scaling=0.5, y=y)
    yy = y.clone()
    fusedk.lowrank_update(x, v, u_t, codes, scaling=0.5, y=yy, out=yy)
    assert torch.equal(yy, want)
    f = torch.compile(lambda x, v, c, u, y: fkt.lowrank_update(x, v, u, c, scaling=0.5, y=y) * 2, fullgraph=True)
    assert torch.equal(f(x, v, codes, u_t, y), want * 2)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fusedk.lowrank_update(x, v, u_t, codes, scaling=0.5, y=y)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fusedk.lowrank_update(x, v, u_t, codes, scaling=0.5, y=y)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@needs_gpu
def test_gpu_bem_helpers():
    """fusedk.bem: the seed's fused_generated_update (the chain's values), validate_numerical_accuracy
    (no less accurate than the chain) and benchmark_kernel_performance (its keys, positive times)"""
    from fusedk import bem
    x, v, codes, u_t, _ = gpu_operands(torch.float16, 512, 768, 8, 768)
    got = bem.fused_generated_update(x, v, codes, u_t, 2.0)
    want = ((x.double() @ v.double()) * codes.double()) @ u_t.double() * 2.0
    assert (got.double() - want).abs().max().item() <= 2 ** -10 * want.abs().max().item() + 1e-3
    r = bem.validate_numerical_accuracy(batch_size=2, seq_len=256)
    assert r["passed"], r
    b = bem.benchmark_kernel_performance(batch_size=4, seq_len=512, iters=5)
    assert b["fused_ms"] > 0 and b["pytorch_ms"] > 0 and b["base_ms"] > 0 and b["comparison"]["speedup_ratio"] > 0


def test_bem_helpers_on_the_cpu():
    """validate_numerical_accuracy on CPU tensors (fusedk's reference against torch's chain)"""
    pytest.importorskip("torch")
    from fusedk import bem
    r = bem.validate_numerical_accuracy(batch_size=1, seq_len=64, input_dim=96, output_dim=80, dtype="float32",
                                        device="cpu")
    assert r["passed"], r
