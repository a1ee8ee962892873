"""fusedk inside diffusers' VAE decoders: AutoencoderKL (Flux, SD3, SDXL), AutoencoderKLWan (Wan
2.1 / 2.2), AutoencoderKLLTXVideo (LTX-Video) and AutoencoderKLMochi, their ResNet blocks and
convolutions through fusedk's channels-last ops.

Per ResnetBlock2D (AutoencoderKL's decoder: no time embedding, no resampling inside):
  group_norm(x, act="silu")                 GroupNorm + SiLU, one op
  conv(., W1, b1)                           3x3, an implicit GEMM (no im2col copy)
  group_norm(., act="silu")
  conv(x, Ws, bs) where the block has a 1x1 shortcut
  conv(., W2, b2, residual=shortcut)        the block's add in conv2's epilogue
Per WanResidualBlock (the same with Wan's causal 3x3x3 convs and its RMSNorm):
  channel_rmsnorm(x, clamp, act="silu")     F.normalize(x) * sqrt(C) * gamma + SiLU, one op,
                                            written behind the frames cached from the last chunk
  conv(., W1, b1, pad_t=2 - cached)         causal in time: zeros where no frames are cached
  channel_rmsnorm(., act="silu"), conv(., W2, b2, residual=shortcut)
The frame-by-frame cache (feat_cache) keeps the stock protocol: the same entries, the last two
frames of each conv's input. Per LTXVideoResnetBlock3d:
  channel_rmsnorm(x, scale1, shift1, act="silu")   RMSNorm, the timestep modulation, SiLU
  conv(., W1, b1, pad_t, pad_t_back, time_pad="replicate")   the first/last frame repeated
  channel_rmsnorm(., scale2, shift2, act="silu"), layernorm + conv for a shortcut that changes
  channels, conv(., W2, b2, residual=shortcut)
(blocks that inject noise, LTX-Video 0.9.1's, run their stock forward). Per MochiResnetBlock3D:
  group_norm(x, act="silu") a frame at a time, the edge pixels repeated into a padded copy
  (F.pad, as stock), conv(., time_pad="replicate"), the same, conv(., residual=x)
The upsamplers' nearest 2x + conv (Upsample2D; Wan's resample Sequential) run as one
conv(upsample=2), the upsampled image never written. Every other conv of the decoder (conv_in,
the time convs, LTX's upsampler convs, conv_out, the attention's 1x1s) and the VAE's
post_quant_conv run as fusedk.conv, Wan's other RMSNorms as fusedk.channel_rmsnorm. The closing
norm and SiLU (AutoencoderKL's conv_norm_out + conv_act, Wan's norm_out + nonlinearity) run as one
group_norm or channel_rmsnorm with act="silu": the norm module applies the SiLU and the SiLU
module passes its input on (a torch hook on that norm sees its output after the SiLU).
Activations flow in channels-last memory (a tensor NC[T]HW to torch, N[T]HWC to fusedk: a
permuted view, no copy); an input in another layout is made channels-last once, at the first
patched module. The attention of the mid block, LTX's and Mochi's depth-to-space reshapes and
projections and their final norms stay torch's.

A module runs its stock forward when fusedk cannot reproduce the call: CUDA tensors other than
float16/bfloat16 (the conv kernel's), parameters of another dtype than the input, autograd
recording, a time embedding given, torch hooks on the module. On CPU tensors the stock forwards
run too: fusedk's CPU references are double-precision loops, minutes a decode (the tests set
CPU_REFERENCE = True to check the patched math against them). Modules with a forward of their own
(diffusers' hooks: layerwise casting, group offloading; accelerate's) are left alone, and the
report says why. The weights are the model's: a conv's weight is read as a channels-last view
where it is stored so, else its N[T]HWC copy is made at the call and kept until the weight
changes (apply() stores the decoder's conv weights channels-last; revert() stores them back
contiguous, the same values bit for bit)."""
import types

import torch

import fusedk

