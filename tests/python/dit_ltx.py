"""LTX-Video for test_diffusers.py: a small random LTXVideoTransformer3DModel (and LTX-Video 2B's
real width, one block, for the GPU), its inputs and its blocks."""
import torch
from diffusers import LTXVideoTransformer3DModel

from dit_common import randomized

KEEP_F32 = ("timestep",)  # the pipeline's timesteps are float32 in a bf16 run too
# peft target_modules for a LoRA on every projection of its blocks (attn2's too, which runs as stock)
LORA = ["to_q", "to_k", "to_v", "to_out.0", "ff.net.0.proj", "ff.net.2"]


def build(big=False):
    if big:  # LTX-Video 2B's widths: 32 heads of 64 (2048 % 6 = 2: two leading channels unrotated), T5 4096
        cfg = dict(in_channels=128, out_channels=128, num_attention_heads=32, attention_head_dim=64,
                   cross_attention_dim=2048, num_layers=1, caption_channels=4096)
    else:  # 4 x 16 = 64 wide: 64 % 6 = 4 leading channels of head 0 unrotated, as the real model's 2
        cfg = dict(in_channels=16, out_channels=16, num_attention_heads=4, attention_head_dim=16,
                   cross_attention_dim=64, num_layers=2, caption_channels=48)
    return randomized(LTXVideoTransformer3DModel(**cfg), big)


def inputs(model, device, big=False):
    c = model.config
    B, (F, H, W), St = (1, (2, 8, 16), 64) if big else (2, (2, 3, 4), 8)
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    mask = torch.ones(B, St)
    mask[-1, St // 2:] = 0  # padded caption: the cross-attention mask matters
    return dict(hidden_states=r(B, F * H * W, c.in_channels), encoder_hidden_states=r(B, St, c.caption_channels),
                timestep=(1000 * torch.rand(B, generator=g)).to(device), encoder_attention_mask=mask.to(device),
                num_frames=F, height=H, width=W, rope_interpolation_scale=(8 / 25, 32.0, 32.0), return_dict=False)


def output(result):
    return result[0]


def blocks(model):
    return list(model.transformer_blocks)
