"""Drives fusedk.act (gelu_tanh) and PyTorch eager's GELU (tanh) on the 2x4096x4608 bf16 bench
shape, 3 calls each, for Nsight Compute:
    ncu --clock-control none --kernel-name regex:"elementwise|gelu|GeluCUDA" python3 bench/ncu_act.py"""
import torch

import fusedk

torch.set_grad_enabled(False)
x = torch.randn(2, 4096, 4608, device="cuda", dtype=torch.bfloat16)
y = torch.empty_like(x)
for _ in range(3):
    fusedk.act(x, "gelu_tanh", out=y)
    torch.nn.functional.gelu(x, approximate="tanh")
torch.cuda.synchronize()
