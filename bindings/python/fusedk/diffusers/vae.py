"""fusedk inside diffusers' VAE decoders (AutoencoderKL: Flux, SD3, SDXL): the decoder's ResNet
blocks and convolutions through fusedk's channels-last ops.

Per ResnetBlock2D (the decoder's: no time embedding, no resampling inside):
  group_norm(x, act="silu")                 GroupNorm + SiLU, one op
  conv(., W1, b1)                           3x3, an implicit GEMM (no im2col copy)
  group_norm(., act="silu")
  conv(x, Ws, bs) where the block has a 1x1 shortcut
  conv(., W2, b2, residual=shortcut)        the block's add in conv2's epilogue
Every other Conv2d of the decoder (conv_in, the upsamplers' convs, conv_out) and the VAE's
post_quant_conv run as fusedk.conv. Activations flow in channels-last memory (a tensor NCHW to
torch, NHWC to fusedk: a permuted view, no copy); an input in another layout is made
channels-last once, at the first patched module. The attention of the mid block, the
upsamplers' nearest-neighbour interpolation and the final GroupNorm + SiLU stay torch's.

A module runs its stock forward when fusedk cannot reproduce the call: CUDA tensors other than
float16/bfloat16 (the conv kernel's), parameters of another dtype than the input, autograd
recording, a time embedding given, torch hooks on the module. On CPU tensors the stock forwards
run too: fusedk's CPU references are double-precision loops, minutes a decode (the tests set
CPU_REFERENCE = True to check the patched math against them). Modules with a forward of their own
(diffusers' hooks: layerwise casting, group offloading; accelerate's) are left alone, and the
report says why. The weights are the model's: a conv's weight is read
as a channels-last view where it is stored so, else its NHWC copy is made at the call and kept
until the weight changes (apply() stores the decoder's conv weights channels-last; revert()
stores them back contiguous, the same values bit for bit)."""
import types

import torch

import fusedk

_CL = torch.channels_last
CPU_REFERENCE = False  # True: CPU tensors through fusedk's C references (slow; for tests)


def vaes(model):
    """(name, AutoencoderKL) of a pipeline's .vae, or of the model itself"""
    try:
        from diffusers import AutoencoderKL
    except ImportError:  # pragma: no cover
        return []
    out = [(n, v) for n, v in (("vae", getattr(model, "vae", None)), ("", model)) if isinstance(v, AutoencoderKL)]
    return out[:1]


def _conv_why_not(c):
    if type(c) is not torch.nn.Conv2d:
        return f"{type(c).__name__}, expected torch.nn.Conv2d"
    if c.groups != 1 or tuple(c.dilation) != (1, 1) or c.padding_mode != "zeros" or isinstance(c.padding, str):
        return "grouped, dilated, string-padded or non-zero-padded conv"
    if c.stride[0] != c.stride[1] or c.padding[0] != c.padding[1] or c.stride[0] not in (1, 2):
        return f"stride {tuple(c.stride)}, padding {tuple(c.padding)}: expected one of 1 or 2, and one padding"
    return None


def _hooked(m):
    """why module m keeps its forward: an instance forward (diffusers' and accelerate's hooks
    replace it), else None"""
    if "forward" in vars(m) or "_diffusers_hook" in vars(m) or "_hf_hook" in vars(m):
        return "hooks replace its forward (layerwise casting, offloading, accelerate)"
    return None


def _resnet_why_not(m):
    from diffusers.models.resnet import ResnetBlock2D
    if type(m) is not ResnetBlock2D:
        return f"{type(m).__name__}, expected ResnetBlock2D"
    if m.time_embedding_norm not in ("default", "group"):  # (without temb both are norm2 alone)
        return f"time_embedding_norm {m.time_embedding_norm!r}, expected 'default' or 'group'"
    if m.upsample is not None or m.downsample is not None:
        return "resamples inside the block"
    if m.time_emb_proj is not None:
        return "takes a time embedding"
    for n in (m.norm1, m.norm2):
        if type(n) is not torch.nn.GroupNorm or not n.affine:
            return f"norm {type(n).__name__}, expected GroupNorm with affine"
    if type(m.nonlinearity) is not torch.nn.SiLU:
        return f"nonlinearity {type(m.nonlinearity).__name__}, expected SiLU"
    if m.output_scale_factor != 1.0:
        return f"output_scale_factor {m.output_scale_factor}, expected 1"
    for c in (m.conv1, m.conv2) + ((m.conv_shortcut,) if m.conv_shortcut is not None else ()):
        why = _conv_why_not(c)
        if why:
            return why
    return None


def _nhwc(t):
    """t [N, C, H, W] as fusedk's [N, H, W, C] view of its channels-last memory (one copy if it is
    stored otherwise)"""
    return t.contiguous(memory_format=_CL).permute(0, 2, 3, 1)


