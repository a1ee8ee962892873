"""LTX-Video (diffusers' LTXVideoTransformer3DModel): LTXVideoTransformerBlock through fusedk.

Per block (x [B, S, D] video tokens, c the caption tokens; temb [B, T, 6D] with T = 1 for one
timestep a sample, T = S for per-token timesteps (conditioning frames); modulation =
scale_shift_table + temb, as stock):
  adaln(x, scale_msa, shift_msa, norm="rms")   RMSNorm + modulation, one pass (T = 1)
  linear(., [Wq; Wk; Wv])                      one GEMM for attn1's q, k, v
  qk_norm_rope(qkv, norm="full") -> q, k, v    RMSNorm over the whole H*Dh row (LTX's
                                               rms_norm_across_heads) and LTX's interleaved RoPE
                                               (tables per sample [B, S, H, Dh/2]; the dim % 6
                                               leading channels rotate by cos 1, sin 0: unchanged)
  attention                                    diffusers' dispatch (SDPA or the model's backend), or
                                               fusedk's kernel with apply(attention=True)
  linear(o, Wo) ; gated_residual               x + gate_msa * (o Wo^T + bo)            (T = 1)
  attn2 (cross-attention)                      stock: its q (S rows) and k, v (caption rows)
                                               differ in length, which qk_norm_rope's one S does
                                               not take, it has no RoPE, and it takes the caption
                                               mask; x + attn2(x, c) as stock
  adaln(x, scale_mlp, shift_mlp, norm="rms") ; linear(., W1, act=gelu_tanh) ; linear(., W2) ;
  gated_residual                                                                       (T = 1)
With per-token timesteps (T = S) the modulations are [B, S, D], which adaln and gated_residual
(per-sample [B, D] vectors) do not take: the norms, modulations and gated residuals then run the
stock torch expressions (diffusers' RMSNorm rounding included); the GEMMs, qk_norm_rope and the
attention stay fused.
peft LoRA layers on attn1's and the feed-forward's projections fold into their GEMMs (_lora.py);
those on attn2's run there, as stock."""
import torch

from ._block_op import block_op, compiling
from ._common import PerForward, attention_why_not, embedding_why_not, gelu_ff_why_not
from ._lifecycle import Patcher, as_op
from ._lora import feed_forward, normed


def _groups(m):
    """The block's GEMMs: {name: the projections it runs}"""
    a = m.attn1
    return {"qkv": [a.to_q, a.to_k, a.to_v], "o": [a.to_out[0]], "ff1": [m.ff.net[0].proj], "ff2": [m.ff.net[2]]}


def _why_not(m, root):
    from diffusers.models.normalization import RMSNorm
    from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor
    a = m.attn1
    why = attention_why_not(a, LTXVideoAttnProcessor)
    if why:
        return why
    if any(type(n) is not torch.nn.RMSNorm for n in (a.norm_q, a.norm_k)) or a.norm_q.eps != a.norm_k.eps:
        return "q/k norms are not torch.nn.RMSNorm with one eps"
    inner = a.heads * a.head_dim
    if not inner == a.to_q.out_features == a.to_k.out_features == a.to_v.out_features == a.to_q.in_features:
        return "heads * head_dim differs from the projection widths (kv heads, tensor parallel?)"
    if a.head_dim % 2 or inner > 8192:
        return f"head dim {a.head_dim} (odd: RoPE pairs straddle heads) or width {inner} > 8192 (qk_norm_rope's limit)"
    for n in (m.norm1, m.norm2):
        if type(n) is not RMSNorm or n.weight is not None:
            return "norm1/norm2 are not diffusers' RMSNorm without affine"
    if tuple(m.scale_shift_table.shape) != (6, inner):
        return f"scale_shift_table {tuple(m.scale_shift_table.shape)}, expected (6, {inner})"
    return gelu_ff_why_not(m.ff) or _rope_why_not(root)


