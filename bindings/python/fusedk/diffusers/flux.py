"""Flux (diffusers' FluxTransformer2DModel): the double-stream FluxTransformerBlock and the
FluxSingleTransformerBlock through fusedk.

Per double block (image stream x, text stream c; temb -> one GEMM for both streams' AdaLN-Zero
modulations):
  adaln(x, scale_msa, shift_msa)            LayerNorm + modulation, one pass (each stream)
  linear(., [Wq; Wk; Wv])                   one GEMM for q, k, v (each stream)
  qk_norm_rope(qkv) -> q, k, v [B, S, H, Dh] per-head RMSNorm and Flux's interleaved RoPE, the
                                            text rows then the image rows written straight into
                                            the joint q, k, v (no concatenation)
  attention                                 diffusers' dispatch (SDPA or the model's backend), or
                                            fusedk's kernel with apply(attention=True)
  linear(o, Wo) ; gated_residual            x + gate_msa * (o Wo^T + bo)
  adaln(x, scale_mlp, shift_mlp) ; linear(., W1, act=gelu_tanh) ; linear(., W2) ; gated_residual
Per single block: adaln; linear(., W_mlp, gelu_tanh) into the second part of the proj_out
input; linear(., [Wq; Wk; Wv]) ; qk_norm_rope ; attention into its first part; linear(., W_out) ;
gated_residual. Its (text, image) outputs are views of one joint tensor, which the next single
block takes as it is (no torch.cat).
peft LoRA layers on any of these projections fold into their GEMM (linear_lowrank over w_cat =
[w | s b ...]; the q/k/v adapters of a stream together in its one GEMM). The op that makes such a
projection's input (adaln, fc1's GEMM, the single block's [attention, mlp]) writes it into a buffer
with room for the adapters' h, so linear_lowrank reads it in place instead of copying it."""
import torch

from ._block_op import block_op, compiling
from ._common import PerForward, attention_why_not, embedding_why_not, gelu_ff_why_not, rows
from ._lifecycle import Patcher
from ._lora import feed_forward, normed
from ._pieces import row_slices


def _attn_why_not(attn, added):
    from diffusers.models.transformers.transformer_flux import FluxAttnProcessor
    why = attention_why_not(attn, FluxAttnProcessor)
    if why:
        return why
    norms = [attn.norm_q, attn.norm_k] + ([attn.norm_added_q, attn.norm_added_k] if added else [])
    if any(type(n) is not torch.nn.RMSNorm for n in norms):
        return f"q/k norms {[type(n).__name__ for n in norms]}, expected torch.nn.RMSNorm"
    if len({n.eps for n in norms}) != 1:
        return "q and k norms with different eps"
    if attn.heads * attn.head_dim != attn.to_q.out_features:
        return "heads * head_dim differs from the projection width (tensor parallel?)"
    return None


def _ada_why_not(norm, n_chunks):
    if getattr(norm, "emb", None) is not None:
        return "AdaLayerNormZero with its own embedding (num_embeddings)"
    if type(norm.norm) is not torch.nn.LayerNorm or norm.norm.elementwise_affine:
        return f"modulation norm {type(norm.norm).__name__}, expected LayerNorm without affine"
    if type(norm.silu) is not torch.nn.SiLU or norm.linear.out_features != n_chunks * norm.linear.in_features:
        return "modulation is not SiLU + Linear to the chunks"
    return None


def _groups_double(m):
    """The double block's GEMMs: {name: the projections it runs} ("mod": one GEMM, both streams)"""
    a = m.attn
    return {"qkv": [a.to_q, a.to_k, a.to_v], "aqkv": [a.add_q_proj, a.add_k_proj, a.add_v_proj],
            "mod": [m.norm1.linear, m.norm1_context.linear], "o": [a.to_out[0]], "add_o": [a.to_add_out],
            "ff1": [m.ff.net[0].proj], "ff2": [m.ff.net[2]], "cff1": [m.ff_context.net[0].proj],
            "cff2": [m.ff_context.net[2]]}


def _groups_single(m):
    return {"qkv": [m.attn.to_q, m.attn.to_k, m.attn.to_v], "mod": [m.norm.linear], "mlp": [m.proj_mlp],
            "out": [m.proj_out]}


