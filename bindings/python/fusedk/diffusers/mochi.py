"""Mochi (diffusers' MochiTransformer3DModel): MochiTransformerBlock through fusedk.

Per block (video stream x, text stream c; temb -> one GEMM for both streams' modulations):
  adaln(x, scale_msa, 0, norm="rms")        MochiRMSNormZero's RMSNorm * (1 + scale), one pass
                                            (each stream; the last block's text stream:
                                            MochiLayerNormContinuous, the same math)
  linear(., [Wq; Wk; Wv])                   one GEMM for q, k, v (each stream)
  qk_norm_rope -> q, k, v [B, S, H, Dh]     per-head RMSNorm and Mochi's interleaved RoPE (tables
                                            [S, H, Dh/2] from MochiRoPE), the video rows then the
                                            text rows (norm only: cos 1, sin 0 tables) written
                                            straight into the joint q, k, v (no concatenation)
  attention                                 SDPA as MochiAttnProcessor2_0 calls it: one batched
                                            call when every text token is valid, else per sample
                                            over the video rows and the valid text rows, the rest
                                            zeros (the stock processor's padding); traced by
                                            torch.compile one batched call with no host sync,
                                            the padded text keys masked (SDPA's boolean mask);
                                            with apply(attention=True) fusedk's kernel, one call,
                                            the padded text keys masked through kv_len
  linear(o, Wo) ; residual_tanh_gated_rmsnorm  x + (rms(o Wo^T + bo) * tanh(gate_msa)).type_as(x)
  adaln(x, scale_mlp, 0, norm="rms") ; linear(., W1) ; glu(., silu, gate = second half) ;
  linear(., W2) ; residual_tanh_gated_rmsnorm
The last block (context_pre_only) queries with the video rows only (the stock block drops the
text rows' attention output) and returns the text stream as it came.
peft LoRA layers on any of these projections fold into their GEMMs (_lora.py); under torch.compile
such a block runs as one operator (block_op), eagerly inside it."""
import torch
import torch.nn.functional as F

from ._block_op import block_op, compiling
from ._common import attention_why_not, embedding_why_not, rows
from ._lifecycle import Patcher, as_op
from ._lora import feed_forward, normed


def _groups(m):
    """The block's GEMMs: {name: the projections it runs} ("mod": one GEMM, both streams; the last
    block's text stream has no projections after its q, k, v)"""
    a, last = m.attn1, m.context_pre_only
    ctx = m.norm1_context.linear_1 if last else m.norm1_context.linear
    groups = {"mod": [m.norm1.linear, ctx], "qkv": [a.to_q, a.to_k, a.to_v],
              "aqkv": [a.add_q_proj, a.add_k_proj, a.add_v_proj], "o": [a.to_out[0]], "ff1": [m.ff.net[0].proj],
              "ff2": [m.ff.net[2]]}
    if not last:
        groups.update(add_o=[a.to_add_out], cff1=[m.ff_context.net[0].proj], cff2=[m.ff_context.net[2]])
    return groups


def _rms_why_not(norm, name):
    from diffusers.models.normalization import RMSNorm
    if type(norm) is not RMSNorm or norm.weight is not None:
        return f"{name} is {type(norm).__name__}, expected diffusers' RMSNorm without weight"
    return None


def _modulated_why_not(m, names):
    from diffusers.models.transformers.transformer_mochi import MochiModulatedRMSNorm
    for name in names:
        n = getattr(m, name)
        if type(n) is not MochiModulatedRMSNorm:
            return f"{name} is {type(n).__name__}, expected MochiModulatedRMSNorm"
        why = _rms_why_not(n.norm, name)
        if why:
            return why
    return None


def _ff_why_not(ff):
    from diffusers.models.activations import SwiGLU
    net = list(ff.net)
    if len(net) != 3 or type(net[0]) is not SwiGLU or type(net[0].activation) is not torch.nn.SiLU:
        return "feed-forward is not SwiGLU + Dropout + Linear"
    if type(net[1]) is not torch.nn.Dropout or net[1].p != 0:
        return "feed-forward dropout p > 0"
    return None


