"""The models' own RoPE formulas, written the models' way (diffusers' apply_rotary_emb, Flux's and
LTX's full-width tables, Mochi's even/odd rotation and positions, Llama's rotate_half), float64 NumPy:
the second, literal oracle of test_rope.py and test_qk_norm_rope.py."""
import numpy as np

from oracle import f64


def full_width(t):
    """A half table [..., R/2] as the models' repeat_interleave(2) full-width one [..., R]."""
    return np.repeat(f64(t), 2, -1)


def diffusers_apply_rotary_emb(x, cos_full, sin_full):
    """diffusers' apply_rotary_emb(use_real=True, unbind dim -1), LTX's apply_rotary_emb: full-width
    [S, D] tables; x viewed as (real, imag) pairs, rotated = stack([-imag, real])."""
    x = f64(x)
    pairs = x.reshape(*x.shape[:-1], -1, 2)
    rotated = np.stack([-pairs[..., 1], pairs[..., 0]], -1).reshape(x.shape)
    return x * cos_full + rotated * sin_full


def mochi_apply_rotary_emb(x, cos, sin):
    """Mochi's attention processor: [S, H, D/2] tables; even/odd channels, stacked back."""
    x = f64(x)
    ev, od = x[..., 0::2], x[..., 1::2]
    return np.stack([ev * cos - od * sin, ev * sin + od * cos], -1).reshape(x.shape)


def llama_apply_rotary(x, cos_full, sin_full, rotary_dim):
    """Llama / GPT-NeoX: rotate_half over the first rotary_dim channels (cat(-x2, x1)),
    full-width tables cat(freqs, freqs); the rest passes (NeoX rotary_pct)."""
    x = f64(x)
    rot, rest = x[..., :rotary_dim], x[..., rotary_dim:]
    x1, x2 = rot[..., :rotary_dim // 2], rot[..., rotary_dim // 2:]
    rot = rot * cos_full + np.concatenate([-x2, x1], -1) * sin_full
    return np.concatenate([rot, rest], -1)


def flux_full_tables(ids, axes_dim, theta):
    """FluxPosEmbed: per axis get_1d_rotary_pos_embed(repeat_interleave_real=True), concatenated."""
    cos_out, sin_out = [], []
    for a, d in enumerate(axes_dim):
        freqs = 1.0 / (theta ** (np.arange(0, d, 2, dtype=np.float64)[: d // 2] / d))
        ang = np.outer(f64(ids)[:, a], freqs)
        cos_out.append(np.repeat(np.cos(ang), 2, axis=1))
        sin_out.append(np.repeat(np.sin(ang), 2, axis=1))
    return np.concatenate(cos_out, -1), np.concatenate(sin_out, -1)


def ltx_full_tables(grid, dim, theta):
    """LTXVideoRotaryPosEmbed.forward from its grid [B, S, 3]: freqs = theta ** linspace(log_theta(1),
    log_theta(theta), dim // 6) * pi / 2, * (2 grid - 1), transpose(-1, -2).flatten(2),
    repeat_interleave(2), then dim % 6 leading channels of cos 1 / sin 0."""
    import math
    grid = f64(grid)
    freqs = theta ** np.linspace(math.log(1.0, theta), math.log(theta, theta), dim // 6)
    freqs = freqs * math.pi / 2.0
    freqs = freqs * (grid[..., None] * 2 - 1)  # [B, S, 3, n]
    freqs = np.swapaxes(freqs, -1, -2).reshape(*grid.shape[:2], 3 * (dim // 6))
    cos, sin = np.repeat(np.cos(freqs), 2, axis=-1), np.repeat(np.sin(freqs), 2, axis=-1)
    if dim % 6:
        pad = grid.shape[:2] + (dim % 6,)
        cos, sin = np.concatenate([np.ones(pad), cos], -1), np.concatenate([np.zeros(pad), sin], -1)
    return cos, sin


def mochi_positions(num_frames, height, width, target_area=192 * 192):
    """MochiRoPE._get_positions: t = arange(T); h, w = the centres of height (width) cells spanning
    +-size*scale/2, scale = sqrt(target_area / (height * width))."""
    scale = (target_area / (height * width)) ** 0.5

    def centres(n):
        e = np.linspace(-n * scale / 2, n * scale / 2, n + 1)
        return (e[:-1] + e[1:]) / 2

    g = np.meshgrid(np.arange(num_frames, dtype=np.float64), centres(height), centres(width), indexing="ij")
    return np.stack(g, -1).reshape(-1, 3).astype(np.float32)


def flux_ids(txt_len, h, w):
    """Flux's ids: text tokens all 0, image tokens (0, row, col)."""
    img = np.zeros((h, w, 3), np.float32)
    img[..., 1] += np.arange(h)[:, None]
    img[..., 2] += np.arange(w)[None, :]
    return np.concatenate([np.zeros((txt_len, 3), np.float32), img.reshape(-1, 3)])
