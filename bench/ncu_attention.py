"""Drives fusedk.attention and SDPA's cuDNN backend at the bench's Dh 64 and Dh 128 shapes (B2 H16
S4096 Dh64, B1 H24 S4608 Dh128, bf16), 2 calls each, for Nsight Compute:
    ncu --clock-control none --kernel-name regex:"attn_tma|cudnn|fmha|sm90" --launch-skip 0 \\
        --set full python3 bench/ncu_attention.py"""
import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fusedk

for B, H, S, Dh in ((2, 16, 4096, 64), (1, 24, 4608, 128)):
    q, k, v = (torch.randn(B, S, H, Dh, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(2):
        fusedk.attention(q, k, v)
        with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
            F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
torch.cuda.synchronize()