def _attn_why_not(a):
    from diffusers.models.attention_processor import MochiAttnProcessor2_0
    from diffusers.models.normalization import MochiRMSNorm
    why = attention_why_not(a, MochiAttnProcessor2_0)
    if why:
        return why
    norms = [a.norm_q, a.norm_k, a.norm_added_q, a.norm_added_k]
    if any(type(n) is not MochiRMSNorm for n in norms):
        return f"q/k norms {[type(n).__name__ for n in norms]}, expected MochiRMSNorm"
    if a.norm_q.eps != a.norm_k.eps or a.norm_added_q.eps != a.norm_added_k.eps:
        return "q and k norms with different eps"
    if a.heads * a.norm_q.dim[0] != a.to_q.out_features:
        return "heads * head_dim differs from the projection width (tensor parallel?)"
    return None


def _why_not(m, root):
    from diffusers.models.transformers.transformer_mochi import (MochiLayerNormContinuous, MochiRMSNormZero,
                                                                 MochiRoPE)
    a, last = m.attn1, m.context_pre_only
    if a.context_pre_only != last or hasattr(a, "to_add_out") == last:
        return "the block's and its attention's context_pre_only differ"
    ctx = MochiLayerNormContinuous if last else MochiRMSNormZero
    for n, cls in ((m.norm1, MochiRMSNormZero), (m.norm1_context, ctx)):
        if type(n) is not cls or type(n.silu) is not torch.nn.SiLU:
            return f"modulation {type(n).__name__}, expected {cls.__name__} with SiLU"
    why = (_rms_why_not(m.norm1.norm, "norm1.norm")
           or (_modulated_why_not(m.norm1_context, ["norm"]) if last else _rms_why_not(m.norm1_context.norm,
                                                                                     "norm1_context.norm"))
           or _modulated_why_not(m, ["norm2", "norm3", "norm4"] + ([] if last else
                                                                  ["norm2_context", "norm3_context", "norm4_context"]))
           or _attn_why_not(a) or _ff_why_not(m.ff) or (None if last else _ff_why_not(m.ff_context)))
    if why:
        return why
    return embedding_why_not(root, "rope", MochiRoPE, "tables [S, H, Dh/2]")


def _prepare(m, st):
    a, last = m.attn1, m.context_pre_only
    st.attention(a, a.norm_q.dim[0])
    st.eps_aqk = a.norm_added_q.eps
    st.eps1 = m.norm1.norm.eps
    st.eps1c = m.norm1_context.norm.norm.eps if last else m.norm1_context.norm.eps
    st.eps = [m.norm2.norm.eps, m.norm3.norm.eps, m.norm4.norm.eps]
    if not last:
        st.epsc = [m.norm2_context.norm.eps, m.norm3_context.norm.eps, m.norm4_context.norm.eps]


def _sdpa(q, k, v):
    """[B, S, H, Dh] in and out, through F.scaled_dot_product_attention as the stock processor."""
    return F.scaled_dot_product_attention(q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)).transpose(1, 2)


# per forward (every block gets the same mask): the mask, its version, the video length and the rows
# each sample attends over (None: all of them); eager only, so one host sync a forward, not a block
# (and none in a CUDA graph captured after a warm-up). Inference tensors have no version counter
# (an in-place change would go unseen): they are not kept.
_masks = [None, None, None, None]


def _validrows(mask, B, Si):
    """Eager: None when every text token is valid, else per sample the joint rows the stock
    processor keeps: the video rows, then the valid text rows in order (a host sync)."""
    keep = not mask.is_inference()
    if keep and _masks[0] is mask and _masks[1] == mask._version and _masks[2] == Si:
        return _masks[3]
    m = mask.reshape(B, -1)
    rows = None
    if not bool(m.all()):
        rows = []
        for r in m:
            rows.append(torch.cat([torch.arange(Si, device=m.device), Si + torch.nonzero(r).flatten()]))
    if keep:
        _masks[:] = [mask, mask._version, Si, rows]
    return rows


