"""[attention] attention (softmax(q k^T scale) v with GQA, causal masks aligned bottom-right,
per-sample kv_len, lse): the CPU reference (through the bindings, on NumPy arrays) against a
float64 NumPy oracle over every dtype, GQA ratios, Sq != Sk both ways, [B, S, H, D] and
transposed [B, H, S, D] views, views of one packed qkv, kv_len (0, 1, partial, full, past Sk),
rows that see no key, huge scores, a NaN key; a bad value for every argument."""
import numpy as np
import pytest

import fusedk
import oracle
from oracle import DTYPES, assert_close

rng = np.random.default_rng()


def rand(shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def check(dtype, what, q, k, v, scale=None, causal=False, kv_len=None, **kw):
    got, lse = fusedk.attention(q, k, v, scale=scale, causal=causal, kv_len=kv_len, return_lse=True, **kw)
    want, want_lse = oracle.attention(q, k, v, scale, causal, kv_len)
    assert got.shape == q.shape and got.dtype == dtype and lse.dtype == np.float32
    assert lse.shape == (q.shape[0], q.shape[2], q.shape[1])
    # the reference accumulates in double and rounds once: one ulp of out, plus the double
    # accumulation's own error (far below it); lse in float32 within one float32 ulp
    assert_close(got, want, dtype, what=f"{what} out", atol=1e-6, nan_ok=False)
    assert_close(lse, want_lse, np.float32, what=f"{what} lse", atol=1e-6, nan_ok=False)
    return got, lse


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("B,Sq,Sk,Hq,Hkv,D", [(1, 1, 1, 1, 1, 8), (2, 17, 17, 4, 4, 16), (1, 5, 23, 8, 2, 32),
                                              (2, 23, 5, 8, 1, 24), (1, 33, 33, 6, 3, 64), (1, 7, 127, 2, 2, 128)],
                         ids=str)
def test_attention(B, Sq, Sk, Hq, Hkv, D, causal, dtype):
    q, k, v = rand((B, Sq, Hq, D), dtype), rand((B, Sk, Hkv, D), dtype), rand((B, Sk, Hkv, D), dtype)
    check(dtype, f"B{B} Sq{Sq} Sk{Sk} Hq{Hq} Hkv{Hkv} D{D} causal {causal}", q, k, v, causal=causal)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_kv_len_and_rows_that_see_nothing(dtype):
    B, Sq, Sk, H, D = 5, 6, 9, 2, 16
    q, k, v = rand((B, Sq, H, D), dtype), rand((B, Sk, H, D), dtype), rand((B, Sk, H, D), dtype)
    kv_len = np.array([0, 1, 4, 9, 7], np.int32)  # none, one, part, all, most
    for causal in (False, True):
        got, lse = check(dtype, f"kv_len causal {causal}", q, k, v, causal=causal, kv_len=kv_len)
        assert not got[0].any() and np.all(lse[0] == -np.inf)  # kv_len 0: zeros, lse -inf
        assert np.array_equal(got[3], fusedk.attention(q, k, v, causal=causal)[3])  # kv_len = Sk: as without
    # causal with Sk < Sq: the first Sq - Sk rows see no key
    got, lse = check(dtype, "causal Sk < Sq", q[:, :6], k[:, :3], v[:, :3], causal=True)
    assert not got[:, :3].any() and np.all(lse[:, :, :3] == -np.inf) and np.all(np.isfinite(lse[:, :, 3:]))


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_views_transposed_and_packed(dtype):
    B, S, H, D = 2, 11, 4, 32
    qkv = rand((B, S, 3, H, D + 8), dtype)[..., :D]  # a packed projection, padded rows
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    check(dtype, "packed views", q, k, v)
    bhsd = [rand((B, H, S, D), dtype) for _ in range(3)]  # SDPA's layout, as transposed views
    check(dtype, "bhsd through transposes", *[t.transpose(0, 2, 1, 3) for t in bhsd], causal=True)
    out = np.zeros((B, H, S, D), dtype).transpose(0, 2, 1, 3)  # out= a transposed view
    got = fusedk.attention(q, k, v, out=out)
    assert got is out
    assert_close(out, oracle.attention(q, k, v)[0], dtype, what="out= transposed", atol=1e-6)


def test_scale_huge_scores_and_nan():
    B, S, H, D = 1, 8, 2, 16
    q, k, v = rand((B, S, H, D), np.float32, 30.0), rand((B, S, H, D), np.float32, 30.0), rand((B, S, H, D), np.float32)
    got, lse = check(np.float32, "huge scores", q, k, v, scale=1.0)  # scores ~1e4: exp overflows unshifted
    assert np.all(np.isfinite(got)) and np.all(np.isfinite(lse))
    check(np.float32, "scale 0.05", q, k, v, scale=0.05)
    k2 = k.copy()
    k2[0, 5, 1, 3] = np.nan  # one key: the rows of head 1 that see it are NaN, nothing else
    got, lse = fusedk.attention(q, k2, v, causal=True, return_lse=True)
    assert np.all(np.isnan(got[0, 5:, 1])) and np.all(np.isfinite(got[0, :5, 1])) and np.all(np.isfinite(got[:, :, 0]))


def test_empty_and_one():
    q = np.zeros((0, 3, 2, 8), np.float32)
    assert fusedk.attention(q, q, q).shape == (0, 3, 2, 8)
    q, k = rand((1, 4, 2, 8), np.float32), np.zeros((1, 0, 2, 8), np.float32)  # no keys at all
    got, lse = fusedk.attention(q, k, k, return_lse=True)
    assert not got.any() and np.all(lse == -np.inf)


def test_bad_arguments():
    q, k = rand((2, 4, 4, 8), np.float32), rand((2, 6, 2, 8), np.float32)
    cases = [
        (dict(k=rand((2, 6, 3, 8), np.float32)), fusedk.ShapeError, "k has 3 heads, expected a divisor of q's 4"),
        (dict(k=rand((1, 6, 2, 8), np.float32)), fusedk.ShapeError, "k has shape"),
        (dict(v=rand((2, 5, 2, 8), np.float32)), fusedk.ShapeError, "v has shape"),
        (dict(v=rand((2, 6, 2, 8), np.float16)), fusedk.DTypeError, "v has dtype float16, expected float32"),
        (dict(q=rand((2, 4, 8), np.float32)), fusedk.ShapeError, "q has shape [2, 4, 8], expected [B, Sq, Hq, Dh]"),
        (dict(kv_len=np.array([1.0, 2.0], np.float32)), fusedk.DTypeError, "kv_len has dtype float32, expected int32"),
        (dict(kv_len=np.array([1, 2, 3], np.int32)), fusedk.ShapeError, "kv_len has shape"),
        # host memory: a value outside [0, Sk] is refused, naming the sample (the GPU clamps)
        (dict(kv_len=[-1, 6]), fusedk.InvalidArgumentError, "kv_len[0] is -1, expected 0 to 6 .k's Sk."),
        (dict(kv_len=np.array([6, 7], np.int32)), fusedk.InvalidArgumentError, "kv_len[1] is 7, expected 0 to 6"),
        (dict(kv_len=[2 ** 31 - 1, 0]), fusedk.InvalidArgumentError, "kv_len[0] is 2147483647, expected 0 to 6"),
        (dict(kv_len=[2 ** 31, 0]), fusedk.InvalidArgumentError, "kv_len holds values outside int32"),
        (dict(scale="0.1"), TypeError, "scale is '0.1' \\(a str\\), expected a number"),
        (dict(causal="no"), TypeError, "causal is 'no' \\(a str\\), expected True or False"),
        (dict(lse_out=np.zeros((2, 4, 4), np.float16)), fusedk.DTypeError, "lse_out has dtype float16"),
        (dict(scale=float("nan")), fusedk.InvalidArgumentError, "scale is nan"),
        (dict(scale=0.0), fusedk.InvalidArgumentError, "scale is 0.0"),
        (dict(out=np.zeros((2, 4, 4, 8), np.float16)), fusedk.DTypeError, "out has dtype float16"),
        (dict(q=rand((2, 4, 4, 8), np.float32)[..., ::2]), fusedk.LayoutError, "q has stride 2 in its last dim"),
    ]
    for over, err, says in cases:
        args = dict(q=q, k=k, v=k)
        args.update(over)
        out = args.get("out")
        with pytest.raises(err, match=says.replace("[", r"\[")) as e:
            fusedk.attention(**args)
        assert isinstance(e.value, fusedk.Error)
        if out is not None:
            assert not out.any()
    with pytest.raises(fusedk.LayoutError, match="out overlaps q"):
        fusedk.attention(q, k, k, out=q)


def test_torch_cpu_eager_and_compile():
    """fusedk.torch's custom op on CPU tensors: eager and torch.compile(fullgraph) give the NumPy
    path's bits; an int64 kv_len (torch's default integer) is refused with the dtype named"""
    torch = pytest.importorskip("torch")
    q, k, v = rand((2, 5, 4, 16), np.float32), rand((2, 7, 2, 16), np.float32), rand((2, 7, 2, 16), np.float32)
    n = np.array([3, 7], np.int32)
    want, want_lse = fusedk.attention(q, k, v, causal=True, kv_len=n, return_lse=True)
    t = [torch.from_numpy(a) for a in (q, k, v, n)]
    got, lse = fusedk.attention(*t[:3], causal=True, kv_len=t[3], return_lse=True)
    assert isinstance(got, torch.Tensor) and np.array_equal(got.numpy(), want) and np.array_equal(lse.numpy(), want_lse)
    f = torch.compile(lambda q, k, v, n: fusedk.attention(q, k, v, causal=True, kv_len=n), fullgraph=True)
    assert np.array_equal(f(*t).numpy(), want)
    # outputs used inside the graph: the fake's shapes (out like q, lse [B, Hq, Sq]) are what inductor plans by
    g = torch.compile(lambda q, k, v, n: [x * 2 for x in fusedk.attention(q, k, v, causal=True, kv_len=n,
                                                                           return_lse=True)], fullgraph=True)
    got, lse = g(*t)
    assert np.array_equal(got.numpy(), want * 2) and np.array_equal(lse.numpy(), want_lse * 2)
    with pytest.raises(fusedk.DTypeError, match="kv_len has dtype int64, expected int32"):
        fusedk.attention(*t[:3], kv_len=t[3].long())


def test_jax_cpu_jit():
    """JAX arrays through the XLA custom call, eager and under jax.jit, int32 kv_len included"""
    jax = pytest.importorskip("jax")
    import fusedk.jax  # noqa: F401 - registers the custom calls
    q, k, v = rand((2, 5, 4, 16), np.float32), rand((2, 7, 2, 16), np.float32), rand((2, 7, 2, 16), np.float32)
    n = np.array([3, 7], np.int32)
    want = fusedk.attention(q, k, v, causal=True, kv_len=n)
    cpu = jax.devices("cpu")[0]
    j = [jax.device_put(a, cpu) for a in (q, k, v, n)]
    assert np.array_equal(np.asarray(fusedk.attention(*j[:3], causal=True, kv_len=j[3])), want)
    f = jax.jit(lambda q, k, v, n: fusedk.attention(q, k, v, causal=True, kv_len=n))
    assert np.array_equal(np.asarray(f(*j)), want)


# --- the GPU kernel, through torch -----------------------------------------------------------
torch, _gpu = oracle.torch_cuda()
needs_gpu = pytest.mark.skipif(not _gpu, reason="no CUDA device, torch or fusedk GPU half")


def torch_reference(q, k, v, causal, kv_len=None):
    """float64 attention on the GPU (GQA by repeating k, v; causal bottom-right), out [B, Sq, Hq, D]
    and lse [B, Hq, Sq]"""
    G = q.shape[2] // k.shape[2]
    qd, kd, vd = q.double().transpose(1, 2), k.double().repeat_interleave(G, 2).transpose(1, 2), \
        v.double().repeat_interleave(G, 2).transpose(1, 2)
    Sq, Sk = q.shape[1], k.shape[1]
    s = qd @ kd.transpose(-1, -2) / q.shape[-1] ** 0.5
    j = torch.arange(Sk, device=q.device)
    mask = torch.zeros(q.shape[0], 1, Sq, Sk, dtype=torch.bool, device=q.device)
    if causal:
        mask |= (j[None, :] > torch.arange(Sq, device=q.device)[:, None] + Sk - Sq)[None, None]
    if kv_len is not None:
        mask |= (j[None, :] >= kv_len.to(q.device)[:, None].long())[:, None, None, :]
    s = s.masked_fill(mask, float("-inf"))
    lse = torch.logsumexp(s, -1)
    out = torch.nan_to_num(torch.exp(s - lse[..., None])) @ vd
    return out.transpose(1, 2), lse


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("B,S,Hq,Hkv,D", [(1, 1000, 8, 2, 128), (2, 333, 6, 6, 64), (1, 777, 4, 1, 256),
                                          (1, 2048, 4, 4, 128)], ids=str)
def test_gpu_error_no_larger_than_flash(B, S, Hq, Hkv, D, causal, dtype):
    """fusedk's error against float64 is that of FlashAttention-2 (SDPA's flash backend) on the
    same inputs: both round P to the dtype before P V and differ by summation order and rounding
    points (measured on the H200: mean within 4 %, max within 13 %; the bounds 5 % and 25 %);
    lse within float32 rounding"""
    from torch.nn.attention import SDPBackend, sdpa_kernel
    dt = getattr(torch, dtype)
    q = torch.randn(B, S, Hq, D, device="cuda", dtype=dt)
    k, v = (torch.randn(B, S, Hkv, D, device="cuda", dtype=dt) for _ in range(2))
    got, lse = fusedk.attention(q, k, v, causal=causal, return_lse=True)
    want, want_lse = torch_reference(q, k, v, causal)
    G = Hq // Hkv
    with sdpa_kernel(SDPBackend.FLASH_ATTENTION):
        flash = torch.nn.functional.scaled_dot_product_attention(
            q.transpose(1, 2), k.repeat_interleave(G, 2).transpose(1, 2), v.repeat_interleave(G, 2).transpose(1, 2),
            is_causal=causal).transpose(1, 2)
    e, f = (got.double() - want).abs(), (flash.double() - want).abs()
    print(f"fusedk max {e.max().item():.3e} mean {e.mean().item():.3e}; flash max {f.max().item():.3e} "
          f"mean {f.mean().item():.3e}")
    assert e.mean() <= 1.05 * f.mean() and e.max() <= 1.25 * f.max(), (e.max().item(), f.max().item())
    assert ((lse.double() - want_lse).abs() <= 1e-5 * (1 + want_lse.abs())).all()


@needs_gpu
def test_gpu_rows_that_see_no_key_beside_an_inf_in_v():
    """rows that see no key are 0 (lse -inf) also where their block's P V meets an Inf of v (their
    weights 0 times it); the rows that see its key Inf there"""
    q = torch.randn(1, 6, 2, 128, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, 3, 2, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    v[0, 1, 0, 3] = float("inf")
    out, lse = fusedk.attention(q, k, v, causal=True, return_lse=True)  # rows 0-2 see no key (Sq 6 > Sk 3)
    assert not out[:, :3].any() and (lse[:, :, :3] == -float("inf")).all()
    assert out[0, 4:, 0, 3].isposinf().all()


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_masks_views_and_edges(dtype):
    """Sq != Sk both ways under causal masks, kv_len (0, 1, partial, full, past Sk), [B, H, S, D]
    views and packed qkv, rows that see no key (0, lse -inf), on the GPU against float64"""
    dt = getattr(torch, dtype)
    tol = 2 * (2 ** -7 if dt == torch.bfloat16 else 2 ** -10)
    for Sq, Sk in ((17, 1000), (1000, 17), (1, 1), (129, 129)):
        q = torch.randn(5, Sq, 4, 128, device="cuda", dtype=dt)
        kv = torch.randn(5, 2, 2, Sk, 128, device="cuda", dtype=dt).transpose(2, 3)  # [B, H, S, D] views
        k, v = kv[:, 0], kv[:, 1]
        kv_len = torch.tensor([0, 1, Sk // 2, Sk, Sk + 7], dtype=torch.int32, device="cuda")
        for causal in (False, True):
            for n in (None, kv_len):
                got, lse = fusedk.attention(q, k, v, causal=causal, kv_len=n, return_lse=True)
                want, want_lse = torch_reference(q, k, v, causal, n)
                err = (got.double() - want).abs().max().item()
                assert err <= tol * v.abs().max().item(), (Sq, Sk, causal, n is not None, err)
                seen = torch.isfinite(want_lse)
                assert torch.equal(torch.isfinite(lse), seen) and not got.double()[~seen.transpose(1, 2)].any()
                assert ((lse.double() - want_lse)[seen].abs() <= 1e-5 * (1 + want_lse[seen].abs())).all()


@needs_gpu
def test_gpu_torch_compile_and_cuda_graph():
    """fusedk.torch.attention under torch.compile(fullgraph) and inside a captured CUDA graph: the
    eager call's bits"""
    import fusedk.torch as fkt
    q, k, v = (torch.randn(2, 333, 4, 64, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    n = torch.tensor([100, 333], dtype=torch.int32, device="cuda")
    want, want_lse = fusedk.attention(q, k, v, causal=True, kv_len=n, return_lse=True)
    f = torch.compile(lambda q, k, v, n: fkt.attention(q, k, v, causal=True, kv_len=n, return_lse=True), fullgraph=True)
    got, lse = f(q, k, v, n)
    assert torch.equal(got, want) and torch.equal(lse, want_lse)
    g = torch.compile(lambda q, k, v, n: [x * 2 for x in fkt.attention(q, k, v, kv_len=n, return_lse=True)],
                      fullgraph=True)
    full, full_lse = fusedk.attention(q, k, v, kv_len=n, return_lse=True)
    got, lse = g(q, k, v, n)
    assert torch.equal(got, full * 2) and torch.equal(lse, full_lse * 2)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fusedk.attention(q, k, v, causal=True)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fusedk.attention(q, k, v, causal=True, kv_len=n)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, want)


@needs_gpu
@pytest.mark.parametrize("causal", [False, True], ids=["split", "counter"])
def test_gpu_persistent_schedules_repeat_streams_and_graph(causal):
    """Shapes on the Hopper kernel's two persistent schedules: the last wave split by keys across
    blocks (192 units of 16 key tiles on 132 SMs), and causal units taken from a counter. Repeated
    calls, calls on two streams at once and replays of a captured CUDA graph with new inputs give
    the eager call's bits (each launch leaves its counters at 0 for the next)"""
    q, k, v = (torch.randn(1, 3000, 8, 128, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    q2 = torch.randn_like(q)
    want, want2 = fusedk.attention(q, k, v, causal=causal), fusedk.attention(q2, k, v, causal=causal)
    ref, _ = torch_reference(q, k, v, causal)
    assert (want.double() - ref).abs().max().item() <= 2 * 2 ** -7 * v.abs().max().item()
    for _ in range(3):
        assert torch.equal(fusedk.attention(q, k, v, causal=causal), want)
    streams = [torch.cuda.Stream() for _ in range(2)]
    for s in streams:
        s.wait_stream(torch.cuda.current_stream())
    outs = []
    for i in range(6):
        with torch.cuda.stream(streams[i % 2]):
            outs.append(fusedk.attention(q2 if i % 2 else q, k, v, causal=causal))
    for s in streams:
        torch.cuda.current_stream().wait_stream(s)
    torch.cuda.synchronize()
    assert all(torch.equal(o, want2 if i % 2 else want) for i, o in enumerate(outs))
    qs = q.clone()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        out = fusedk.attention(qs, k, v, causal=causal)
    for x, w in ((q2, want2), (q, want), (q2, want2)):
        qs.copy_(x)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, w)
