#!/usr/bin/env python3
"""[attention] attention_int8_scaled (q and k given in int8 with their scales) beside
attention_int8 (fusedk quantizes them), through fusedk.attention(ScaledTensor, ScaledTensor, v):
kernel times (torch.profiler's CUDA activity, median of --calls calls) and the error against float64 attention of the unquantized inputs (the first 256 query rows).

    PYTHONPATH=bindings/python python3 bench/attn_i8_scaled.py [--shapes B,H,S[,Dh] ...]

q and k are quantized here by torch ops as attention_int8 quantizes q: per (token, head) row,
amax / 127, round half to even; k without its mean (what a fused producer such as qk_norm_rope
emits in one pass). Families: N(0,1) and k offset per channel (uniform +-4)."""
import argparse
import collections
import statistics

import numpy as np
import torch

import fusedk


def quantize(x):
    """(int8 data, float32 scale) per row of x's last dim"""
    amax = x.float().abs().amax(-1)
    inv = torch.where(amax > 0, 127.0 / amax, torch.zeros_like(amax))
    return torch.round(x.float() * inv[..., None]).clamp(-127, 127).to(torch.int8), amax / 127.0


def scaled_attention(q8, qs, k8, ks, v):
    return fusedk.attention(fusedk.ScaledTensor(q8, qs), fusedk.ScaledTensor(k8, ks), v)


def kernel_times(fn, calls):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    d = collections.defaultdict(list)
    for e in prof.events():
        if e.device_type == torch.autograd.DeviceType.CUDA:
            d[e.name.replace("(anonymous namespace)::", "").split("<")[0].split("(")[0].replace("void ", "")].append(
                e.device_time_total)
    return {n: statistics.median(t) * len(t) / calls for n, t in d.items()}  # us a call (a kernel's launches summed)


def rel_l2(a, b):
    return float(np.linalg.norm(a - b) / np.linalg.norm(b))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=["1,24,4608", "1,24,16384", "1,16,8192,256"])
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    print(torch.cuda.get_device_name())
    for sh in args.shapes:
        f = [int(x) for x in sh.split(",")]
        B, H, S, D = f[0], f[1], f[2], f[3] if len(f) > 3 else 128
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        (q8, qs), (k8, ks) = quantize(q), quantize(k)
        flop = 4.0 * B * H * S * S * D
        for name, fn in (("int8", lambda: fusedk.attention(q, k, v, precision="int8")),
                         ("int8_scaled", lambda: scaled_attention(q8, qs, k8, ks, v))):
            t = kernel_times(fn, args.calls)
            total = sum(t.values())
            print(f"B{B} H{H} S{S} Dh{D} {name}: " + ", ".join(f"{n} {u:.1f}" for n, u in t.items())
                  + f" us; all {flop / total / 1e6:.0f} TFLOP/s")
    # errors against float64 (first 256 rows), k without its mean in the scaled call
    rng = np.random.default_rng(0)
    for D in (64, 128, 256):
        for fam in ("normal", "offset"):
            S, R = 4096, 256
            x = [rng.standard_normal((1, S, 4, D)).astype(np.float32) for _ in range(3)]
            if fam == "offset":
                x[1] += rng.uniform(-4, 4, (1, 1, 4, D)).astype(np.float32)
            q, k, v = (torch.from_numpy(t).to(torch.bfloat16).cuda() for t in x)
            qd, kd, vd = (t.double().cpu().numpy() for t in (q, k, v))
            s = np.einsum("bihd,bjhd->bhij", qd[:, :R], kd) * np.float64(np.float32(1 / np.sqrt(D)))
            p = np.exp(s - s.max(-1, keepdims=True))
            want = np.einsum("bhij,bjhd->bihd", p / p.sum(-1, keepdims=True), vd)
            (q8, qs), (k8, ks) = quantize(q), quantize(k)
            got_s = scaled_attention(q8, qs, k8, ks, v)[:, :R].double().cpu().numpy()
            got = fusedk.attention(q, k, v, precision="int8")[:, :R].double().cpu().numpy()
            print(f"{fam} S{S} Dh{D}: rel. L2 int8 {rel_l2(got, want):.4f}, int8_scaled (k without its mean) "
                  f"{rel_l2(got_s, want):.4f}")


if __name__ == "__main__":
    main()
