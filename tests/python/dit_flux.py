"""Flux for test_diffusers.py: a small random FluxTransformer2DModel (and Flux-dev's real width,
one block of each kind, for the GPU), its inputs and its blocks."""
import torch
from diffusers import FluxTransformer2DModel

from dit_common import randomized

KEEP_F32 = ("img_ids", "txt_ids")  # inputs that stay float32 in a bf16 run (position ids)
# peft target_modules for a LoRA on every projection of both block kinds
LORA = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "ff.net.0.proj",
        "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear", "norm1_context.linear", "proj_mlp",
        "proj_out", "norm.linear"]


def build(big=False):
    if big:  # Flux-dev's widths: 24 heads of 128, T5 4096, CLIP 768; one double and one single block
        cfg = dict(patch_size=1, in_channels=64, num_layers=1, num_single_layers=1, attention_head_dim=128,
                   num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768,
                   guidance_embeds=True, axes_dims_rope=(16, 56, 56))
    else:
        cfg = dict(patch_size=1, in_channels=16, num_layers=2, num_single_layers=2, attention_head_dim=16,
                   num_attention_heads=4, joint_attention_dim=48, pooled_projection_dim=32, guidance_embeds=True,
                   axes_dims_rope=(4, 6, 6))
    return randomized(FluxTransformer2DModel(**cfg), big)


def inputs(model, device, big=False):
    c = model.config
    B, Si, St = (1, 256, 64) if big else (2, 36, 8)
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    h = w = int(Si ** 0.5)
    img_ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(float(h)), torch.arange(float(w)), indexing="ij"), -1)
    return dict(hidden_states=r(B, Si, c.in_channels), encoder_hidden_states=r(B, St, c.joint_attention_dim),
                pooled_projections=r(B, c.pooled_projection_dim), timestep=torch.rand(B, generator=g).to(device),
                img_ids=img_ids.reshape(-1, 3).float().to(device), txt_ids=torch.zeros(St, 3, device=device),
                guidance=torch.full((B,), 3.5, device=device), return_dict=False)


def output(result):
    return result[0]


def blocks(model):
    return list(model.transformer_blocks) + list(model.single_transformer_blocks)