def _rope_why_not(root):
    from diffusers.models.transformers.transformer_ltx import LTXVideoRotaryPosEmbed
    return embedding_why_not(root, "rope", LTXVideoRotaryPosEmbed, "repeat-interleaved tables")


def _prepare(m, st):
    st.attention(m.attn1, m.attn1.head_dim)
    st.eps1, st.eps2 = m.norm1.eps, m.norm2.eps


_tables = PerForward()


def _half_tables(rope, heads):
    """The half tables [B, S, H, Dh/2] of the model's repeat-interleaved (cos, sin) [B, S, H*Dh]."""
    return _tables.get(rope, heads, lambda: tuple(t[..., ::2].unflatten(-1, (heads, -1)).float().contiguous()
                                                  for t in rope))


def _rmsnorm(x, eps):
    """diffusers' RMSNorm without affine, its rounding points."""
    return (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _adaln(k, P, x, scale, shift, eps):
    """norm(x) * (1 + scale) + shift as Proj P's input; scale, shift [B, T, D]: fused for T = 1,
    else stock."""
    if scale.shape[1] == 1:
        return normed(k, P, x, scale[:, 0], shift[:, 0], eps, norm="rms")
    return _rmsnorm(x, eps) * (1 + scale) + shift


def _gated(k, x, y, gate, out=None):
    """x + y * gate; gate [B, T, D]: fused for T = 1, else stock."""
    if gate.shape[1] == 1:
        return k.gated_residual(x, y, gate[:, 0], out=out)
    return x + y * gate


def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, encoder_attention_mask=None):
    if image_rotary_emb is None:
        return type(self).forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                  encoder_attention_mask)
    if compiling() and as_op(self):  # one operator a block (block_op)
        mask = [] if encoder_attention_mask is None else [encoder_attention_mask]
        return block_op(self._fusedk, [hidden_states, encoder_hidden_states, temb, *image_rotary_emb, *mask])[0]
    return _block(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb, encoder_attention_mask)


def _block(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb, encoder_attention_mask):
    st = self._fusedk
    k, x, p = st.k, hidden_states, st.p
    B, S, _ = x.shape
    H, Dh = st.heads, st.dh
    ada = self.scale_shift_table[None, None].to(temb.device) + temb.reshape(B, temb.size(1), 6, -1)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = ada.unbind(dim=2)  # [B, T, D] each
    a = self.attn1
    qkv = k.proj(_adaln(k, p["qkv"], x, scale_msa, shift_msa, st.eps1), p["qkv"]).view(B, S, 3, H, Dh)
    cos, sin = _half_tables(image_rotary_emb, H)
    q, kk, v = k.attn_qkv(qkv, cos, sin, a.norm_q.weight, a.norm_k.weight, st.eps_qk, norm="full")
    x = _gated(k, x, k.proj(k.attention(a, q, kk, v).flatten(2, 3).to(x.dtype), p["o"]), gate_msa)
    x = x + self.attn2(x, encoder_hidden_states=encoder_hidden_states, image_rotary_emb=None,
                       attention_mask=encoder_attention_mask)
    h = feed_forward(k, _adaln(k, p["ff1"], x, scale_mlp, shift_mlp, st.eps2), p["ff1"], p["ff2"])
    return _gated(k, x, h, gate_mlp, out=x)  # x is this forward's own tensor here


def patchers():
    from diffusers.models.transformers.transformer_ltx import LTXVideoTransformerBlock

    def args(xs):  # block_op's tensors: x, c, temb, the rope tables, the caption mask if any
        return xs[0], xs[1], xs[2], (xs[3], xs[4]), xs[5] if len(xs) > 5 else None
    op = (lambda m, xs: [_block(m, *args(xs))], lambda xs: [torch.empty_like(xs[0])],
          lambda m, xs: [type(m).forward(m, *args(xs)).clone()])  # (an operator's outputs alias no input)
    return {LTXVideoTransformerBlock: Patcher(_groups, _why_not, _prepare, forward, op, calls=lambda m: [m.attn2])}
