#!/usr/bin/env python3
"""[attention] attention_int8's quantization choices, emulated in float64 NumPy (no GPU): the
relative L2 error against float64 attention of the unquantized inputs, per input family (N(0,1);
k offset +-4 a channel; 0.1 % of q and k entries x20), for q and k as int8 per token or per block
of tokens (k less its mean over the keys), P as uint8 at a fixed scale against the running row
max or scaled a tile (each row's 8 bits span the tile's largest weight), or exact, and v as int8
per channel. The online softmax runs tile by tile (BC keys) as the kernel's does. The next
kernel's candidates beside them: P scaled by two tiles at once (one int32 sum of P V a 256
keys), l summed from P's bytes rather than the exact weights, k scaled a (tile, group of the
32 keys one accumulator thread holds: key % 8 // 2), and P V in FP8 e4m3 (P against the running
max times 448, v a channel to 448: SageAttention2's layout, its sums taken as exact; and P alone
in e4m3 beside int8 v, a pairing wgmma lacks, to show whose error it is), and P V in f16 (P
against the running max, v as given: SageAttention1's split). --pv16: the shipped kernel (q, k
int8 a token, k less its mean, P in bf16 against the running max, v as given) beside the k
scales that would fold into the exponent's FFMA (a 128-key tile's, a (tile, thread group)'s)
and k without its mean (what qk_norm_rope could emit in one pass).

    python3 bench/attn_int8_emulate.py [--sq 256] [--sk 2048,32768] [--dh 128] [--next | --pv16]"""
import argparse

import numpy as np


def reference(q, k, v):
    s = q @ k.T / np.sqrt(q.shape[1])
    p = np.exp(s - s.max(1, keepdims=True))
    return p @ v / p.sum(1, keepdims=True)


def int8(x, block=None):
    """symmetric int8 of x's rows (block: rows share a scale by blocks), dequantized"""
    a = np.abs(x).max(1, keepdims=True)
    if block:
        a = np.repeat([a[i:i + block].max() for i in range(0, len(x), block)], block)[:len(x), None]
    s = np.maximum(a, 1e-30) / 127
    return np.round(x / s) * s


def int8_groups(x, BC=128):
    """int8 of x's rows by (tile of BC rows, key % 8 // 2): the 32 keys one thread's accumulator
    columns hold share a scale"""
    out = np.empty_like(x)
    g = np.arange(len(x)) % 8 // 2
    for j in range(0, len(x), BC):
        for t in range(4):
            rows = np.arange(j, min(j + BC, len(x)))
            rows = rows[g[rows] == t]
            if len(rows):
                s = max(np.abs(x[rows]).max(), 1e-30) / 127
                out[rows] = np.round(x[rows] / s) * s
    return out


def bf16(x):
    """x rounded to bfloat16 (nearest, ties to even), as float64"""
    u = np.asarray(x, np.float32).view(np.uint32).astype(np.uint64)
    u = (u + 0x7FFF + ((u >> 16) & 1)) & 0xFFFF0000
    return u.astype(np.uint32).view(np.float32).astype(np.float64)


def e4m3(x):
    """x rounded to FP8 e4m3 (nearest, saturating at 448; subnormals from 2^-9)"""
    a = np.minimum(np.abs(x), 448.0)
    e = np.floor(np.log2(np.maximum(a, 2.0 ** -6)))
    step = 2.0 ** (e - 3)
    return np.sign(x) * np.minimum(np.round(a / step) * step, 448.0)