def _attend(q, k, v, Sq, rows):
    """Joint attention of the first Sq rows of q over k, v (all [B, S, H, Dh]). rows: None (one
    batched call) or per sample the rows kept; their outputs come first, then zeros (Sq = S) as the
    stock processor pads, or the Sq video rows (Sq < S: the last block drops the text rows)."""
    if rows is None:
        return _sdpa(q[:, :Sq], k, v)
    S, outs = q.shape[1], []
    for b, r in enumerate(rows):
        kb, vb = k[b].index_select(0, r)[None], v[b].index_select(0, r)[None]
        if Sq < S:
            outs.append(_sdpa(q[b:b + 1, :Sq], kb, vb))
        else:
            o = _sdpa(q[b].index_select(0, r)[None], kb, vb)
            outs.append(F.pad(o, (0, 0, 0, 0, 0, S - o.shape[1])))
    return torch.cat(outs)


def _attend_masked(k, a, q, kk, v, Sq, mask):
    """_attend in one batched call with no host sync (fusedk's kernel, and torch.compile's graphs,
    which a data-dependent row count would break): each sample's valid text rows moved ahead of its
    padded ones (a stable sort) in k and v, the keys past them masked (kv_len for fusedk's kernel,
    a boolean mask for SDPA: softmax does not depend on the keys' order), and in q, so that the
    valid rows' outputs come first and the rest are zeros, as the stock processor packs and pads."""
    B, S = q.shape[:2]
    m = mask.reshape(B, -1) != 0
    Si, n = S - m.shape[1], m.sum(1)
    order = torch.sort((~m).to(torch.uint8), dim=1, stable=True).indices
    idx = order[:, :, None, None].expand(-1, -1, *kk.shape[2:])
    kk[:, Si:], v[:, Si:] = kk[:, Si:].gather(1, idx), v[:, Si:].gather(1, idx)
    if Sq > Si:
        q[:, Si:] = q[:, Si:].gather(1, idx)
    if k.fused_attention(q):
        o = k.attention(a, q[:, :Sq], kk, v, kv_len=(Si + n).to(torch.int32))
    else:
        seen = torch.arange(S, device=m.device)[None] < (Si + n)[:, None]  # [B, S]: every row sees Si >= 1 keys
        o = F.scaled_dot_product_attention(q[:, :Sq].transpose(1, 2), kk.transpose(1, 2), v.transpose(1, 2),
                                           attn_mask=seen[:, None, None]).transpose(1, 2)
    if Sq > Si:
        pad = torch.arange(S - Si, device=m.device)[None] >= n[:, None]
        o[:, Si:].masked_fill_(pad[:, :, None, None], 0)
    return o


def _zeros(t, B, D):
    return t.new_zeros(1, D).expand(B, D)  # adaln's shift: MochiRMSNormZero has none


def _stream(k, x, o, po, gate_msa, scale_mlp, gate_mlp, eps, p1, p2):
    """One stream after its attention output o (Projs: po its output projection, p1 and p2 the
    feed-forward's): the gated-norm residual, the modulated norm, the SwiGLU feed-forward and its
    gated-norm residual."""
    x = k.residual_tanh_gated_rmsnorm(x, k.proj(rows(o), po), gate_msa, eps[0])
    n = normed(k, p1, x, scale_mlp, _zeros(x, x.shape[0], x.shape[2]), eps[1], norm="rms")
    h = feed_forward(k, n, p1, p2, act="silu", glu_half="second")  # diffusers' SwiGLU gates the second half
    return k.residual_tanh_gated_rmsnorm(x, h, gate_mlp, eps[2])