def _why_not_double(m, root):
    for n in (m.norm2, m.norm2_context):
        if type(n) is not torch.nn.LayerNorm or n.elementwise_affine:
            return "norm2 is not a LayerNorm without affine"
    return (_attn_why_not(m.attn, True) or _ada_why_not(m.norm1, 6) or _ada_why_not(m.norm1_context, 6)
            or gelu_ff_why_not(m.ff) or gelu_ff_why_not(m.ff_context) or _pos_why_not(root))


def _why_not_single(m, root):
    if type(m.act_mlp) is not torch.nn.GELU or m.act_mlp.approximate != "tanh":
        return f"MLP activation {m.act_mlp!r}, expected GELU(approximate='tanh')"
    return _attn_why_not(m.attn, False) or _ada_why_not(m.norm, 3) or _pos_why_not(root)


def _pos_why_not(root):
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed
    return embedding_why_not(root, "pos_embed", FluxPosEmbed, "repeat-interleaved tables")


def _prepare_double(m, st):
    st.attention(m.attn, m.attn.head_dim)
    st.eps1, st.eps1c = m.norm1.norm.eps, m.norm1_context.norm.eps
    st.eps2, st.eps2c = m.norm2.eps, m.norm2_context.eps


def _prepare_single(m, st):
    st.attention(m.attn, m.attn.head_dim)
    st.eps = m.norm.norm.eps


_tables = PerForward()


def _half_tables(rope):
    """The half tables [S, Dh/2] of the model's repeat-interleaved (cos, sin) [S, Dh]."""
    return _tables.get(rope, None, lambda: tuple(t[:, ::2].float().contiguous() for t in rope))


def _clip16(t):
    return t.clip(-65504, 65504) if t.dtype == torch.float16 else t


def _stream_mlp(k, x, gate_msa, ax, gate_mlp, scale_mlp, shift_mlp, eps, p1, p2):
    """The rest of one stream of a double block after its attention output ax."""
    x = k.gated_residual(x, ax, gate_msa)
    h = feed_forward(k, normed(k, p1, x, scale_mlp, shift_mlp, eps), p1, p2)
    return k.gated_residual(x, h, gate_mlp, out=x)


def _stock(rope, kwargs):
    """Whether a Flux block runs its stock forward: attention kwargs (IP-adapter states, ...), or
    no rope tables (autograd recording: _checked_forward)."""
    return bool(kwargs) or rope is None


def forward_double(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                   joint_attention_kwargs=None):
    if _stock(image_rotary_emb, joint_attention_kwargs):
        return type(self).forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                  joint_attention_kwargs)
    if compiling():  # one operator a block (block_op)
        c, x = block_op(self._fusedk, [hidden_states, encoder_hidden_states, temb, *image_rotary_emb])
        return c, x
    return _double(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb)


def _double(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb):
    st = self._fusedk
    k, x, c = st.k, hidden_states, encoder_hidden_states
    B, Si, D = x.shape
    St, H, Dh = c.shape[1], st.heads, st.dh
    p = st.p
    mod = k.proj(torch.nn.functional.silu(temb), p["mod"])  # [B, 12 D]: both streams
    shift, scale, gate, shift2, scale2, gate2, c_shift, c_scale, c_gate, c_shift2, c_scale2, c_gate2 = mod.chunk(12, 1)
    qkv_x = k.proj(normed(k, p["qkv"], x, scale, shift, st.eps1), p["qkv"])
    qkv_c = k.proj(normed(k, p["aqkv"], c, c_scale, c_shift, st.eps1c), p["aqkv"])
    cos, sin = _half_tables(image_rotary_emb)
    qkv_c, qkv_x = qkv_c.view(B, St, 3, H, Dh), qkv_x.view(B, Si, 3, H, Dh)
    q, kk, v = k.attn_buffers(x, qkv_x, St + Si)  # (int8 q and k where the attention takes them)
    a = self.attn
    k.attn_qkv(qkv_c, cos[:St], sin[:St], a.norm_added_q.weight, a.norm_added_k.weight, st.eps_qk,
               out=row_slices((q, kk, v), 0, St))
    k.attn_qkv(qkv_x, cos[St:], sin[St:], a.norm_q.weight, a.norm_k.weight, st.eps_qk,
               out=row_slices((q, kk, v), St, St + Si))
    o = k.attention(a, q, kk, v).flatten(2, 3).to(x.dtype)
    x = _stream_mlp(k, x, gate, k.proj(rows(o[:, St:]), p["o"]), gate2, scale2, shift2, st.eps2, p["ff1"], p["ff2"])
    c = _stream_mlp(k, c, c_gate, k.proj(rows(o[:, :St]), p["add_o"]), c_gate2, c_scale2, c_shift2, st.eps2c,
                    p["cff1"], p["cff2"])
    return _clip16(c), x  # as stock: the text stream is clipped in float16, the image stream not


