"""Wan for test_diffusers.py: a small random WanTransformer3DModel (text-to-video; and Wan 2.1
1.3B's real width, one block, for the GPU), its inputs and its blocks."""
import torch
from diffusers import WanTransformer3DModel

from dit_common import randomized

KEEP_F32 = ("timestep",)  # the pipelines pass the scheduler's float32 timesteps
# peft target_modules for a LoRA on every projection of its blocks (self- and cross-attention, FFN)
LORA = ["to_q", "to_k", "to_v", "to_out.0", "ffn.net.0.proj", "ffn.net.2"]


def build(big=False):
    if big:  # Wan 2.1 1.3B: 12 heads of 128, FFN 8960, umT5 4096; one block
        cfg = dict(patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16,
                   out_channels=16, text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=1)
    else:
        cfg = dict(patch_size=(1, 2, 2), num_attention_heads=4, attention_head_dim=16, in_channels=4,
                   out_channels=4, text_dim=32, freq_dim=32, ffn_dim=96, num_layers=2, rope_max_seq_len=32)
    return randomized(WanTransformer3DModel(**cfg), big)


def inputs(model, device, big=False):
    c = model.config
    B, F, HW, St = (1, 2, 16, 64) if big else (2, 3, 8, 8)  # latent frames, height = width, text tokens
    g = torch.Generator().manual_seed(1)
    r = lambda *s: torch.randn(*s, generator=g).to(device)  # noqa: E731
    return dict(hidden_states=r(B, c.in_channels, F, HW, HW), timestep=(torch.rand(B, generator=g) * 1000).to(device),
                encoder_hidden_states=r(B, St, c.text_dim), return_dict=False)


def output(result):
    return result[0]


def blocks(model):
    return list(model.blocks)