_CL = {4: torch.channels_last, 5: torch.channels_last_3d}
CPU_REFERENCE = False  # True: CPU tensors through fusedk's C references (slow; for tests)


def _classes():
    try:
        from diffusers import AutoencoderKL, AutoencoderKLLTXVideo, AutoencoderKLMochi, AutoencoderKLWan
    except ImportError:  # pragma: no cover
        return ()
    return AutoencoderKL, AutoencoderKLWan, AutoencoderKLLTXVideo, AutoencoderKLMochi


def vaes(model):
    """(name, VAE) of a pipeline's .vae, or of the model itself: an AutoencoderKL, AutoencoderKLWan,
    AutoencoderKLLTXVideo or AutoencoderKLMochi"""
    kinds = _classes()
    out = [(n, v) for n, v in (("vae", getattr(model, "vae", None)), ("", model)) if kinds and isinstance(v, kinds)]
    return out[:1]


def _conv_why_not(c, cls=torch.nn.Conv2d):
    """why c, a torch conv of type cls, is not fusedk.conv's: groups 1, no dilation, zero padding,
    the same stride (1 or 2) and padding on H and W (its last two dims)"""
    if type(c) is not cls and not (cls is None and isinstance(c, (torch.nn.Conv2d, torch.nn.Conv3d))):
        return f"{type(c).__name__}, expected torch.nn.{(cls or torch.nn.Conv3d).__name__}"
    if c.groups != 1 or any(d != 1 for d in c.dilation) or c.padding_mode != "zeros" or isinstance(c.padding, str):
        return "grouped, dilated, string-padded or non-zero-padded conv"
    if c.stride[-2] != c.stride[-1] or c.padding[-2] != c.padding[-1] or c.stride[-1] not in (1, 2):
        return f"stride {tuple(c.stride)}, padding {tuple(c.padding)}: expected one of 1 or 2, one padding on H and W"
    return None


def _conv3d_why_not(c):
    return _conv_why_not(c, torch.nn.Conv3d)


def _causal_why_not(c):
    """why WanCausalConv3d c is not fusedk.conv's: its padding (w, w, h, h, 2 pt, 0) after the
    frames cached"""
    if type(c).__name__ != "WanCausalConv3d":
        return f"{type(c).__name__}, expected WanCausalConv3d"
    p = tuple(getattr(c, "_padding", ()))
    if len(p) != 6 or p[0] != p[1] or p[2] != p[3] or p[0] != p[2] or p[5] != 0 or tuple(c.padding) != (0, 0, 0):
        return f"causal padding {p}, expected (p, p, p, p, t, 0)"
    return _conv_why_not(c, None)


def _rms_why_not(n):
    if type(n).__name__ != "WanRMS_norm" or not n.channel_first:
        return f"{type(n).__name__}, expected a channel-first WanRMS_norm"
    if not isinstance(n.bias, (float, torch.Tensor)) or (isinstance(n.bias, float) and n.bias != 0.0):
        return f"bias {n.bias!r}, expected a parameter or 0"
    return None


def _hooked(m):
    """why module m keeps its forward: an instance forward (diffusers' and accelerate's hooks
    replace it), else None"""
    if "forward" in vars(m) or "_diffusers_hook" in vars(m) or "_hf_hook" in vars(m):
        return "hooks replace its forward (layerwise casting, offloading, accelerate)"
    return None


def _block_why_not(m, kind):
    """why m is not a `kind` ResNet block with SiLU, else None"""
    if type(m).__name__ != kind:
        return f"{type(m).__name__}, expected {kind}"
    if type(m.nonlinearity) is not torch.nn.SiLU:
        return f"nonlinearity {type(m.nonlinearity).__name__}, expected SiLU"
    return None


