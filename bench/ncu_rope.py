"""Drives fusedk.rope and torch.compile's rope (the bench's formula) at the bench shape,
B2 S4096 H24 Dh128 bf16, 3 calls each, for Nsight Compute:
    ncu --clock-control none --kernel-name regex:"rope|triton" python3 bench/ncu_rope.py"""
import torch

import bench  # the torch formula shared with the bench
import fusedk

bench.torch = torch
t_rope = bench.t_rope

q, k = (torch.randn(2, 4096, 24, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
ang = torch.arange(4096, device="cuda")[:, None] * 10000.0 ** (-torch.arange(0, 128, 2, device="cuda") / 128)
c, s = ang.cos().float(), ang.sin().float()
f = torch.compile(t_rope)
for _ in range(3):
    fusedk.rope(q, k, c, s)
    f(q, k, c, s)
torch.cuda.synchronize()
