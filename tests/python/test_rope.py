"""[rope] rope (interleaved and half rotation of q/k by float32 half tables) and the table
builders rope_table_1d, rope_table_axes (Flux), rope_table_ltx (LTX-Video) and rope_table_mixed
(Mochi): the CPU references (through the bindings, on NumPy arrays) against float64 NumPy oracles,
against the models' own formulas written the models' way (diffusers' apply_rotary_emb, Flux's and
LTX's full-width tables, Mochi's even/odd rotation, Llama's rotate_half), over every dtype, GQA,
partial rotary, every table shape, strided and broadcast views, in place, and a bad value for
every argument; then the GPU kernels through torch and CuPy against the CPU reference."""
import numpy as np
import pytest

import fusedk
import oracle
from models import (diffusers_apply_rotary_emb, flux_full_tables, flux_ids, full_width, llama_apply_rotary,
                    ltx_full_tables, mochi_apply_rotary_emb, mochi_positions)
from oracle import DTYPES, assert_close, pair_aux, table_shape, tables, wide

rng = np.random.default_rng()
F32 = np.dtype(np.float32)


def rand(shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


# (B, S, Hq, Hk, Dh, rotary_dim, table kind)
CASES = {
    "basic": (2, 7, 4, 4, 64, None, "SR"),
    "minimal": (1, 1, 1, 1, 2, None, "SR"),
    "partial": (1, 5, 3, 3, 64, 32, "SR"),
    "partial-odd-Dh": (2, 3, 2, 1, 9, 4, "SR"),
    "gqa": (2, 6, 8, 2, 32, None, "SR"),
    "mqa-partial": (1, 9, 6, 1, 24, 8, "S1R"),
    "per-head": (2, 5, 3, 3, 16, None, "SHR"),
    "per-batch": (2, 5, 3, 3, 16, 12, "BSHR"),
    "per-batch-gqa": (3, 4, 4, 2, 128, None, "BS1R"),
    "flux-head": (1, 33, 3, 3, 128, None, "SR"),
}


@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_rope(case, dtype, style):
    B, S, Hq, Hk, Dh, R, kind = CASES[case]
    q, k = rand((B, S, Hq, Dh), dtype), rand((B, S, Hk, Dh), dtype)
    q0, k0 = q.copy(), k.copy()
    c, s = tables(table_shape(kind, B, S, Hq, (R or Dh) // 2))
    q2, k2 = fusedk.rope(q, k, c, s, style=style, rotary_dim=R)
    assert q2.shape == q.shape and k2.shape == k.shape and q2.dtype == dtype and k2.dtype == dtype
    assert_close(q2, oracle.rope(q, c, s, style, R), dtype, what=f"rope {style} {case} q")
    assert_close(k2, oracle.rope(k, c, s, style, R), dtype, what=f"rope {style} {case} k")
    if R is not None:  # the channels past rotary_dim pass through bit for bit
        assert np.array_equal(q2[..., R:].view(np.uint8), q[..., R:].view(np.uint8))
        assert np.array_equal(k2[..., R:].view(np.uint8), k[..., R:].view(np.uint8))
    assert np.array_equal(q.view(np.uint8), q0.view(np.uint8)) and np.array_equal(k.view(np.uint8), k0.view(np.uint8))


@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_rope_broadcast_table_views(style):
    B, S, H, Dh = 2, 6, 4, 32
    q, k = rand((B, S, H, Dh), np.float32), rand((B, S, H, Dh), np.float32)
    c, s = tables((S, Dh // 2))
    views = oracle.table_views(B, S, H, Dh // 2)
    for what, view in views.items():
        cv, sv = view(c), view(s)
        q2, k2 = fusedk.rope(q, k, cv, sv, style=style)
        assert_close(q2, oracle.rope(q, c, s, style), np.float32, what=f"rope {what} q")
        assert_close(k2, oracle.rope(k, c, s, style), np.float32, what=f"rope {what} k")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_rope_strided_views_of_packed_qkv(style, dtype):
    B, S, H, Dh = 2, 5, 3, 64
    qkv = rand((B, S, 3, H, Dh), dtype)  # one fused projection, unflattened: q, k, v = qkv.unbind(2)
    before = qkv.copy()
    q, k = qkv[:, :, 0], qkv[:, :, 1]
    c, s = tables((S, 16))
    q2, k2 = fusedk.rope(q, k, c, s, style=style, rotary_dim=32)
    assert_close(q2, oracle.rope(q, c, s, style, 32), dtype, what="rope strided q")
    assert_close(k2, oracle.rope(k, c, s, style, 32), dtype, what="rope strided k")
    assert np.array_equal(qkv.view(np.uint8), before.view(np.uint8))  # inputs untouched


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("style", ["interleaved", "half"])
def test_rope_in_place(style, dtype):
    B, S, Hq, Hk, Dh = 2, 7, 4, 2, 32
    q, k = rand((B, S, Hq, Dh), dtype), rand((B, S, Hk, Dh), dtype)
    c, s = tables((S, Dh // 2))
    wq, wk = oracle.rope(q, c, s, style), oracle.rope(k, c, s, style)
    q2, k2 = fusedk.rope(q, k, c, s, style=style, inplace=True)
    assert q2 is q and k2 is k
    assert_close(q, wq, dtype, what="rope in place q")
    assert_close(k, wk, dtype, what="rope in place k")
    # in place into a packed qkv buffer: v stays as it was
    qkv = rand((B, S, 3, Hq, Dh), dtype)
    c8, s8 = c[:, :8], s[:, :8]  # rotary_dim 16 of 32
    v0 = qkv[:, :, 2].copy()
    wq, wk = oracle.rope(qkv[:, :, 0], c8, s8, style, 16), oracle.rope(qkv[:, :, 1], c8, s8, style, 16)
    q2, k2 = fusedk.rope(qkv[:, :, 0], qkv[:, :, 1], c8, s8, style=style, rotary_dim=16, inplace=True)
    assert_close(qkv[:, :, 0], wq, dtype, what="rope in place packed q")
    assert_close(qkv[:, :, 1], wk, dtype, what="rope in place packed k")
    assert np.array_equal(qkv[:, :, 2].view(np.uint8), v0.view(np.uint8))
    assert np.shares_memory(q2, qkv) and np.shares_memory(k2, qkv)


def test_rope_out_arrays_and_k_none():
    B, S, Hq, Hk, Dh = 1, 4, 2, 1, 16
    q, k = rand((B, S, Hq, Dh), np.float16), rand((B, S, Hk, Dh), np.float16)
    c, s = tables((S, Dh // 2))
    qo, ko = np.empty_like(q), np.empty_like(k)
    q2, k2 = fusedk.rope(q, k, c, s, q_out=qo, k_out=ko)
    assert q2 is qo and k2 is ko
    assert_close(qo, oracle.rope(q, c, s), np.float16, what="rope q_out")
    assert_close(ko, oracle.rope(k, c, s), np.float16, what="rope k_out")
    q1 = fusedk.rope(q, None, c, s, style="half")  # k=None: q' alone, not a tuple
    assert isinstance(q1, np.ndarray) and q1.shape == q.shape
    assert_close(q1, oracle.rope(q, c, s, "half"), np.float16, what="rope k=None")
    wq = oracle.rope(q.copy(), c, s)  # before q is rotated in place
    q3 = fusedk.rope(q, None, c, s, inplace=True)
    assert q3 is q
    assert_close(q, wq, np.float16, what="rope k=None in place")
    qo = np.empty_like(q)
    assert fusedk.rope(q1, None, c, s, q_out=qo) is qo
    assert_close(qo, oracle.rope(q1, c, s), np.float16, what="rope k=None q_out")


def test_rope_identity_and_quarter_turn():
    """angle 0 returns x exactly; angle pi/2 (cos 0, sin 1) maps the pair (a, b) to (-b, a)."""
    q = rand((1, 3, 2, 8), np.float32)
    c, s = np.ones((3, 4), np.float32), np.zeros((3, 4), np.float32)
    for style in ("interleaved", "half"):
        assert np.array_equal(fusedk.rope(q, None, c, s, style=style), q)
    q2 = fusedk.rope(q, None, s, c)  # cos 0, sin 1
    assert np.array_equal(q2[..., 0::2], -q[..., 1::2]) and np.array_equal(q2[..., 1::2], q[..., 0::2])
    q2 = fusedk.rope(q, None, s, c, style="half")
    assert np.array_equal(q2[..., :4], -q[..., 4:]) and np.array_equal(q2[..., 4:], q[..., :4])


# --- the table builders ------------------------------------------------------------------------
@pytest.mark.parametrize("theta", [10000.0, 500000.0, 256.0])
@pytest.mark.parametrize("dim", [2, 16, 64, 128])
def test_rope_table_1d(dim, theta):
    pos = (np.arange(300) + rng.uniform(-0.5, 0.5, 300)).astype(np.float32)
    c, s = fusedk.rope_table_1d(pos, dim, theta)
    assert c.dtype == F32 and s.dtype == F32 and c.shape == (300, dim // 2) and s.shape == (300, dim // 2)
    wc, ws = oracle.rope_table_1d(pos, dim, theta)
    assert_close(c, wc, np.float32, what="rope_table_1d cos")
    assert_close(s, ws, np.float32, what="rope_table_1d sin")


def test_rope_table_1d_converts_numpy_positions():
    for pos in (np.arange(50), np.arange(50) * 1.1, np.arange(50, dtype=np.int32)):  # int64, float64, int32
        c, s = fusedk.rope_table_1d(pos, 32)
        wc, ws = oracle.rope_table_1d(pos.astype(np.float32), 32)
        assert c.dtype == F32
        assert_close(c, wc, np.float32, what=f"rope_table_1d {pos.dtype} cos")
        assert_close(s, ws, np.float32, what=f"rope_table_1d {pos.dtype} sin")


@pytest.mark.parametrize("axes_dim", [(16, 56, 56), (32, 32, 32, 32), (8,), (24, 40)], ids=str)
def test_rope_table_axes(axes_dim):
    n, base = len(axes_dim), flux_ids(7, 12, 9)  # (0, row, col), text tokens 0
    ids = {1: base[:, 2:], 2: base[:, 1:], 3: base,
           4: np.concatenate([base, rng.integers(0, 4, (base.shape[0], 1)).astype(np.float32)], 1)}[n]
    ids = ids + rng.uniform(-0.25, 0.25, ids.shape).astype(np.float32)  # fractional ids as well
    c, s = fusedk.rope_table_axes(ids, axes_dim)
    assert c.dtype == F32 and c.shape == (ids.shape[0], sum(axes_dim) // 2) and s.shape == c.shape
    wc, ws = oracle.rope_table_axes(ids, axes_dim)
    assert_close(c, wc, np.float32, what="rope_table_axes cos")
    assert_close(s, ws, np.float32, what="rope_table_axes sin")
    # Flux's full-width tables are the half tables with every column repeated twice
    fc, fs = flux_full_tables(ids, axes_dim, 10000.0)
    assert np.allclose(np.repeat(wc, 2, -1), fc, rtol=0, atol=1e-12)
    assert np.allclose(np.repeat(ws, 2, -1), fs, rtol=0, atol=1e-12)


@pytest.mark.parametrize("dim", [4, 6, 10, 16, 128, 132, 2048])
def test_rope_table_ltx(dim):
    # LTX's grid: (frame / base_num_frames, row / base_height, col / base_width), plus random coords
    f, h, w = np.meshgrid(np.arange(3), np.arange(8), np.arange(5), indexing="ij")
    grid = np.stack([f / 20.0, h * 32 / 2048.0, w * 32 / 2048.0], -1).reshape(-1, 3)
    coords = np.concatenate([grid, rng.uniform(-0.2, 1.2, (16, 3))]).astype(np.float32)
    c, s = fusedk.rope_table_ltx(coords, dim)
    assert c.dtype == F32 and c.shape == (coords.shape[0], dim // 2) and s.shape == c.shape
    wc, ws = oracle.rope_table_ltx(coords, dim)
    assert_close(c, wc, np.float32, what=f"rope_table_ltx {dim} cos")
    assert_close(s, ws, np.float32, what=f"rope_table_ltx {dim} sin")
    # the oracle against LTXVideoRotaryPosEmbed written the diffusers way (the second, literal oracle)
    lc, ls = ltx_full_tables(coords[None], dim, 10000.0)
    assert np.allclose(np.repeat(wc, 2, -1), lc[0], rtol=0, atol=1e-9)
    assert np.allclose(np.repeat(ws, 2, -1), ls[0], rtol=0, atol=1e-9)
    assert_close(np.repeat(c, 2, -1), lc[0], np.float32, what=f"rope_table_ltx {dim} vs diffusers cos")
    assert_close(np.repeat(s, 2, -1), ls[0], np.float32, what=f"rope_table_ltx {dim} vs diffusers sin")


@pytest.mark.parametrize("theta", [10000.0, 1000.0])
def test_rope_table_ltx_theta(theta):
    coords = rng.uniform(0, 1, (40, 3)).astype(np.float32)
    c, s = fusedk.rope_table_ltx(coords, 128, theta)
    wc, ws = oracle.rope_table_ltx(coords, 128, theta)
    assert_close(c, wc, np.float32, what="rope_table_ltx theta cos")
    assert_close(s, ws, np.float32, what="rope_table_ltx theta sin")


@pytest.mark.parametrize("H, F, grid", [(1, 1, (1, 1, 1)), (3, 8, (2, 4, 6)), (24, 64, (2, 6, 8))], ids=str)
def test_rope_table_mixed(H, F, grid):
    pos = mochi_positions(*grid)
    freqs = rand((3, H, F), np.float32, 0.5)
    c, s = fusedk.rope_table_mixed(pos, freqs)
    assert c.dtype == F32 and c.shape == (pos.shape[0], H, F) and s.shape == c.shape
    wc, ws = oracle.rope_table_mixed(pos, freqs)
    assert_close(c, wc, np.float32, what="rope_table_mixed cos")
    assert_close(s, ws, np.float32, what="rope_table_mixed sin")


# --- tables into rope, against the models' formulas --------------------------------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flux_tables_into_rope(dtype):
    ids = flux_ids(5, 6, 4)
    S, H, Dh = ids.shape[0], 3, 128
    q, k = rand((2, S, H, Dh), dtype), rand((2, S, H, Dh), dtype)
    c, s = fusedk.rope_table_axes(ids, (16, 56, 56))
    q2, k2 = fusedk.rope(q, k, c, s)
    cf, sf = full_width(c)[None, :, None], full_width(s)[None, :, None]
    assert_close(q2, diffusers_apply_rotary_emb(q, cf, sf), dtype, what="Flux rope q")
    assert_close(k2, diffusers_apply_rotary_emb(k, cf, sf), dtype, what="Flux rope k")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ltx_tables_into_rope(dtype):
    """LTX rotates the whole inner dim (heads * head_dim) before the head split: x [B, S, 1, inner];
    per-sample coords give a [B, S, 1, inner/2] table."""
    B, S, inner = 2, 24, 2 * 64
    coords = rng.uniform(0, 1, (B, S, 3)).astype(np.float32)
    c, s = (np.stack(t) for t in zip(*(fusedk.rope_table_ltx(coords[b], inner) for b in range(B))))
    q = rand((B, S, 1, inner), dtype)
    q2 = fusedk.rope(q, None, c[:, :, None], s[:, :, None])
    lc, ls = ltx_full_tables(coords, inner, 10000.0)
    assert_close(np.repeat(c, 2, -1), lc, np.float32, what="LTX tables vs diffusers")
    cf, sf = full_width(c)[:, :, None], full_width(s)[:, :, None]
    assert_close(q2, diffusers_apply_rotary_emb(q, cf, sf), dtype, what="LTX rope")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mochi_tables_into_rope(dtype):
    pos = mochi_positions(2, 4, 6)
    S, H, Dh = pos.shape[0], 4, 32
    freqs = rand((3, H, Dh // 2), np.float32, 0.3)
    c, s = fusedk.rope_table_mixed(pos, freqs)
    q, k = rand((1, S, H, Dh), dtype), rand((1, S, H, Dh), dtype)
    q2, k2 = fusedk.rope(q, k, c, s)
    assert_close(q2, mochi_apply_rotary_emb(q, oracle.f64(c), oracle.f64(s)), dtype, what="Mochi rope q")
    assert_close(k2, mochi_apply_rotary_emb(k, oracle.f64(c), oracle.f64(s)), dtype, what="Mochi rope k")


@pytest.mark.parametrize("rotary_dim", [64, 16])
def test_llama_neox_tables_into_rope(rotary_dim):
    S, Dh = 40, 64
    c, s = fusedk.rope_table_1d(np.arange(S), rotary_dim, 10000.0)
    q, k = rand((2, S, 8, Dh), np.float32), rand((2, S, 2, Dh), np.float32)
    q2, k2 = fusedk.rope(q, k, c, s, style="half", rotary_dim=rotary_dim)
    cf, sf = oracle.f64(wide(c))[None, :, None], oracle.f64(wide(s))[None, :, None]  # cat((freqs, freqs), -1)
    assert_close(q2, llama_apply_rotary(q, cf, sf, rotary_dim), np.float32, what="Llama rope q")
    assert_close(k2, llama_apply_rotary(k, cf, sf, rotary_dim), np.float32, what="Llama rope k")


# --- bad arguments -----------------------------------------------------------------------------
BAD = [  # (call(q [2,5,4,16] f32, k [2,5,2,16], c, s [5,8]), status, op, argument)
    (lambda q, k, c, s: fusedk.rope(q, k, c, s, style="neox"), "INVALID_ARGUMENT", "rope", "style"),
    (lambda q, k, c, s: fusedk.rope(q, k, c[:, :3], s[:, :3], rotary_dim=7), "INVALID_ARGUMENT", "rope", "rotary_dim"),
    (lambda q, k, c, s: fusedk.rope(q, k, wide(c), wide(s), rotary_dim=32), "INVALID_ARGUMENT", "rope",
     "rotary_dim"),
    (lambda q, k, c, s: fusedk.rope(q, k, c.astype(np.float16), s), "DTYPE", "rope", "cos"),
    (lambda q, k, c, s: fusedk.rope(q, k, c, s.astype(np.float16)), "DTYPE", "rope", "sin"),
    (lambda q, k, c, s: fusedk.rope(q, k, c, s[:, :4]), "SHAPE", "rope", "sin"),
    (lambda q, k, c, s: fusedk.rope(q, k, c[:, :4], s[:, :4]), "SHAPE", "rope", "cos"),
    (lambda q, k, c, s: fusedk.rope(q, k, c, s, rotary_dim=8), "SHAPE", "rope", "cos"),
    (lambda q, k, c, s: fusedk.rope(q, k, c[:4], s[:4]), "SHAPE", "rope", "cos"),
    (lambda q, k, c, s: fusedk.rope(q, k, c[0], s[0]), "SHAPE", "rope", "cos"),
    (lambda q, k, c, s: fusedk.rope(q, k, np.stack([c] * 3, 1), np.stack([s] * 3, 1)), "SHAPE", "rope", "cos"),
    # a per-head table needs Hq == Hk (or H == 1)
    (lambda q, k, c, s: fusedk.rope(q, k, np.stack([c] * 4, 1), np.stack([s] * 4, 1)), "SHAPE", "rope", "cos"),
    (lambda q, k, c, s: fusedk.rope(q, k, np.stack([c[:, None]] * 3), np.stack([s[:, None]] * 3)), "SHAPE", "rope",
     "cos"),
    (lambda q, k, c, s: fusedk.rope(q, k, wide(c)[:, ::2], wide(s)[:, ::2]), "LAYOUT", "rope", "cos"),
    (lambda q, k, c, s: fusedk.rope(q, k[:1], c, s), "SHAPE", "rope", "k"),
    (lambda q, k, c, s: fusedk.rope(q, k[:, :4], c, s), "SHAPE", "rope", "k"),
    (lambda q, k, c, s: fusedk.rope(q, k[..., :8], c, s), "SHAPE", "rope", "k"),
    (lambda q, k, c, s: fusedk.rope(q, k[0], c, s), "SHAPE", "rope", "k"),
    (lambda q, k, c, s: fusedk.rope(q, k.astype(np.float16), c, s), "DTYPE", "rope", "k"),
    (lambda q, k, c, s: fusedk.rope(q.astype(np.float64), None, c, s), "DTYPE", "rope", "q"),
    (lambda q, k, c, s: fusedk.rope(q[0], None, c, s), "SHAPE", "rope", "q"),
    (lambda q, k, c, s: fusedk.rope(wide(q)[..., ::2], k, c, s), "LAYOUT", "rope", "q"),
    (lambda q, k, c, s: fusedk.rope(q, k, c, s, q_out=np.empty((2, 5, 4, 8), np.float32)), "SHAPE", "rope", "q_out"),
    (lambda q, k, c, s: fusedk.rope(q, k, c, s, q_out=np.empty_like(q, np.float16)), "DTYPE", "rope", "q_out"),
    (lambda q, k, c, s: fusedk.rope(q, k, c, s, k_out=np.empty_like(q)), "SHAPE", "rope", "k_out"),
    (lambda q, k, c, s: fusedk.rope(q, k, c, s, k_out=np.empty_like(k, np.float16)), "DTYPE", "rope", "k_out"),
    (lambda q, k, c, s: fusedk.rope(q, k, c, s, q_out=np.lib.stride_tricks.as_strided(
        q.copy(), q.shape, (q.strides[0], 0, q.strides[2], q.strides[3]))), "LAYOUT", "rope", "q_out"),
    (lambda q, k, c, s: fusedk.rope_table_1d(np.arange(5), 7), "INVALID_ARGUMENT", "rope_table_1d", "dim"),
    (lambda q, k, c, s: fusedk.rope_table_1d(np.zeros((5, 2), np.float32), 8), "SHAPE", "rope_table_1d", "positions"),
    (lambda q, k, c, s: fusedk.rope_table_axes(np.zeros((5, 3), np.float32), (16, 55, 56)), "INVALID_ARGUMENT",
     "rope_table_axes", "axes_dim"),
    (lambda q, k, c, s: fusedk.rope_table_axes(np.zeros((5, 3), np.float32), (16, 56)), "SHAPE", "rope_table_axes",
     "ids"),
    (lambda q, k, c, s: fusedk.rope_table_axes(np.zeros((5, 5), np.float32), (8,) * 5), "INVALID_ARGUMENT",
     "rope_table_axes", "axes_dim"),
    (lambda q, k, c, s: fusedk.rope_table_ltx(np.zeros((5, 2), np.float32), 128), "SHAPE", "rope_table_ltx", "coords"),
    (lambda q, k, c, s: fusedk.rope_table_ltx(np.zeros((5, 3), np.float32), 127), "INVALID_ARGUMENT",
     "rope_table_ltx", "dim"),
    (lambda q, k, c, s: fusedk.rope_table_mixed(np.zeros((5, 2), np.float32), np.zeros((3, 2, 4), np.float32)),
     "SHAPE", "rope_table_mixed", "pos"),
    (lambda q, k, c, s: fusedk.rope_table_mixed(np.zeros((5, 3), np.float32), np.zeros((3, 4), np.float32)),
     "SHAPE", "rope_table_mixed", "freqs"),
    (lambda q, k, c, s: fusedk.rope_table_mixed(np.zeros((5, 3), np.float32), np.zeros((2, 2, 4), np.float32)),
     "SHAPE", "rope_table_mixed", "freqs"),
]


@pytest.mark.parametrize("case, status, op, name", BAD)
def test_bad_arguments(case, status, op, name):
    q, k = rand((2, 5, 4, 16), np.float32), rand((2, 5, 2, 16), np.float32)
    c, s = tables((5, 8))
    with pytest.raises(fusedk.Error) as e:
        case(q, k, c, s)
    r = e.value.reason
    assert e.value.status == "FUSEDK_ERR_" + status and r.startswith(op + ": ") and name in r, e.value


# --- the GPU kernels through torch and CuPy, against the CPU reference ---------------------------
GPU_CASES = {  # (B, S, Hq, Hk, Dh, rotary_dim, table kind, in place)
    "basic": (2, 300, 8, 8, 64, None, "SR", False),
    "gqa": (2, 257, 16, 4, 128, None, "SR", False),
    "partial": (1, 129, 4, 4, 128, 64, "SR", False),
    "per-head": (2, 100, 6, 6, 64, None, "SHR", False),
    "per-batch-partial-gqa": (2, 65, 8, 2, 96, 32, "BS1R", False),
    "in-place": (2, 300, 8, 2, 64, None, "SR", True),
}


@pytest.mark.skipif(not oracle.gpu_frameworks(), reason="no CUDA device with torch or CuPy")
@pytest.mark.parametrize("style", ["interleaved", "half"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_rope_matches_the_reference(case, dtype, style):
    from oracle import assert_close_gpu
    B, S, Hq, Hk, Dh, R, kind, inplace = GPU_CASES[case]
    q, k = rand((B, S, Hq, Dh), dtype), rand((B, S, Hk, Dh), dtype)
    c, s = tables(table_shape(kind, B, S, Hq, (R or Dh) // 2))
    wq, wk = fusedk.rope(q, k, c, s, style=style, rotary_dim=R)
    for fw, to_dev, to_host, _ in oracle.gpu_frameworks():
        qd, kd = to_dev(q), to_dev(k)
        if qd is None:
            continue  # CuPy has no bfloat16 arrays
        q2, k2 = fusedk.rope(qd, kd, to_dev(c), to_dev(s), style=style, rotary_dim=R, inplace=inplace)
        if inplace:
            assert q2 is qd and k2 is kd
        assert_close_gpu(to_host(q2), wq, dtype, pair_aux(q, style, R), what=f"{fw} rope {case} {style} q")
        assert_close_gpu(to_host(k2), wk, dtype, pair_aux(k, style, R), what=f"{fw} rope {case} {style} k")


@pytest.mark.skipif(not oracle.gpu_frameworks(), reason="no CUDA device with torch or CuPy")
def test_gpu_rope_strided_and_broadcast_views():
    from oracle import assert_close_gpu
    B, S, H, Dh = 2, 77, 4, 64
    qkv = rand((B, S, 3, H, Dh), np.float16)
    c, s = tables((S, Dh // 2))
    want = fusedk.rope(qkv[:, :, 0], qkv[:, :, 1], c, s)
    for fw, to_dev, to_host, bcast in oracle.gpu_frameworks():
        d = to_dev(qkv)
        cd, sd = (bcast(to_dev(t)[None, :, None, :], (B, S, H, Dh // 2)) for t in (c, s))
        got = fusedk.rope(d[:, :, 0], d[:, :, 1], cd, sd)
        for g, w, x, n in zip(got, want, (qkv[:, :, 0], qkv[:, :, 1]), "qk"):
            assert_close_gpu(to_host(g), w, np.float16, pair_aux(x, "interleaved"), what=f"{fw} rope strided {n}")
        fusedk.rope(d[:, :, 0], d[:, :, 1], cd, sd, inplace=True)  # in place into the packed buffer
        h = to_host(d)
        assert_close_gpu(h[:, :, 0], want[0], np.float16, pair_aux(qkv[:, :, 0], "interleaved"), what=f"{fw} in place")
        assert np.array_equal(h[:, :, 2], qkv[:, :, 2])


GPU_TABLE_TOL = {"eps": {F32: 2e-6}, "atol": 2e-6}  # float64 angle on the GPU, rounded once


@pytest.mark.skipif(not oracle.gpu_frameworks(), reason="no CUDA device with torch or CuPy")
def test_gpu_tables_match_the_reference():
    pos = (np.arange(4096) + rng.uniform(-0.5, 0.5, 4096)).astype(np.float32)
    ids = flux_ids(512, 64, 64)
    coords = rng.uniform(-0.1, 1.1, (3000, 3)).astype(np.float32)
    mpos, mfreqs = mochi_positions(4, 16, 16), rand((3, 24, 64), np.float32, 0.5)
    calls = {
        "rope_table_1d": (lambda t: fusedk.rope_table_1d(t[0], 128, 10000.0), (pos,)),
        "rope_table_1d theta 5e5": (lambda t: fusedk.rope_table_1d(t[0], 64, 500000.0), (pos,)),
        "rope_table_axes": (lambda t: fusedk.rope_table_axes(t[0], (16, 56, 56)), (ids,)),
        "rope_table_axes 4": (lambda t: fusedk.rope_table_axes(t[0], (32, 32, 32, 32)),
                              (np.concatenate([ids, ids[:, 2:]], 1),)),
        "rope_table_ltx 2048": (lambda t: fusedk.rope_table_ltx(t[0], 2048), (coords,)),
        "rope_table_ltx 130": (lambda t: fusedk.rope_table_ltx(t[0], 130), (coords,)),
        "rope_table_mixed": (lambda t: fusedk.rope_table_mixed(t[0], t[1]), (mpos, mfreqs)),
    }
    for name, (call, args) in calls.items():
        wc, ws = call(args)
        for fw, to_dev, to_host, _ in oracle.gpu_frameworks():
            gc, gs = call(tuple(to_dev(a) for a in args))
            gc, gs = to_host(gc), to_host(gs)
            assert gc.dtype == F32 and gc.shape == wc.shape and gs.shape == ws.shape
            assert_close(gc, wc, np.float32, what=f"{fw} {name} cos", **GPU_TABLE_TOL)
            assert_close(gs, ws, np.float32, what=f"{fw} {name} sin", **GPU_TABLE_TOL)