def _joint(c, x):
    """cat([c, x], 1), or the tensor c and x are already adjacent views of (a single block's
    outputs), without a copy."""
    B, St, D = c.shape
    Si = x.shape[1]
    if (not compiling() and c.dtype == x.dtype and c.device == x.device and c.stride() == x.stride()
            and c.stride(2) == 1 and c.stride(1) == D and (B == 1 or c.stride(0) == (St + Si) * D)
            and c.untyped_storage().data_ptr() == x.untyped_storage().data_ptr()
            and x.storage_offset() == c.storage_offset() + St * D):
        return c.as_strided((B, St + Si, D), (c.stride(0) if B > 1 else (St + Si) * D, D, 1))
    return torch.cat([c, x], dim=1)


def forward_single(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb=None,
                   joint_attention_kwargs=None):
    if _stock(image_rotary_emb, joint_attention_kwargs):
        return type(self).forward(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb,
                                  joint_attention_kwargs)
    St = encoder_hidden_states.shape[1]
    if compiling():  # one operator a block (block_op)
        out = block_op(self._fusedk, [hidden_states, encoder_hidden_states, temb, *image_rotary_emb])[0]
    else:
        out = _single(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb)
    return out[:, :St], out[:, St:]


def _single(self, hidden_states, encoder_hidden_states, temb, image_rotary_emb):
    """The single block's joint output [B, St + Si, D] (text rows, then image rows)."""
    st = self._fusedk
    k = st.k
    r = _joint(encoder_hidden_states, hidden_states)
    B, S, D = r.shape
    H, Dh = st.heads, st.dh
    p = st.p
    shift, scale, gate = k.proj(torch.nn.functional.silu(temb), p["mod"]).chunk(3, 1)
    nq = normed(k, p["qkv"], r, scale, shift, st.eps)  # with room for the qkv adapters' h, if any
    n = nq if isinstance(nq, k.fk.ScaledTensor) else nq[..., :D]  # (FP8: the one input of both GEMMs)
    E = D + p["mlp"].w.shape[0]
    hb = k.room(p["out"], r)  # proj_out's input: [attention, mlp] (and room for its adapters' h)
    h = r.new_empty(B, S, E) if hb is None else hb[..., :E]
    k.proj(n, p["mlp"], act="gelu_tanh", out=h[..., D:])
    qkv = k.proj(nq, p["qkv"]).view(B, S, 3, H, Dh)
    cos, sin = _half_tables(image_rotary_emb)
    a = self.attn
    q, kk, v = k.attn_qkv(qkv, cos, sin, a.norm_q.weight, a.norm_k.weight, st.eps_qk)
    h[..., :D] = k.attention(a, q, kk, v).flatten(2, 3)
    return _clip16(k.gated_residual(r, k.proj(h if hb is None else hb, p["out"]), gate))


def patchers():
    from diffusers.models.transformers.transformer_flux import FluxSingleTransformerBlock, FluxTransformerBlock
    stock = lambda m, xs: type(m).forward(m, xs[0], xs[1], xs[2], (xs[3], xs[4]))  # noqa: E731  (c, x)
    double = (lambda m, xs: list(_double(m, xs[0], xs[1], xs[2], (xs[3], xs[4]))),
              lambda xs: [torch.empty_like(xs[1]), torch.empty_like(xs[0])],
              lambda m, xs: [t.clone() for t in stock(m, xs)])  # (an operator's outputs alias no input)
    single = (lambda m, xs: [_single(m, xs[0], xs[1], xs[2], (xs[3], xs[4]))],
              lambda xs: [xs[0].new_empty(xs[0].shape[0], xs[1].shape[1] + xs[0].shape[1], xs[0].shape[2])],
              lambda m, xs: [torch.cat(stock(m, xs), 1)])
    # every block one operator under torch.compile, LoRA or not: fewer dispatches and copies than its
    # fusedk calls traced one by one
    return {FluxTransformerBlock: Patcher(_groups_double, _why_not_double, _prepare_double, forward_double,
                                          double, op_always=True),
            FluxSingleTransformerBlock: Patcher(_groups_single, _why_not_single, _prepare_single, forward_single,
                                                single, op_always=True)}
