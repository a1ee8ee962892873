#!/usr/bin/env python3
"""[attention] Where attention_int8's time goes: its quantization passes and its kernel, apart,
by torch.profiler's kernel durations (CUDA activity), next to the bf16 kernel of the same inputs.

    PYTHONPATH=bindings/python python3 bench/attn_i8_parts.py [--shapes B,H,S[,causal[,Dh]] ...]

Prints, per shape, each kernel's median duration over --calls calls and TFLOP/s of the int8
kernel alone and of the whole call (4 B H S^2 Dh, halved when causal)."""
import argparse
import collections
import re
import statistics

import torch

import fusedk


def kernel_name(n):
    """a demangled kernel's bare name: void (anonymous namespace)::attn_i8_rows<...>(...) -> attn_i8_rows"""
    n = n.replace("(anonymous namespace)::", "")
    n = n[5:] if n.startswith("void ") else n
    return re.split(r"[<(]", n)[0]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", nargs="*", default=["1,24,4608", "1,24,16384", "1,24,32760", "2,24,4096,1", "2,16,4096,0,64", "1,16,16384,0,64"])
    ap.add_argument("--calls", type=int, default=20)
    args = ap.parse_args()
    print(f"{torch.cuda.get_device_name()}")
    for sh in args.shapes:
        f = [int(x) for x in sh.split(",")]
        B, H, S, causal, D = f[0], f[1], f[2], bool(f[3]) if len(f) > 3 else False, f[4] if len(f) > 4 else 128
        q, k, v = (torch.randn(B, S, H, D, device="cuda", dtype=torch.bfloat16) for _ in range(3))
        flop = 4.0 * B * H * S * S * D / (2 if causal else 1)
        for prec in ("int8", None):
            for _ in range(3):
                fusedk.attention(q, k, v, causal=causal, precision=prec)
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                for _ in range(args.calls):
                    fusedk.attention(q, k, v, causal=causal, precision=prec)
                torch.cuda.synchronize()
            d = collections.defaultdict(list)
            for e in prof.events():
                if e.device_type == torch.autograd.DeviceType.CUDA:
                    d[kernel_name(e.name)].append(e.device_time_total)
            med = {n: statistics.median(t) for n, t in d.items()}
            total = sum(med.values())
            kern = max(med, key=med.get)  # the attention kernel: the passes are a few percent of it
            parts = ", ".join(f"{n} {u:.1f}" for n, u in sorted(med.items(), key=lambda x: -x[1]))
            print(f"B{B} H{H} S{S} Dh{D}{' causal' if causal else ''} {prec or 'bf16'}: {parts} us; "
                  f"kernel {flop / med[kern] / 1e6:.0f} TFLOP/s, all {flop / total / 1e6:.0f}")


if __name__ == "__main__":
    main()
