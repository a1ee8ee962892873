"""[lowrank] the backward: lowrank_update_backward and linear_lowrank_backward (the CPU reference
against a float64 NumPy oracle, itself checked against finite differences of the forward oracles),
every dtype, ranks 1-128, codes, stacked adapters with ids, every act through aux; bad input;
autograd through fusedk.torch (eager, torch.compile) and jax.grad through fusedk.jax's custom_vjp
on the CPU; on the GPU every gradient against the oracle and a LoRA'd layer's training step
against PyTorch autograd of peft's unfused chain."""
import numpy as np
import pytest

import fusedk
import oracle
from oracle import DTYPES, EPS, f64, gemm_close

rng = np.random.default_rng()
ACTS = ["none", "relu", "gelu_tanh", "gelu", "silu"]


def rand(shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def rp(r):
    return (r + 7) // 8 * 8


def lora_factors(w_cat, a, K):
    """the oracle's P_q = a_q^T and Q_q = w_cat's scaling b_q columns (as rounded there)"""
    a3 = a[None] if a.ndim == 2 else a
    r = a3.shape[1]
    return [f64(a3[q]).T for q in range(a3.shape[0])], \
        [f64(w_cat)[:, K + q * rp(r):K + q * rp(r) + r] for q in range(a3.shape[0])]


def close(got, want, bound, dtype, what, extra=0.0, gpu=False):
    gemm_close(oracle.np_of(got) if gpu else got, want, dtype, bound, what, extra=extra, gpu=gpu)


# --- the oracle against finite differences of the forward oracles --------------------------------
def numeric_grads(f, args):
    """d f / d args[i] for every i, by central differences (float64)"""
    out = []
    for i, arg in enumerate(args):
        num = np.zeros_like(arg)
        for idx in np.ndindex(arg.shape):
            for sgn in (1, -1):
                t = list(args)
                t[i] = arg.copy()
                t[i][idx] += sgn * 1e-6
                num[idx] += sgn * f(*t) / 2e-6
        out.append(num)
    return out


def test_oracle_against_finite_differences():
    """lowrank_grad's formulas: d<loss>/d(every input) for loss = sum(dy * forward) by central
    differences in float64, both ops, codes, two adapters with ids, gelu_tanh"""
    x, v, u, c, dy = (rng.standard_normal(s) for s in ((3, 4), (4, 2), (2, 5), (3, 2), (3, 5)))
    f = lambda x, v, u, c: np.sum(dy * oracle.lowrank_update(x, v, u, c, 0.7)[0])  # noqa: E731
    dx, (dv,), (du,), dc, _ = oracle.lowrank_grad(dy, x, [v], [0.7 * u.T], c, scaling=0.7)
    for g, num in zip((dx, dv, du.T, dc), numeric_grads(f, [x, v, u, c])):
        np.testing.assert_allclose(g, num, rtol=1e-6, atol=1e-7)
    A, r, K, N = 2, 3, 4, 5
    w, a, b, bias = (rng.standard_normal(s) for s in ((N, K), (A, r, K), (A, N, r), (N,)))
    ids = np.array([1, -1, 0, 1])
    x, c, dy = (rng.standard_normal(s) for s in ((4, K), (4, r), (4, N)))
    fz = lambda x, a, b, c: oracle.linear_lowrank(x, w, a, b, 0.5, bias, c, "none", ids=ids)[0]  # noqa: E731
    f = lambda x, a, b, c: np.sum(dy * oracle.act(fz(x, a, b, c), "gelu_tanh"))  # noqa: E731
    ps, qs = [a[q].T for q in range(A)], [0.5 * b[q] for q in range(A)]
    dx, dps, dqs, dc, dbias = oracle.lowrank_grad(dy, x, ps, qs, c, ids, 0.5, w, fz(x, a, b, c), "gelu_tanh")
    grads = (dx, np.stack([p.T for p in dps]), np.stack(dqs), dc)
    for g, num in zip(grads, numeric_grads(f, [x, a, b, c])):
        np.testing.assert_allclose(g, num, rtol=1e-5, atol=1e-6)
    gz = dy * oracle.act_grad(fz(x, a, b, c), "gelu_tanh")
    np.testing.assert_allclose(dbias, gz.sum(0), rtol=1e-12)


# --- the CPU reference against the oracle --------------------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("r", [1, 7, 8, 16, 64, 128])
@pytest.mark.parametrize("with_codes", [False, True])
def test_lowrank_update_backward(r, with_codes, dtype):
    x, v, u, c, dout = rand((2, 5, 24), dtype), rand((24, r), dtype, 0.3), rand((r, 40), dtype, 0.3), \
        rand((2, 5, r), dtype), rand((2, 5, 40), dtype)
    c = c if with_codes else None
    dx, dv, du, dc = fusedk.lowrank_update_backward(dout, x, v, u, c, scaling=0.75)
    assert dx.shape == x.shape and dv.shape == v.shape and du.shape == u.shape and dx.dtype == dtype
    assert (dc is None) == (c is None)
    want = oracle.lowrank_grad(dout, x, [v], [0.75 * f64(u).T], c, scaling=0.75)
    ab = lambda t: None if t is None else np.abs(f64(t))  # noqa: E731
    bound = oracle.lowrank_grad(ab(dout), ab(x), [ab(v)], [0.75 * ab(u).T], ab(c), scaling=0.75)
    what = f"r={r} codes={with_codes}"
    close(dx, want[0], bound[0], dtype, what + " dx")
    close(dv, want[1][0], bound[1][0], dtype, what + " dv")
    close(du, want[2][0].T, bound[2][0].T, dtype, what + " du_t")
    if c is not None:
        close(dc, want[3], bound[3], dtype, what + " dcodes")
    only = fusedk.lowrank_update_backward(dout, x, v, u, c, 0.75, dv=False, du_t=False)
    assert only[1] is None and only[2] is None and np.array_equal(only[0], dx)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("A,r,ids", [(0, 8, False), (0, 7, False), (2, 5, True), (3, 16, False), (16, 8, True)],
                         ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_linear_lowrank_backward(A, r, ids, act, dtype):
    K, N = 24, 40
    lead = (3, 7)
    x, w, bias, c, dy = rand(lead + (K,), dtype), rand((N, K), dtype, K ** -0.5), rand((N,), dtype, 0.5), \
        rand(lead + (r,), dtype), rand(lead + (N,), dtype)
    a = rand(((A,) if A else ()) + (r, K), dtype, K ** -0.5)
    b = rand(((A,) if A else ()) + (N, r), dtype, r ** -0.5)
    idv = np.array([(i // 3) % (A + 1) - 1 if i % 5 else A + 3 for i in range(21)], np.int32) if ids else None
    w_cat = fusedk.lowrank_prepare(w, b, 0.5)
    y, z = fusedk.linear_lowrank(x, w_cat, a, bias, c, act, adapter_ids=idv, aux=True)
    assert np.array_equal(y, fusedk.linear_lowrank(x, w_cat, a, bias, c, act, adapter_ids=idv))
    dx, da, db, dc, dbias = fusedk.linear_lowrank_backward(dy, x, w_cat, a, c, idv, z if act != "none" else None,
                                                           act, 0.5, dbias=True)
    assert dx.shape == x.shape and da.shape == a.shape and db.shape == b.shape and dc.shape == c.shape
    assert dbias.shape == (N,) and db.dtype == dtype
    ps, qs = lora_factors(w_cat, a, K)
    want = oracle.lowrank_grad(dy, x, ps, qs, c, idv, 0.5, f64(w_cat)[:, :K], z, act, dtype)
    g1 = 1.0 if act in ("none", "relu") else 1.13
    ab = np.abs
    bound = oracle.lowrank_grad(ab(f64(dy)) * g1, ab(f64(x)), [ab(p) for p in ps], [ab(q) for q in qs], ab(f64(c)),
                                idv, 0.5, ab(f64(w_cat))[:, :K])
    extra = [EPS[dtype] * bb for bb in (bound[0], np.stack(bound[1]), np.stack(bound[2]), bound[3], bound[4])] \
        if act != "none" else [0.0] * 5  # dz: an ulp either way where act' is computed differently
    what = f"A={A} r={r} ids={ids} act={act}"
    close(dx, want[0], bound[0], dtype, what + " dx", extra[0])
    da3 = np.stack([p.T for p in want[1]]).reshape(a.shape)
    close(da, da3, np.stack([p.T for p in bound[1]]).reshape(a.shape), dtype, what + " da",
          np.transpose(extra[1], (0, 2, 1)).reshape(a.shape) if act != "none" else 0.0)
    close(db, np.stack(want[2]).reshape(b.shape), np.stack(bound[2]).reshape(b.shape), dtype, what + " db",
          extra[2].reshape(b.shape) if act != "none" else 0.0)
    close(dc, want[3], bound[3], dtype, what + " dcodes", extra[3])
    close(dbias, want[4], bound[4], dtype, what + " dbias", extra[4])


def test_backward_edges_and_bad_input():
    """no rows (zeros for the factors), nothing asked for, and bad arguments: fusedk.Error naming them"""
    x, v, u, dout = rand((0, 8), np.float32), rand((8, 3), np.float32), rand((3, 5), np.float32), \
        rand((0, 5), np.float32)
    dx, dv, du, dc = fusedk.lowrank_update_backward(dout, x, v, u)
    assert dx.shape == (0, 8) and np.array_equal(dv, np.zeros((8, 3), np.float32)) and not du.any() and dc is None
    assert fusedk.lowrank_update_backward(dout, x, v, u, dx=False, dv=False, du_t=False) == (None,) * 4
    x, w, a, b = rand((4, 8), np.float32), rand((6, 8), np.float32), rand((3, 8), np.float32), rand((6, 3), np.float32)
    w_cat, dy = fusedk.lowrank_prepare(w, b, 2.0), rand((4, 6), np.float32)
    with pytest.raises(fusedk.InvalidArgumentError, match="aux is NULL"):
        fusedk.linear_lowrank_backward(dy, x, w_cat, a, act="gelu")
    with pytest.raises(fusedk.ShapeError, match="linear_lowrank_backward: w_cat has shape"):
        fusedk.linear_lowrank_backward(dy, x, w, a)
    with pytest.raises(fusedk.ShapeError, match="lowrank_update_backward: dout has shape"):
        fusedk.lowrank_update_backward(dy, x, v, u)
    with pytest.raises(fusedk.InvalidArgumentError, match="scaling is nan"):
        fusedk.lowrank_update_backward(rand((4, 5), np.float32), x, v, u, scaling=float("nan"))
    with pytest.raises(fusedk.DTypeError):
        fusedk.linear_lowrank_backward(dy.astype(np.float16), x, w_cat, a)
    with pytest.raises(ValueError):  # fusedk.Error is a ValueError here
        fusedk.linear_lowrank_backward(dy, x, w_cat, a, adapter_ids=np.zeros(5, np.int32))


# --- autograd on the CPU: fusedk.torch (eager, compile) and jax.grad ------------------------------
def torch_lora_case(torch, dtype=None, device="cpu", M=12, K=16, r=4, N=20, A=0, act="gelu_tanh", ids=False):
    dt = dtype or torch.float32
    g = torch.Generator(device=device).manual_seed(M + K + r)
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, generator=g, device=device)).to(dt)  # noqa: E731
    lead = (A,) if A else ()
    t = {"x": mk(M, K), "w": mk(N, K, scale=K ** -0.5), "a": mk(*lead, r, K, scale=K ** -0.5),
         "b": mk(*lead, N, r, scale=r ** -0.5), "bias": mk(N, scale=0.5), "codes": mk(M, r), "dy": mk(M, N)}
    t["ids"] = (torch.arange(M, device=device, dtype=torch.int32) % (A + 1) - 1) if ids else None
    for k in ("x", "a", "b", "bias", "codes"):
        t[k].requires_grad_(True)
    return t


def torch_chain(torch, t, s, act):
    """peft's LoRA'd linear, unfused: base + scaling * lora_B(lora_A(x) * codes), then act"""
    F = torch.nn.functional
    x, a, b = t["x"], t["a"], t["b"]
    y = F.linear(x, t["w"], t["bias"])
    for q in range(a.shape[0] if a.dim() == 3 else 1):
        aq, bq = (a[q], b[q]) if a.dim() == 3 else (a, b)
        h = F.linear(x, aq) * t["codes"]
        if t["ids"] is not None:
            h = h * (t["ids"] == q)[:, None].to(h.dtype)
        y = y + F.linear(h, bq) * s
    return {"none": lambda z: z, "relu": F.relu, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh"),
            "gelu": F.gelu, "silu": F.silu}[act](y)


def fused_lora(t, s, act):
    return fusedk.linear_lowrank(t["x"], fusedk.lowrank_prepare(t["w"], t["b"], s), t["a"], t["bias"], t["codes"],
                                 act, adapter_ids=t["ids"])


def grads_of(torch, f, t, keys=("x", "a", "b", "bias", "codes")):
    for k in keys:
        t[k].grad = None
    (f(t) * t["dy"]).sum().backward()
    return [t[k].grad for k in keys]


@pytest.mark.parametrize("act", ACTS)
@pytest.mark.parametrize("A,ids", [(0, False), (3, True), (2, False)], ids=str)
def test_torch_cpu_autograd_eager_and_compile(A, ids, act):
    """fusedk.linear_lowrank(x, lowrank_prepare(w, b, s), a, bias, codes) under autograd: x, a, b,
    bias and codes get PyTorch's own chain's gradients, eager and under torch.compile(fullgraph)"""
    torch = pytest.importorskip("torch")
    torch._dynamo.reset()  # one lambda's code for every parametrization: past the recompile limit otherwise
    t = torch_lora_case(torch, A=A, ids=ids, act=act)
    want = grads_of(torch, lambda t: torch_chain(torch, t, 0.5, act), t)
    got = grads_of(torch, lambda t: fused_lora(t, 0.5, act), t)
    f = torch.compile(lambda x, w, a, b, bias, c, ids: fusedk.linear_lowrank(
        x, fusedk.lowrank_prepare(w, b, 0.5), a, bias, c, act, adapter_ids=ids), fullgraph=True)
    comp = grads_of(torch, lambda t: f(t["x"], t["w"], t["a"], t["b"], t["bias"], t["codes"], t["ids"]), t)
    for k, w_, g, c in zip(("x", "a", "b", "bias", "codes"), want, got, comp):
        torch.testing.assert_close(g, w_, rtol=2e-5, atol=2e-5, msg=lambda m: f"{k} eager: {m}")
        torch.testing.assert_close(c, g, rtol=1e-6, atol=1e-6, msg=lambda m: f"{k} compiled: {m}")


def test_torch_cpu_lowrank_update_autograd():
    """fusedk.lowrank_update(x, v, u_t, codes, scaling, y, beta): x, v, u_t, codes and y get the
    chain's gradients (y's: beta dout), eager and compiled"""
    torch = pytest.importorskip("torch")
    g = torch.Generator().manual_seed(3)
    x, v, u, c, y, dout = (torch.randn(*s, generator=g) for s in ((2, 6, 16), (16, 5), (5, 12), (2, 6, 5), (2, 6, 12),
                                                                    (2, 6, 12)))
    ts = [x, v, u, c, y]
    for t in ts:
        t.requires_grad_(True)

    def run(f):
        for t in ts:
            t.grad = None
        (f(*ts) * dout).sum().backward()
        return [t.grad for t in ts]

    want = run(lambda x, v, u, c, y: 0.5 * y + 0.75 * ((x @ v) * c) @ u)
    got = run(lambda x, v, u, c, y: fusedk.lowrank_update(x, v, u, c, 0.75, y=y, beta=0.5))
    comp = run(torch.compile(lambda x, v, u, c, y: fusedk.lowrank_update(x, v, u, c, 0.75, y=y, beta=0.5),
                             fullgraph=True))
    for w_, g_, c_ in zip(want, got, comp):
        torch.testing.assert_close(g_, w_, rtol=2e-5, atol=2e-5)
        torch.testing.assert_close(c_, g_, rtol=1e-6, atol=1e-6)


def test_torch_frozen_base_weight():
    """w (the base weight) requiring grad: the backward says it is frozen rather than give zeros"""
    torch = pytest.importorskip("torch")
    t = torch_lora_case(torch, act="none")
    t["w"].requires_grad_(True)
    with pytest.raises(RuntimeError, match="frozen base weight"):
        (fused_lora(t, 0.5, "none") * t["dy"]).sum().backward()


def test_jax_cpu_grad_and_jit():
    """jax.grad through fusedk.jax's custom_vjp (jit too): the LoRA's x, a, b, bias, codes and
    lowrank_update's inputs get JAX's own chain's cotangents"""
    jax = pytest.importorskip("jax")
    import jax.numpy as jnp

    import fusedk.jax as fkj
    cpu = jax.devices("cpu")[0]
    K, N, r, A, M = 16, 20, 4, 2, 12
    x, w, a, b, bias, c, dy = (jax.device_put(rand(s, np.float32, 0.5), cpu) for s in
                               ((M, K), (N, K), (A, r, K), (A, N, r), (N,), (M, r), (M, N)))
    ids = jax.device_put(np.arange(M, dtype=np.int32) % (A + 1) - 1, cpu)

    def chain(x, a, b, bias, c):
        y = x @ w.T + bias
        for q in range(A):
            y = y + (((x @ a[q].T) * c) * (ids == q)[:, None]) @ b[q].T * 0.5
        return jnp.sum(jax.nn.gelu(y, approximate=True) * dy)

    def fused(x, a, b, bias, c):
        return jnp.sum(fkj.linear_lowrank(x, fkj.lowrank_prepare(w, b, 0.5), a, bias, c, "gelu_tanh",
                                          adapter_ids=ids) * dy)

    want = jax.grad(chain, argnums=(0, 1, 2, 3, 4))(x, a, b, bias, c)
    for f in (jax.grad(fused, argnums=(0, 1, 2, 3, 4)), jax.jit(jax.grad(fused, argnums=(0, 1, 2, 3, 4)))):
        for g, w_ in zip(f(x, a, b, bias, c), want):
            np.testing.assert_allclose(np.asarray(g), np.asarray(w_), rtol=2e-5, atol=2e-5)
    v, u = jax.device_put(rand((K, r), np.float32), cpu), jax.device_put(rand((r, N), np.float32), cpu)
    lw = jax.grad(lambda x, v, u, c, y: jnp.sum((0.5 * y + 0.75 * ((x @ v) * c) @ u) * dy), argnums=(0, 1, 2, 3, 4))
    lf = jax.grad(lambda x, v, u, c, y: jnp.sum(fkj.lowrank_update(x, v, u, c, 0.75, y=y, beta=0.5) * dy),
                  argnums=(0, 1, 2, 3, 4))
    for g, w_ in zip(jax.jit(lf)(x, v, u, c, dy), lw(x, v, u, c, dy)):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w_), rtol=2e-5, atol=2e-5)


# --- the GPU kernels, through torch ------------------------------------------------------------
torch, _gpu = oracle.torch_cuda()
needs_gpu = pytest.mark.skipif(not _gpu, reason="no CUDA device, torch or fusedk GPU half")


@needs_gpu
@pytest.mark.parametrize("dtype", ["float32", "float16", "bfloat16"])
@pytest.mark.parametrize("M,K,r,N,A,ids,act", [(1, 8, 1, 8, 0, False, "none"), (130, 200, 7, 136, 0, False, "relu"),
                                               (300, 768, 8, 768, 0, False, "none"),
                                               (77, 1000, 12, 4095, 2, True, "gelu_tanh"),
                                               (500, 512, 16, 520, 4, False, "silu"),
                                               (257, 1024, 128, 1032, 0, False, "gelu")], ids=str)
def test_gpu_linear_lowrank_backward(M, K, r, N, A, ids, act, dtype):
    """every gradient of the GPU backward against the float64 oracle: float32 accumulation, dh and
    scaling g rounded once each to the dtype (two ulps of the bound), dz's act' an ulp either way"""
    t = torch_lora_case(torch, getattr(torch, dtype), "cuda", M, K, r, N, A, act, ids)
    w_cat = fusedk.lowrank_prepare(t["w"].detach(), t["b"].detach(), 1.5)
    d = {k: (v.detach() if v is not None else None) for k, v in t.items()}
    y, z = fusedk.linear_lowrank(d["x"], w_cat, d["a"], d["bias"], d["codes"], act, adapter_ids=d["ids"], aux=True)
    dx, da, db, dc, dbias = fusedk.linear_lowrank_backward(d["dy"], d["x"], w_cat, d["a"], d["codes"], d["ids"],
                                                           z if act != "none" else None, act, 1.5, dbias=True)
    n = {k: (oracle.np_of(v) if v is not None else None) for k, v in d.items()}
    ps, qs = lora_factors(oracle.np_of(w_cat), n["a"], K)
    dt = np.asarray(n["x"]).dtype
    want = oracle.lowrank_grad(n["dy"], n["x"], ps, qs, n["codes"], n["ids"], 1.5, f64(oracle.np_of(w_cat))[:, :K],
                               oracle.np_of(z), act, dt)
    g1 = 1.0 if act in ("none", "relu") else 1.13
    ab = np.abs
    bound = oracle.lowrank_grad(ab(f64(n["dy"])) * g1, ab(f64(n["x"])), [ab(p) for p in ps], [ab(q) for q in qs],
                                ab(f64(n["codes"])), n["ids"], 1.5, ab(f64(oracle.np_of(w_cat)))[:, :K])
    e = 2 * EPS[dt] + (EPS[dt] if act != "none" else 0.0)
    what = f"M{M} K{K} r{r} N{N} A{A} ids={ids} {act} {dtype}"
    close(dx, want[0], bound[0], dt, what + " dx", e * bound[0], gpu=True)
    wa = np.stack([p.T for p in want[1]]).reshape(da.shape)
    ba = np.stack([p.T for p in bound[1]]).reshape(da.shape)
    close(da, wa, ba, dt, what + " da", e * ba, gpu=True)
    wb, bb = np.stack(want[2]).reshape(db.shape), np.stack(bound[2]).reshape(db.shape)
    close(db, wb, bb, dt, what + " db", e * bb, gpu=True)
    close(dc, want[3], bound[3], dt, what + " dcodes", e * bound[3], gpu=True)
    close(dbias, want[4], bound[4], dt, what + " dbias", e * bound[4], gpu=True)


@needs_gpu
@pytest.mark.parametrize("dtype", ["float16", "bfloat16"])
def test_gpu_training_step_against_torch_autograd(dtype):
    """a LoRA'd Flux-width layer's gradients through fusedk.torch (eager and compiled) against
    PyTorch autograd of peft's unfused chain, both against float64: no larger an error"""
    dt = getattr(torch, dtype)
    t = torch_lora_case(torch, dt, "cuda", 512, 3072, 32, 1024, 0, "gelu_tanh")
    got = grads_of(torch, lambda t: fused_lora(t, 2.0, "gelu_tanh"), t)
    chain = grads_of(torch, lambda t: torch_chain(torch, t, 2.0, "gelu_tanh"), t)
    t64 = {k: (v.detach().double().requires_grad_(v.requires_grad) if v is not None and v.is_floating_point() else v)
           for k, v in t.items()}
    want = grads_of(torch, lambda t: torch_chain(torch, t, 2.0, "gelu_tanh"), t64)
    f = torch.compile(lambda x, w, a, b, bias, c: fusedk.linear_lowrank(
        x, fusedk.lowrank_prepare(w, b, 2.0), a, bias, c, "gelu_tanh"), fullgraph=True)
    comp = grads_of(torch, lambda t: f(t["x"], t["w"], t["a"], t["b"], t["bias"], t["codes"]), t)
    for k, g, c, ch, w_ in zip(("x", "a", "b", "bias", "codes"), got, comp, chain, want):
        e, ec = (g.double() - w_).abs(), (ch.double() - w_).abs()
        scale = w_.abs().max().item()
        print(f"{k}: fused max {e.max().item():.3e}, chain max {ec.max().item():.3e} (|grad| max {scale:.3e})")
        assert e.max() <= 2 * ec.max() + 1e-6 * scale, k
        assert torch.equal(c, g), k
