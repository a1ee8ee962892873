#!/usr/bin/env python3
"""[attention] the attention prologue and attention of a DiT block, from the packed qkv projection
[B, S, 3, H, Dh] (bf16) to attention's output, three ways side by side in one run:
  bf16        qk_norm_rope (bshd) + attention
  int8        qk_norm_rope (bshd) + attention(precision="int8")   (three quantization passes + kernel)
  int8_fused  qk_norm_rope_int8 + attention(ScaledTensor, ScaledTensor, v view)   (a scales pass + kernel)
Per chain: each kernel's time (torch.profiler's CUDA activity, median of --calls calls), their sum
as attention TFLOP/s, and the eager call as a user makes it (CUDA events around --calls
back-to-back calls, no graphs, no out=). Per prologue: qk_norm_rope_int8's and qk_norm_rope's
kernel time and bytes moved a second. Errors of the two int8 chains against float64 attention of
the bf16 chain's q', k', v (first 256 query rows). Writes JSON and Markdown under --out.

    PYTHONPATH=bindings/python:bench python3 bench/attn_i8_fused.py [--out DIR]"""
import argparse
import datetime
import json
import os

import numpy as np
import torch

import fusedk
import fusedk.torch as ft
from attn_i8_scaled import kernel_times

SHAPES = {  # name: (B, S, H, Dh, norm)
    "flux": (1, 4608, 24, 128, "head"),
    "wan-1.3b": (1, 32760, 12, 128, "full"),
    "ltx": (1, 6930, 32, 64, "full"),
    "dh256": (1, 8192, 16, 256, "head"),
}


def eager_us(fn, calls):
    for _ in range(3):
        fn()
    a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    torch.cuda.synchronize()
    a.record()
    for _ in range(calls):
        fn()
    b.record()
    torch.cuda.synchronize()
    return a.elapsed_time(b) * 1e3 / calls


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--calls", type=int, default=20)
    ap.add_argument("--shapes", default=",".join(SHAPES))
    args = ap.parse_args()
    gpu = torch.cuda.get_device_name()
    print(gpu)
    res = {"gpu": gpu, "date": datetime.date.today().isoformat(), "torch": torch.__version__,
           "fusedk": fusedk.__version__, "rows": []}
    for name in args.shapes.split(","):
        B, S, H, D, norm = SHAPES[name]
        g = torch.Generator(device="cuda").manual_seed(0)
        qkv = torch.randn(B, S, 3, H, D, device="cuda", dtype=torch.bfloat16, generator=g)
        ang = torch.rand(S, D // 2, device="cuda", generator=g) * 6.28
        cos, sin = ang.cos(), ang.sin()
        n = H * D if norm == "full" else D
        wq, wk = (1 + 0.1 * torch.randn(n, device="cuda", dtype=torch.bfloat16, generator=g) for _ in range(2))

        def prologue16():
            return ft.qk_norm_rope(qkv, cos, sin, wq, wk, norm=norm, layout="bshd")

        def prologue8():
            return ft.qk_norm_rope_int8(qkv, cos, sin, wq, wk, norm=norm)
        chains = {
            "bf16": lambda: ft.attention(*prologue16()),
            "int8": lambda: ft.attention(*prologue16(), precision="int8"),
            "int8_fused": lambda: ft.attention(*prologue8()),
        }
        flop = 4.0 * B * H * S * S * D
        row = {"shape": name, "B": B, "S": S, "H": H, "Dh": D, "norm": norm, "chains": {}}
        for c, fn in chains.items():
            t = kernel_times(fn, args.calls)
            total = sum(t.values())
            e = eager_us(fn, args.calls)
            row["chains"][c] = {"kernels_us": t, "kernels_total_us": total, "tflops_kernels": flop / total / 1e6,
                                "eager_us": e, "tflops_eager": flop / e / 1e6}
            print(f"{name} {c}: " + ", ".join(f"{k} {u:.1f}" for k, u in t.items())
                  + f" us; kernels {total:.0f} us ({flop / total / 1e6:.0f} TFLOP/s), eager call {e:.0f} us "
                  f"({flop / e / 1e6:.0f} TFLOP/s)")
        elems = B * S * H * D
        for p, fn, nbytes in (("qk_norm_rope", prologue16, 6 * 2 * elems),  # q, k, v read and written, 16-bit
                              ("qk_norm_rope_int8", prologue8, 2 * 2 * elems + 2 * elems + 2 * 4 * B * S * H)):
            t = sum(kernel_times(fn, args.calls).values())
            row[p] = {"us": t, "GBps": nbytes / t / 1e3}
            print(f"{name} {p}: {t:.1f} us, {nbytes / t / 1e3:.0f} GB/s")
        # errors of the int8 chains against float64 attention of the bf16 chain's q', k', v (256 rows)
        q, k, v = prologue16()
        R = 256
        qd, kd, vd = (t.double().cpu().numpy() for t in (q[:, :R], k, v))
        s = np.matmul(qd.transpose(0, 2, 1, 3), kd.transpose(0, 2, 3, 1)) * np.float64(np.float32(1 / np.sqrt(D)))
        pr = np.exp(s - s.max(-1, keepdims=True))
        want = np.matmul(pr / pr.sum(-1, keepdims=True), vd.transpose(0, 2, 1, 3)).transpose(0, 2, 1, 3)
        for c in ("bf16", "int8", "int8_fused"):
            got = chains[c]()[:, :R].double().cpu().numpy()
            row["chains"][c]["rel_l2"] = rel_l2(got, want)
            print(f"{name} {c}: rel. L2 {rel_l2(got, want):.4f}")
        res["rows"].append(row)
        del qkv
        torch.cuda.empty_cache()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "attn_i8_fused.json"), "w") as f:
        json.dump(res, f, indent=1)
    with open(os.path.join(args.out, "attn_i8_fused.md"), "w") as f:
        f.write(f"# Attention prologue + attention, from packed qkv (bf16)\n\n{gpu}, {res['date']}, torch "
                f"{res['torch']}, fusedk {res['fusedk']}. TFLOP/s of attention's 4 B H S^2 Dh; kernels: the sum "
                "of every kernel's median time a call (graph-free, torch.profiler); eager: the call as a user "
                "makes it (CUDA events, back-to-back calls). rel. L2: first 256 rows against float64 attention "
                "of the bf16 prologue's q', k', v.\n\n"
                "| shape | chain | kernels us | TFLOP/s (kernels) | eager us | TFLOP/s (eager) | rel. L2 |\n"
                "|---|---|---:|---:|---:|---:|---:|\n")
        for r in res["rows"]:
            for c, d in r["chains"].items():
                f.write(f"| {r['shape']} B{r['B']} S{r['S']} H{r['H']} Dh{r['Dh']} ({r['norm']}) | {c} | "
                        f"{d['kernels_total_us']:.0f} | {d['tflops_kernels']:.0f} | {d['eager_us']:.0f} | "
                        f"{d['tflops_eager']:.0f} | {d['rel_l2']:.4f} |\n")
        f.write("\n| shape | qk_norm_rope us (GB/s) | qk_norm_rope_int8 us (GB/s) |\n|---|---:|---:|\n")
        for r in res["rows"]:
            a, b = r["qk_norm_rope"], r["qk_norm_rope_int8"]
            f.write(f"| {r['shape']} | {a['us']:.1f} ({a['GBps']:.0f}) | {b['us']:.1f} ({b['GBps']:.0f}) |\n")


if __name__ == "__main__":
    main()