def _resnet_why_not(m):
    why = _block_why_not(m, "ResnetBlock2D")
    if why:
        return why
    if m.time_embedding_norm not in ("default", "group"):  # (without temb both are norm2 alone)
        return f"time_embedding_norm {m.time_embedding_norm!r}, expected 'default' or 'group'"
    if m.upsample is not None or m.downsample is not None:
        return "resamples inside the block"
    if m.time_emb_proj is not None:
        return "takes a time embedding"
    for n in (m.norm1, m.norm2):
        if type(n) is not torch.nn.GroupNorm or not n.affine:
            return f"norm {type(n).__name__}, expected GroupNorm with affine"
    if m.output_scale_factor != 1.0:
        return f"output_scale_factor {m.output_scale_factor}, expected 1"
    for c in (m.conv1, m.conv2) + ((m.conv_shortcut,) if m.conv_shortcut is not None else ()):
        why = _conv_why_not(c)
        if why:
            return why
    return None


def _wan_block_why_not(m):
    why = _block_why_not(m, "WanResidualBlock")
    if why:
        return why
    for c in (m.conv1, m.conv2):
        why = _causal_why_not(c) or ("" if c._padding[4] == 2 and tuple(c.stride) == (1, 1, 1) else
                                     f"{c._padding}, stride {tuple(c.stride)}: expected a causal 3x3x3 conv")
        if why:
            return why
    if type(m.conv_shortcut) is not torch.nn.Identity:
        why = _causal_why_not(m.conv_shortcut)
        if why or m.conv_shortcut.kernel_size != (1, 1, 1) or tuple(m.conv_shortcut.stride) != (1, 1, 1):
            return why or "a shortcut other than a 1x1x1 conv"
    return _rms_why_not(m.norm1) or _rms_why_not(m.norm2)


def _cl(t):
    """t [N, C, (T,) H, W] as fusedk's [N, (T,) H, W, C] view of its channels-last memory (one copy
    if it is stored otherwise)"""
    return t.contiguous(memory_format=_CL[t.dim()]).movedim(1, -1)


def _weight(c):
    """conv c's weight [Co, (kt,) kh, kw, Ci]: a view where it is stored channels-last, else a copy
    kept until the weight changes"""
    w = c.weight
    if w.is_contiguous(memory_format=_CL[w.dim()]):
        return w.detach().movedim(1, -1)
    key = (w.data_ptr(), w._version, w.dtype, w.device)
    st = vars(c).get("_fusedk_w")
    if st is None or st[0] != key:
        st = (key, w.detach().movedim(1, -1).contiguous())
        c._fusedk_w = st
    return st[1]


def _runs(x, root):
    """whether fusedk runs the call of module root: x [N, C, (T,) H, W] 16-bit on CUDA (or on the
    CPU, CPU_REFERENCE), every parameter in root of x's dtype and device, no autograd recording,
    no torch hooks on root or any module inside it"""
    ok = (torch.float16, torch.bfloat16) if x.is_cuda else (torch.float32, torch.float16, torch.bfloat16)
    if x.dim() not in (4, 5) or x.dtype not in ok or not (x.is_cuda or (CPU_REFERENCE and x.device.type == "cpu")):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for p in root.parameters())):
        return False
    for m in root.modules():
        if m._forward_hooks or m._forward_pre_hooks:
            return False
    return all(p.dtype == x.dtype and p.device == x.device for p in root.parameters())


def _conv(c, x, residual=None):
    """Conv2d c on the NHWC view x (residual: NHWC, added in the epilogue)"""
    return fusedk.conv(x, _weight(c), c.bias, residual, stride=c.stride[0], padding=c.padding[0])


def _conv_forward(self, x):
    if not _runs(x, self) or x.dim() != self.weight.dim():
        return type(self).forward(self, x)
    if x.dim() == 4:
        return _conv(self, _cl(x)).movedim(-1, 1)
    st, p = self.stride, self.padding  # an nn.Conv3d: zeros on every side
    return fusedk.conv(_cl(x), _weight(self), self.bias, stride=st[1], padding=p[1], stride_t=st[0], pad_t=p[0],
                       pad_t_back=p[0]).movedim(-1, 1)


