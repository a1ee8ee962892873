#!/usr/bin/env python3
"""[attention] attention_int8's quantization choices, emulated in float64 NumPy (no GPU): the
relative L2 error against float64 attention of the unquantized inputs, per input family (N(0,1);
k offset +-4 a channel; 0.1 % of q and k entries x20), for q and k as int8 per token or per block
of tokens (k less its mean over the keys), P as uint8 at a fixed scale against the running row
max or scaled a tile (each row's 8 bits span the tile's largest weight), or exact, and v as int8
per channel. The online softmax runs tile by tile (BC keys) as the kernel's does.

    python3 bench/attn_int8_emulate.py [--sq 256] [--sk 2048,32768] [--dh 128]"""
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


def emulate(q, k, v, p_mode, q_block=None, k_block=None, BC=128):
    kq = int8(k - k.mean(0), k_block)
    qq, vq = int8(q, q_block), int8(v.T).T
    c = 1 / np.sqrt(q.shape[1])
    m, l, o = np.full(len(q), -np.inf), np.zeros(len(q)), np.zeros((len(q), v.shape[1]))
    for j in range(0, len(k), BC):
        s = qq @ kq[j:j + BC].T * c
        mn = np.maximum(m, s.max(1))
        alpha, p = np.exp(m - mn), np.exp(s - mn[:, None])
        top = p.max(1, keepdims=True) if p_mode == "tile" else 1.0
        pq = p if p_mode == "exact" else np.round(p * 255 / top) * top / 255
        l, o, m = l * alpha + p.sum(1), o * alpha[:, None] + pq @ vq[j:j + BC], mn
    return o / l[:, None]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--sq", type=int, default=256)
    ap.add_argument("--sk", default="2048,32768")
    ap.add_argument("--dh", type=int, default=128)
    args = ap.parse_args()
    rng = np.random.default_rng(0)
    configs = [("q, k a token; P fixed", dict(p_mode="fixed")), ("q, k a token; P a tile", dict(p_mode="tile")),
               ("q, k a token; P exact", dict(p_mode="exact")),
               ("q a token, k 128 keys; P a tile", dict(p_mode="tile", k_block=128)),
               ("q 64 tokens, k a token; P a tile", dict(p_mode="tile", q_block=64))]
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
