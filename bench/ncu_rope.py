"""Drives fusedk.rope, fusedk.qk_norm_rope and torch.compile's versions of both (the bench's
formulas) at the bench shape, B2 S4096 H24 Dh128 bf16, 3 calls each, for Nsight Compute:
    ncu --clock-control none --kernel-name regex:"rope|qkv|triton" python3 bench/ncu_rope.py"""
import torch

import bench  # the torch formulas shared with the bench
import fusedk

bench.torch = torch
t_rope, t_qknr = bench.t_rope, bench.t_qknr

q, k = (torch.randn(2, 4096, 24, 128, device="cuda", dtype=torch.bfloat16) for _ in range(2))
qkv = torch.randn(2, 4096, 3, 24, 128, device="cuda", dtype=torch.bfloat16)
w = 1 + 0.1 * torch.randn(2, 128, device="cuda", dtype=torch.bfloat16)
ang = bench.rope_angles(4096, 128)
c, s = ang.cos().float(), ang.sin().float()
f, g = torch.compile(t_rope), torch.compile(t_qknr)
for _ in range(3):
    fusedk.rope(q, k, c, s)
    f(q, k, c, s)
    fusedk.qk_norm_rope(qkv, c, s, q_weight=w[0], k_weight=w[1])
    g(qkv, w[0], w[1], c, s)
torch.cuda.synchronize()
