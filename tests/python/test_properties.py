"""Property tests (hypothesis) of every op through the NumPy path: generated shapes (B and L of
size 0 and 1, D from 1 up, not a multiple of 8; GEMMs with M = 0 or K = 0), views (strided rows,
negative row strides, broadcast inputs, per-sample vectors taken from a [B, 6D] modulation,
heads inside a packed projection), every dtype, float32 modulations beside 16-bit rows, every
enum, a byte-swapped argument, in-place out=. Each result is within the op's documented bound
of the float64 oracle (one unit in the last place for the row ops; the GEMM bound of
test_linear.py), or the call is refused with the right type (a byte-swapped array:
DTypeError). With a CUDA device, each example also runs through torch and CuPy on the GPU, with
the same views (torch: negative strides copied compact), against the NumPy path's result.
FUSEDK_HYPOTHESIS_EXAMPLES (default 1000) examples an op; --hypothesis-show-statistics counts
each outcome."""
import os

import numpy as np
import pytest

import fusedk
import oracle
from oracle import DTYPES, assert_close

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, event, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

SETTINGS = settings(max_examples=int(os.environ.get("FUSEDK_HYPOTHESIS_EXAMPLES", "1000")), deadline=None,
                    database=None, suppress_health_check=[HealthCheck.too_slow])


class Case:
    """One generated call's data: a dtype, rows [B, L, D] and how each array is laid out."""

    def __init__(self, draw):
        self.dt = draw(st.sampled_from(DTYPES))
        self.B, self.L = draw(st.integers(0, 3)), draw(st.integers(0, 5))
        self.D = draw(st.integers(1, 40) | st.sampled_from([64, 127, 1000, 3072]))
        self.rows_view = draw(st.sampled_from(["compact", "strided", "reversed"]))
        self.vec_view = draw(st.sampled_from(["compact", "modulation", "broadcast"]))
        self.swap = draw(st.integers(0, 7))  # < argument count: that argument byte-swapped
        self.rng = np.random.default_rng(draw(st.integers(0, 2 ** 32 - 1)))

    def rows(self, scale=1.0, D=None):
        B, L, D = self.B, self.L, D or self.D
        a = (scale * self.rng.standard_normal((B, 2 * L + 1, D + 3))).astype(self.dt)
        if self.rows_view == "strided":
            return a[:, 1::2, :D]
        if self.rows_view == "reversed":
            return a[:, L - 1::-1, :D] if L else a[:, :0, :D]
        return np.ascontiguousarray(a[:, :L, :D])

    def vec(self, dt=None, scale=0.5):
        dt = dt or self.dt
        m = (scale * self.rng.standard_normal((max(self.B, 1), 6 * self.D))).astype(dt)
        if self.vec_view == "modulation":
            return m[:self.B, 2 * self.D:3 * self.D]
        if self.vec_view == "broadcast" and self.B:
            return np.broadcast_to(m[:1, :self.D], (self.B, self.D))
        return np.ascontiguousarray(m[:self.B, :self.D])

    def col(self, scale=0.2, mean=0.0):
        return (mean + scale * self.rng.standard_normal(self.D)).astype(self.dt)


cases = st.composite(lambda draw: Case(draw))


def swappable(a):
    """an array NumPy can byte-swap (ml_dtypes' bfloat16 has one byte order)"""
    return isinstance(a, np.ndarray) and a.dtype.itemsize > 1 and a.dtype != oracle.BF16


def swapped(a):
    return a.astype(a.dtype.newbyteorder("S"))


def results(r):
    return r if isinstance(r, tuple) else (r,)


# --- the same calls through torch and CuPy on a GPU, against the NumPy path's result -------------
FRAMEWORKS = oracle.gpu_frameworks()  # none without a CUDA device


