"""Drives a few normalization kernels for Nsight Compute (ncu): fusedk's and Liger's rmsnorm and
layernorm, fusedk's and torch.compile's gated residual norm (Mochi, exact), on the 4x4096x3072
bf16 bench shape (--shape BxLxD, --dtype for others), each called 3 times; --fp8: adaln and
layernorm beside their FP8 forms (adaln_fp8, layernorm_fp8) and quantize_fp8 instead. tools/gpu_run.sh --ncu
runs it under ncu; set TORCHINDUCTOR_CACHE_DIR or TORCH_LOGS=output_code to keep Triton's source.
    python3 bench/ncu_norm.py [--shape 1x1024x2048] [--dtype fp16] [--no-compile] [--fp8]"""
import argparse

import torch

import bench  # the Liger wrapper and reference formulas shared with the bench
import fusedk

bench.torch = torch
torch.set_grad_enabled(False)
ap = argparse.ArgumentParser()
ap.add_argument("--shape", default="4x4096x3072")
ap.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
ap.add_argument("--no-compile", action="store_true")
ap.add_argument("--fp8", action="store_true")
args = ap.parse_args()
B, L, D = map(int, args.shape.split("x"))
dt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[args.dtype]
g = torch.Generator(device="cuda").manual_seed(0)
x = torch.randn(B, L, D, device="cuda", dtype=dt, generator=g)
r = torch.randn_like(x)
w = torch.randn(D, device="cuda", dtype=dt, generator=g)
b = torch.randn_like(w)
gate = torch.randn(B, D, device="cuda", dtype=dt, generator=g)
y = torch.empty_like(x)
calls = [("fusedk rmsnorm", lambda: fusedk.rmsnorm(x, w, 1e-6, out=y)),
         ("fusedk layernorm", lambda: fusedk.layernorm(x, w, b, 1e-5, out=y)),
         ("fusedk rtg", lambda: fusedk.residual_tanh_gated_rmsnorm(x, r, gate, 1e-6, exact=True, out=y))]
sc, sh = gate * 0.2, torch.randn_like(gate)
if args.fp8:
    args.no_compile = True
    calls = [("fusedk adaln", lambda: fusedk.adaln(x, sc, sh, out=y)),
             ("fusedk adaln_fp8", lambda: fusedk.adaln_fp8(x, sc, sh)),
             ("fusedk layernorm", lambda: fusedk.layernorm(x, w, b, 1e-5, out=y)),
             ("fusedk layernorm_fp8", lambda: fusedk.layernorm_fp8(x, w, b, 1e-5)),
             ("fusedk quantize_fp8", lambda: fusedk.quantize_fp8(x))]
if not args.no_compile:
    rtg = torch.compile(bench.t_rtg, dynamic=False)
    calls.append(("compile rtg", lambda: rtg(x, r, gate)))
try:
    if args.fp8:
        raise RuntimeError("--fp8: fusedk alone")
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
