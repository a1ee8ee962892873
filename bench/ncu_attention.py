"""Drives fusedk.attention and one SDPA backend at the bench's Dh 64 and Dh 128 shapes (B2 H16
S4096 Dh64, B1 H24 S4608 Dh128, bf16), 2 calls each, for Nsight Compute:
    ncu --clock-control none --kernel-name regex:"attn_tma|cudnn|fmha|sm90" --launch-skip 0 \\
        --set full python3 bench/ncu_attention.py [--peer cudnn|flash] [--dh 64,128]
The portable kernel against FA2 (SDPA's flash backend): FUSEDK_NO_TMA=1, --peer flash,
--kernel-name regex:"attn_kernel|flash_fwd"."""
import argparse

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

import fusedk

ap = argparse.ArgumentParser()
ap.add_argument("--peer", choices=("cudnn", "flash"), default="cudnn")
ap.add_argument("--dh", default="64,128")
args = ap.parse_args()
backend = SDPBackend.CUDNN_ATTENTION if args.peer == "cudnn" else SDPBackend.FLASH_ATTENTION
shapes = {64: (2, 16, 4096, 64), 128: (1, 24, 4608, 128)}
for B, H, S, Dh in (shapes[int(d)] for d in args.dh.split(",")):
    q, k, v = (torch.randn(B, S, H, Dh, device="cuda", dtype=torch.bfloat16) for _ in range(3))
    for _ in range(2):
        fusedk.attention(q, k, v)
        with sdpa_kernel(backend):
            F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2))
torch.cuda.synchronize()