def _weight(c):
    """conv c's weight [Co, kh, kw, Ci]: a view where it is stored channels-last, else a copy kept
    until the weight changes"""
    w = c.weight
    if w.is_contiguous(memory_format=_CL):
        return w.detach().permute(0, 2, 3, 1)
    key = (w.data_ptr(), w._version, w.dtype, w.device)
    st = vars(c).get("_fusedk_w")
    if st is None or st[0] != key:
        st = (key, w.detach().permute(0, 2, 3, 1).contiguous())
        c._fusedk_w = st
    return st[1]


def _runs(x, mods):
    """whether fusedk runs the call: x [N, C, H, W] 16-bit on CUDA (or on the CPU, CPU_REFERENCE),
    every parameter of x's dtype and device, no autograd recording, no hooks"""
    ok = (torch.float16, torch.bfloat16) if x.is_cuda else (torch.float32, torch.float16, torch.bfloat16)
    if x.dim() != 4 or x.dtype not in ok or not (x.is_cuda or (CPU_REFERENCE and x.device.type == "cpu")):
        return False
    if torch.is_grad_enabled() and (x.requires_grad or any(p.requires_grad for m in mods for p in m.parameters())):
        return False
    for m in mods:
        if m._forward_hooks or m._forward_pre_hooks:
            return False
        for p in m.parameters(recurse=False):
            if p.dtype != x.dtype or p.device != x.device:
                return False
    return True


def _conv(c, x, residual=None):
    """conv c on the NHWC view x (residual: NHWC, added in the epilogue)"""
    return fusedk.conv(x, _weight(c), c.bias, residual, stride=c.stride[0], padding=c.padding[0])


def _conv_forward(self, x):
    if not _runs(x, (self,)):
        return type(self).forward(self, x)
    return _conv(self, _nhwc(x)).permute(0, 3, 1, 2)


def _resnet_forward(self, input_tensor, temb=None, *args, **kwargs):
    subs = (self, self.norm1, self.norm2, self.conv1, self.conv2) + (
        (self.conv_shortcut,) if self.conv_shortcut is not None else ())
    if temb is not None or args or kwargs or (self.training and self.dropout.p > 0) or not _runs(input_tensor, subs):
        return type(self).forward(self, input_tensor, temb, *args, **kwargs)
    x = _nhwc(input_tensor)
    n1, n2 = self.norm1, self.norm2
    h = fusedk.group_norm(x, n1.num_groups, n1.weight, n1.bias, n1.eps, act="silu")
    h = fusedk.group_norm(_conv(self.conv1, h), n2.num_groups, n2.weight, n2.bias, n2.eps, act="silu")
    shortcut = x if self.conv_shortcut is None else _conv(self.conv_shortcut, x)
    return _conv(self.conv2, h, shortcut).permute(0, 3, 1, 2)


def apply(vae, prefix, report):
    """Patches vae's decoder (and post_quant_conv); adds what it did to report."""
    if getattr(vae, "_fusedk_vae", None) is not None:
        return
    patched, stored = [], []
    mods = [("post_quant_conv", getattr(vae, "post_quant_conv", None))] + [
        ("decoder." + n if n else "decoder", m) for n, m in vae.decoder.named_modules()]
    dot = prefix + "." if prefix else ""
    resnet_convs = set()
    for name, m in mods:
        if m is None or type(m).__name__ != "ResnetBlock2D":
            continue
        why = _resnet_why_not(m) or _hooked(m)
        if why:
            report.skipped.append((dot + name, type(m).__name__, why))
            continue
        m.forward = types.MethodType(_resnet_forward, m)
        patched.append(m)
        resnet_convs.update(id(c) for c in m.modules() if type(c) is torch.nn.Conv2d)
        report.patched.append((dot + name, "ResnetBlock2D"))
    for name, m in mods:
        if m is None or type(m) is not torch.nn.Conv2d:
            continue
        why = _conv_why_not(m) or _hooked(m)
        if why:
            report.skipped.append((dot + name, "Conv2d", why))
            continue
        if m.weight.dim() == 4 and not m.weight.is_contiguous(memory_format=_CL):
            m.weight.data = m.weight.data.contiguous(memory_format=_CL)  # the same values, NHWC storage
            stored.append(m)
        if id(m) not in resnet_convs:  # (a block's convs run inside its fused forward)
            m.forward = types.MethodType(_conv_forward, m)
            patched.append(m)
            report.patched.append((dot + name, "Conv2d"))
    vae._fusedk_vae = (patched, stored)


def revert(vae):
    """Undoes apply(vae): the stock forwards, the conv weights stored contiguous again. Returns the
    number of modules reverted."""
    st = vars(vae).pop("_fusedk_vae", None)
    if st is None:
        return 0
    patched, stored = st
    for m in patched:
        vars(m).pop("forward", None)
        vars(m).pop("_fusedk_w", None)
    for c in stored:
        c.weight.data = c.weight.data.contiguous()
        vars(c).pop("_fusedk_w", None)
    return len(patched)

