"""examples/dit_block (one Flux-style block in C on fusedk alone) against NumPy: the C program's CPU
block (bf16, fusedk's references) against the same block in float64 with the inputs it makes
(its xorshift generator, replayed here) — once with a rounding to bf16 where each fusedk op
writes its output (what the references compute: double math, one rounding an op), and once
without any (the exact block). The GPU block is checked against the CPU one by the program itself
(meson test dit_block on a GPU machine)."""
import os
import subprocess

import numpy as np
import pytest

import oracle

ml_dtypes = pytest.importorskip("ml_dtypes")
BF16 = ml_dtypes.bfloat16
B, ST, GH, GW, D, H, F = 2, 37, 9, 14, 256, 4, 1024  # main.c's small block
S, DH = ST + GH * GW, D // H


def program():
    lib = os.environ.get("FUSEDK_LIBRARY", "")
    exe = os.path.join(os.path.dirname(lib), "fusedk_dit_block") if lib else ""
    if not os.path.isfile(exe):
        pytest.skip("fusedk_dit_block not built next to FUSEDK_LIBRARY (meson builds it)")
    return exe


def host_rand(n, scale, shift, seed):
    """main.c's host_rand: bf16 of shift + scale * frand, float32 arithmetic, xorshift32 state."""
    s, out = seed, np.empty(n, np.uint32)
    for i in range(n):
        s ^= (s << 13) & 0xFFFFFFFF
        s ^= s >> 17
        s ^= (s << 5) & 0xFFFFFFFF
        out[i] = s
    r = (out & 0xFFFFFF).astype(np.float32) / np.float32(8388608.0) - np.float32(1.0)
    return (np.float32(shift) + np.float32(scale) * r).astype(BF16).astype(np.float64)


def inputs():
    ws, ws2 = np.float32(1) / np.sqrt(np.float32(D)), np.float32(1) / np.sqrt(np.float32(F))
    p = dict(mod_w=host_rand(6 * D * D, ws, 0, 1).reshape(6 * D, D), mod_b=host_rand(6 * D, 0.1, 0, 2),
             qkv_w=host_rand(3 * D * D, ws, 0, 3).reshape(3 * D, D), qkv_b=host_rand(3 * D, 0.1, 0, 4),
             q_norm=host_rand(DH, 0.2, 1, 5), k_norm=host_rand(DH, 0.2, 1, 6),
             o_w=host_rand(D * D, ws, 0, 7).reshape(D, D), o_b=host_rand(D, 0.1, 0, 8),
             fc1_w=host_rand(F * D, ws, 0, 9).reshape(F, D), fc1_b=host_rand(F, 0.1, 0, 10),
             fc2_w=host_rand(D * F, ws2, 0, 11).reshape(D, F), fc2_b=host_rand(D, 0.1, 0, 12))
    x = host_rand(B * S * D, 1, 0, 13).reshape(B, S, D)
    temb = host_rand(B * D, 1, 0, 14).reshape(B, D)
    return p, x, temb


def rope_tables():
    """fusedk_rope_table_axes's float32 tables for Flux's ids (text (0, 0, 0), image (0, row,
    column)), axes Dh/8 and the rest halved, theta 10000."""
    ids = np.zeros((S, 3))
    ids[ST:, 1], ids[ST:, 2] = np.arange(GH * GW) // GW, np.arange(GH * GW) % GW
    axes = (DH // 8, (DH - DH // 8) // 2, (DH - DH // 8) // 2)
    return tuple(t.astype(np.float32) for t in oracle.rope_table_axes(ids, axes))


def block(p, x, temb, r):
    """The C block's math through the ops' float64 oracles; r rounds an op's output (to bf16, or
    not at all)."""
    lin = lambda t, w, act="none": r(oracle.linear(t, p[w + "_w"], p[w + "_b"], act)[0])  # noqa: E731
    t = r(oracle.act(temb, "silu"))
    mod = lin(t, "mod")
    shift1, scale1, gate1, shift2, scale2, gate2 = (mod[:, i * D:(i + 1) * D] for i in range(6))
    qkv = lin(r(oracle.adaln(x, scale1, shift1)), "qkv").reshape(B, S, 3, H, DH)
    q, k, v = (r(t) for t in oracle.qk_norm_rope(qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2], *rope_tables(),
                                                   p["q_norm"], p["k_norm"], layout="bshd"))
    o = r(oracle.attention(q, k, v)[0]).reshape(B, S, D)
    x1 = r(oracle.gated_residual(x, lin(o, "o"), gate1))
    h = lin(r(oracle.adaln(x1, scale2, shift2)), "fc1", "gelu_tanh")
    return r(oracle.gated_residual(x1, lin(h, "fc2"), gate2))


def rel(a, ref):
    return float(np.linalg.norm(a - ref) / np.linalg.norm(ref))


def test_c_block_matches_numpy(tmp_path):
    out = tmp_path / "out.bin"
    r = subprocess.run([program(), "--dump", str(out)], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    got = np.fromfile(out, np.uint16).view(BF16).astype(np.float64).reshape(B, S, D)
    p, x, temb = inputs()
    rounded = block(p, x, temb, lambda a: a.astype(BF16).astype(np.float64))
    exact = block(p, x, temb, lambda a: a)
    # the references round where the NumPy block does: they differ only where an accumulation
    # order moves a value across a bf16 rounding boundary
    assert rel(got, rounded) < 1e-3, rel(got, rounded)
    # and the bf16 block is the exact one within bf16's rounding (2^-9 a step, a dozen steps)
    assert rel(got, exact) < 2e-2, rel(got, exact)
    assert rel(rounded, exact) < 2e-2
