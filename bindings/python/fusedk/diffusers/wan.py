"""Wan (diffusers' WanTransformer3DModel, also in WanVACETransformer3DModel): WanTransformerBlock
through fusedk.

Per block (video tokens x, text c; mod = scale_shift_table + temb in float32, as diffusers):
  adaln(x, scale_msa, shift_msa)            FP32LayerNorm + modulation, one pass (float32 model)
  linear(., [Wq; Wk; Wv])                   one GEMM for q, k, v
  qk_norm_rope(qkv, norm="full") -> [B, S, H, Dh]  RMSNorm over all heads (Wan's norm_q/norm_k)
                                            and Wan's interleaved RoPE, one pass
  attention                                 diffusers' dispatch (SDPA or the model's backend), or
                                            fusedk's kernel with apply(attention=True)
  linear(o, Wo) ; gated_residual            x + gate_msa * (o Wo^T + bo)
  cross-attention: norm2 (torch), linear(., Wq), linear(c, [Wk; Wv]) (one GEMM; I2V: the image
    context's [Wk'; Wv'] too), q/k RMSNorm (torch), attention, linear(o, Wo), x + o (torch)
  adaln(x, c_scale, c_shift) ; linear(., W1, act=gelu_tanh) ; linear(., W2) ; gated_residual

Wan keeps its modulation in float32 (scale_shift_table + temb.float()): fusedk's adaln and
gated_residual read it as float32 beside the model's 16-bit rows, as the stock expressions
compute (float32 math, one rounding). Wan 2.2 TI2V's per-token temb [B, L, 6, D] runs the
stock expressions for those two.
peft LoRA layers on any of these projections fold into their GEMMs (_lora.py)."""
import torch
from diffusers.models.normalization import FP32LayerNorm
from diffusers.models.transformers.transformer_wan import WanAttnProcessor, WanTransformerBlock

from ._block_op import block_op, compiling
from ._common import PerForward, attention_why_not, gelu_ff_why_not, rows
from ._lifecycle import Patcher, as_op
from ._lora import feed_forward, normed


def _groups(m):
    """The block's GEMMs: {name: the projections it runs} ("kv2": the cross-attention's k and v)"""
    a, a2 = m.attn1, m.attn2
    groups = {"qkv": [a.to_q, a.to_k, a.to_v], "o": [a.to_out[0]], "q2": [a2.to_q], "kv2": [a2.to_k, a2.to_v],
              "o2": [a2.to_out[0]], "ff1": [m.ffn.net[0].proj], "ff2": [m.ffn.net[2]]}
    if a2.add_k_proj is not None:  # I2V: the image context's k, v
        groups["akv2"] = [a2.add_k_proj, a2.add_v_proj]
    return groups


