"""[position] qk_norm_rope (RMSNorm of q and k per head or over the token's whole H*Dh row, their
weights, RoPE, v copied, all three written in the attention layout [B, H, S, Dh] or [B, S, H, Dh]):
the CPU reference (through the bindings, on NumPy arrays) against the float64 oracle
(oracle.qk_norm_rope) over every dtype, norm, style, layout, with and without weights, the packed
[B, S, 3, H, Dh] and the (q, k, v) forms, GQA, v=None, partial rotary, every table shape, odd
shapes, strided and broadcast views, out= and in place; against the models' own unfused chains
written the models' way (Flux, LTX-Video, Mochi, Wan, a Qwen3/Llama-style GQA block); a bad
value for every argument; fusedk.torch (torch.compile, opcheck) and fusedk.jax on the CPU; then
the GPU kernel through torch, CuPy, torch.compile and JAX against the CPU reference."""
import os

import numpy as np
import pytest

import fusedk
import oracle
from models import (diffusers_apply_rotary_emb, flux_ids, full_width, llama_apply_rotary, mochi_apply_rotary_emb,
                    mochi_positions)
from oracle import BF16, DTYPES, assert_close, bits, f64, np_of, pair_aux, rmsnorm, table_shape, tables, wide

rng = np.random.default_rng()
F32 = np.dtype(np.float32)
STYLES = ["interleaved", "half"]
LAYOUTS = ["bhsd", "bshd"]


def rand(shape, dtype, scale=1.0, mean=0.0):
    return (mean + scale * rng.standard_normal(shape)).astype(dtype)


def same_bits(a, b):
    return a.shape == b.shape and np.array_equal(bits(a), bits(b))


def in_layout(x, layout):
    """[B, S, H, Dh] as the op writes it: transposed to [B, H, S, Dh] for bhsd."""
    return x.transpose(0, 2, 1, 3) if layout == "bhsd" else x


def weights(norm, with_w, Hq, Hk, Dh, dtype):
    """(q_weight, k_weight): [Dh] for head, [H*Dh] (each tensor's own H) for full, None otherwise."""
    if not with_w or norm == "none":
        return None, None
    n = (Hq * Dh, Hk * Dh) if norm == "full" else (Dh, Dh)
    return rand((n[0],), dtype, 0.2, 1.0), rand((n[1],), dtype, 0.2, 1.0)


def inputs(form, B, S, Hq, Hk, Dh, dtype, scale=2.0, mean=0.3):
    """(the qkv argument, q, k, v) for form "packed" ([B, S, 3, H, Dh], Hq == Hk), "tuple" or
    "no-v" ((q, k, None)); q, k, v are what the op reads (views of the packed array)."""
    if form == "packed":
        assert Hq == Hk
        qkv = rand((B, S, 3, Hq, Dh), dtype, scale, mean)
        return qkv, qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q, k = rand((B, S, Hq, Dh), dtype, scale, mean), rand((B, S, Hk, Dh), dtype, scale, mean)
    v = rand((B, S, Hk, Dh), dtype, scale, mean) if form == "tuple" else None
    return (q, k, v), q, k, v


def snapshot(*arrays):
    return [None if a is None else a.copy() for a in arrays]


def check(got, q, k, v, cos, sin, dtype, what, q_weight=None, k_weight=None, eps=1e-6, norm="head",
          style="interleaved", layout="bhsd", rotary_dim=None):
    """got (the op's result) against the float64 oracle; v' bit for bit; shapes and dtypes."""
    want = oracle.qk_norm_rope(q, k, v, cos, sin, q_weight, k_weight, eps, norm, style, layout, rotary_dim)
    assert isinstance(got, tuple) and len(got) == len(want) == (2 if v is None else 3), (type(got), len(got))
    for g, w, x, n in zip(got, want, (q, k, v), "qkv"):
        assert g.shape == w.shape and g.dtype == dtype, (what, n, g.shape, w.shape, g.dtype)
        assert_close(g, w, dtype, what=f"{what} {n}")
    if v is not None:  # v' = v: a copy, exact
        assert same_bits(got[2], in_layout(v, layout)), f"{what}: v' is not v"
    return want


NORMS = {"head": ("head", False), "head+w": ("head", True), "full": ("full", False), "full+w": ("full", True),
         "none": ("none", False)}