def emulate(q, k, v, p_mode, q_block=None, k_block=None, BC=128, l_bytes=False, k_groups=False, v_mode=None,
            smooth=True):
    ks = k - k.mean(0) if smooth else k
    kq = int8_groups(ks) if k_groups else int8(ks, k_block)
    qq = int8(q, q_block)
    v_mode = v_mode or ("e4m3" if p_mode == "e4m3" else "int8")
    if v_mode in ("e4m3", "e4m3x2"):  # x2: v as two e4m3 terms, the second the first's remainder
        vs = np.maximum(np.abs(v).max(0, keepdims=True), 1e-30) / 448
        hi = e4m3(v / vs)
        vq = (hi + (e4m3((v / vs - hi) * 16) / 16 if v_mode == "e4m3x2" else 0)) * vs
    elif v_mode == "f16":
        vq = v.astype(np.float16).astype(np.float64)
    elif v_mode == "exact":
        vq = v
    else:
        vq = int8(v.T).T
    c = 1 / np.sqrt(q.shape[1])
    m, l, o = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), v.shape[1]))
    step = 2 * BC if p_mode == "tile2" else BC
    for j in range(0, len(k), step):
        s = qq @ kq[j:j + step].T * c
        mn = np.maximum(m, s.max(1))
        alpha, p = np.exp(m - mn), np.exp(s - mn[:, None])
        if p_mode == "e4m3":
            pq = e4m3(p * 448) / 448
        elif p_mode == "f16":
            pq = p.astype(np.float16).astype(np.float64)
        elif p_mode == "bf16":
            pq = bf16(p)
        else:
            top = p.max(1, keepdims=True) if p_mode in ("tile", "tile2") else 1.0
            pq = p if p_mode == "exact" else np.round(p * 255 / top) * top / 255
        l, o, m = l * alpha + (pq if l_bytes else p).sum(1), o * alpha[:, None] + pq @ vq[j:j + step], mn
    return o / l[:, None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sq", type=int, default=256)
    ap.add_argument("--sk", default="2048,32768")
    ap.add_argument("--dh", type=int, default=128)
    ap.add_argument("--next", action="store_true", help="the next kernel's candidates instead")
    ap.add_argument("--pv16", action="store_true", help="the shipped kernel and its k-scale candidates instead")
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    configs = [("q, k a token; P fixed", dict(p_mode="fixed")), ("q, k a token; P a tile", dict(p_mode="tile")),
               ("q, k a token; P exact", dict(p_mode="exact")),
               ("q a token, k 128 keys; P a tile", dict(p_mode="tile", k_block=128)),
               ("q 64 tokens, k a token; P a tile", dict(p_mode="tile", q_block=64))]
    if args.next:
        configs = [("today: P a tile, l exact", dict(p_mode="tile")),
                   ("P a tile, l of the bytes", dict(p_mode="tile", l_bytes=True)),
                   ("P by two tiles", dict(p_mode="tile2")),
                   ("k a (tile, thread group)", dict(p_mode="tile", k_groups=True)),
                   ("P, v e4m3", dict(p_mode="e4m3")),
                   ("P e4m3, v int8 (no such wgmma: P's share)", dict(p_mode="e4m3", v_mode="int8")),
                   ("P exact, v e4m3", dict(p_mode="exact", v_mode="e4m3")),
                   ("P, v f16 (int8 Q K^T, f16 P V)", dict(p_mode="f16", v_mode="f16")),
                   ("P exact, v e4m3 hi + lo", dict(p_mode="exact", v_mode="e4m3x2")),
                   ("P, v e4m3; k a (tile, thread group)", dict(p_mode="e4m3", k_groups=True))]
    if args.pv16:
        pv = dict(p_mode="bf16", v_mode="exact")
        configs = [("shipped: q, k a token, P bf16, v as given", pv),
                   ("k a 128-key tile", dict(pv, k_block=128)),
                   ("k a (tile, thread group)", dict(pv, k_groups=True)),
                   ("k a token, not less its mean", dict(pv, smooth=False)),
                   ("k a 128-key tile, not less its mean", dict(pv, k_block=128, smooth=False))]
    print("| Sk | config | N(0,1) | k offset | outliers |\n|---:|---|---:|---:|---:|")
    for sk in (int(x) for x in args.sk.split(",")):
        q, k, v = (rng.standard_normal((n, args.dh)) for n in (args.sq, sk, sk))
        fam = {"normal": (q, k, v), "offset": (q, k + rng.uniform(-4, 4, (1, args.dh)), v)}
        q2, k2 = q.copy(), k.copy()
        for t in (q2, k2):
            t[rng.random(t.shape) < 1e-3] *= 20
        fam["outliers"] = (q2, k2, v)
        for name, kw in configs:
            errs = []
            for q_, k_, v_ in fam.values():
                r = reference(q_, k_, v_)
                errs.append(np.linalg.norm(emulate(q_, k_, v_, **kw) - r) / np.linalg.norm(r))
            print(f"| {sk} | {name} | " + " | ".join(f"{e:.4f}" for e in errs) + " |", flush=True)


if __name__ == "__main__":
    main()
