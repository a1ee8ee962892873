"""Drives a few normalization kernels for Nsight Compute (ncu): fusedk's and Liger's rmsnorm and
layernorm, and fusedk's gated residual norm, on the 4x4096x3072 bf16 bench shape (--shape BxLxD
for another), each called 3 times. tools/gpu_run.sh --ncu runs it under ncu.
    python3 bench/ncu_norm.py [--shape 1x4096x3584]"""
import argparse

import torch

import bench  # the Liger wrapper shared with the bench
import fusedk

bench.torch = torch
torch.set_grad_enabled(False)
ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="4x4096x3072")
B, L, D = map(int, ap.parse_args().shape.split("x"))
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(B, L, D, device="cuda", dtype=torch.bfloat16, generator=g)
r = torch.randn_like(x)
w = torch.randn(D, device="cuda", dtype=torch.bfloat16, generator=g)
b = torch.randn_like(w)
gate = torch.randn(B, D, device="cuda", dtype=torch.bfloat16, generator=g)
y = torch.empty_like(x)
calls = [("fusedk rmsnorm", lambda: fusedk.rmsnorm(x, w, 1e-6, out=y)),
         ("fusedk layernorm", lambda: fusedk.layernorm(x, w, b, 1e-5, out=y)),
         ("fusedk rtg", lambda: fusedk.residual_tanh_gated_rmsnorm(x, r, gate, 1e-6, out=y))]
try:
    lrms, lln = bench.liger_fn("rms"), bench.liger_fn("ln")
    calls += [("liger rmsnorm", lambda: lrms(x.view(-1, D), w)),
              ("liger layernorm", lambda: lln(x.view(-1, D), w, b))]
except Exception as e:  # Liger missing: profile fusedk alone
    print("liger:", e)
for name, f in calls:
    for _ in range(3):
        f()
    torch.cuda.synchronize()
    print("ran", name)
