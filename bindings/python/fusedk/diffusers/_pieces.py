"""The pieces a patched forward is written in (Pieces): each fusedk's op, or the stock torch
expression of the same formula where apply(ops=...) leaves it out (A/B measurements, bisecting)."""
import torch

# the fused pieces a patched forward may use; apply(model, ops=...) picks a subset (the rest run
# the stock torch expression: for A/B measurements and bisecting)
OPS = frozenset({"adaln", "linear", "qk_norm_rope", "gated_residual", "residual_tanh_gated_rmsnorm", "glu"})


def _act_out(y, act, out):
    """The stock expression's tail: act (none or gelu_tanh), then into out when given."""
    if act == "gelu_tanh":
        y = torch.nn.functional.gelu(y, approximate="tanh")
    elif act != "none":
        raise ValueError(act)
    if out is not None:
        out.copy_(y)
        return out
    return y


class Pieces:
    """The fused pieces a patched forward calls: fusedk's op where `use` names it, else the
    stock torch expression (the same formula, in the block's dtype)."""

    def __init__(self, use):
        self.use = use
        import fusedk
        self.fk = fusedk

    def __getstate__(self):  # copy.deepcopy and pickle of a patched model: modules do not pickle
        return {"use": self.use}

    def __setstate__(self, state):
        self.__init__(state["use"])

    def adaln(self, x, scale, shift, eps, norm="layer", out=None, fp8=False):
        """fp8: as an FP8 ScaledTensor (adaln_fp8, or the stock expression quantized)"""
        if "adaln" in self.use:
            if fp8:
                return self.fk.adaln_fp8(x, scale, shift, norm=norm, eps=eps)
            return self.fk.adaln(x, scale, shift, norm=norm, eps=eps, out=out)
        n = (torch.nn.functional.layer_norm(x, x.shape[-1:], eps=eps) if norm == "layer"
             else torch.nn.functional.rms_norm(x, x.shape[-1:], eps=eps))
        y = _act_out(n * (1 + scale[:, None]) + shift[:, None], "none", out)
        return self.fk.quantize_fp8(y) if fp8 else y

    def fp8(self, P):
        """Whether Proj P runs on FP8 tensor cores (its input made in FP8): apply(precision="fp8")
        gave it an e4m3 weight"""
        return P.w8 is not None and not self.w8(P)

    def w8(self, P):
        """Whether Proj P runs weight-only in int8 (linear_w8, its input as it is): the modulation
        under apply(precision="fp8")"""
        return P.w8 is not None and P.w8.data.dtype == torch.int8

    def room(self, P, like):
        """Where Proj P has adapters and runs as linear_lowrank: a [*like's leading dims, K + A rp]
        buffer for its input, whose producer writes x into the first K columns (out=); the GEMM
        then reads x there, h beside it, without linear_lowrank copying x. Else None."""
        if P.a is None or "linear" not in self.use:
            return None
        if isinstance(like, self.fk.ScaledTensor):  # an FP8 producer's output: its rows, P's dtype
            like = like.data
        return like.new_empty(*like.shape[:-1], P.w_cat.shape[1], dtype=P.w_cat.dtype)

    def linear(self, x, w, b=None, act="none", out=None):
        if "linear" in self.use:
            return self.fk.linear(x, w, b, act=act, out=out)
        return _act_out(torch.nn.functional.linear(x, w, b), act, out)

    def proj(self, x, P, act="none", out=None):
        """x through Proj P: linear, or with adapters linear_lowrank (the stock expression: the base
        linear plus each adapter's (x a_q^T) (s b_q)^T, in the block's dtype)."""
        if self.fp8(P):  # x quantized a row at a time unless its producer wrote it in FP8
            x8 = x if isinstance(x, self.fk.ScaledTensor) else self.fk.quantize_fp8(x)
            return self.fk.linear_fp8(x8, P.w8, P.b, act=act, out=out, out_dtype=P.w.dtype)
        if isinstance(x, self.fk.ScaledTensor):  # an FP8 input shared with a projection that is not
            x = self.fk.dequantize_fp8(x, out_dtype=P.w.dtype)
        if self.w8(P):  # weight-only: x as it is
            return self.fk.linear_w8(x, P.w8, P.b, act=act, out=out)
        if P.a is None:
            return self.linear(x, P.w, P.b, act=act, out=out)
        if "linear" in self.use:
            return self.fk.linear_lowrank(x, P.w_cat, P.a, P.b, act=act, out=out)
        A, r, K = P.a.shape
        rp = (r + 7) // 8 * 8
        sb = P.w_cat[:, K:].unflatten(1, (A, rp))[:, :, :r].flatten(1)  # [N, A r]
        F = torch.nn.functional
        return _act_out(F.linear(x, P.w, P.b) + F.linear(F.linear(x, P.a.flatten(0, 1)), sb), act, out)

    def int8_attention(self, q):
        """Whether fusedk's attention runs as attention_int8: apply(attention="int8") and a head size
        its kernel takes (any on the CPU, 64, 128 and 256 on a CUDA device; one without sm_90a
        refuses it by name)."""
        return "attention_int8" in self.use and (q.device.type == "cpu" or q.shape[-1] in (64, 128, 256))

    def fused_attention(self, q):
        """Whether attention(q, ...) runs fusedk's kernel: apply(attention=True), and a call it
        takes (any CPU tensor; f16/bf16 and Dh <= 256 on the GPU)."""
        return "attention" in self.use and (q.device.type == "cpu" or (
            q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256))

    def int8_qk(self, qkv):
        """Whether attn_qkv hands q and k to the attention as int8 ScaledTensors (qk_norm_rope_int8:
        no quantization pass before the int8 kernel): fusedk's qk_norm_rope and int8 attention on
        a call attention takes (qkv [B, S, 3, H, Dh] or a (q, k, v) tuple)."""
        x = qkv[0] if isinstance(qkv, (tuple, list)) else qkv
        return "qk_norm_rope" in self.use and self.fused_attention(x) and self.int8_attention(x)

    def attn_qkv(self, qkv, cos, sin, wq, wk, eps, out=None, norm="head", style="interleaved"):
        """qk_norm_rope for the attention that follows: where int8_qk(qkv), q and k as ScaledTensors
        and v the projection's view (out=: two ScaledTensors and v's array, v copied there), else
        qk_norm_rope's q, k, v."""
        if not self.int8_qk(qkv):
            return self.qk_norm_rope(qkv, cos, sin, wq, wk, eps, out, norm, style)
        q, k, v = self.fk.qk_norm_rope_int8(qkv, cos, sin, q_weight=wq, k_weight=wk, eps=eps, norm=norm, style=style,
                                            rotary_dim=2 * cos.shape[-1], out=None if out is None else out[:2])
        if out is None:
            return q, k, v
        out[2].copy_(v)
        return out

    def attn_buffers(self, like, qkv, S):
        """(q, k, v) [B, S, H, Dh] for attn_qkv(qkv, out=row_slices(...)) to fill row by row: q and
        k as ScaledTensors where int8_qk(qkv), v in like's dtype"""
        B, H, Dh = qkv.shape[0], qkv.shape[3], qkv.shape[4]
        if not self.int8_qk(qkv):
            return tuple(like.new_empty(B, S, H, Dh) for _ in range(3))
        st = [self.fk.ScaledTensor(like.new_empty(B, S, H, Dh, dtype=torch.int8),
                                   like.new_empty(B, S, H, dtype=torch.float32)) for _ in range(2)]
        return st[0], st[1], like.new_empty(B, S, H, Dh)

    def attention(self, attn, q, k, v, kv_len=None):
        """q [B, Sq, H, Dh], k, v [B, Sk, H, Dh] -> [B, Sq, H, Dh]: fusedk's kernel where
        fused_attention(q) (or q and k are attn_qkv's ScaledTensors), else diffusers' dispatch with
        the processor's backend. kv_len (int32 [B]: keys at or past it masked) only where
        fused_attention(q)."""
        if isinstance(q, self.fk.ScaledTensor):
            return self.fk.attention(q, k, v, kv_len=kv_len)
        if self.fused_attention(q):
            return self.fk.attention(q, k, v, kv_len=kv_len, precision="int8" if self.int8_attention(q) else None)
        if kv_len is not None:
            raise ValueError("kv_len needs fusedk's attention")
        return dispatch_attention(attn, q, k, v)

    def gated_residual(self, x, y, gate, out=None):
        if "gated_residual" in self.use:
            return self.fk.gated_residual(x, y, gate, out=out)
        r = x + gate[:, None] * y
        if out is not None:
            out.copy_(r)
            return out
        return r

    def qk_norm_rope(self, qkv, cos, sin, wq, wk, eps, out=None, norm="head", style="interleaved"):
        """qkv [B, S, 3, H, Dh] (or a tuple q, k, v of [B, S, H, Dh] views) -> q, k, v [B, S, H, Dh]:
        RMSNorm of q and k (norm "head": over Dh, "full": over H*Dh, "none") with weights, then
        RoPE (style "interleaved": pairs (2i, 2i+1), "half": (i, i + R/2); tables [S, R/2],
        [S, H, R/2] or [B, S, H, R/2] float32, R <= Dh: the first R channels rotate)."""
        if "qk_norm_rope" in self.use:
            return self.fk.qk_norm_rope(qkv, cos, sin, q_weight=wq, k_weight=wk, eps=eps, norm=norm,
                                        style=style, layout="bshd", rotary_dim=2 * cos.shape[-1], out=out)
        q, k, v = qkv if isinstance(qkv, (tuple, list)) else qkv.unbind(2)
        res = [_rope(_rms(t, w, eps, norm), cos, sin, style) for t, w in ((q, wq), (k, wk))] + [v]
        if out is None:
            return tuple(t.contiguous() for t in res)
        for o, t in zip(out, res):
            o.copy_(t)
        return out

    def glu(self, x, act, act_half, out=None, fp8=False):
        """x[..., 2H] -> act(the act_half half) * the other half (silu, gelu, gelu_tanh); fp8: as an
        FP8 ScaledTensor where fusedk's glu runs (glu_fp8: no quantization pass after it)."""
        if "glu" in self.use:
            return self.fk.glu_fp8(x, act, act_half) if fp8 else self.fk.glu(x, act, act_half, out=out)
        a, b = x.chunk(2, -1)
        g, v = (a, b) if act_half == "first" else (b, a)
        f = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
             "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[act]
        return _act_out(v * f(g), "none", out)

    def residual_tanh_gated_rmsnorm(self, x, x_res, gate, eps):
        """Mochi: x + (x_res.float() * rsqrt(mean(x_res.float()^2) + eps) * tanh(gate)).type_as(x),
        PyTorch's rounding points (exact mode)."""
        if "residual_tanh_gated_rmsnorm" in self.use:
            return self.fk.residual_tanh_gated_rmsnorm(x, x_res, gate, eps=eps, exact=True)
        xf = x_res.float()
        n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * torch.tanh(gate).float()[:, None]
        return x + n.type_as(x)


