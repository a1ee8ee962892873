"""Mochi for test_diffusers.py: a small random MochiTransformer3DModel (and mochi-1's real width,
one block and the last, context_pre_only block, for the GPU), its inputs and its blocks."""
import torch
from diffusers import MochiTransformer3DModel

from dit_common import randomized

KEEP_F32 = ("timestep",)  # inputs that stay float32 in a bf16 run (timesteps up to 1000)
# peft target_modules for a LoRA on every projection of its blocks (the modulations', the last
# block's text one included; "to_q" also meets the time embedding's attention pool, outside them)
LORA = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "ff.net.0.proj",
        "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear", "norm1_context.linear",
        "norm1_context.linear_1"]


def build(big=False):
    if big:  # mochi-1-preview's widths: 24 heads of 128, text 1536 (T5 4096), time 256; two blocks
        cfg = dict(patch_size=2, num_attention_heads=24, attention_head_dim=128, num_layers=2,
                   pooled_projection_dim=1536, in_channels=12, text_embed_dim=4096, time_embed_dim=256)
    else:
        cfg = dict(patch_size=2, num_attention_heads=4, attention_head_dim=16, num_layers=2, pooled_projection_dim=32,
                   in_channels=4, text_embed_dim=48, time_embed_dim=16, max_sequence_length=8)
    return randomized(MochiTransformer3DModel(**cfg), big)


def inputs(model, device, big=False):
    c = model.config
    B, F, HW, St = (1, 4, 16, 64) if big else (2, 3, 8, 8)  # latent frames, height = width; text tokens
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    return dict(hidden_states=r(B, c.in_channels, F, HW, HW), encoder_hidden_states=r(B, St, c.text_embed_dim),
                timestep=(1000 * torch.rand(B, generator=g)).to(device),
                encoder_attention_mask=torch.ones(B, St, dtype=torch.bool, device=device), return_dict=False)


def output(result):
    return result[0]


def blocks(model):
    return list(model.transformer_blocks)
