"""Property tests (hypothesis) of the norm, elementwise and rope ops through the NumPy path: generated
row shapes (B and L of size 0 and 1, D from 1 up, not a multiple of 8), views (strided rows,
negative row strides, per-sample vectors broadcast or taken from a [B, 6D] modulation), every
dtype, float32 modulations beside 16-bit rows, a byte-swapped argument, in-place out=. Each
result is within one unit in the last place of the float64 oracle (the ops' documented bound),
or the call is refused with the right type (a byte-swapped array: DTypeError, nothing written).
FUSEDK_HYPOTHESIS_EXAMPLES (default 1000) examples an op."""
import os

import numpy as np
import pytest

import fusedk
import oracle
from oracle import DTYPES, assert_close

hypothesis = pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, given, settings  # noqa: E402
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


def act_of(x, kind):
    """oracle.act, which takes no empty arrays (np.vectorize)"""
    return oracle.act(x, kind) if x.size else np.zeros(x.shape)


def run(case, fn, args, want, **close):
    """fn(*args) against want(); with one argument byte-swapped (case.swap) a DTypeError instead,
    naming a big- or little-endian dtype, and nothing written to an out= array."""
    if case.swap < len(args) and args[case.swap] is not None and args[case.swap].dtype.itemsize > 1 \
            and args[case.swap].dtype != oracle.BF16:
        bad = list(args)
        bad[case.swap] = args[case.swap].astype(args[case.swap].dtype.newbyteorder("S"))
        with pytest.raises(fusedk.DTypeError, match="-endian"):
            fn(*bad)
        return
    ref = want()  # before the call: out= may be an input
    got = fn(*args)
    assert got.shape == ref.shape and got.dtype == case.dt
    assert_close(got, ref, case.dt, **close)


@pytest.mark.parametrize("layer", [False, True], ids=["rmsnorm", "layernorm"])
@SETTINGS
@given(cases(), st.booleans())
def test_rmsnorm_and_layernorm(layer, c, weighted):
    x, w, b = c.rows(), c.col(mean=1.0) if weighted else None, c.col() if weighted else None
    if layer:
        run(c, lambda x, w, b: fusedk.layernorm(x, w, b), (x, w, b), lambda: oracle.layernorm(x, w, b))
    else:
        run(c, lambda x, w: fusedk.rmsnorm(x, w), (x, w), lambda: oracle.rmsnorm(x, w)[0])


@SETTINGS
@given(cases(), st.sampled_from(["layer", "rms"]), st.booleans())
def test_adaln(c, norm, f32_mod):
    mdt = np.dtype(np.float32) if f32_mod else c.dt
    x, sc, sh = c.rows(), c.vec(mdt), c.vec(mdt)
    run(c, lambda x, sc, sh: fusedk.adaln(x, sc, sh, norm=norm), (x, sc, sh),
        lambda: oracle.adaln(x, sc, sh, norm))


@SETTINGS
@given(cases())
def test_residual_tanh_gated_rmsnorm(c):
    x, xr, g = c.rows(), c.rows(2.0), c.vec()
    run(c, lambda x, xr, g: fusedk.residual_tanh_gated_rmsnorm(x, xr, g, exact=False), (x, xr, g),
        lambda: oracle.mochi(x, xr, g), aux=x)


@SETTINGS
@given(cases(), st.sampled_from(["gelu", "gelu_tanh", "silu", "relu"]), st.booleans())
def test_act(c, kind, in_place):
    x = c.rows(3.0)
    run(c, lambda x: fusedk.act(x, kind, out=x if in_place else None), (x,), lambda: act_of(x, kind))


@pytest.mark.parametrize("gated", [False, True], ids=["silu_fma", "gated_residual"])
@SETTINGS
@given(cases())
def test_silu_fma_and_gated_residual(gated, c):
    if gated:
        x, y, g = c.rows(), c.rows(), c.vec(np.dtype(np.float32) if c.swap == 7 else None)
        run(c, lambda x, y, g: fusedk.gated_residual(x, y, g, out=x), (x, y, g),
            lambda: oracle.gated_residual(x, y, g))
    else:
        a, b, d = c.rows(), c.rows(), c.rows()
        run(c, lambda a, b, d: fusedk.silu_fma(a, b, d), (a, b, d), lambda: oracle.silu_fma(a, b, d))


@pytest.mark.parametrize("pair", [False, True], ids=["glu", "glu_pair"])
@SETTINGS
@given(cases(), st.sampled_from(["silu", "gelu", "gelu_tanh", "relu"]), st.sampled_from(["first", "second"]))
def test_glu(pair, c, kind, half):
    if pair:
        v, g = c.rows(), c.rows()
        run(c, lambda v, g: fusedk.glu_pair(v, g, kind), (v, g), lambda: oracle.f64(v) * act_of(g, kind))
    else:
        x = c.rows(D=2 * c.D)
        a, b = np.split(oracle.f64(x), 2, axis=-1)
        run(c, lambda x: fusedk.glu(x, kind, half), (x,),
            lambda: act_of(a, kind) * b if half == "first" else a * act_of(b, kind))


@SETTINGS
@given(st.sampled_from(DTYPES), st.integers(0, 2), st.integers(0, 6), st.integers(1, 3), st.integers(1, 3),
       st.integers(1, 20), st.integers(0, 40), st.sampled_from(["interleaved", "half"]), st.booleans(),
       st.integers(0, 4), st.integers(0, 2 ** 32 - 1))
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
    args = [q, k, cos, sin]
    if swap < 4 and args[swap].dtype != oracle.BF16:
        args[swap] = args[swap].astype(args[swap].dtype.newbyteorder("S"))
        with pytest.raises(fusedk.DTypeError, match="-endian"):
            fusedk.rope(*args, style=style, rotary_dim=R)
        return
    want_q, want_k = oracle.rope(q, cos, sin, style, R), oracle.rope(k, cos, sin, style, R)
    q2, k2 = fusedk.rope(q, k, cos, sin, style=style, rotary_dim=R, inplace=swap == 4)
    assert q2.shape == q.shape and k2.shape == k.shape and q2.dtype == dt
    assert_close(q2, want_q, dt, what="rope q")
    assert_close(k2, want_k, dt, what="rope k")