def forward(self, hidden_states, encoder_hidden_states, temb, encoder_attention_mask, image_rotary_emb=None):
    st, B, St = self._fusedk, hidden_states.shape[0], encoder_hidden_states.shape[1]
    if image_rotary_emb is None or encoder_attention_mask is None or encoder_attention_mask.numel() != B * St:
        return type(self).forward(self, hidden_states, encoder_hidden_states, temb, encoder_attention_mask,
                                  image_rotary_emb)
    if compiling() and as_op(self):  # one operator a block (block_op)
        x, c = block_op(st, [hidden_states, encoder_hidden_states, temb, encoder_attention_mask, *image_rotary_emb])
        return x, encoder_hidden_states if self.context_pre_only else c
    return _block(self, hidden_states, encoder_hidden_states, temb, encoder_attention_mask, image_rotary_emb)


def _block(self, hidden_states, encoder_hidden_states, temb, encoder_attention_mask, image_rotary_emb):
    st = self._fusedk
    B, Si, D = hidden_states.shape
    St, Dc = encoder_hidden_states.shape[1:]
    k, x, c, last, p = st.k, hidden_states, encoder_hidden_states, self.context_pre_only, st.p
    H, Dh = st.heads, st.dh
    mod = k.proj(F.silu(temb), p["mod"])  # [B, 4 D + (Dc if last else 4 Dc)]
    scale, gate, scale2, gate2 = mod[:, :4 * D].chunk(4, 1)
    qkv_x = k.proj(normed(k, p["qkv"], x, scale, _zeros(x, B, D), st.eps1, norm="rms"), p["qkv"])
    c_scale = mod[:, 4 * D:4 * D + Dc]  # the last block's MochiLayerNormContinuous: its scale only
    qkv_c = k.proj(normed(k, p["aqkv"], c, c_scale, _zeros(c, B, Dc), st.eps1c, norm="rms"), p["aqkv"])
    q, kk, v = (x.new_empty(B, Si + St, H, Dh) for _ in range(3))
    a = self.attn1
    cos, sin = (t.float().contiguous() for t in image_rotary_emb)
    k.qk_norm_rope(qkv_x.view(B, Si, 3, H, Dh), cos, sin, a.norm_q.weight, a.norm_k.weight, st.eps_qk,
                   out=(q[:, :Si], kk[:, :Si], v[:, :Si]))
    one, zero = (torch.full((1, Dh // 2), f, dtype=torch.float32, device=x.device).expand(St, -1) for f in (1., 0.))
    k.qk_norm_rope(qkv_c.view(B, St, 3, H, Dh), one, zero, a.norm_added_q.weight, a.norm_added_k.weight,
                   st.eps_aqk, out=(q[:, Si:], kk[:, Si:], v[:, Si:]))  # no RoPE on the text rows
    Sq = Si if last else Si + St
    if k.fused_attention(q) or compiling():
        o = _attend_masked(k, a, q, kk, v, Sq, encoder_attention_mask)
    else:
        o = _attend(q, kk, v, Sq, _validrows(encoder_attention_mask, B, Si))
    o = o.flatten(2, 3).to(x.dtype)
    x = _stream(k, x, o[:, :Si], p["o"], gate, scale2, gate2, st.eps, p["ff1"], p["ff2"])
    if last:
        return x, encoder_hidden_states
    c_gate, c_scale2, c_gate2 = mod[:, 4 * D + Dc:].chunk(3, 1)
    return x, _stream(k, c, o[:, Si:], p["add_o"], c_gate, c_scale2, c_gate2, st.epsc, p["cff1"], p["cff2"])


def patchers():
    from diffusers.models.transformers.transformer_mochi import MochiTransformerBlock

    def args(xs):  # block_op's tensors: x, c, temb, the text mask, the rope tables
        return xs[0], xs[1], xs[2], xs[3], (xs[4], xs[5])

    def run(m, xs):  # (the last block's text stream is its input: a copy, an operator's outputs alias no input)
        x, c = _block(m, *args(xs))
        return [x, c.clone() if c is xs[1] else c]
    op = (run, lambda xs: [torch.empty_like(xs[0]), torch.empty_like(xs[1])],
          lambda m, xs: [t.clone() for t in type(m).forward(m, *args(xs))])
    return {MochiTransformerBlock: Patcher(_groups, _why_not, _prepare, forward, op)}