def _resnet_forward(self, input_tensor, temb=None, *args, **kwargs):
    if temb is not None or args or kwargs or (self.training and self.dropout.p > 0) or not _runs(input_tensor, self) \
            or input_tensor.dim() != 4:
        return type(self).forward(self, input_tensor, temb, *args, **kwargs)
    x = _cl(input_tensor)
    n1, n2 = self.norm1, self.norm2
    h = fusedk.group_norm(x, n1.num_groups, n1.weight, n1.bias, n1.eps, act="silu")
    h = fusedk.group_norm(_conv(self.conv1, h), n2.num_groups, n2.weight, n2.bias, n2.eps, act="silu")
    shortcut = x if self.conv_shortcut is None else _conv(self.conv_shortcut, x)
    return _conv(self.conv2, h, shortcut).movedim(-1, 1)


# [Wan] causal convs over N T H W C; a conv's input buffer holds the frames cached from the last
# chunk in front of the new ones, so the norm writes behind them and no concatenation is copied


def _rms(n, x, act, out=None):
    """WanRMS_norm n (+ act) on the N...C view x: F.normalize(x) * sqrt(C) * gamma + bias"""
    C = x.shape[-1]
    bias = n.bias.reshape(C) if isinstance(n.bias, torch.Tensor) else None
    return fusedk.channel_rmsnorm(x, n.gamma.reshape(C), bias,
                                  1e-12 / C ** 0.5, clamp=True, act=act, out=out)


def _cached(c, cache):
    """the frames of cache (NCTHW, a previous chunk's, or None) that conv c puts in front of its
    input: at most its causal padding's"""
    return 0 if cache is None or not isinstance(cache, torch.Tensor) else min(cache.shape[2], c._padding[4])


def _causal(c, buf, n, residual=None):
    """WanCausalConv3d c on buf [N, n + T, H, W, C] whose first n frames are cached ones"""
    st, p = c.stride, c._padding
    return fusedk.conv(buf, _weight(c), c.bias, residual, stride=st[1], padding=p[2], stride_t=st[0],
                       pad_t=p[4] - n)


def _framed(c, cache, x, norm=None):
    """conv c's input buffer for the new frames x (N T H W C): cache's last frames in front, then x,
    or norm(x) written there when norm is given; with the number of cached frames"""
    n = _cached(c, cache)
    if n == 0 and norm is None:
        return x, 0
    N, T, H, W, C = x.shape
    buf = torch.empty((N, n + T, H, W, C), dtype=x.dtype, device=x.device)
    if n:
        buf[:, :n].copy_(cache[:, :, cache.shape[2] - n:].movedim(1, -1))
    if norm is None:
        buf[:, n:].copy_(x)
    else:
        norm(x, out=buf[:, n:])
    return buf, n


def _keep(buf, n, prev):
    """the stock cache entry for the next chunk: the last two frames of this conv's new input, the
    previous entry's last frame in front when only one is new (NCTHW, channels-last memory)"""
    new = buf[:, n:]
    if new.shape[1] >= 2 or prev is None:
        keep = new[:, -2:].clone()
    else:
        keep = torch.cat([prev[:, :, -1:].movedim(1, -1).to(new.device, new.dtype), new], 1)
    return keep.movedim(-1, 1)


def _causal_forward(self, x, cache_x=None):
    if not _runs(x, self) or x.dim() != 5 or (cache_x is not None and not isinstance(cache_x, torch.Tensor)):
        return type(self).forward(self, x, cache_x)
    buf, n = _framed(self, cache_x, _cl(x))
    return _causal(self, buf, n).movedim(-1, 1)


def _rms_forward(self, x, act="none"):
    if not _runs(x, self) or x.shape[1] != self.gamma.shape[0]:
        y = type(self).forward(self, x)
        return torch.nn.functional.silu(y) if act == "silu" else y
    return _rms(self, _cl(x), act).movedim(-1, 1)


