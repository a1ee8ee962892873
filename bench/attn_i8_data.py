#!/usr/bin/env python3
"""[attention] the int8 kernel on a model's own q, k, v against random ones of the same shapes
and strides: one Wan 2.1 1.3B block at 480p x 81 frames (32760 tokens; bench_dit's random-weight
build), its self-attention's inputs captured from the patched block (attention=True: bf16 q, k,
v; attention="int8": q and k from qk_norm_rope_int8), then the bf16 and int8 kernels timed
(torch.profiler, median of --calls) on those inputs and on random ones (N(0,1); int8: uniform
data with the captured scales), and what the data does to the online softmax: per query
row (--rows of each head), the share of 128-key tiles whose max raises the running max (a
rescale of O in the bf16 kernel; the int8 kernel rescales only past a jump of 2^8, also counted),
and the scores' spread. --ncu: one launch each of the four for Nsight Compute (run under ncu).

    PYTHONPATH=bindings/python:bench python3 bench/attn_i8_data.py [--ncu]"""
import argparse
import sys

import torch

import fusedk
import fusedk.diffusers as fd
import fusedk.torch as ft
from attn_i8_scaled import kernel_times
from bench_dit import MODELS, block_inputs


def capture(attention):
    build, inputs, kinds, _ = MODELS["wan"]
    m = build(1)
    blk = kinds[0][1](m)
    a, kw = block_inputs(m, inputs(m), [blk])[0]
    fd.apply(m, attention=attention)
    got, real = [], fusedk.attention

    def rec(q, k, v, *x, **y):
        got.append((q, k, v))
        return real(q, k, v, *x, **y)
    fusedk.attention = rec
    try:
        with torch.inference_mode():
            blk(*a, **kw)
    finally:
        fusedk.attention = real
    del m
    return got[0]  # the self-attention (the first call; the cross-attention follows)


def like_normal(t):
    """N(0,1) (int8: uniform -127..127 with the same scales) in t's shape and strides"""
    if isinstance(t, fusedk.ScaledTensor):
        d = torch.empty_strided(t.data.shape, t.data.stride(), dtype=torch.int8, device="cuda")
        d.copy_(torch.randint(-127, 128, t.data.shape, device="cuda", dtype=torch.int8))
        return fusedk.ScaledTensor(d, t.scale.clone())
    x = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device="cuda")
    return x.copy_(torch.randn(t.shape, device="cuda", dtype=t.dtype))


def softmax_stats(q, k, rows):
    """over `rows` query rows of every head: the share of 128-key tiles whose max raises the running
    max (any rise; a rise past 2^8 in exp2 units), and the scores' std (in natural-log units)"""
    if isinstance(q, fusedk.ScaledTensor):
        q = q.data.float() * q.scale[..., None]
        k = k.data.float() * k.scale[..., None]
    q, k = q.float(), k.float()
    S, H, D = k.shape[1], k.shape[2], k.shape[3]
    idx = torch.linspace(0, q.shape[1] - 1, rows, device="cuda").long()
    s = torch.einsum("bihd,bjhd->bhij", q[:, idx], k) / D ** 0.5  # [1, H, rows, S]
    T = S // 128
    tmax = s[..., :T * 128].unflatten(-1, (T, 128)).amax(-1)  # [1, H, rows, T]
    run = torch.cummax(tmax, -1).values
    rise = (run[..., 1:] > run[..., :-1]).float().mean().item()
    big = ((run[..., 1:] - run[..., :-1]) * 1.4426950408889634 > 8).float().mean().item()
    return rise, big, s.std().item()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--calls", type=int, default=10)
    ap.add_argument("--rows", type=int, default=64)
    ap.add_argument("--ncu", action="store_true")
    args = ap.parse_args()
    print(torch.cuda.get_device_name())
    q16, k16, v16 = capture(True)
    q8, k8, v8 = capture("int8")
    cases = {"bf16 model": (q16, k16, v16), "int8 model": (q8, k8, v8)}
    cases["bf16 N(0,1)"] = tuple(like_normal(t) for t in cases["bf16 model"])
    cases["int8 N(0,1)"] = tuple(like_normal(t) for t in cases["int8 model"])
    def desc(t):
        x = t if torch.is_tensor(t) else t.data
        return f"{'' if torch.is_tensor(t) else 'int8 '}{tuple(x.shape)}/{x.stride()}"
    for name, (q, k, v) in cases.items():
        print(f"{name}: q {desc(q)} k {desc(k)} v {desc(v)}")
    if args.ncu:  # one launch each inside NVTX range "probe" (ncu --nvtx --nvtx-include probe/), in
        # this order: bf16 model, int8 model, bf16 N(0,1), int8 N(0,1)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_push("probe")
        for q, k, v in cases.values():
            ft.attention(q, k, v)
        torch.cuda.synchronize()
        torch.cuda.nvtx.range_pop()
        return
    for name, (q, k, v) in cases.items():
        t = {n: u for n, u in kernel_times(lambda: ft.attention(q, k, v), args.calls).items() if "_kernel" in n}
        rise, big, std = softmax_stats(q, k, args.rows)
        print(f"{name}: " + ", ".join(f"{n} {u:.0f} us" for n, u in t.items())
              + f"; tiles raising the running max {100 * rise:.2f}% (past 2^8: {100 * big:.3f}%), score std {std:.3f}")


if __name__ == "__main__":
    sys.exit(main())