CASES = {  # (B, S, Hq, Hk, Dh, rotary_dim, table kind, form)
    "packed": (2, 7, 4, 4, 64, None, "SR", "packed"),
    "packed-partial": (1, 5, 3, 3, 64, 32, "SR", "packed"),
    "per-head": (2, 5, 3, 3, 16, None, "SHR", "packed"),
    "gqa": (2, 6, 8, 2, 32, None, "SR", "tuple"),
    "gqa-no-v": (2, 6, 4, 2, 16, None, "S1R", "no-v"),
    "mqa-partial": (1, 9, 6, 1, 24, 8, "S1R", "tuple"),
    "per-batch": (2, 5, 3, 3, 16, 12, "BSHR", "tuple"),
    "per-batch-gqa-no-v": (3, 4, 4, 2, 32, None, "BS1R", "no-v"),
    "minimal": (1, 1, 1, 1, 2, None, "SR", "packed"),
    "one-token": (1, 1, 4, 4, 64, None, "SR", "tuple"),
    "Dh10-R4-H1": (2, 3, 1, 1, 10, 4, "SR", "packed"),
    "odd-Dh9-R4": (2, 3, 2, 1, 9, 4, "SR", "tuple"),
    "flux-head": (1, 33, 3, 3, 128, None, "SR", "packed"),
}


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("norm_w", list(NORMS))
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(CASES))
def test_qk_norm_rope(case, dtype, style, norm_w, layout):
    B, S, Hq, Hk, Dh, R, kind, form = CASES[case]
    norm, with_w = NORMS[norm_w]
    qkv, q, k, v = inputs(form, B, S, Hq, Hk, Dh, dtype)
    qw, kw = weights(norm, with_w, Hq, Hk, Dh, dtype)
    c, s = tables(table_shape(kind, B, S, Hq, (R or Dh) // 2))
    before = snapshot(q, k, v, qw, kw, c, s)
    got = fusedk.qk_norm_rope(qkv, c, s, q_weight=qw, k_weight=kw, norm=norm, style=style, layout=layout,
                              rotary_dim=R)
    check(got, q, k, v, c, s, dtype, f"qk_norm_rope {case} {norm_w} {style} {layout}", qw, kw, norm=norm,
          style=style, layout=layout, rotary_dim=R)
    for a, b in zip((q, k, v, qw, kw, c, s), before):  # inputs untouched
        assert a is None or same_bits(a, b)
    if R is not None and norm == "none":  # past rotary_dim, not normalized: the input bit for bit
        for g, x in zip(got, (q, k)):
            assert same_bits(g[..., R:], in_layout(x, layout)[..., R:])


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", ["head", "full"])
def test_channels_past_rotary_dim_are_normalized_not_rotated(norm, dtype):
    B, S, H, Dh, R = 2, 6, 3, 48, 16
    qkv, q, k, v = inputs("packed", B, S, H, H, Dh, dtype)
    qw, kw = weights(norm, True, H, H, Dh, dtype)
    c, s = tables((S, R // 2))
    got = fusedk.qk_norm_rope(qkv, c, s, qw, kw, norm=norm, layout="bshd", rotary_dim=R)
    for g, x, w in zip(got, (q, k), (qw, kw)):
        n = oracle.qk_norm(x, w, 1e-6, norm)
        assert_close(g[..., R:], n[..., R:], dtype, what=f"{norm} pass-through channels")
        assert_close(g[..., :R], oracle.rope(n[..., :R], c, s), dtype, what=f"{norm} rotated channels")
        assert not np.allclose(oracle.f64(g[..., R:]), oracle.f64(x[..., R:]))  # normalized, not copied


def test_identity_tables_and_no_norm_copy_exactly():
    """cos 1, sin 0 and norm "none": every output is its input, bit for bit, in the layout."""
    for dtype in DTYPES:
        qkv, q, k, v = inputs("packed", 2, 5, 3, 3, 32, dtype)
        c, s = np.ones((5, 16), np.float32), np.zeros((5, 16), np.float32)
        for layout in LAYOUTS:
            for style in STYLES:
                got = fusedk.qk_norm_rope(qkv, c, s, norm="none", style=style, layout=layout)
                for g, x in zip(got, (q, k, v)):
                    assert same_bits(g, in_layout(x, layout)), (dtype, layout, style)


@pytest.mark.parametrize("eps", [0.0, 1e-6, 1e-5, 0.1, 3.0])
def test_eps(eps):
    """eps inside the square root (as a float32 attribute): small inputs make it count."""
    qkv, q, k, v = inputs("packed", 2, 4, 3, 3, 32, np.float32, scale=0.05, mean=0.0)
    c, s = tables((4, 16))
    for norm in ("head", "full"):
        got = fusedk.qk_norm_rope(qkv, c, s, eps=eps, norm=norm)
        check(got, q, k, v, c, s, F32, f"eps {eps} {norm}", eps=eps, norm=norm)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("H, Dh", [(64, 128), (32, 256), (128, 64)])
def test_full_norm_up_to_8192_channels(H, Dh, dtype):
    qkv, q, k, v = inputs("packed", 1, 3, H, H, Dh, dtype)
    qw, kw = weights("full", True, H, H, Dh, dtype)
    c, s = tables((3, Dh // 2))
    got = fusedk.qk_norm_rope(qkv, c, s, qw, kw, norm="full", style="half")
    check(got, q, k, v, c, s, dtype, f"full H*Dh {H * Dh}", qw, kw, norm="full", style="half")


@pytest.mark.parametrize("style", STYLES)
def test_broadcast_table_views(style):
    B, S, H, Dh = 2, 6, 4, 32
    qkv, q, k, v = inputs("packed", B, S, H, H, Dh, np.float32)
    qw, kw = weights("head", True, H, H, Dh, np.float32)
    c, s = tables((S, Dh // 2))
    views = oracle.table_views(B, S, H, Dh // 2)
    for what, view in views.items():
        cv, sv = view(c), view(s)
        for layout in LAYOUTS:
            got = fusedk.qk_norm_rope(qkv, cv, sv, qw, kw, style=style, layout=layout)
            check(got, q, k, v, c, s, F32, f"table {what} {layout}", qw, kw, style=style, layout=layout)


def _strided(B, S, Hq, Hk, Dh, dtype):
    """(name, qkv argument, q, k, v): inputs whose strides are not the compact ones."""
    out = []
    pad = rand((B, S, 3, Hq, Dh + 8), dtype, 2.0)[..., :Dh]  # padded head stride, packed
    out.append(("packed, padded heads", pad, pad[:, :, 0], pad[:, :, 1], pad[:, :, 2]))
    hf = rand((B, S, Hq, 3, Dh), dtype, 2.0)  # heads-first packing: q = qkv[:, :, :, 0]
    out.append(("[B,S,H,3,Dh] packing", (hf[:, :, :, 0], hf[:, :, :, 1], hf[:, :, :, 2]), hf[:, :, :, 0],
                hf[:, :, :, 1], hf[:, :, :, 2]))
    qs = rand((S, B, Hq, Dh), dtype).transpose(1, 0, 2, 3)  # sequence-major [S, B, H, Dh] storage
    ks = rand((B, S, 2 * Hk, Dh + 4), dtype)[:, :, ::2, 3:3 + Dh]  # every other head, an offset row
    vs = rand((B, S + 3, Hk, Dh), dtype)[:, 3:]
    out.append(("GQA mixed strides", (qs, ks, vs), qs, ks, vs))
    rv = rand((B, S, Hq, Dh), dtype)[:, ::-1]  # negative strides: the sequence reversed
    out.append(("reversed sequence", (rv, rv[:, :, :Hk], None), rv, rv[:, :, :Hk], None))
    return out


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", ["head", "full", "none"])
def test_strided_inputs(norm, dtype, layout):
    B, S, Hq, Hk, Dh = 2, 5, 4, 2, 32
    c, s = tables((S, 8))  # rotary_dim 16 of 32
    for name, qkv, q, k, v in _strided(B, S, Hq, Hk, Dh, dtype):
        qw, kw = weights(norm, True, q.shape[2], k.shape[2], Dh, dtype)
        before = snapshot(q, k, v)
        got = fusedk.qk_norm_rope(qkv, c, s, qw, kw, norm=norm, layout=layout, rotary_dim=16)
        check(got, q, k, v, c, s, dtype, f"strided {name} {norm} {layout}", qw, kw, norm=norm, layout=layout,
              rotary_dim=16)
        for a, b in zip((q, k, v), before):
            assert a is None or same_bits(a, b)
        # the result does not depend on the strides: the same call on compact copies, bit for bit
        compact = tuple(None if a is None else np.ascontiguousarray(a) for a in (q, k, v))
        ref = fusedk.qk_norm_rope(compact, c, s, qw, kw, norm=norm, layout=layout, rotary_dim=16)
        assert all(same_bits(a, b) for a, b in zip(got, ref)), name


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("layout", LAYOUTS)
def test_out_arrays(layout, dtype):
    B, S, Hq, Hk, Dh = 2, 5, 4, 2, 16
    qkv, q, k, v = inputs("tuple", B, S, Hq, Hk, Dh, dtype)
    qw, kw = weights("full", True, Hq, Hk, Dh, dtype)
    c, s = tables((S, Dh // 2))
    kw_ = dict(q_weight=qw, k_weight=kw, norm="full", layout=layout)
    want = oracle.qk_norm_rope(q, k, v, c, s, qw, kw, norm="full", layout=layout)
    shp = [w.shape for w in want]
    outs = tuple(np.full(sh, np.nan, dtype) for sh in shp)
    got = fusedk.qk_norm_rope(qkv, c, s, out=outs, **kw_)
    assert isinstance(got, tuple) and all(g is o for g, o in zip(got, outs))
    for o, w, n in zip(outs, want, "qkv"):
        assert_close(o, w, dtype, what=f"out= {layout} {n}")
    # only q_out given: k' and v' are new arrays
    qo = np.full(shp[0], np.nan, dtype)
    got = fusedk.qk_norm_rope(qkv, c, s, out=(qo, None, None), **kw_)
    assert got[0] is qo and got[1].shape == shp[1] and got[2].shape == shp[2]
    for g, w, n in zip(got, want, "qkv"):
        assert_close(g, w, dtype, what=f"out=(q_out, None, None) {layout} {n}")
    # v None: out=(q_out, k_out, None), two results
    qo, ko = np.empty(shp[0], dtype), np.empty(shp[1], dtype)
    got = fusedk.qk_norm_rope((q, k, None), c, s, out=(qo, ko, None), **kw_)
    assert len(got) == 2 and got[0] is qo and got[1] is ko
    assert_close(ko, want[1], dtype, what=f"out= v None {layout} k")
    # strided outputs: rows padded (the padding stays as it was), or FlashAttention's packed
    # [B, S, 3, H, Dh] buffer (bshd)
    bases = [np.full(sh[:-1] + (Dh + 5,), 7.0, dtype) for sh in shp]
    outs = tuple(b[..., 1:1 + Dh] for b in bases)
    fusedk.qk_norm_rope(qkv, c, s, out=outs, **kw_)
    for b, w, n in zip(bases, want, "qkv"):
        assert_close(b[..., 1:1 + Dh], w, dtype, what=f"out= padded rows {layout} {n}")
        assert (b[..., 0] == 7).all() and (b[..., 1 + Dh:] == 7).all(), "the padding of a strided out was written"
    if layout == "bshd":
        qkv2, q2, k2, v2 = inputs("packed", B, S, Hq, Hq, Dh, dtype)
        qw2, kw2 = weights("full", True, Hq, Hq, Dh, dtype)
        buf = np.full((B, S, 3, Hq, Dh), np.nan, dtype)
        got = fusedk.qk_norm_rope(qkv2, c, s, qw2, kw2, norm="full", layout="bshd",
                                  out=(buf[:, :, 0], buf[:, :, 1], buf[:, :, 2]))
        assert all(np.shares_memory(g, buf) for g in got)
        want2 = oracle.qk_norm_rope(q2, k2, v2, c, s, qw2, kw2, norm="full", layout="bshd")
        for j, n in enumerate("qkv"):
            assert_close(buf[:, :, j], want2[j], dtype, what=f"out= into a packed buffer {n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", ["head", "full", "none"])
@pytest.mark.parametrize("layout", LAYOUTS)
def test_in_place(layout, norm, dtype):
    """Outputs that are exactly the inputs (same pointer and strides): bshd writes q, k, v back
    where they are; bhsd does too through transposed views of them."""
    B, S, H, Dh, R = 2, 7, 4, 32, 16
    qkv, q, k, v = inputs("packed", B, S, H, H, Dh, dtype)
    qw, kw = weights(norm, True, H, H, Dh, dtype)
    c, s = tables((S, R // 2))
    want = oracle.qk_norm_rope(q, k, v, c, s, qw, kw, norm=norm, layout="bshd", rotary_dim=R)
    v0 = v.copy()
    outs = tuple(in_layout(x, layout) for x in (q, k, v))
    got = fusedk.qk_norm_rope(qkv, c, s, qw, kw, norm=norm, layout=layout, rotary_dim=R, out=outs)
    assert all(g is o for g, o in zip(got, outs))
    for j, n in enumerate("qk"):
        assert_close(qkv[:, :, j], want[j], dtype, what=f"in place {layout} {norm} {n}")
    assert same_bits(qkv[:, :, 2], v0)
    # GQA, separate arrays
    q, k = rand((B, S, 8, Dh), dtype), rand((B, S, 2, Dh), dtype)
    qw, kw = weights(norm, True, 8, 2, Dh, dtype)
    want = oracle.qk_norm_rope(q, k, None, c, s, qw, kw, norm=norm, layout="bshd", rotary_dim=R)
    fusedk.qk_norm_rope((q, k, None), c, s, qw, kw, norm=norm, layout=layout, rotary_dim=R,
                        out=(in_layout(q, layout), in_layout(k, layout), None))
    assert_close(q, want[0], dtype, what=f"in place GQA {layout} {norm} q")
    assert_close(k, want[1], dtype, what=f"in place GQA {layout} {norm} k")


def test_zero_size():
    c, s = tables((5, 8))
    for shape, cs in (((0, 5, 3, 4, 16), (c, s)), ((2, 0, 3, 4, 16), tables((0, 8))), ((2, 5, 3, 0, 16), (c, s))):
        qkv = np.zeros(shape, np.float32)
        for layout in LAYOUTS:
            got = fusedk.qk_norm_rope(qkv, *cs, layout=layout)
            want = in_layout(qkv[:, :, 0], layout).shape
            assert len(got) == 3 and all(g.shape == want and g.dtype == F32 for g in got)


def test_bhsd_outputs_are_compact_and_bshd_outputs_too():
    qkv, q, k, v = inputs("packed", 2, 5, 3, 3, 16, np.float16)
    c, s = tables((5, 8))
    for layout in LAYOUTS:
        for g in fusedk.qk_norm_rope(qkv, c, s, layout=layout):
            assert g.flags.c_contiguous, layout


# --- the models' own chains, unfused, written the models' way (float64 NumPy) ---------------------
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_flux_the_model_way(dtype):
    """Flux (FluxAttnProcessor2_0, fused projections): qkv = to_qkv(x); q, k, v = chunk(3);
    each .view(B, -1, H, Dh).transpose(1, 2); norm_q/norm_k = RMSNorm(Dh, eps=1e-6); then
    apply_rotary_emb with FluxPosEmbed's full-width tables; SDPA takes [B, H, S, Dh]."""
    B, H, Dh, eps = 2, 3, 128, 1e-6
    ids = flux_ids(5, 6, 4)
    S = ids.shape[0]
    proj = rand((B, S, 3 * H * Dh), dtype, 2.0)  # the fused projection's output
    wq, wk = rand((Dh,), dtype, 0.2, 1.0), rand((Dh,), dtype, 0.2, 1.0)
    c, s = fusedk.rope_table_axes(ids, (16, 56, 56))
    # the model's chain
    query, key, value = np.split(f64(proj), 3, -1)
    query, key, value = (t.reshape(B, -1, H, Dh).transpose(0, 2, 1, 3) for t in (query, key, value))
    query, key = rmsnorm(query, wq, eps)[0], rmsnorm(key, wk, eps)[0]
    cf, sf = full_width(c)[None, None], full_width(s)[None, None]  # [1, 1, S, Dh]
    query, key = diffusers_apply_rotary_emb(query, cf, sf), diffusers_apply_rotary_emb(key, cf, sf)
    # fused: the projection unflattened to [B, S, 3, H, Dh] (a view)
    got = fusedk.qk_norm_rope(proj.reshape(B, S, 3, H, Dh), c, s, wq, wk, eps=eps, norm="head")
    for g, w, n in zip(got, (query, key, value), "qkv"):
        assert g.shape == (B, H, S, Dh)
        assert_close(g, w, dtype, what=f"Flux {n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ltx_video_the_model_way(dtype):
    """LTX-Video (LTXVideoAttentionProcessor2_0): q = to_q(x) [B, S, inner]; norm_q =
    RMSNorm(inner, eps=1e-5) over the whole inner dim (all heads); apply_rotary_emb over the
    inner dim with LTXVideoRotaryPosEmbed's [B, S, inner] tables; then .unflatten(2, (H, -1))
    .transpose(1, 2). Fused: norm "full", the half table [B, S, inner/2] seen per head as
    [B, S, H, Dh/2]."""
    B, S, H, Dh, eps = 2, 24, 4, 64, 1e-5
    inner = H * Dh
    xq, xk, xv = rand((B, S, inner), dtype, 2.0), rand((B, S, inner), dtype, 2.0), rand((B, S, inner), dtype, 2.0)
    wq, wk = rand((inner,), dtype, 0.2, 1.0), rand((inner,), dtype, 0.2, 1.0)
    coords = rng.uniform(0, 1, (B, S, 3)).astype(np.float32)
    c, s = (np.stack(t) for t in zip(*(fusedk.rope_table_ltx(coords[b], inner) for b in range(B))))  # [B, S, inner/2]
    freqs = full_width(c), full_width(s)
    query = diffusers_apply_rotary_emb(rmsnorm(xq, wq, eps)[0], *freqs)  # LTX's own: the whole inner dim
    key = diffusers_apply_rotary_emb(rmsnorm(xk, wk, eps)[0], *freqs)
    query, key, value = (t.reshape(B, S, H, Dh).transpose(0, 2, 1, 3) for t in (query, key, f64(xv)))
    tq, ts = c.reshape(B, S, H, Dh // 2), s.reshape(B, S, H, Dh // 2)
    got = fusedk.qk_norm_rope((xq.reshape(B, S, H, Dh), xk.reshape(B, S, H, Dh), xv.reshape(B, S, H, Dh)), tq, ts,
                              wq, wk, eps=eps, norm="full")
    for g, w, n in zip(got, (query, key, value), "qkv"):
        assert_close(g, w, dtype, what=f"LTX-Video {n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_mochi_the_model_way(dtype):
    """Mochi (MochiAttnProcessor2_0): q = to_q(x).unflatten(2, (H, -1)); norm_q = RMSNorm(Dh);
    the rotation on even/odd channels with [S, H, Dh/2] tables (rope_table_mixed), stacked back;
    then transpose(1, 2)."""
    B, H, Dh, eps = 1, 4, 32, 1e-6
    pos = mochi_positions(2, 4, 6)
    S = pos.shape[0]
    freqs = rand((3, H, Dh // 2), np.float32, 0.3)
    c, s = fusedk.rope_table_mixed(pos, freqs)
    xq, xk, xv = (rand((B, S, H * Dh), dtype, 2.0) for _ in range(3))
    wq, wk = rand((Dh,), dtype, 0.2, 1.0), rand((Dh,), dtype, 0.2, 1.0)
    query = mochi_apply_rotary_emb(rmsnorm(f64(xq).reshape(B, S, H, Dh), wq, eps)[0], f64(c), f64(s))
    key = mochi_apply_rotary_emb(rmsnorm(f64(xk).reshape(B, S, H, Dh), wk, eps)[0], f64(c), f64(s))
    query, key = query.transpose(0, 2, 1, 3), key.transpose(0, 2, 1, 3)
    value = f64(xv).reshape(B, S, H, Dh).transpose(0, 2, 1, 3)
    got = fusedk.qk_norm_rope(tuple(x.reshape(B, S, H, Dh) for x in (xq, xk, xv)), c, s, wq, wk, eps=eps)
    for g, w, n in zip(got, (query, key, value), "qkv"):
        assert_close(g, w, dtype, what=f"Mochi {n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wan_the_model_way(dtype):
    """Wan (WanAttnProcessor): norm_q = RMSNorm(inner) over all heads; .unflatten(2, (H, -1));
    apply_rotary_emb with freqs [1, S, 1, Dh] (x1, x2 = pairs; cos = freqs_cos[..., 0::2]);
    the attention takes [B, S, H, Dh]: layout bshd."""
    B, S, H, Dh, eps = 2, 12, 4, 32, 1e-6
    xq, xk, xv = (rand((B, S, H * Dh), dtype, 2.0) for _ in range(3))
    wq, wk = rand((H * Dh,), dtype, 0.2, 1.0), rand((H * Dh,), dtype, 0.2, 1.0)
    c, s = fusedk.rope_table_1d(np.arange(S), Dh, 10000.0)
    freqs_cos, freqs_sin = full_width(c)[None, :, None], full_width(s)[None, :, None]

    def wan_rope(x):
        x1, x2 = x.reshape(*x.shape[:-1], -1, 2)[..., 0], x.reshape(*x.shape[:-1], -1, 2)[..., 1]
        cos, sin = freqs_cos[..., 0::2], freqs_sin[..., 1::2]
        out = np.empty_like(x)
        out[..., 0::2] = x1 * cos - x2 * sin
        out[..., 1::2] = x1 * sin + x2 * cos
        return out

    query = wan_rope(rmsnorm(xq, wq, eps)[0].reshape(B, S, H, Dh))
    key = wan_rope(rmsnorm(xk, wk, eps)[0].reshape(B, S, H, Dh))
    got = fusedk.qk_norm_rope(tuple(x.reshape(B, S, H, Dh) for x in (xq, xk, xv)), c, s, wq, wk, eps=eps, norm="full",
                              layout="bshd")
    for g, w, n in zip(got, (query, key, f64(xv).reshape(B, S, H, Dh)), "qkv"):
        assert g.shape == (B, S, H, Dh)
        assert_close(g, w, dtype, what=f"Wan {n}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("rotary_dim", [64, 32])
def test_qwen3_llama_gqa_the_model_way(rotary_dim, dtype):
    """Qwen3-style attention (Llama's rotate_half RoPE with a per-head q_norm/k_norm): q =
    q_proj(x).view(B, S, Hq, Dh); q = q_norm(q).transpose(1, 2); cos = cat(freqs, freqs);
    q * cos + rotate_half(q) * sin over the first rotary_dim channels (NeoX's rotary_pct; the
    rest pass); k likewise with Hk < Hq heads; v.view(...).transpose(1, 2)."""
    B, S, Hq, Hk, Dh, eps = 2, 20, 8, 2, 64, 1e-6
    xq, xk, xv = rand((B, S, Hq * Dh), dtype, 2.0), rand((B, S, Hk * Dh), dtype, 2.0), rand((B, S, Hk * Dh), dtype)
    wq, wk = rand((Dh,), dtype, 0.2, 1.0), rand((Dh,), dtype, 0.2, 1.0)
    c, s = fusedk.rope_table_1d(np.arange(S), rotary_dim, 1000000.0)
    cos, sin = f64(wide(c)), f64(wide(s))  # the models' cat((freqs, freqs), -1)
    cos, sin = cos[None, None], sin[None, None]  # [S, R] unsqueezed over the heads of x [B, H, S, Dh]
    query = rmsnorm(xq.reshape(B, S, Hq, Dh), wq, eps)[0].transpose(0, 2, 1, 3)
    key = rmsnorm(xk.reshape(B, S, Hk, Dh), wk, eps)[0].transpose(0, 2, 1, 3)
    query, key = llama_apply_rotary(query, cos, sin, rotary_dim), llama_apply_rotary(key, cos, sin, rotary_dim)
    value = f64(xv).reshape(B, S, Hk, Dh).transpose(0, 2, 1, 3)
    got = fusedk.qk_norm_rope((xq.reshape(B, S, Hq, Dh), xk.reshape(B, S, Hk, Dh), xv.reshape(B, S, Hk, Dh)), c, s,
                              wq, wk, eps=eps, style="half", rotary_dim=rotary_dim)
    for g, w, n in zip(got, (query, key, value), "qkv"):
        assert_close(g, w, dtype, what=f"Qwen3 {n}")


# --- bad arguments -----------------------------------------------------------------------------
class _A:
    """The arguments the bad calls start from: qkv [2, 5, 3, 4, 16] float32 and its views q, k,
    v [2, 5, 4, 16]; k2, v2 [2, 5, 2, 16] (GQA); tables c, s [5, 8]; weights w [16], w64 [64]."""

    def __init__(self):
        self.qkv = rand((2, 5, 3, 4, 16), np.float32)
        self.q, self.k, self.v = self.qkv[:, :, 0], self.qkv[:, :, 1], self.qkv[:, :, 2]
        self.k2, self.v2 = rand((2, 5, 2, 16), np.float32), rand((2, 5, 2, 16), np.float32)
        self.c, self.s = tables((5, 8))
        self.w, self.w64 = np.ones(16, np.float32), np.ones(64, np.float32)
        self.bhsd = np.zeros((2, 4, 5, 16), np.float32)
        self.bshd = np.zeros((2, 5, 4, 16), np.float32)


def _qknr(a, qkv=None, c=None, s=None, **kw):
    return fusedk.qk_norm_rope(a.qkv if qkv is None else qkv, a.c if c is None else c, a.s if s is None else s, **kw)


BAD = [  # (call(a: _A), status, a regex the reason must contain after "qk_norm_rope: ")
    # qkv: the packed array or the tuple
    (lambda a: _qknr(a, a.qkv[0]), "SHAPE", r"qkv has shape \(5, 3, 4, 16\), expected \[B, S, 3, H, Dh\]"),
    (lambda a: _qknr(a, a.qkv[:, :, :2]), "SHAPE", r"qkv has shape \(2, 5, 2, 4, 16\), expected \[B, S, 3, H, Dh\]"),
    (lambda a: _qknr(a, a.qkv[..., None]), "SHAPE", r"qkv has shape \(2, 5, 3, 4, 16, 1\), expected"),
    (lambda a: _qknr(a, (a.q, a.k)), "INVALID_ARGUMENT", r"qkv is a sequence of 2, expected \(q, k, v\)"),
    (lambda a: _qknr(a, [a.q, a.k, a.v, a.v]), "INVALID_ARGUMENT", r"qkv is a sequence of 4, expected \(q, k, v\)"),
    (lambda a: _qknr(a, (None, a.k, a.v)), "INVALID_ARGUMENT", r"q is NULL, expected a tensor"),
    (lambda a: _qknr(a, (a.q[0], a.k, a.v)), "SHAPE", r"q has shape \[5, 4, 16\], expected \[B, S, H, Dh\]"),
    (lambda a: _qknr(a, (a.q.astype(np.float64), a.k, a.v)), "DTYPE", r"q has dtype float64, expected float32, "
     r"float16 or bfloat16"),
    (lambda a: _qknr(a, (wide(a.q)[..., ::2], a.k, a.v)), "LAYOUT", r"q has stride 2 in its last dim"),
    (lambda a: _qknr(a, (a.q, a.k.astype(np.float16), a.v), out=(a.bhsd, a.bhsd.copy(), a.bhsd.copy())), "DTYPE",
     r"k has dtype float16, expected float32 \(the dtype of q\)"),
    (lambda a: _qknr(a, (a.q, a.k, a.v.astype(BF16)), out=(a.bhsd, a.bhsd.copy(), a.bhsd.copy())), "DTYPE",
     r"v has dtype bfloat16, expected float32 \(the dtype of q\)"),
    # k and v against q
    (lambda a: _qknr(a, (a.q, a.k[:1], a.v[:1])), "SHAPE", r"k has shape \[1, 5, 4, 16\], expected \[B, S, Hk, Dh\] "
     r"with q's B, S and Dh \(2, 5, 16\)"),
    (lambda a: _qknr(a, (a.q, a.k[:, :3], a.v[:, :3])), "SHAPE", r"k has shape \[2, 3, 4, 16\], expected \[B, S, Hk, "
     r"Dh\] with q's B, S and Dh"),
    (lambda a: _qknr(a, (a.q, a.k[..., :8], a.v[..., :8])), "SHAPE", r"k has shape \[2, 5, 4, 8\], expected \[B, S, "
     r"Hk, Dh\] with q's B, S and Dh"),
    (lambda a: _qknr(a, (a.q, a.k[0], a.v)), "SHAPE", r"k has shape \[5, 4, 16\], expected \[B, S, H, Dh\]"),
    (lambda a: _qknr(a, (a.q, a.k2, a.v)), "SHAPE", r"v has shape \[2, 5, 4, 16\], expected \[B, S, Hk, Dh\] .*and "
     r"k's Hk"),
    (lambda a: _qknr(a, (a.q, a.k, a.v2)), "SHAPE", r"v has shape \[2, 5, 2, 16\], expected .*and k's Hk"),
    (lambda a: _qknr(a, (a.q, a.k, a.v[..., :8])), "SHAPE", r"v has shape \[2, 5, 4, 8\], expected \[B, S, Hk, Dh\] "
     r"with q's B, S and Dh"),
    (lambda a: _qknr(a, (a.q, a.k, a.v[:, :, :, None])), "SHAPE", r"v has shape \[2, 5, 4, 1, 16\], expected "
     r"\[B, S, H, Dh\]"),
    # the strings
    (lambda a: _qknr(a, norm="layer"), "INVALID_ARGUMENT", r"norm is 'layer', expected 'head', 'full' or 'none'"),
    (lambda a: _qknr(a, norm=0), "INVALID_ARGUMENT", r"norm is 0, expected 'head'"),
    (lambda a: _qknr(a, style="neox"), "INVALID_ARGUMENT", r"style is 'neox', expected 'interleaved' or 'half'"),
    (lambda a: _qknr(a, layout="sbhd"), "INVALID_ARGUMENT", r"layout is 'sbhd', expected 'bhsd' or 'bshd'"),
    (lambda a: _qknr(a, layout="BHSD"), "INVALID_ARGUMENT", r"layout is 'BHSD', expected 'bhsd' or 'bshd'"),
    # rotary_dim
    (lambda a: _qknr(a, c=a.c[:, :3], s=a.s[:, :3], rotary_dim=7), "INVALID_ARGUMENT",
     r"rotary_dim is 7, expected an even size 2\.\.16"),
    (lambda a: _qknr(a, c=wide(a.c), s=wide(a.s), rotary_dim=32), "INVALID_ARGUMENT",
     r"rotary_dim is 32, expected an even size 2\.\.16"),
    (lambda a: _qknr(a, rotary_dim=-2), "INVALID_ARGUMENT", r"rotary_dim is -2, expected an even size"),
    (lambda a: _qknr(a, rotary_dim=1.5), "INVALID_ARGUMENT", r"attribute rotary_dim is 1\.5, expected an integer"),
    (lambda a: _qknr(a, rotary_dim=8), "SHAPE", r"cos has shape \[5, 8\], expected \[S, R/2\], \[S, H, R/2\] or "
     r"\[B, S, H, R/2\] with R/2 = 4"),
    # eps
    (lambda a: _qknr(a, eps=-1.0), "INVALID_ARGUMENT", r"eps is -1, expected a finite value >= 0"),
    (lambda a: _qknr(a, eps=float("nan")), "INVALID_ARGUMENT", r"eps is nan, expected a finite value >= 0"),
    (lambda a: _qknr(a, eps=float("inf")), "INVALID_ARGUMENT", r"eps is inf, expected a finite value >= 0"),
    # the tables
    (lambda a: _qknr(a, c=a.c[:, :4], s=a.s[:, :4]), "SHAPE", r"cos has shape \[5, 4\], expected \[S, R/2\], "
     r"\[S, H, R/2\] or \[B, S, H, R/2\] with R/2 = 8"),
    (lambda a: _qknr(a, s=a.s[:, :4]), "SHAPE", r"sin has shape \[5, 4\], expected \[5, 8\] \(same as cos\)"),
    (lambda a: _qknr(a, s=a.s[:, None]), "SHAPE", r"sin has shape \[5, 1, 8\], expected \[5, 8\] \(same as cos\)"),
    (lambda a: _qknr(a, c=a.c[:4], s=a.s[:4]), "SHAPE", r"cos has shape \[4, 8\], expected its S dim"),
    (lambda a: _qknr(a, c=a.c[0], s=a.s[0]), "SHAPE", r"cos has shape \[8\], expected \[S, R/2\]"),
    (lambda a: _qknr(a, c=a.c[None, :, None, None], s=a.s[None, :, None, None]), "SHAPE",
     r"cos has shape \[1, 5, 1, 1, 8\], expected \[S, R/2\]"),
    (lambda a: _qknr(a, c=np.stack([a.c] * 3, 1), s=np.stack([a.s] * 3, 1)), "SHAPE",
     r"cos has shape \[5, 3, 8\], expected its H dim to be 1 or the heads of q and k"),
    (lambda a: _qknr(a, (a.q, a.k2, a.v2), c=np.stack([a.c] * 4, 1), s=np.stack([a.s] * 4, 1)), "SHAPE",
     r"cos has shape \[5, 4, 8\], expected its H dim to be 1 or the heads of q and k \(equal\)"),
    (lambda a: _qknr(a, c=np.stack([a.c[:, None]] * 3), s=np.stack([a.s[:, None]] * 3)), "SHAPE",
     r"cos has shape \[3, 5, 1, 8\], expected its B dim to be 1 or q's B"),
    (lambda a: _qknr(a, c=a.c.astype(np.float16)), "DTYPE", r"cos has dtype float16, expected float32"),
    (lambda a: _qknr(a, s=a.s.astype(BF16)), "DTYPE", r"sin has dtype bfloat16, expected float32"),
    (lambda a: _qknr(a, c=wide(a.c)[:, ::2], s=wide(a.s)[:, ::2]), "LAYOUT", r"cos has stride 2 in its last dim"),
    # the weights
    (lambda a: _qknr(a, q_weight=a.w[:8]), "SHAPE", r"q_weight has shape \[8\], expected \[16\] \(Dh of q\)"),
    (lambda a: _qknr(a, k_weight=a.w64), "SHAPE", r"k_weight has shape \[64\], expected \[16\] \(Dh of k\)"),
    (lambda a: _qknr(a, q_weight=a.w[None]), "SHAPE", r"q_weight has shape \[1, 16\], expected \[16\]"),
    (lambda a: _qknr(a, norm="full", q_weight=a.w), "SHAPE", r"q_weight has shape \[16\], expected \[64\] "
     r"\(H\*Dh of q\)"),
    (lambda a: _qknr(a, (a.q, a.k2, a.v2), norm="full", q_weight=a.w64, k_weight=a.w64), "SHAPE",
     r"k_weight has shape \[64\], expected \[32\] \(H\*Dh of k\)"),
    (lambda a: _qknr(a, norm="none", q_weight=a.w), "INVALID_ARGUMENT",
     r"q_weight is given but norm is NONE, expected no weights"),
    (lambda a: _qknr(a, norm="none", k_weight=a.w), "INVALID_ARGUMENT",
     r"k_weight is given but norm is NONE, expected no weights"),
    (lambda a: _qknr(a, q_weight=a.w.astype(np.float16)), "DTYPE",
     r"q_weight has dtype float16, expected float32 \(the dtype of q\)"),
    (lambda a: _qknr(a, k_weight=a.w.astype(BF16)), "DTYPE", r"k_weight has dtype bfloat16, expected float32"),
    (lambda a: _qknr(a, q_weight=wide(a.w)[::2]), "LAYOUT", r"q_weight has stride 2"),
    # norm FULL: at most 8192 channels a token (q's, or k's)
    (lambda a: _qknr(a, rand((1, 2, 3, 65, 128), np.float32), c=np.ones((2, 64), np.float32),
                     s=np.zeros((2, 64), np.float32), norm="full"), "SHAPE",
     r"norm is FULL over q's H\*Dh = 8320 channels, expected at most 8192"),
    (lambda a: _qknr(a, (rand((1, 2, 1, 128), np.float32), rand((1, 2, 65, 128), np.float32), None),
                     c=np.ones((2, 64), np.float32), s=np.zeros((2, 64), np.float32), norm="full"), "SHAPE",
     r"norm is FULL over k's H\*Dh = 8320 channels, expected at most 8192"),
    (lambda a: _qknr(a, np.ones((1, 1, 3, 1, 8194), np.float32), c=np.ones((1, 4097), np.float32),
                     s=np.zeros((1, 4097), np.float32)), "SHAPE",
     r"q has shape \[1, 1, 1, 8194\], expected a head dim \(last\) of at most 8192"),
    # out=
    (lambda a: _qknr(a, out=(a.bshd, None, None)), "SHAPE",
     r"q_out has shape \[2, 5, 4, 16\], expected \[2, 4, 5, 16\] \(\[B, H, S, Dh\] of its input\)"),
    (lambda a: _qknr(a, layout="bshd", out=(a.bhsd, None, None)), "SHAPE",
     r"q_out has shape \[2, 4, 5, 16\], expected \[2, 5, 4, 16\] \(its input's\)"),
    (lambda a: _qknr(a, out=(None, a.bshd, None)), "SHAPE", r"k_out has shape \[2, 5, 4, 16\], expected "
     r"\[2, 4, 5, 16\]"),
    (lambda a: _qknr(a, (a.q, a.k2, a.v2), out=(None, a.bhsd, None)), "SHAPE",
     r"k_out has shape \[2, 4, 5, 16\], expected \[2, 2, 5, 16\]"),
    (lambda a: _qknr(a, out=(None, None, a.bshd)), "SHAPE", r"v_out has shape \[2, 5, 4, 16\], expected "
     r"\[2, 4, 5, 16\]"),
    (lambda a: _qknr(a, out=(a.bhsd.astype(np.float16), None, None)), "DTYPE",
     r"q_out has dtype float16, expected float32 \(the dtype of q\)"),
    (lambda a: _qknr(a, out=(None, None, a.bhsd.astype(BF16))), "DTYPE", r"v_out has dtype bfloat16, expected float32"),
    (lambda a: _qknr(a, out=(np.lib.stride_tricks.as_strided(a.bhsd, strides=(0,) + a.bhsd.strides[1:]), None,
                             None)), "LAYOUT", r"output q_out has stride 0 in dim 0 \(size 2\); outputs cannot "
     r"broadcast"),
    (lambda a: _qknr(a, out=(np.broadcast_to(a.bhsd[:1], a.bhsd.shape), None, None)), "INVALID_ARGUMENT",
     r"q_out is read-only, expected a writable array"),
    (lambda a: _qknr(a, out=(wide(a.bhsd)[..., ::2], None, None)), "LAYOUT", r"q_out has stride 2 in its last dim"),
    (lambda a: _qknr(a, (a.q, a.k, None), out=(None, None, a.bhsd)), "INVALID_ARGUMENT",
     r"v_out is given but v is NULL, expected both or neither"),
    (lambda a: _qknr(a, out=(a.bhsd, a.bhsd.copy())), "INVALID_ARGUMENT",
     r"out has 2 arrays, expected \(q_out, k_out, v_out\)"),
    (lambda a: _qknr(a, out=(a.bhsd,) * 4), "INVALID_ARGUMENT", r"out has 4 arrays, expected \(q_out, k_out, v_out\)"),
]


@pytest.mark.parametrize("case, status, match", BAD, ids=[f"{i}-{b[2][:40]}" for i, b in enumerate(BAD)])
def test_bad_arguments(case, status, match):
    a = _A()
    q0 = a.qkv.copy()
    with pytest.raises(fusedk.Error, match="^qk_norm_rope: " + match) as e:
        case(a)
    assert e.value.status == "FUSEDK_ERR_" + status, e.value
    assert same_bits(a.qkv, q0)


def test_bad_arguments_leave_the_outputs_untouched():
    a = _A()
    outs = tuple(np.full((2, 4, 5, 16), 7.0, np.float32) for _ in range(3))
    for bad in (dict(q_weight=a.w[:8]), dict(rotary_dim=6), dict(s=a.s[:, :4]), dict(eps=-1.0)):
        with pytest.raises(fusedk.Error):
            _qknr(a, out=outs, **bad)
        assert all((o == 7).all() for o in outs), bad


@pytest.mark.parametrize("case, match", [
    (lambda a: _qknr(a, (a.q, a.k.astype(np.float16), a.v)), r"k has dtype float16, expected float32"),
    (lambda a: _qknr(a, (a.q, a.k, a.v.astype(np.float16))), r"v has dtype float16, expected float32"),
    (lambda a: _qknr(a, (a.q, None, a.v)), r"k is (NULL|None), expected a tensor"),
], ids=["k-dtype", "v-dtype", "k-None"])
def test_bad_inputs_are_named_when_outputs_are_allocated(case, match):
    with pytest.raises(fusedk.Error, match="^qk_norm_rope: " + match):
        case(_A())


# --- fusedk.torch and fusedk.jax on the CPU ----------------------------------------------------------
def _torch():
    torch = pytest.importorskip("torch")
    if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
        pytest.skip("this torch has no DLPack C exchange API (torch >= 2.11)")
    return torch


def _cuda_ok():
    try:
        import torch
        return torch.cuda.is_available() and bool(fusedk.kernel_info()["cuda"].get("devices"))
    except ImportError:
        return False


def _torch_inputs(torch, device, dtype, B=2, S=64, H=4, Dh=64, R=None):
    g = torch.Generator(device="cpu").manual_seed(3)
    qkv = torch.randn(B, S, 3, H, Dh, generator=g).to(device=device, dtype=dtype)
    w = (1 + 0.2 * torch.randn(2, Dh, generator=g)).to(device=device, dtype=dtype)
    ang = torch.rand(S, (R or Dh) // 2, generator=g, dtype=torch.float64) * 8 - 4
    c, s = (f(ang).float().to(device) for f in (torch.cos, torch.sin))
    return qkv, c, s, w[0], w[1]


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _cuda_ok(),
                                                                                        reason="no CUDA"))])
def test_torch_compile_fullgraph(device):
    torch = _torch()
    import fusedk.torch as fkt
    from oracle import assert_close_gpu
    qkv, c, s, wq, wk = _torch_inputs(torch, device, torch.bfloat16, R=32)

    def prologue(qkv, c, s, wq, wk):
        q, k, v = fkt.qk_norm_rope(qkv, c, s, q_weight=wq, k_weight=wk, norm="head", style="half", rotary_dim=32)
        return q, k, v

    def prologue_out(qkv, c, s, wq, wk):  # out= under compile: declared mutations
        B, S, _, H, Dh = qkv.shape
        outs = tuple(qkv.new_empty(B, S, H, Dh) for _ in range(3))
        fkt.qk_norm_rope(qkv, c, s, wq, wk, norm="head", layout="bshd", rotary_dim=32,
                         out=outs)
        return outs

    want = fusedk.qk_norm_rope(np_of(qkv), np_of(c), np_of(s), np_of(wq), np_of(wk), norm="head", style="half",
                               rotary_dim=32)
    want_out = fusedk.qk_norm_rope(np_of(qkv), np_of(c), np_of(s), np_of(wq), np_of(wk), layout="bshd",
                                   rotary_dim=32)
    eager = prologue(qkv, c, s, wq, wk)
    got = torch.compile(prologue, fullgraph=True)(qkv, c, s, wq, wk)
    got_out = torch.compile(prologue_out, fullgraph=True)(qkv, c, s, wq, wk)
    for g, e, w in zip(got + got_out, eager + prologue_out(qkv, c, s, wq, wk), want + want_out):
        assert isinstance(g, torch.Tensor) and g.device.type == device and g.shape == w.shape
        if device == "cpu":  # the same C reference: bit for bit
            assert np.array_equal(bits(np_of(g)), bits(w)) and torch.equal(g, e)
        else:
            assert_close_gpu(np_of(g), w, w.dtype, what="torch.compile qk_norm_rope")
            assert torch.equal(g, e)  # the same kernel on the same inputs
    if device == "cuda":  # CUDA graphs through cudagraph trees
        ro = torch.compile(prologue, fullgraph=True, mode="reduce-overhead")
        for _ in range(4):  # warm-up, record, replay
            r = tuple(t.clone() for t in ro(qkv, c, s, wq, wk))
        torch.cuda.synchronize()
        assert all(torch.equal(a, b) for a, b in zip(r, eager))


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.skipif(not _cuda_ok(),
                                                                                        reason="no CUDA"))])
def test_torch_opcheck(device):
    torch = _torch()
    import fusedk.torch  # noqa: F401 - registers torch.ops.fusedk
    from torch.library import opcheck
    qkv, c, s, wq, wk = _torch_inputs(torch, device, torch.float32, B=2, S=5, H=3, Dh=16)
    q, k, v = qkv.unbind(2)
    op, op_out = torch.ops.fusedk.qk_norm_rope, torch.ops.fusedk.qk_norm_rope_out
    bhsd, bshd = torch.empty(2, 3, 5, 16, device=device), torch.empty(2, 5, 3, 16, device=device)
    cases = [
        (op, (q, k, v, c, s, wq, wk, 1e-6, 0, 0, 0, 0)), (op, (q, k, None, c, s, None, None, 1e-6, 2, 1, 1, 16)),
        (op, (q, k[:, :, :1], v[:, :, :1], c, s, None, None, 1e-5, 1, 0, 0, 0)),
        (op_out, (q, k, v, c, s, wq, wk, 1e-6, 0, 1, 0, 0, bhsd.clone(), bhsd.clone(), bhsd.clone())),
        (op_out, (q, k, None, c, s, None, None, 1e-6, 1, 0, 1, 0, bshd.clone(), bshd.clone(), None)),
    ]
    for o, a in cases:
        res = opcheck(o, a)
        assert all(r == "SUCCESS" for r in res.values()), (o, res)


def _jax():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    jax = pytest.importorskip("jax")
    import fusedk.jax as fk
    return jax, fk


@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("form", ["packed", "gqa", "no-v"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_jax_cpu_is_the_numpy_path(dtype, form, jit):
    """XLA:CPU runs the same C reference: bit for bit what NumPy gets (XLA hands the custom call
    compact copies of the q, k, v slices; the reference does not depend on strides)."""
    jax, fk = _jax()
    cpu = jax.devices("cpu")[0]
    B, S, Hq, Dh = 2, 9, 4, 32
    Hk = Hq if form == "packed" else 2
    qkv, q, k, v = inputs({"packed": "packed", "gqa": "tuple", "no-v": "no-v"}[form], B, S, Hq, Hk, Dh, dtype)
    qw, kw = weights("full", True, Hq, Hk, Dh, dtype)
    c, s = tables((S, 8))
    kw_ = dict(eps=1e-5, norm="full", style="half", layout="bshd" if form == "gqa" else "bhsd", rotary_dim=16)
    want = fusedk.qk_norm_rope(qkv, c, s, qw, kw, **kw_)
    put = (lambda a: None if a is None else jax.device_put(a, cpu))
    args = (put(qkv) if form == "packed" else tuple(put(a) for a in qkv), put(c), put(s), put(qw), put(kw))
    f = (lambda qkv, c, s, qw, kw: fk.qk_norm_rope(qkv, c, s, qw, kw, **kw_))
    got = jax.jit(f)(*args) if jit else f(*args)
    assert isinstance(got, tuple) and len(got) == len(want)
    for g, w in zip(got, want):
        assert isinstance(g, jax.Array)
        g = np.asarray(g)
        assert g.dtype == w.dtype and g.shape == w.shape and same_bits(g, w), form
    # fusedk's own function routes JAX arrays to the same custom call
    got = fusedk.qk_norm_rope(*args, **kw_)
    assert all(same_bits(np.asarray(g), w) for g, w in zip(got, want))


def test_jax_errors():
    jax, fk = _jax()
    a = _A()
    cpu = jax.devices("cpu")[0]
    qkv = jax.device_put(a.qkv, cpu)
    with pytest.raises(fusedk.Error, match=r"qk_norm_rope: q_weight has shape \[8\], expected \[16\]"):
        fk.qk_norm_rope(qkv, a.c, a.s, a.w[:8])
    with pytest.raises(fusedk.Error, match=r"qk_norm_rope: cos has dtype float16, expected float32"):
        fk.qk_norm_rope(qkv, a.c.astype(np.float16), a.s)
    with pytest.raises(fusedk.Error, match=r"qk_norm_rope: layout is 'sbhd'"):
        fk.qk_norm_rope(qkv, a.c, a.s, layout="sbhd")
    with pytest.raises(fusedk.Error, match="JAX arrays are immutable"):
        fusedk.qk_norm_rope(qkv, a.c, a.s, out=(qkv[:, :, 0], None, None))


# --- the GPU kernel through torch and CuPy, against the CPU reference ---------------------------
def _perm(a, layout):
    """a [B, S, H, Dh] seen in `layout` (NumPy, torch, CuPy)."""
    if layout == "bshd":
        return a
    return a.permute(0, 2, 1, 3) if hasattr(a, "permute") else a.transpose(0, 2, 1, 3)


def _view(kind, shape):
    """(the base array's shape, base -> the [..] view of `shape`) for a view kind: "compact";
    "pad" (padded rows: strided heads); "misaligned" (the base offset by one element: the scalar
    path); "odd-rows" (rows of Dh + 1 elements, offset by one)."""
    n = int(np.prod(shape))
    if kind == "compact":
        return shape, lambda a: a
    if kind == "pad":
        return shape[:-1] + (shape[-1] + 8,), lambda a: a[..., :shape[-1]]
    if kind == "misaligned":
        return (n + 1,), lambda a: a[1:].reshape(shape)
    if kind == "odd-rows":
        return shape[:-1] + (shape[-1] + 1,), lambda a: a[..., 1:]
    raise ValueError(kind)


GPU_CASES = {  # (B, S, Hq, Hk, Dh, rotary_dim, table, form, norm, weights, layout, view, out)
    "bench-small": (2, 300, 24, 24, 128, None, "SR", "packed", "head", True, "bhsd", "compact", None),
    "bench-small-bshd": (2, 300, 24, 24, 128, None, "SR", "packed", "head", True, "bshd", "compact", None),
    "gqa": (2, 257, 16, 4, 128, None, "SR", "tuple", "head", True, "bhsd", "compact", None),
    "gqa-no-v-full": (2, 129, 8, 2, 64, None, "SR", "no-v", "full", True, "bshd", "compact", None),
    "partial": (1, 129, 4, 4, 128, 64, "SR", "packed", "head", True, "bhsd", "compact", None),
    "partial-full-none-w": (1, 77, 6, 6, 96, 32, "SR", "tuple", "full", False, "bhsd", "compact", None),
    "per-head": (2, 100, 6, 6, 64, None, "SHR", "packed", "full", True, "bhsd", "compact", None),
    "per-batch-gqa-partial": (2, 65, 8, 2, 96, 32, "BS1R", "tuple", "head", False, "bhsd", "compact", None),
    "per-batch-heads": (2, 33, 4, 4, 64, None, "BSHR", "tuple", "head", True, "bshd", "compact", None),
    "no-norm": (2, 100, 8, 8, 128, None, "SR", "packed", "none", False, "bhsd", "compact", None),
    "Dh64": (2, 200, 12, 12, 64, None, "SR", "packed", "head", True, "bhsd", "compact", None),
    "Dh96": (2, 150, 10, 10, 96, None, "SR", "packed", "head", True, "bshd", "compact", None),
    "Dh256": (1, 120, 8, 8, 256, None, "SR", "packed", "head", True, "bhsd", "compact", None),
    "Dh256-full": (1, 70, 32, 32, 256, None, "SR", "packed", "full", True, "bhsd", "compact", None),
    "full-8192": (1, 37, 64, 64, 128, None, "SR", "packed", "full", True, "bhsd", "compact", None),
    "full-8192-gqa": (1, 33, 64, 8, 128, None, "SR", "tuple", "full", True, "bshd", "compact", None),
    "full-8192-Dh64": (2, 9, 128, 128, 64, None, "SR", "packed", "full", False, "bhsd", "compact", None),
    "odd-Dh10-R4": (2, 19, 3, 1, 10, 4, "SR", "tuple", "head", True, "bhsd", "compact", None),
    "Dh2": (1, 17, 2, 2, 2, None, "SR", "packed", "full", True, "bshd", "compact", None),
    "strided-heads": (2, 77, 4, 4, 128, None, "SR", "packed", "head", True, "bhsd", "pad", None),
    "strided-heads-gqa": (2, 77, 8, 2, 64, 32, "SR", "tuple", "full", True, "bshd", "pad", None),
    "misaligned": (2, 61, 4, 4, 128, None, "SR", "packed", "head", True, "bhsd", "misaligned", None),
    "misaligned-gqa-full": (2, 61, 6, 3, 64, None, "SR", "tuple", "full", True, "bshd", "misaligned", None),
    "odd-rows": (1, 45, 4, 2, 64, None, "SR", "tuple", "head", True, "bhsd", "odd-rows", None),
    "one-token": (1, 1, 4, 4, 64, None, "SR", "packed", "head", True, "bhsd", "compact", None),
    "one-token-full": (1, 1, 16, 16, 128, None, "SR", "packed", "full", True, "bshd", "compact", None),
    "many-tokens": (1, 65536, 2, 2, 64, None, "SR", "packed", "head", True, "bhsd", "compact", None),
    "strided-out": (2, 50, 4, 2, 64, None, "SR", "tuple", "head", True, "bhsd", "compact", "pad"),
    "in-place-bshd": (2, 50, 4, 4, 64, None, "SR", "packed", "full", True, "bshd", "compact", "inplace"),
    "in-place-bhsd": (2, 50, 4, 4, 64, 32, "SR", "packed", "head", True, "bhsd", "compact", "inplace"),
    "in-place-no-norm": (2, 50, 4, 4, 64, 32, "SR", "packed", "none", False, "bshd", "compact", "inplace"),
}


def _gpu_inputs(case, dtype):
    """Host bases of the inputs, a builder (bases -> the qkv argument), and the views q, k, v."""
    B, S, Hq, Hk, Dh, R, kind, form, norm, with_w, layout, view, out = GPU_CASES[case]
    names = ["qkv"] if form == "packed" else ["q", "k"] + (["v"] if form == "tuple" else [])
    shapes = {"qkv": (B, S, 3, Hq, Dh), "q": (B, S, Hq, Dh), "k": (B, S, Hk, Dh), "v": (B, S, Hk, Dh)}
    bases, fns = {}, {}
    for n in names:
        base_shape, fns[n] = _view(view, shapes[n])
        bases[n] = rand(base_shape, dtype, 2.0, 0.3)

    def build(b):
        if form == "packed":
            return fns["qkv"](b["qkv"])
        return tuple(fns[n](b[n]) if n in b else None for n in ("q", "k", "v"))

    arg = build(bases)
    q, k, v = (arg[:, :, 0], arg[:, :, 1], arg[:, :, 2]) if form == "packed" else arg
    return bases, build, q, k, v


@pytest.mark.skipif(not oracle.gpu_frameworks(), reason="no CUDA device with torch or CuPy")
@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("case", list(GPU_CASES))
def test_gpu_qk_norm_rope_matches_the_reference(case, dtype, style):
    from oracle import assert_close_gpu
    B, S, Hq, Hk, Dh, R, kind, form, norm, with_w, layout, _, out = GPU_CASES[case]
    bases, build, q, k, _ = _gpu_inputs(case, dtype)
    qw, kw = weights(norm, with_w, Hq, Hk, Dh, dtype)
    c, s = tables(table_shape(kind, B, S, Hq, (R or Dh) // 2))
    attrs = dict(norm=norm, style=style, layout=layout, rotary_dim=R)
    want = fusedk.qk_norm_rope(build(bases), c, s, qw, kw, **attrs)  # the CPU reference, same views
    aux = [in_layout(pair_aux(oracle.qk_norm(x, w, 1e-6, norm), style, R, keep_rest=True), layout)
           for x, w in ((q, qw), (k, kw))]
    for fw, to_dev, to_host, _ in oracle.gpu_frameworks():
        dev = {n: to_dev(b) for n, b in bases.items()}
        if any(d is None for d in dev.values()):
            continue  # CuPy has no bfloat16 arrays
        arg = build(dev)
        dq, dk, dv = (arg[:, :, 0], arg[:, :, 1], arg[:, :, 2]) if form == "packed" else arg
        outs, pads = None, None
        if out == "inplace":
            outs = (_perm(dq, layout), _perm(dk, layout), _perm(dv, layout))
        elif out == "pad":
            pads = [to_dev(np.full(w.shape[:-1] + (Dh + 6,), 7.0, dtype)) for w in want]
            outs = tuple(p[..., 3:3 + Dh] for p in pads) + (None,) * (3 - len(want))
        got = fusedk.qk_norm_rope(arg, to_dev(c), to_dev(s), None if qw is None else to_dev(qw),
                                  None if kw is None else to_dev(kw), out=outs, **attrs)
        assert len(got) == len(want)
        if outs is not None:
            assert all(g is o for g, o in zip(got, outs))
        what = f"{fw} qk_norm_rope {case} {style}"
        for j, (g, w) in enumerate(zip(got, want)):
            h = to_host(g)
            assert h.shape == w.shape, (what, j, h.shape, w.shape)
            if j == 2:  # v' = v, exact
                assert np.array_equal(h.astype(np.float64), oracle.f64(w)), f"{what}: v' is not v"
            else:
                assert_close_gpu(h, w, dtype, aux[j], what=f"{what} {'qk'[j]}")
        if pads is not None:
            for p in pads:
                p = to_host(p)
                assert (p[..., :3] == 7).all() and (p[..., 3 + Dh:] == 7).all(), f"{what}: out padding written"
        if out != "inplace":  # the inputs stay as they were
            for n, b in bases.items():
                assert np.array_equal(oracle.f64(to_host(dev[n])), oracle.f64(b)), f"{what}: input {n} written"


@pytest.mark.skipif(not oracle.gpu_frameworks(), reason="no CUDA device with torch or CuPy")
def test_gpu_broadcast_table_views_and_determinism():
    from oracle import assert_close_gpu
    B, S, H, Dh = 2, 77, 4, 64
    qkv, q, k, v = inputs("packed", B, S, H, H, Dh, np.float16)
    qw, kw = weights("head", True, H, H, Dh, np.float16)
    c, s = tables((S, Dh // 2))
    want = fusedk.qk_norm_rope(qkv, c, s, qw, kw)
    aux = [in_layout(pair_aux(oracle.qk_norm(x, w), "interleaved", keep_rest=True), "bhsd")
           for x, w in ((q, qw), (k, kw))]
    for fw, to_dev, to_host, bcast in oracle.gpu_frameworks():
        d = to_dev(qkv)
        for what, view in {"[B,S,H,R/2] stride 0": lambda t: bcast(t[None, :, None, :], (B, S, H, Dh // 2)),
                           "[S,H,R/2] stride 0": lambda t: bcast(t[:, None, :], (S, H, Dh // 2))}.items():
            cd, sd = view(to_dev(c)), view(to_dev(s))
            got = fusedk.qk_norm_rope(d, cd, sd, to_dev(qw), to_dev(kw))
            for j in range(2):
                assert_close_gpu(to_host(got[j]), want[j], np.float16, aux[j], what=f"{fw} {what} {'qk'[j]}")
            again = fusedk.qk_norm_rope(d, cd, sd, to_dev(qw), to_dev(kw))
            for a, b in zip(got, again):  # run to run: bit for bit
                assert np.array_equal(to_host(a).view(np.uint16), to_host(b).view(np.uint16)), f"{fw} determinism"


def _jax_gpu():
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    try:
        import jax
        import fusedk.jax as fk
        return jax, fk, jax.devices("gpu")[0]
    except Exception:  # noqa: BLE001 - no jax, or no GPU backend
        return None


@pytest.mark.skipif(not (fusedk.kernel_info()["cuda"].get("devices") and _jax_gpu()),
                    reason="no jax GPU backend, or no CUDA device for fusedk")
@pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gpu_jax(dtype, jit):
    from oracle import assert_close_gpu
    jax, fk, gpu = _jax_gpu()
    B, S, H, Dh = 2, 300, 8, 128
    qkv, q, k, v = inputs("packed", B, S, H, H, Dh, dtype)
    qw, kw = weights("head", True, H, H, Dh, dtype)
    c, s = tables((S, Dh // 2))
    want = fusedk.qk_norm_rope(qkv, c, s, qw, kw)
    aux = [in_layout(pair_aux(oracle.qk_norm(x, w), "interleaved", keep_rest=True), "bhsd")
           for x, w in ((q, qw), (k, kw))]
    args = [jax.device_put(a, gpu) for a in (qkv, c, s, qw, kw)]
    f = (lambda qkv, c, s, qw, kw: fk.qk_norm_rope(qkv, c, s, qw, kw))
    got = jax.jit(f)(*args) if jit else f(*args)
    for j, (g, w) in enumerate(zip(got, want)):
        assert isinstance(g, jax.Array) and g.devices() == {gpu}
        if j == 2:
            assert same_bits(np.asarray(g), w)
        else:
            assert_close_gpu(np.asarray(g), w, dtype, aux[j], what=f"jax gpu {'qk'[j]}")