def _wan_step(conv, norm, x, feat_cache, feat_idx, residual=None):
    """norm + SiLU, then the causal conv, through the chunk cache as WanResidualBlock does it"""
    prev = None
    if feat_cache is not None:
        prev = feat_cache[feat_idx[0]]
    buf, n = _framed(conv, prev, x, lambda v, out: _rms(norm, v, "silu", out))
    if feat_cache is not None:
        feat_cache[feat_idx[0]] = _keep(buf, n, prev)
        feat_idx[0] += 1
    return _causal(conv, buf, n, residual)


def _wan_block_forward(self, x, feat_cache=None, feat_idx=[0]):  # noqa: B006 (the stock signature)
    prevs = [] if feat_cache is None else feat_cache[feat_idx[0]:feat_idx[0] + 2]
    if (self.training and self.dropout.p > 0) or not _runs(x, self) or x.dim() != 5 or \
            any(p is not None and not isinstance(p, torch.Tensor) for p in prevs):
        return type(self).forward(self, x, feat_cache, feat_idx)
    xv = _cl(x)
    h = xv if type(self.conv_shortcut) is torch.nn.Identity else _causal(self.conv_shortcut, xv, 0)
    a = _wan_step(self.conv1, self.norm1, xv, feat_cache, feat_idx)
    return _wan_step(self.conv2, self.norm2, a, feat_cache, feat_idx, residual=h).movedim(-1, 1)


# [LTX-Video] causal or centred convs whose time padding repeats the first (and last) frame; the
# timestep-conditioned blocks' scale and shift go into the norms


def _ltx_conv_why_not(c):
    if type(c).__name__ != "LTXVideoCausalConv3d":
        return f"{type(c).__name__}, expected LTXVideoCausalConv3d"
    if not isinstance(c.conv.padding, str) and c.conv.padding[0] != 0:
        return f"padding {tuple(c.conv.padding)}: expected none in time (the frames repeat)"
    return _conv_why_not(c.conv, None)