def row_slices(ts, a, b):
    """Rows a..b (dim 1) of each of ts (tensors or ScaledTensors): attn_buffers' slices"""
    return tuple(type(t)(*(x[:, a:b] for x in t)) if isinstance(t, tuple) else t[:, a:b] for t in ts)


def _rms(t, w, eps, norm):
    if norm == "none":
        return t
    if norm == "head":
        return torch.nn.functional.rms_norm(t, t.shape[-1:], w, eps)
    flat = t.flatten(-2)
    return torch.nn.functional.rms_norm(flat, flat.shape[-1:], w, eps).unflatten(-1, t.shape[-2:])


def _rope(x, cos, sin, style):
    """x [B, S, H, Dh] rotated by half tables [S, R/2] (or [B, S, H, R/2]), float32 math: the first
    R channels, pairs (2i, 2i+1) for "interleaved" (diffusers' apply_rotary_emb, use_real, unbind
    -1), (i, i + R/2) for "half"; the rest pass through."""
    R = 2 * cos.shape[-1]
    c, s = {2: (cos[None, :, None], sin[None, :, None]), 3: (cos[None], sin[None])}.get(cos.dim(), (cos, sin))
    xr = x[..., :R].float()
    if style == "interleaved":
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
        re, im = xr.unflatten(-1, (-1, 2)).unbind(-1)
        rot = torch.stack([-im, re], -1).flatten(-2)
    else:
        c, s = torch.cat([c, c], -1), torch.cat([s, s], -1)
        a, b = xr.chunk(2, -1)
        rot = torch.cat([-b, a], -1)
    return torch.cat([(xr * c + rot * s).to(x.dtype), x[..., R:]], -1)


def dispatch_attention(attn, q, k, v):
    """[B, S, H, Dh] in and out, through diffusers' dispatch with the processor's backend."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    p = attn.processor
    return dispatch_attention_fn(q, k, v, attn_mask=None, backend=p._attention_backend,
                                 parallel_config=p._parallel_config)