def device_view(fw, to_device, a):
    """a (a NumPy view: zero, negative, padded strides) on fw's device viewed the same way: the bytes
    a spans copied over, then its shape and strides on them. torch has no negative strides: a
    compact copy there. None where fw lacks a's dtype (CuPy: bfloat16)."""
    if not isinstance(a, np.ndarray):
        return a
    if a.size == 0 or (fw == "torch" and min(a.strides, default=0) < 0):
        return to_device(np.array(a, order="C"))  # a fresh array: no negative strides, even of size-1 dims
    item = a.itemsize
    low = tuple(slice(n - 1, n) if s < 0 else slice(0, 1) for s, n in zip(a.strides, a.shape))
    span = 1 + sum(abs(s) * (n - 1) for s, n in zip(a.strides, a.shape)) // item
    buf = to_device(np.lib.stride_tricks.as_strided(a[low], (span,), (item,)).copy())
    if buf is None:
        return None
    first = sum(-s * (n - 1) for s, n in zip(a.strides, a.shape) if s < 0) // item  # a[0, ..., 0] in buf
    if fw == "torch":
        return buf.as_strided(a.shape, [s // item for s in a.strides], first)
    import cupy
    return cupy.ndarray(a.shape, a.dtype, buf.data + first * item, a.strides)


def on_devices(args):
    """[(framework, args on its device, to_host)] for each framework that has every argument's dtype"""
    out = []
    for fw, to_device, to_host, _ in FRAMEWORKS:
        dargs = [device_view(fw, to_device, a) for a in args]
        if all(d is not None or a is None for a, d in zip(args, dargs)):
            out.append((fw, dargs, to_host))
    return out


def run(dt, swap, fn, args, want, check=None, gpu_check=None, aux=None, devices=True):
    """fn(*args) against want() (the float64 oracle: a result or a tuple), each output i of dtype
    dt (or dt[i]) within check(got, want, i) (default: one ulp of dt, aux its extra terms); with argument
    `swap` byte-swapped a DTypeError instead, naming a big- or little-endian dtype. With a GPU, fn
    on each framework's copy of args too, against the NumPy path's result within
    gpu_check(got, ref, i, framework) (default: one GPU ulp, oracle.assert_close_gpu); devices=False:
    the NumPy path alone (an op without its GPU kernel yet)."""
    if swap < len(args) and swappable(args[swap]):
        bad = list(args)
        bad[swap] = swapped(args[swap])
        with pytest.raises(fusedk.DTypeError, match="-endian"):
            fn(*bad)
        event("refused: a byte-swapped argument")
        return
    check = check or (lambda got, want, i: assert_close(got, want, dt, aux, f"output {i}"))
    gpu_check = gpu_check or (lambda got, ref, i, fw: oracle.assert_close_gpu(got, ref, dt, aux, f"{fw} output {i}"))
    ref = want()  # before the calls: out= may be an input
    devices = on_devices(args) if devices else []
    got = results(fn(*args))
    for i, (g, w) in enumerate(zip(got, results(ref), strict=True)):
        assert (g is None) == (w is None)
        if g is not None:
            assert g.shape == w.shape and g.dtype == (dt[i] if isinstance(dt, tuple) else dt), (i, g.shape, g.dtype)
            check(g, w, i)
    event("NumPy: checked against the oracle")
    for fw, dargs, to_host in devices:
        for i, (d, g) in enumerate(zip(results(fn(*dargs)), got, strict=True)):
            assert (d is None) == (g is None)
            if d is not None:
                assert tuple(d.shape) == g.shape, (fw, i, d.shape, g.shape)
                gpu_check(to_host(d), g, i, fw)
        event(f"{fw}: checked against the NumPy path")


@pytest.mark.parametrize("layer", [False, True], ids=["rmsnorm", "layernorm"])
@SETTINGS
@given(cases(), st.booleans(), st.sampled_from([None, "residual", "residual in place"]))
def test_rmsnorm_and_layernorm(layer, c, weighted, residual):
    """layernorm; rmsnorm alone or with the fused residual (y, r = x + residual), r written to
    residual_out=residual in place or returned"""
    x, w, b = c.rows(), c.col(mean=1.0) if weighted else None, c.col() if weighted else None
    if layer:
        run(c.dt, c.swap, lambda x, w, b: fusedk.layernorm(x, w, b), (x, w, b), lambda: oracle.layernorm(x, w, b))
    elif residual:
        r, in_place = c.rows(), residual == "residual in place"
        run(c.dt, c.swap, lambda x, w, r: fusedk.rmsnorm(x, w, residual=r, residual_out=r if in_place else None),
            (x, w, r), lambda: oracle.rmsnorm(x, w, residual=r))
    else:
        run(c.dt, c.swap, lambda x, w: fusedk.rmsnorm(x, w), (x, w), lambda: oracle.rmsnorm(x, w)[0])


@SETTINGS
@given(cases(), st.sampled_from(["layer", "rms"]), st.booleans())
def test_adaln(c, norm, f32_mod):
    mdt = np.dtype(np.float32) if f32_mod else c.dt
    x, sc, sh = c.rows(), c.vec(mdt), c.vec(mdt)
    run(c.dt, c.swap, lambda x, sc, sh: fusedk.adaln(x, sc, sh, norm=norm), (x, sc, sh),
        lambda: oracle.adaln(x, sc, sh, norm))


@SETTINGS
@given(cases())
def test_residual_tanh_gated_rmsnorm(c):
    x, xr, g = c.rows(), c.rows(2.0), c.vec()
    run(c.dt, c.swap, lambda x, xr, g: fusedk.residual_tanh_gated_rmsnorm(x, xr, g, exact=False), (x, xr, g),
        lambda: oracle.mochi(x, xr, g), aux=x)


@SETTINGS
@given(cases(), st.sampled_from(["gelu", "gelu_tanh", "silu", "relu"]), st.booleans())
def test_act(c, kind, in_place):
    x = c.rows(3.0)
    run(c.dt, c.swap, lambda x: fusedk.act(x, kind, out=x if in_place else None), (x,), lambda: oracle.act(x, kind))


@pytest.mark.parametrize("gated", [False, True], ids=["silu_fma", "gated_residual"])
@SETTINGS
@given(cases())
def test_silu_fma_and_gated_residual(gated, c):
    if gated:
        x, y, g = c.rows(), c.rows(), c.vec(np.dtype(np.float32) if c.swap == 7 else None)
        run(c.dt, c.swap, lambda x, y, g: fusedk.gated_residual(x, y, g, out=x), (x, y, g),
            lambda: oracle.gated_residual(x, y, g))
    else:
        a, b, d = c.rows(), c.rows(), c.rows()
        run(c.dt, c.swap, lambda a, b, d: fusedk.silu_fma(a, b, d), (a, b, d), lambda: oracle.silu_fma(a, b, d))


@pytest.mark.parametrize("pair", [False, True], ids=["glu", "glu_pair"])
@SETTINGS
@given(cases(), st.sampled_from(["silu", "gelu", "gelu_tanh", "relu"]), st.sampled_from(["first", "second"]))
def test_glu(pair, c, kind, half):
    if pair:
        v, g = c.rows(), c.rows()
        run(c.dt, c.swap, lambda v, g: fusedk.glu_pair(v, g, kind), (v, g), lambda: oracle.f64(v) * oracle.act(g, kind))
    else:
        x = c.rows(D=2 * c.D)
        a, b = np.split(oracle.f64(x), 2, axis=-1)
        run(c.dt, c.swap, lambda x: fusedk.glu(x, kind, half), (x,),
            lambda: oracle.act(a, kind) * b if half == "first" else a * oracle.act(b, kind))


@SETTINGS
@given(st.sampled_from(DTYPES), st.integers(0, 2), st.integers(0, 6), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 20), st.integers(0, 40), st.sampled_from(["interleaved", "half"]), st.booleans(),
       st.integers(0, 9), st.integers(0, 2 ** 32 - 1))
def test_rope(dt, B, S, Hq, Hk, half, cut, style, strided, swap, seed):
    """q [B, S, Hq, Dh] and k (GQA heads), Dh = 2 * half, rotary_dim R <= Dh (even), float32
    [S, R/2] tables, heads strided inside a wider buffer or compact; in place or not."""
    rng = np.random.default_rng(seed)
    Dh = 2 * half
    R = Dh - 2 * (cut % half) if cut % 2 else Dh
    heads = lambda H: rng.standard_normal((B, S, H + (2 if strided else 0), Dh)).astype(dt)[:, :, :H]  # noqa: E731
    q, k = heads(Hq), heads(Hk)
    ang = rng.uniform(-4, 4, (S, R // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    run(dt, swap, lambda q, k, c, s: fusedk.rope(q, k, c, s, style=style, rotary_dim=R, inplace=swap >= 7),
        (q, k, cos, sin), lambda: (oracle.rope(q, cos, sin, style, R), oracle.rope(k, cos, sin, style, R)))


@SETTINGS
@given(st.data())
def test_qk_norm_rope(data):
    """packed [B, S, 3, H, Dh] or (q, k, v) / (q, k, None) with GQA heads, Dh odd or even, rotary_dim
    R <= Dh, every table shape, norm head / full / none with or without weights, both layouts,
    heads strided inside a wider buffer, in place (BSHD)."""
    d = data.draw
    dt, B, S, Hk = d(st.sampled_from(DTYPES)), d(st.integers(0, 2)), d(st.integers(0, 5)), d(st.integers(1, 3))
    form = d(st.sampled_from(["packed", "tuple", "no-v"]))
    Hq = Hk if form == "packed" else d(st.integers(1, 4))
    Dh = d(st.integers(2, 24) | st.sampled_from([64, 128]))
    R = 2 * d(st.integers(1, Dh // 2))
    kind = d(st.sampled_from(["SR", "S1R", "BS1R"] + (["SHR", "BSHR"] if Hq == Hk else [])))
    norm, weighted = d(st.sampled_from(["head", "full", "none"])), d(st.booleans())
    style, layout, eps = d(st.sampled_from(["interleaved", "half"])), d(st.sampled_from(["bhsd", "bshd"])), \
        d(st.sampled_from([1e-6, 1e-5, 0.5]))
    pad, swap = d(st.integers(0, 2)), d(st.integers(0, 13))
    in_place = form != "packed" and layout == "bshd" and d(st.booleans())
    rng = np.random.default_rng(d(st.integers(0, 2 ** 32 - 1)))
    normal = lambda *shape: (0.3 + 2.0 * rng.standard_normal(shape)).astype(dt)  # noqa: E731
    ang = rng.uniform(-4, 4, oracle.table_shape(kind, B, S, Hq, R // 2))
    cos, sin = np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)
    wlen = lambda H: Dh if norm == "head" else H * Dh  # noqa: E731
    qw, kw = (normal(wlen(Hq)), normal(wlen(Hk))) if weighted and norm != "none" else (None, None)
    if form == "packed":
        qkv = normal(B, S, 3, Hq + pad, Dh + pad)[:, :, :, :Hq, :Dh]
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
        args, call = (qkv, cos, sin, qw, kw), lambda qkv, *rest: fusedk.qk_norm_rope(qkv, *rest, **kw_)
    else:
        q, k = normal(B, S, Hq + pad, Dh + pad)[:, :, :Hq, :Dh], normal(B, S, Hk + pad, Dh)[:, :, :Hk]
        v = normal(B, S, Hk, Dh + pad)[..., :Dh] if form == "tuple" else None
        args = (q, k, v, cos, sin, qw, kw)
        call = lambda q, k, v, *rest: fusedk.qk_norm_rope((q, k, v), *rest, **kw_,  # noqa: E731
                                                          out=(q, k, v) if in_place else None)
    kw_ = dict(eps=eps, norm=norm, style=style, layout=layout, rotary_dim=R)
    run(dt, swap, call, args, lambda: oracle.qk_norm_rope(q, k, v, cos, sin, qw, kw, **kw_))


def as_given(form, a):
    """a float32 NumPy table input as a caller may pass it: float64, integer (truncated), another
    byte order, a strided view, a list; or itself (a device array on the GPU: itself)"""
    if not isinstance(a, np.ndarray):
        return a
    return {"float32": lambda: a, "float64": lambda: a.astype(np.float64), "int": lambda: a.astype(np.int64),
            "swapped": lambda: swapped(a), "strided": lambda: np.stack([a, a], -1)[..., 0],
            "list": lambda: a.tolist() if a.size else a}[form]()


@pytest.mark.parametrize("builder", ["1d", "axes", "ltx", "mixed"])
@SETTINGS
@given(st.data())
def test_rope_tables(builder, data):
    """each builder over generated sizes, thetas and inputs in every form as_given makes, against
    the float64 oracle of the float32 values the C op sees; the float32 tables within one ulp"""
    d = data.draw
    S, form = d(st.integers(0, 40)), d(st.sampled_from(["float32", "float64", "int", "swapped", "strided", "list"]))
    rng = np.random.default_rng(d(st.integers(0, 2 ** 32 - 1)))
    theta = float(np.float32(d(st.sampled_from([10000.0, 500000.0, 256.0]) | st.floats(2.0, 1e6))))
    evenly = lambda lo, hi: 2 * d(st.integers(lo, hi))  # noqa: E731
    if builder == "1d":
        dim = evenly(1, 128)
        ins, fn = (rng.uniform(-64, 4096, S).astype(np.float32),), lambda p: fusedk.rope_table_1d(p, dim, theta)
        want = lambda p: oracle.rope_table_1d(p, dim, theta)  # noqa: E731
    elif builder == "axes":
        axes = tuple(evenly(1, 32) for _ in range(d(st.integers(1, 4))))
        ins, fn = (rng.uniform(-64, 512, (S, len(axes))).astype(np.float32),), \
            lambda ids: fusedk.rope_table_axes(ids, axes, theta)
        want = lambda ids: oracle.rope_table_axes(ids, axes, theta)  # noqa: E731
    elif builder == "ltx":
        dim = evenly(1, 150)
        ins, fn = (rng.uniform(-0.2, 1.2, (S, 3)).astype(np.float32),), lambda c: fusedk.rope_table_ltx(c, dim, theta)
        want = lambda c: oracle.rope_table_ltx(c, dim, theta)  # noqa: E731
    else:
        H, F = d(st.integers(1, 4)), d(st.integers(1, 16))
        ins, fn = (rng.uniform(0, 64, (S, 3)).astype(np.float32), rng.uniform(-0.5, 0.5, (3, H, F)).astype(
            np.float32)), fusedk.rope_table_mixed
        want = oracle.rope_table_mixed
    seen = tuple(np.ascontiguousarray(as_given(form, a), np.float32) for a in ins)  # the values C reads (the GPU's input)
    run(np.dtype(np.float32), len(ins), lambda *a: fn(*[as_given(form, x) for x in a]), seen, lambda: want(*seen))


@SETTINGS
@given(cases(), st.sampled_from(["euler", "ddim"]), st.booleans(), st.booleans(), st.booleans(), st.data())
def test_diffusion_step(c, sampler, cfg, with_prev, in_place, data):
    """x [B, L, D] views, cond broadcast over L or not, guidance with uncond, prev with a blend,
    Euler or DDIM with generated coefficients and a clamp, in place (out=x)"""
    d = data.draw
    unit = lambda lo=0.0, hi=1.0: d(st.floats(lo, hi))  # noqa: E731
    x, cond = c.rows(2.0), c.rows()
    if c.vec_view == "broadcast":
        cond = np.broadcast_to(cond[:, :1], cond.shape) if c.L else cond
    uncond, prev = c.rows() if cfg else None, c.rows() if with_prev else None
    kw = dict(guidance=unit(-2.0, 15.0) if cfg else 1.0, blend=unit(-0.5, 1.5) if with_prev else 1.0,
              sampler=sampler)
    if sampler == "euler":
        kw.update(sigma=unit(), sigma_next=unit())
    else:
        kw.update(alpha_bar=unit(1e-3), alpha_bar_prev=unit(), clamp_x0=d(st.none() | st.floats(0.5, 5.0)))
    run(c.dt, c.swap, lambda x, cond, uncond, prev: fusedk.diffusion_step(x, cond, uncond, prev=prev,
                                                                        out=x if in_place else None, **kw),
        (x, cond, uncond, prev), lambda: oracle.diffusion_step(x, cond, uncond, prev=prev, **kw),
        aux=oracle.step_aux(x, cond, uncond, prev=prev, **kw))


LINEAR_ACTS = ["none", "relu", "gelu_tanh", "gelu", "silu"]


def gemm_checks(dt, sums, extras, gpu_sums, gpu_extras):
    """(check, gpu_check) for run: output i within oracle.gemm_close of S1 = sums[i] (the sum of
    |terms|) and extras[i] (rounding flips the two sides may differ by); on the GPU gpu_sums[i]
    and gpu_extras[i] (tests/python/test_linear.py's GPU bounds)"""
    return (lambda got, want, i: oracle.gemm_close(got, want, dt, sums[i], f"output {i}", extras[i]),
            lambda got, ref, i, fw: oracle.gemm_close(got, ref, dt, gpu_sums[i], f"{fw} output {i}", gpu_extras[i],
                                                      gpu=True))


@SETTINGS
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), min_size=0, max_size=2), st.integers(1, 40),
       st.integers(0, 70), st.sampled_from(LINEAR_ACTS), st.booleans(), st.booleans(), st.integers(0, 7),
       st.integers(0, 2 ** 32 - 1))
def test_linear(dt, lead, N, K, act, with_bias, padded, swap, seed):
    """y, z = linear(x, w, bias, act, aux=True): x [*lead, K] (lead of 0 to 2 dims, sizes 0 up),
    rows and w padded inside wider buffers or compact, K = 0 too"""
    rng, lead = np.random.default_rng(seed), tuple(lead)
    p = 3 if padded else 0
    x = rng.standard_normal(lead + (K + p,)).astype(dt)[..., :K]
    w = (rng.standard_normal((N, K + p)) / np.sqrt(max(K, 1))).astype(dt)[:, :K]
    b = (0.5 * rng.standard_normal(N)).astype(dt) if with_bias else None
    want_y, want_z = oracle.linear(x, w, b, act, dt)
    s1 = np.abs(oracle.f64(x)) @ np.abs(oracle.f64(w)).T + (0 if b is None else np.abs(oracle.f64(b)))
    # GELU and SILU act on z rounded: a flip of z's rounding moves y by an ulp of z times |act'| < 1.13
    flip = (lambda eps: 1.13 * eps[dt] * np.abs(want_z)) if act in ("gelu", "silu") else (lambda eps: 0.0)
    check, gpu_check = gemm_checks(dt, (s1, s1), (flip(oracle.EPS), 0.0), (1.13 * s1, s1), (flip(oracle.GPU_EPS), 0.0))
    run(dt, swap, lambda x, w, b: fusedk.linear(x, w, b, act=act, aux=True), (x, w, b), lambda: (want_y, want_z),
        check, gpu_check)


@SETTINGS
@given(st.sampled_from(DTYPES), st.lists(st.integers(0, 5), min_size=0, max_size=2), st.integers(1, 40),
       st.integers(0, 70), st.sampled_from(LINEAR_ACTS), st.tuples(st.booleans(), st.booleans(), st.booleans()),
       st.booleans(), st.integers(0, 9), st.integers(0, 2 ** 32 - 1))
def test_linear_backward(dt, lead, N, K, act, wanted, padded, swap, seed):
    """(dx, dw, db) = linear_backward(dy, x, w, aux, act) for any subset of the three; x and w
    padded or compact; aux the pre-activation rounded to the dtype"""
    rng, lead = np.random.default_rng(seed), tuple(lead)
    p = 3 if padded else 0
    x = rng.standard_normal(lead + (K + p,)).astype(dt)[..., :K]
    w = (rng.standard_normal((N, K + p)) / np.sqrt(max(K, 1))).astype(dt)[:, :K]
    dy = rng.standard_normal(lead + (N,)).astype(dt)
    aux = None if act == "none" else rng.standard_normal(lead + (N,)).astype(dt)
    want = oracle.linear_backward(dy, x, w, aux, act, dt)
    g = np.abs(oracle.f64(dy)) * (1.13 if act in ("gelu", "gelu_tanh", "silu") else 1.0)
    M = int(np.prod(lead))
    x2, g2 = np.abs(oracle.f64(x)).reshape(M, K), g.reshape(M, N)
    sums = ((g @ np.abs(oracle.f64(w))).reshape(x.shape), g2.T @ x2, g2.sum(0))
    rows = (N, g2.shape[0], g2.shape[0])  # terms in each output's sums
    # dz rounded to the dtype on both sides: a term whose dz lies at a rounding tie may flip
    flips = lambda k, eps: [k * eps[dt] * s / np.sqrt(max(n, 1)) if act != "none" else 0.0  # noqa: E731
                            for s, n in zip(sums, rows)]
    check, gpu_check = gemm_checks(dt, sums, flips(2, oracle.EPS), sums, flips(4, oracle.GPU_EPS))
    flags = dict(zip(("dx", "dw", "db"), wanted))
    if not any(wanted):
        assert fusedk.linear_backward(dy, x, w, aux, act=act, **flags) == (None, None, None)
        event("nothing asked for: (None, None, None)")
        return
    run(dt, swap, lambda dy, x, w, aux: fusedk.linear_backward(dy, x, w, aux, act=act, **flags), (dy, x, w, aux),
        lambda: tuple(r if f else None for r, f in zip(want, wanted)), check, gpu_check)


@SETTINGS
@given(st.data())
def test_attention(data):
    """q [B, Sq, Hq, D] and k, v [B, Sk, Hkv, D] (GQA ratios 1 to 4, sizes 0 up), compact, as
    transposed [B, H, S, D] views or as views of one packed qkv (Sq = Sk, Hq = Hkv); causal with
    Sq != Sk both ways; kv_len from 0 to Sk (outside: refused in host memory); a scale or the
    default; out and lse against the float64 oracle (oracle.attention)"""
    d = data.draw
    dt, B, Sq, Sk = d(st.sampled_from(DTYPES)), d(st.integers(0, 2)), d(st.integers(0, 9)), d(st.integers(0, 9))
    Hkv, G, D = d(st.integers(1, 3)), d(st.integers(1, 4)), d(st.integers(1, 40) | st.sampled_from([64, 128]))
    view, causal = d(st.sampled_from(["bshd", "bhsd", "packed"])), d(st.booleans())
    swap = d(st.sampled_from([0, 1, 2, 9, 9, 9]))  # q, k or v (kv_len: any int array is converted)
    scale = d(st.none() | st.floats(0.01, 2.0))
    rng = np.random.default_rng(d(st.integers(0, 2 ** 32 - 1)))
    normal = lambda *shape: rng.standard_normal(shape).astype(dt)  # noqa: E731
    if view == "packed":
        qkv = normal(B, Sq, 3, Hkv, D + 3)[..., :D]
        q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    elif view == "bhsd":
        q, k, v = (normal(B, H, S, D).transpose(0, 2, 1, 3) for H, S in ((G * Hkv, Sq), (Hkv, Sk), (Hkv, Sk)))
    else:
        q, k, v = normal(B, Sq, G * Hkv, D), normal(B, Sk, Hkv, D), normal(B, Sk, Hkv, D)
    kv_len = np.array([d(st.integers(0, k.shape[1])) for _ in range(B)], np.int32) if d(st.booleans()) else None
    # the lse of rows that see no key is -inf on both sides; every finite entry within one ulp
    check = lambda got, want, i: assert_close(got, want, dt if i == 0 else np.dtype(np.float32),  # noqa: E731
                                              what=f"output {i}", atol=1e-6, nan_ok=False)
    # GPU (float16, bfloat16): out within eps_T (|ref| + max |v|) of the NumPy path (P rounds to T
    # before P v), lse within 2^-20 (|ref| + the largest |score| possible) (float32 scores)
    vmax = float(np.abs(v.astype(np.float64)).max(initial=0.0))
    smax = (scale or D ** -0.5) * D * float(np.abs(q.astype(np.float64)).max(initial=0.0)) * \
        float(np.abs(k.astype(np.float64)).max(initial=0.0))
    gpu_check = lambda got, ref, i, fw: oracle.assert_close(  # noqa: E731
        got, ref, dt if i == 0 else np.dtype(np.float32), np.full(ref.shape, vmax if i == 0 else smax),
        f"{fw} output {i}", eps={dt: oracle.GPU_EPS[dt], np.dtype(np.float32): 2.0 ** -20}, atol=1e-5)
    run((dt, np.dtype(np.float32)), swap, lambda q, k, v, n: fusedk.attention(q, k, v, scale=scale, causal=causal, kv_len=n,
                                                      return_lse=True),
        (q, k, v, kv_len), lambda: oracle.attention(q, k, v, scale, causal, kv_len), check=check, gpu_check=gpu_check,
        devices=dt != np.float32)