def _ltx_conv(c, x, residual=None):
    """LTXVideoCausalConv3d c on the NTHWC view x: its first frame repeated kt - 1 times in front
    (causal), or (kt - 1) / 2 times and the last frame as often behind"""
    k, kt = c.conv, c.kernel_size[0]
    front, back = (kt - 1, 0) if c.is_causal else ((kt - 1) // 2, (kt - 1) // 2)
    return fusedk.conv(x, _weight(k), k.bias, residual, stride=k.stride[1], padding=k.padding[1], stride_t=k.stride[0],
                       pad_t=front, pad_t_back=back, time_pad="replicate")


def _ltx_conv_forward(self, hidden_states):
    if not _runs(hidden_states, self) or hidden_states.dim() != 5:
        return type(self).forward(self, hidden_states)
    return _ltx_conv(self, _cl(hidden_states)).movedim(-1, 1)


def _ltx_block_why_not(m):
    why = _block_why_not(m, "LTXVideoResnetBlock3d")
    if why:
        return why
    if m.per_channel_scale1 is not None or m.per_channel_scale2 is not None:
        return "injects noise"
    for n in (m.norm1, m.norm2):
        if type(n).__name__ != "RMSNorm":
            return f"norm {type(n).__name__}, expected RMSNorm"
    if m.norm3 is not None and (type(m.norm3) is not torch.nn.LayerNorm or len(m.norm3.normalized_shape) != 1):
        return f"shortcut norm {type(m.norm3).__name__}, expected a LayerNorm over the channels"
    for c in (m.conv1, m.conv2) + ((m.conv_shortcut,) if m.conv_shortcut is not None else ()):
        why = _ltx_conv_why_not(c)
        if why:
            return why
    return None


def _ltx_block_forward(self, inputs, temb=None, generator=None):
    if (self.training and self.dropout.p > 0) or not _runs(inputs, self) or inputs.dim() != 5 or \
            (self.scale_shift_table is not None and (temb is None or temb.dtype != inputs.dtype or
                                                     (temb.requires_grad and torch.is_grad_enabled()))):
        return type(self).forward(self, inputs, temb, generator)
    mod = [None] * 4  # shift 1, scale 1, shift 2, scale 2: [N, C] each
    if self.scale_shift_table is not None:
        t = temb.unflatten(1, (4, -1)) + self.scale_shift_table[None, ..., None, None, None]
        mod = [v.reshape(v.shape[0], -1) for v in t.unbind(1)]
    x = _cl(inputs)
    n1, n2 = self.norm1, self.norm2
    a = fusedk.channel_rmsnorm(x, n1.weight, n1.bias, n1.eps, mod[1], mod[0], act="silu")
    a = fusedk.channel_rmsnorm(_ltx_conv(self.conv1, a), n2.weight, n2.bias, n2.eps, mod[3], mod[2], act="silu")
    h = x
    if self.norm3 is not None:
        h = fusedk.layernorm(h, self.norm3.weight, self.norm3.bias, self.norm3.eps)
    if self.conv_shortcut is not None:
        h = _ltx_conv(self.conv_shortcut, h)
    return _ltx_conv(self.conv2, a, h).movedim(-1, 1)


# [Mochi] causal convs padding time and space by repetition (the first frame, the edge pixels);
# GroupNorm a frame at a time


def _mochi_conv_why_not(c):
    if type(c).__name__ != "CogVideoXCausalConv3d" or c.pad_mode != "replicate":
        return f"{type(c).__name__} ({getattr(c, 'pad_mode', '')}), expected a replicate-padded CogVideoXCausalConv3d"
    k = c.conv
    if tuple(k.padding) != (0, 0, 0) or tuple(k.stride) != (1, 1, 1) or c.height_pad != c.width_pad:
        return f"stride {tuple(k.stride)}, padding {c.time_causal_padding}: expected 1 and the same on H and W"
    return _conv_why_not(k, None)


def _mochi_block_why_not(m):
    why = _block_why_not(m, "MochiResnetBlock3D")
    if why:
        return why
    for n in (m.norm1, m.norm2):
        if type(n).__name__ != "MochiChunkedGroupNorm3D" or not n.norm_layer.affine:
            return f"norm {type(n).__name__}, expected MochiChunkedGroupNorm3D with affine"
    return _mochi_conv_why_not(m.conv1) or _mochi_conv_why_not(m.conv2)


def _frames_gn(n, x, act):
    """MochiChunkedGroupNorm3D n (+ act) on x [N, T, H, W, C]: GroupNorm over each frame"""
    N, T, H, W, C = x.shape
    g = n.norm_layer
    return fusedk.group_norm(x.reshape(N * T, H, W, C), g.num_groups, g.weight, g.bias, g.eps, act=act).view(x.shape)


def _mochi_conv(c, x, residual=None):
    # the edge pixels repeated into a padded copy first (as the stock module does): fusedk's conv
    # with pad="replicate" runs the portable kernel, the zero-padded one the TMA kernel at several
    # times its rate, and the copy costs a read and a write of x
    p = c.height_pad
    xp = torch.nn.functional.pad(x, (0, 0, p, p, p, p), mode="replicate") if p else x
    return fusedk.conv(xp, _weight(c.conv), c.conv.bias, residual, padding=0, pad_t=c.time_pad,
                       time_pad="replicate")


def _mochi_block_forward(self, inputs, conv_cache=None):
    if not _runs(inputs, self) or inputs.dim() != 5 or any(v is not None for v in (conv_cache or {}).values()):
        return type(self).forward(self, inputs, conv_cache)
    x = _cl(inputs)
    a = _frames_gn(self.norm1, x, "silu")
    a = _frames_gn(self.norm2, _mochi_conv(self.conv1, a), "silu")
    return _mochi_conv(self.conv2, a, x).movedim(-1, 1), {"conv1": None, "conv2": None}


# [upsamplers] nearest 2x + conv as one conv reading x upsampled: the 4x larger image never
# written (AutoencoderKL's Upsample2D; Wan's resample Sequential(WanUpsample, Conv2d))


def _up_conv(m):
    """the conv of an upsampler m (Upsample2D's conv or Conv2d_0; the Sequential's second)"""
    if isinstance(m, torch.nn.Sequential):
        return m[1]
    return m.conv if m.name == "conv" else m.Conv2d_0


def _upsample2d_why_not(m):
    if m.norm is not None or m.use_conv_transpose or not m.interpolate or not m.use_conv:
        return "a norm, a transposed conv, or no interpolation or conv"
    return _conv_why_not(_up_conv(m))


def _wan_up_why_not(m):
    u = m[0]
    if tuple(float(f) for f in u.scale_factor) != (2.0, 2.0) or u.mode not in ("nearest", "nearest-exact") or \
            u.size is not None:
        return f"WanUpsample scale {u.scale_factor}, mode {u.mode!r}: expected 2, nearest(-exact)"
    return _conv_why_not(m[1])


def _up_forward(self, x, output_size=None, *args, **kwargs):
    """Upsample2D's forward (or the Sequential's) with the 2x nearest upsampling read by the conv;
    nearest and nearest-exact pick the same pixels at an integer scale"""
    if output_size is not None or args or kwargs or not _runs(x, self) or x.dim() != 4:
        return type(self).forward(self, x, *((output_size,) if output_size is not None else ()), *args, **kwargs)
    c = _up_conv(self)
    return fusedk.conv(_cl(x), _weight(c), c.bias, stride=c.stride[0], padding=c.padding[0], upsample=2).movedim(-1, 1)


# The decoder's closing norm and the SiLU after it: the norm applies the SiLU itself (fused, or
# stock where fusedk does not run the call) and the SiLU module passes its input on


def _gn_silu_forward(self, x):
    if not _runs(x, self) or x.dim() != 4:
        return torch.nn.functional.silu(type(self).forward(self, x))
    return fusedk.group_norm(_cl(x), self.num_groups, self.weight, self.bias, self.eps, act="silu").movedim(-1, 1)


def _rms_silu_forward(self, x):
    return _rms_forward(self, x, "silu")


def _passes(self, x):
    return x


def _tail(vae):
    """(name, label, norm, act, the norm's forward) of the decoder's closing norm + SiLU where
    fusedk fuses them, else None"""
    d = vae.decoder
    if type(vae).__name__ == "AutoencoderKLWan":  # WanDecoder3d's nonlinearity serves its head alone
        n, a = getattr(d, "norm_out", None), getattr(d, "nonlinearity", None)
        if type(d).__name__ == "WanDecoder3d" and type(a) is torch.nn.SiLU and not _rms_why_not(n):
            return "decoder.norm_out + nonlinearity", "WanRMS_norm + SiLU", n, a, _rms_silu_forward
        return None
    n, a = getattr(d, "conv_norm_out", None), getattr(d, "conv_act", None)
    if type(vae).__name__ == "AutoencoderKL" and type(n) is torch.nn.GroupNorm and n.affine and type(a) is torch.nn.SiLU:
        return "decoder.conv_norm_out + conv_act", "GroupNorm + SiLU", n, a, _gn_silu_forward
    return None


def _is(kind):
    return lambda m: type(m).__name__ == kind


def _targets(vae):
    """the fused blocks (a label, a match, the check, the forward) and the standalone modules (a
    type name, the check, the forward) for vae's kind"""
    up2d = ("Upsample2D", _is("Upsample2D"), _upsample2d_why_not, _up_forward)
    if type(vae).__name__ == "AutoencoderKLWan":
        wan_up = ("WanUpsample + Conv2d", lambda m: type(m) is torch.nn.Sequential and len(m) == 2 and
                  type(m[0]).__name__ == "WanUpsample", _wan_up_why_not, _up_forward)
        return [("WanResidualBlock", _is("WanResidualBlock"), _wan_block_why_not, _wan_block_forward), wan_up], [
            ("WanCausalConv3d", _causal_why_not, _causal_forward), ("Conv2d", _conv_why_not, _conv_forward),
            ("WanRMS_norm", _rms_why_not, _rms_forward)]
    if type(vae).__name__ == "AutoencoderKLLTXVideo":
        return [("LTXVideoResnetBlock3d", _is("LTXVideoResnetBlock3d"), _ltx_block_why_not, _ltx_block_forward)], [
            ("LTXVideoCausalConv3d", _ltx_conv_why_not, _ltx_conv_forward)]
    if type(vae).__name__ == "AutoencoderKLMochi":
        return [("MochiResnetBlock3D", _is("MochiResnetBlock3D"), _mochi_block_why_not, _mochi_block_forward)], [
            ("Conv3d", _conv3d_why_not, _conv_forward)]
    return [("ResnetBlock2D", _is("ResnetBlock2D"), _resnet_why_not, _resnet_forward), up2d], [
        ("Conv2d", _conv_why_not, _conv_forward)]


def apply(vae, prefix, report):
    """Patches vae's decoder (and post_quant_conv); adds what it did to report."""
    if getattr(vae, "_fusedk_vae", None) is not None:
        return
    patched, stored, passes = [], [], []
    mods = [("post_quant_conv", getattr(vae, "post_quant_conv", None))] + [
        ("decoder." + n if n else "decoder", m) for n, m in vae.decoder.named_modules()]
    dot = prefix + "." if prefix else ""
    blocks, singles = _targets(vae)
    inside = set()  # the modules a fused block runs itself
    for name, m in mods:
        block = next((b for b in blocks if m is not None and id(m) not in inside and b[1](m)), None)
        if block is None:
            continue
        why = block[2](m) or _hooked(m)
        if why:
            report.skipped.append((dot + name, block[0], why))
            continue
        m.forward = types.MethodType(block[3], m)
        patched.append(m)
        inside.update(id(c) for c in m.modules() if c is not m)
        report.patched.append((dot + name, block[0]))
    tail, fused_tail = _tail(vae), None
    if tail is not None:
        name, label, norm, act, fwd = tail
        why = _hooked(norm) or _hooked(act)
        if why:
            report.skipped.append((dot + name, label, why))
        else:
            norm.forward, act.forward = types.MethodType(fwd, norm), types.MethodType(_passes, act)
            patched.append(norm)  # (one entry of the report: act goes with it)
            passes.append(act)
            inside.update((id(norm), id(act)))
            report.patched.append((dot + name, label))
            fused_tail = norm
    for name, m in mods:
        single = next((t for t in singles if m is not None and type(m).__name__ == t[0]), None)
        if single is None or m is fused_tail:
            continue
        why = single[1](m) or _hooked(m)
        if why:
            report.skipped.append((dot + name, single[0], why))
            continue
        if id(m) not in inside:
            m.forward = types.MethodType(single[2], m)
            patched.append(m)
            report.patched.append((dot + name, single[0]))
    for m in patched:  # the conv weights in what runs fused, stored channels-last: the same values
        for c in m.modules():  # (not those hooks recast: they stay as the hooks keep them)
            w = c.weight if isinstance(c, (torch.nn.Conv2d, torch.nn.Conv3d)) and not _hooked(c) else None
            if w is not None and not w.is_contiguous(memory_format=_CL[w.dim()]):
                c.weight.data = w.data.contiguous(memory_format=_CL[w.dim()])
                stored.append(c)
    vae._fusedk_vae = (patched, stored, passes)


def revert(vae):
    """Undoes apply(vae): the stock forwards, the conv weights stored contiguous again. Returns the
    number of modules reverted."""
    st = vars(vae).pop("_fusedk_vae", None)
    if st is None:
        return 0
    patched, stored, passes = st
    for m in patched + passes:
        vars(m).pop("forward", None)
    for c in stored:
        c.weight.data = c.weight.data.contiguous()
    for m in vae.modules():  # the NHWC weight copies made at calls
        vars(m).pop("_fusedk_w", None)
    return len(patched)