def _attn_why_not(a):
    why = attention_why_not(a, WanAttnProcessor)
    if why:
        return why
    if not a.heads * (a.inner_dim // a.heads) == a.inner_dim == a.to_q.out_features == a.to_k.out_features:
        return "heads * head_dim differs from the projection widths (tensor parallel?)"
    return None


def _why_not(m, root):
    a = m.attn1
    why = _attn_why_not(a) or _attn_why_not(m.attn2) or gelu_ff_why_not(m.ffn)
    if why:
        return why
    for n in (m.norm1, m.norm3):
        if type(n) is not FP32LayerNorm or n.elementwise_affine:
            return f"modulated norm {type(n).__name__}, expected FP32LayerNorm without affine"
    if any(type(n) is not torch.nn.RMSNorm for n in (a.norm_q, a.norm_k)) or a.norm_q.eps != a.norm_k.eps:
        return "self-attention q/k norms are not torch.nn.RMSNorm with one eps"
    if a.inner_dim > 8192:
        return f"q/k RMSNorm over {a.inner_dim} channels, fusedk's qk_norm_rope norms at most 8192"
    return None


def _prepare(m, st):
    st.attention(m.attn1, m.attn1.inner_dim // m.attn1.heads)
    st.eps1, st.eps3 = m.norm1.eps, m.norm3.eps


_tables = PerForward()


def _half_tables(rope):
    """The half tables [S, Dh/2] of the model's (cos, sin) [1, S, 1, Dh]: WanAttnProcessor rotates
    pair i by cos[..., 2i] and sin[..., 2i + 1], so those columns, whatever the tables hold."""
    cos, sin = rope
    return _tables.get(rope, None, lambda: (cos[0, :, 0, 0::2].float().contiguous(),
                                            sin[0, :, 0, 1::2].float().contiguous()))


def _fused(k, op, x, v):
    """Whether fusedk's adaln / gated_residual (op, picked by ops=) reproduce stock here: a [B, D]
    modulation in float32 (as diffusers keeps it; fusedk reads it as float32 beside 16-bit rows)
    or in x's dtype. Not Wan 2.2 TI2V's per-token [B, L, D]."""
    return op in k.use and v.dim() == 2 and v.dtype in (x.dtype, torch.float32)


def _tokens(v):
    return v[:, None] if v.dim() == 2 else v


def _norm_mod(k, P, x, scale, shift, eps):
    """(FP32LayerNorm(x) * (1 + scale) + shift).type_as(x) as Proj P's input: fusedk's adaln where
    it reproduces it, else the stock expression."""
    if _fused(k, "adaln", x, scale):
        return normed(k, P, x, scale, shift, eps)
    n = torch.nn.functional.layer_norm(x.float(), x.shape[-1:], eps=eps)
    return (n * (1 + _tokens(scale)) + _tokens(shift)).type_as(x)


def _gated(k, x, y, gate, out=None):
    """(x.float() + y.float() * gate).type_as(x): fusedk's gated_residual where it reproduces it."""
    if _fused(k, "gated_residual", x, gate):
        return k.gated_residual(x, y, gate, out=out)
    return (x.float() + y.float() * _tokens(gate)).type_as(x)


def _heads(t, h):
    return t.unflatten(-1, (h, -1))


def _cross(self, k, x, c):
    """attn2: the stock processor's math with its GEMMs through fusedk."""
    p, a = self._fusedk.p, self.attn2
    H, D = a.heads, a.inner_dim
    n = self.norm2(x.float()).type_as(x)  # FP32LayerNorm with affine (or Identity), as stock
    c_img = None
    if a.add_k_proj is not None:  # as WanAttnProcessor: the text context is the last 512 tokens
        icl = c.shape[1] - 512
        c_img, c = c[:, :icl], c[:, icl:]
    q = _heads(a.norm_q(k.proj(n, p["q2"])), H)
    kv = k.proj(rows(c), p["kv2"])
    o = k.attention(a, q, _heads(a.norm_k(kv[..., :D]), H), _heads(kv[..., D:], H)).flatten(2, 3).type_as(q)
    if c_img is not None:
        kv = k.proj(rows(c_img), p["akv2"])
        oi = k.attention(a, q, _heads(a.norm_added_k(kv[..., :D]), H), _heads(kv[..., D:], H))
        o = o + oi.flatten(2, 3).type_as(q)
    return k.proj(o, p["o2"])


def forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
    st, S = self._fusedk, hidden_states.shape[1]
    # tables other than WanRotaryPosEmbed's [1, S, 1, Dh] (none, or a per-sample form): the stock forward
    if rotary_emb is None or any(tuple(t.shape) != (1, S, 1, st.dh) for t in rotary_emb):
        return type(self).forward(self, hidden_states, encoder_hidden_states, temb, rotary_emb)
    if compiling() and as_op(self):  # one operator a block (block_op)
        return block_op(st, [hidden_states, encoder_hidden_states, temb, *rotary_emb])[0]
    return _block(self, hidden_states, encoder_hidden_states, temb, rotary_emb)


def _block(self, hidden_states, encoder_hidden_states, temb, rotary_emb):
    st = self._fusedk
    k, x, p = st.k, hidden_states, st.p
    B, S, D = x.shape
    H, Dh = st.heads, st.dh
    mod = self.scale_shift_table + temb.float()  # float32, as stock
    # [B, 6, D] -> [B, D] chunks; Wan 2.2 TI2V's per-token [B, L, 6, D] -> [B, L, D]
    shift, scale, gate, c_shift, c_scale, c_gate = mod.unbind(2 if temb.ndim == 4 else 1)
    a = self.attn1
    qkv = k.proj(_norm_mod(k, p["qkv"], x, scale, shift, st.eps1), p["qkv"]).view(B, S, 3, H, Dh)
    cos, sin = _half_tables(rotary_emb)
    q, kk, v = k.attn_qkv(qkv, cos, sin, a.norm_q.weight, a.norm_k.weight, st.eps_qk, norm="full")
    o = k.attention(a, q, kk, v).flatten(2, 3).to(x.dtype)
    x = _gated(k, x, k.proj(o, p["o"]), gate)
    x = x.add_(_cross(self, k, x, encoder_hidden_states))  # stock: a plain add in x's dtype (x is ours)
    h = feed_forward(k, _norm_mod(k, p["ff1"], x, c_scale, c_shift, st.eps3), p["ff1"], p["ff2"])
    return _gated(k, x, h, c_gate, out=x)


def patchers():
    def args(xs):  # block_op's tensors: x, c, temb, the rope tables
        return xs[0], xs[1], xs[2], (xs[3], xs[4])
    op = (lambda m, xs: [_block(m, *args(xs))], lambda xs: [torch.empty_like(xs[0])],
          lambda m, xs: [type(m).forward(m, *args(xs)).clone()])  # (an operator's outputs alias no input)
    return {WanTransformerBlock: Patcher(_groups, _why_not, _prepare, forward, op)}
