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
attention stay fused."""
import torch

from . import (Patcher, PerForward, State, attention_why_not, embedding_why_not,
               gelu_ff_why_not, linear_parts, linears_why_not, records_grad)


def _why_not(m, root):
    from diffusers.models.normalization import RMSNorm
    from diffusers.models.transformers.transformer_ltx import LTXVideoAttnProcessor
    a = m.attn1
    why = (linears_why_not([a.to_q, a.to_k, a.to_v, a.to_out[0], m.ff.net[0].proj, m.ff.net[2]])
           or attention_why_not(a, LTXVideoAttnProcessor))
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


def _prepare(m, pieces):
    st = State(pieces)
    a = m.attn1
    st.self_attention(a, a.head_dim)
    st.eps1, st.eps2 = m.norm1.eps, m.norm2.eps
    return st


_tables = PerForward()


def _half_tables(rope, heads):
    """The half tables [B, S, H, Dh/2] of the model's repeat-interleaved (cos, sin) [B, S, H*Dh]."""
    return _tables.get(rope, heads, lambda: tuple(t[..., ::2].unflatten(-1, (heads, -1)).float().contiguous()
                                                  for t in rope))


def _rmsnorm(x, eps):
    """diffusers' RMSNorm without affine, its rounding points."""
    return (x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)


def _adaln(k, x, scale, shift, eps):
    """norm(x) * (1 + scale) + shift; scale, shift [B, T, D]: fused for T = 1, else stock."""
    if scale.shape[1] == 1:
        return k.adaln(x, scale[:, 0], shift[:, 0], eps, norm="rms")
    return _rmsnorm(x, eps) * (1 + scale) + shift


def _gated(k, x, y, gate, out=None):
    """x + y * gate; gate [B, T, D]: fused for T = 1, else stock."""
    if gate.shape[1] == 1:
        return k.gated_residual(x, y, gate[:, 0], out=out)
    return x + y * gate


def forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None, encoder_attention_mask=None):
    if image_rotary_emb is None or records_grad(self, hidden_states, encoder_hidden_states, temb):
        return type(self).forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                  encoder_attention_mask)
    st = self._fusedk
    k, x = st.k, hidden_states
    B, S, _ = x.shape
    H, Dh = st.heads, st.dh
    ada = self.scale_shift_table[None, None].to(temb.device) + temb.reshape(B, temb.size(1), 6, -1)
    shift_msa, scale_msa, gate_msa, shift_mlp, scale_mlp, gate_mlp = ada.unbind(dim=2)  # [B, T, D] each
    a = self.attn1
    qkv = k.linear(_adaln(k, x, scale_msa, shift_msa, st.eps1), st.w_qkv, st.b_qkv).view(B, S, 3, H, Dh)
    cos, sin = _half_tables(image_rotary_emb, H)
    q, kk, v = k.qk_norm_rope(qkv, cos, sin, a.norm_q.weight, a.norm_k.weight, st.eps_qk, norm="full")
    wo, bo = linear_parts(a.to_out[0])
    x = _gated(k, x, k.linear(k.attention(a, q, kk, v).flatten(2, 3).to(x.dtype), wo, bo), gate_msa)
    x = x + self.attn2(x, encoder_hidden_states=encoder_hidden_states, image_rotary_emb=None,
                       attention_mask=encoder_attention_mask)
    w1, b1 = linear_parts(self.ff.net[0].proj)
    w2, b2 = linear_parts(self.ff.net[2])
    h = k.linear(_adaln(k, x, scale_mlp, shift_mlp, st.eps2), w1, b1, act="gelu_tanh")
    return _gated(k, x, k.linear(h, w2, b2), gate_mlp, out=x)  # x is this forward's own tensor here


def patchers():
    from diffusers.models.transformers.transformer_ltx import LTXVideoTransformerBlock
    return {LTXVideoTransformerBlock: Patcher(_why_not, _prepare, forward)}
