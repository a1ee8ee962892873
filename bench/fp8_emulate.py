#!/usr/bin/env python3
"""[linear] FP8 GEMM quantization schemes in float64 (what each scaling costs in accuracy, apart
from any kernel): y = x w^T with x and w rounded to e4m3 (ml_dtypes' float8_e4m3fn: round to nearest even,
values scaled into +-448 first) under each scaling, the products summed exactly in float64 (so
only the quantization shows, not an FP8 accumulator's lost bits), against the float64 product
of the unquantized inputs: relative L2 over the output. Schemes:
  tensor      one scale for x, one for w (torch._scaled_mm per tensor)
  row         a scale a row of x, a scale an output channel of w (torchao's PerRow)
  blk128      x per 1x128 block of a row, w per 128x128 block (DeepSeek-V3's)
  row+blk     x per 1x128 block, w per output channel
and each with the output rounded to bf16 (what the GEMM writes); then, for the row scheme, a model
of the FP8 tensor cores' accumulator (about 14 significant bits, DeepSeek-V3's report): the sum
rounded to 14 bits after each k-step of 32, over all of K (cuBLASLt's fast accumulation) or
promoted to an exact sum every 128 (DeepSeek-V3's, and cuBLASLt's default). Inputs: x N(0,1); x with 0.1 %
of its entries x20 (the outlier family of fusedk's 8-bit contract); x with 4 of its channels x20 (outlier channels,
as DiT activations carry); w N(0, 0.02). Shapes: the DiT GEMMs' K with a subsample of rows and
output channels (M 512, N 512).

    python3 bench/fp8_emulate.py [--out FILE.md]"""
import argparse

import ml_dtypes
import numpy as np

E4M3 = ml_dtypes.float8_e4m3fn
FMAX = 448.0


def q8(x, scale):
    """x / scale rounded to e4m3 (saturated to +-448), back as float64 times the scale"""
    return np.clip(x / scale, -FMAX, FMAX).astype(np.float32).astype(E4M3).astype(np.float64) * scale


def amax_scale(a, axis=None, keepdims=True):
    m = np.abs(a).max(axis=axis, keepdims=keepdims)
    return np.where(m > 0, m / FMAX, 1.0)


def blocks(a, rows, cols):
    """a's scales per (rows x cols) block, broadcast back to a's shape"""
    M, K = a.shape
    b = a.reshape(M // rows, rows, K // cols, cols)
    s = amax_scale(b, axis=(1, 3))
    return np.broadcast_to(s, b.shape).reshape(M, K)


def quantized(x, w, scheme):
    if scheme == "tensor":
        return q8(x, amax_scale(x)), q8(w, amax_scale(w))
    if scheme == "row":
        return q8(x, amax_scale(x, 1)), q8(w, amax_scale(w, 1))
    if scheme == "blk128":
        return q8(x, blocks(x, 1, 128)), q8(w, blocks(w, 128, 128))
    if scheme == "row+blk":
        return q8(x, blocks(x, 1, 128)), q8(w, amax_scale(w, 1))
    raise ValueError(scheme)


def acc14(xq, wq, promote=None, step=32, bits=14):
    """xq wq^T with a running sum rounded to `bits` significant bits after each k-step; with
    promote, that sum is added exactly to the result every `promote` elements and restarted"""
    out, acc = np.zeros((xq.shape[0], wq.shape[0])), np.zeros((xq.shape[0], wq.shape[0]))
    for k0 in range(0, xq.shape[1], step):
        acc = rnd(acc + xq[:, k0:k0 + step] @ wq[:, k0:k0 + step].T, bits)
        if promote and (k0 + step) % promote == 0:
            out, acc = out + acc, np.zeros_like(acc)
    return out + acc


def rnd(a, bits):
    m, e = np.frexp(a)
    return np.ldexp(np.round(m * 2.0 ** bits) / 2.0 ** bits, e)


def bf16(y):
    return y.astype(np.float32).astype(ml_dtypes.bfloat16).astype(np.float64)


def rel(a, b):
    return np.linalg.norm(a - b) / np.linalg.norm(b)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    M, N = 512, 512
    Ks = {"Flux qkv/out, K 3072": 3072, "Wan 14B, K 5120": 5120, "Flux mlp down, K 12288": 12288,
          "Wan 14B ffn down, K 13824": 13824}
    schemes = ["tensor", "row", "blk128", "row+blk"]
    lines = ["| K | x | " + " | ".join(schemes) + " | " + " | ".join(s + " +bf16 out" for s in schemes)
             + " | row, 14-bit acc. | row, 14-bit acc. promoted a 128 |", "|---|---|" + "---:|" * (2 * len(schemes) + 2)]
    for kname, K in Ks.items():
        w = 0.02 * rng.standard_normal((N, K))
        base = rng.standard_normal((M, K))
        fams = {"N(0,1)": base.copy(), "0.1 % x20": base.copy(), "4 channels x20": base.copy()}
        fams["0.1 % x20"][rng.random((M, K)) < 1e-3] *= 20
        fams["4 channels x20"][:, rng.choice(K, 4, replace=False)] *= 20
        for fam, x in fams.items():
            want = x @ w.T
            errs, errs16 = [], []
            for s in schemes:
                xq, wq = quantized(x, w, s)
                y = xq @ wq.T
                errs.append(rel(y, want))
                errs16.append(rel(bf16(y), want))
            xq, wq = quantized(x, w, "row")
            acc = [rel(acc14(xq, wq), want), rel(acc14(xq, wq, promote=128), want)]
            lines.append(f"| {kname} | {fam} | " + " | ".join(f"{e:.4f}" for e in errs + errs16 + acc) + " |")
            print(lines[-1], flush=True)
    bf = rel(bf16(fams["N(0,1)"] @ w.T), fams["N(0,1)"] @ w.T)
    tail = f"\nbf16 output rounding alone (the last K, N(0,1)): {bf:.4f}\n"
    print(tail)
    if args.out:
        with open(args.out, "w") as f:
            f.write("# FP8 (e4m3) GEMM quantization schemes, float64 emulation (bench/fp8_emulate.py)\n\n"
                    f"M 512, N 512 (a subsample of the DiT GEMMs' rows and channels), w N(0, 0.02), seed "
                    f"{args.seed}; relative L2 of y = x w^T against the float64 product of the unquantized "
                    "inputs, products summed exactly (no FP8 accumulator loss).\n\n" + "\n".join(lines) + "\n" + tail)


if __name__ == "__main__":
    main()
