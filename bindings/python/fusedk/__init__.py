"""fusedk: fused GPU kernels for diffusion and transformer blocks, with CPU references.

Every op takes NumPy arrays (runs the C reference; bfloat16 through ml_dtypes) or CUDA arrays of
PyTorch, CuPy or JAX (runs the GPU kernel on the caller's current stream, or `stream=`) and
returns the caller's own type; outputs come from the caller's framework allocator. `out=` writes
into the caller's array. Errors raise fusedk.Error with the C library's reason. JAX arrays (and
tracers, under jax.jit) go through XLA custom calls: see fusedk.jax. Under torch.compile the same
functions become the torch.ops.fusedk custom operators (fusedk.torch). fusedk.diffusers puts
fused forwards into diffusers' DiTs; fusedk.bem has BEM's helpers over lowrank_update;
fusedk.LoRA folds a LoRA into its base linear. The formulas are in fusedk.h."""
import collections as _collections
import json as _json

from . import _core
from ._core import (ArgumentTypeError, DeviceError, DTypeError, Error, InvalidArgumentError, LayoutError,
                    OutOfMemoryError, ShapeError)

__all__ = ["Error", "ShapeError", "LayoutError", "InvalidArgumentError", "ArgumentTypeError", "DTypeError",
           "DeviceError",
           "OutOfMemoryError", "rmsnorm", "layernorm", "adaln", "rmsnorm_fp8", "layernorm_fp8", "adaln_fp8", "residual_tanh_gated_rmsnorm", "act", "silu_fma",
           "gated_residual", "glu", "glu_pair", "rope", "rope_table_1d", "rope_table_axes", "rope_table_ltx",
           "rope_table_mixed", "qk_norm_rope", "qk_norm_rope_int8", "diffusion_step", "linear", "linear_backward",
           "quantize_fp8", "dequantize_fp8", "glu_fp8", "linear_fp8", "quantize_int8", "linear_w8",
           "attention",
           "attention_int8", "attention_int8_scaled", "ScaledTensor",
           "lowrank_update", "lowrank_prepare", "linear_lowrank", "LoRA", "lowrank_update_backward",
           "linear_lowrank_backward", "conv", "fold_batchnorm", "fused_conv_bn_silu", "group_norm", "channel_rmsnorm", "kernel_info",
           "__version__"]
__version__ = _core.ffi.string(_core.lib.fusedk_version()).decode()

_call = _core.call
_RMSNORM, _LAYERNORM, _ADALN, _MOCHI = (_core.lib.FUSEDK_OP_RMSNORM, _core.lib.FUSEDK_OP_LAYERNORM,
                                        _core.lib.FUSEDK_OP_ADALN, _core.lib.FUSEDK_OP_RESIDUAL_TANH_GATED_RMSNORM)
_NORMS = {"layer": _core.lib.FUSEDK_NORM_LAYER, "rms": _core.lib.FUSEDK_NORM_RMS}
_ACT, _SILU_FMA, _GATED_RESIDUAL = _core.lib.FUSEDK_OP_ACT, _core.lib.FUSEDK_OP_SILU_FMA, _core.lib.FUSEDK_OP_GATED_RESIDUAL
_GLU, _GLU_PAIR = _core.lib.FUSEDK_OP_GLU, _core.lib.FUSEDK_OP_GLU_PAIR
_ROPE, _T1D, _TAXES, _TLTX, _TMIXED, _STEP = (_core.lib.FUSEDK_OP_ROPE, _core.lib.FUSEDK_OP_ROPE_TABLE_1D,
                                             _core.lib.FUSEDK_OP_ROPE_TABLE_AXES, _core.lib.FUSEDK_OP_ROPE_TABLE_LTX,
                                             _core.lib.FUSEDK_OP_ROPE_TABLE_MIXED, _core.lib.FUSEDK_OP_DIFFUSION_STEP)
_QKNR, _QKNR8 = _core.lib.FUSEDK_OP_QK_NORM_ROPE, _core.lib.FUSEDK_OP_QK_NORM_ROPE_INT8
_LINEAR, _LINEAR_BWD = _core.lib.FUSEDK_OP_LINEAR, _core.lib.FUSEDK_OP_LINEAR_BACKWARD
_RMSNORM8, _LAYERNORM8, _ADALN8 = (_core.lib.FUSEDK_OP_RMSNORM_FP8, _core.lib.FUSEDK_OP_LAYERNORM_FP8,
                                   _core.lib.FUSEDK_OP_ADALN_FP8)
_QUANT8, _DEQUANT8, _LINEAR8 = (_core.lib.FUSEDK_OP_QUANTIZE_FP8, _core.lib.FUSEDK_OP_DEQUANTIZE_FP8,
                                _core.lib.FUSEDK_OP_LINEAR_FP8)
_GLU8 = _core.lib.FUSEDK_OP_GLU_FP8
_QUANT_I8, _LINEAR_W8 = _core.lib.FUSEDK_OP_QUANTIZE_INT8, _core.lib.FUSEDK_OP_LINEAR_W8
_ATTENTION, _ATTENTION_INT8 = _core.lib.FUSEDK_OP_ATTENTION, _core.lib.FUSEDK_OP_ATTENTION_INT8
_ATTENTION_SCALED = _core.lib.FUSEDK_OP_ATTENTION_INT8_SCALED
_PRECISIONS = {None: _ATTENTION, "int8": _ATTENTION_INT8}
_LOWRANK = _core.lib.FUSEDK_OP_LOWRANK_UPDATE
_LR_PREPARE, _LINEAR_LOWRANK = _core.lib.FUSEDK_OP_LOWRANK_PREPARE, _core.lib.FUSEDK_OP_LINEAR_LOWRANK
_LOWRANK_BWD, _LINEAR_LOWRANK_BWD = (_core.lib.FUSEDK_OP_LOWRANK_UPDATE_BACKWARD,
                                     _core.lib.FUSEDK_OP_LINEAR_LOWRANK_BACKWARD)
_CONV, _FOLD_BN, _GN = _core.lib.FUSEDK_OP_CONV, _core.lib.FUSEDK_OP_FOLD_BATCHNORM, _core.lib.FUSEDK_OP_GROUP_NORM
_CRMS = _core.lib.FUSEDK_OP_CHANNEL_RMSNORM
_PADS = {"zeros": 0, "replicate": 1}
_QK_NORMS = {"head": _core.lib.FUSEDK_QK_NORM_HEAD, "full": _core.lib.FUSEDK_QK_NORM_FULL,
             "none": _core.lib.FUSEDK_QK_NORM_NONE}
_LAYOUTS = {"bhsd": _core.lib.FUSEDK_LAYOUT_BHSD, "bshd": _core.lib.FUSEDK_LAYOUT_BSHD}
_STYLES = {"interleaved": _core.lib.FUSEDK_ROPE_INTERLEAVED, "half": _core.lib.FUSEDK_ROPE_HALF}
_SAMPLERS = {"euler": _core.lib.FUSEDK_SAMPLER_EULER, "ddim": _core.lib.FUSEDK_SAMPLER_DDIM}
_HALVES = {"first": _core.lib.FUSEDK_GLU_FIRST, "second": _core.lib.FUSEDK_GLU_SECOND}
_ACTS = {"gelu": _core.lib.FUSEDK_ACT_GELU, "gelu_tanh": _core.lib.FUSEDK_ACT_GELU_TANH,
         "silu": _core.lib.FUSEDK_ACT_SILU, "relu": _core.lib.FUSEDK_ACT_RELU}
_LINEAR_ACTS = {"none": _core.lib.FUSEDK_ACT_NONE, **_ACTS}


def __dir__():
    return sorted(__all__ + ["bem", "diffusers", "jax", "torch"])


# fusedk.torch and fusedk.jax register their routes with _core when imported; until then these
# stand-ins take a call that needs one (torch.compile's trace or autograd, JAX arrays): each
# imports its adapter (an import statement: torch.compile's tracer runs one where it meets it,
# which it does not do for importlib) and passes the call on
def _torch_route(op, x, args, attrs, stream):
    from . import torch as adapter
    return adapter._route(op, x, args, attrs, stream)


def _jax_route(op, x, args, attrs, stream):
    from . import jax as adapter  # imports jax, which the caller has imported already
    return adapter._route(op, x, args, attrs, stream)


_core.register_adapter("torch", _torch_route)
_core.register_adapter("jax", _jax_route)


def kernel_info():
    """Version, build (CUDA on/off, archs, cuBLASLt), devices, and each op with its dtypes."""
    ffi, lib = _core.ffi, _core.lib
    n = lib.fusedk_kernel_info(ffi.NULL, 0)
    buf = ffi.new("char[]", n + 1)
    lib.fusedk_kernel_info(buf, n + 1)
    info = _json.loads(ffi.string(buf).decode())
    from ._ffi import HEADER, LIBRARY
    info["library"], info["header"] = LIBRARY, HEADER
    return info


def rmsnorm(x, weight=None, eps=1e-6, residual=None, out=None, residual_out=None, stream=None):
    """y = r * rsqrt(mean(r^2, -1) + eps) * weight with r = x + residual (if given).
    Returns y, or (y, r) when residual is given (r rounded to x's dtype; the unrounded sum is
    what gets normalized). residual_out=residual updates the residual in place."""
    return _call(_RMSNORM, x, (out, residual_out, x, residual, weight), (eps,), stream)


def _flag(op, name, value):
    """A yes/no argument as 1 or 0: a bool or a number (not a str such as "False")."""
    if not _core.is_number(value):
        raise _core.ArgumentTypeError("FUSEDK_ERR_INVALID_ARGUMENT", f"{op}: {name} is {value!r} (a "
                                      f"{type(value).__name__}), expected True or False")
    return 1 if value else 0


def _choice(op, name, value, table):
    """table[value], or an Error naming the argument and the values it takes."""
    v = table.get(value)
    if v is None:
        keys = [repr(k) for k in table]
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{op}: {name} is {value!r}, expected "
                    + (", ".join(keys[:-1]) + " or " + keys[-1] if len(keys) > 1 else keys[0]))
    return v


def layernorm(x, weight=None, bias=None, eps=1e-5, out=None, stream=None):
    """y = (x - mean) * rsqrt(var + eps) * weight + bias over the last dim (biased variance)."""
    return _call(_LAYERNORM, x, (out, x, weight, bias), (eps,), stream)


def adaln(x, scale, shift, norm="layer", eps=1e-6, weight=None, bias=None, out=None, stream=None):
    """y[B,L,D] = norm(x) * (1 + scale[:, None]) + shift[:, None], norm = "layer" or "rms";
    scale and shift are [B, D] and may be strided views (e.g. chunks of a [B, 6D] modulation)."""
    kind = _choice("adaln", "norm", norm, _NORMS)
    return _call(_ADALN, x, (out, x, scale, shift, weight, bias), (kind, eps), stream)


def rmsnorm_fp8(x, weight=None, eps=1e-6, residual=None, out=None, residual_out=None, stream=None):
    """rmsnorm with y written as an FP8 ScaledTensor (what linear takes for x): each row's float32
    result quantized as quantize_fp8 quantizes, in the norm's one pass. Returns y, or (y, r) with
    residual. out=: a ScaledTensor to write."""
    d, sc = _scaled_out("rmsnorm_fp8", out)
    r = _call(_RMSNORM8, x, (d, sc, residual_out, x, residual, weight), (eps,), stream)
    return (ScaledTensor(r[0], r[1]), r[2]) if len(r) == 3 else ScaledTensor(*r)


def layernorm_fp8(x, weight=None, bias=None, eps=1e-5, out=None, stream=None):
    """layernorm with y written as an FP8 ScaledTensor (rmsnorm_fp8's rule)."""
    d, sc = _scaled_out("layernorm_fp8", out)
    return ScaledTensor(*_call(_LAYERNORM8, x, (d, sc, x, weight, bias), (eps,), stream))


def adaln_fp8(x, scale, shift, norm="layer", eps=1e-6, weight=None, bias=None, out=None, stream=None):
    """adaln with y written as an FP8 ScaledTensor (rmsnorm_fp8's rule): a DiT block's modulated
    norm feeding its projections' FP8 GEMMs with no quantization pass between."""
    kind = _choice("adaln_fp8", "norm", norm, _NORMS)
    d, sc = _scaled_out("adaln_fp8", out)
    return ScaledTensor(*_call(_ADALN8, x, (d, sc, x, scale, shift, weight, bias), (kind, eps), stream))


def residual_tanh_gated_rmsnorm(x, x_res, gate, eps=1e-6, exact=True, out=None, stream=None):
    """Mochi: y = x + cast(x_res * rsqrt(mean(x_res^2) + eps) * tanh(gate)[:, None]).
    exact=True reproduces PyTorch's rounding points; exact=False rounds once."""
    return _call(_MOCHI, x, (out, x, x_res, gate), (eps, _flag("residual_tanh_gated_rmsnorm", "exact", exact)), stream)


# --- [elementwise] -------------------------------------------------------------------------
def act(x, kind="gelu", out=None, stream=None):
    """y = act(x): kind "gelu" (erf), "gelu_tanh", "silu" or "relu"."""
    return _call(_ACT, x, (out, x), (_choice("act", "kind", kind, _ACTS),), stream)


def glu(x, act="silu", act_half="first", gate=None, out=None, stream=None):
    """Gated linear unit. x[..., 2H] -> y[..., H] = act(h_a) * h_b, h_a the half named by act_half
    ("first": x[..., :H]), h_b the other: SwiGLU = glu(x, "silu", "first"), diffusers' GEGLU =
    glu(x, "gelu", "second"). With gate=: y = x * act(gate), one shape (fusedk.glu_pair)."""
    k = _choice("glu", "act", act, _ACTS)
    if gate is not None:
        return _call(_GLU_PAIR, x, (out, x, gate), (k,), stream)
    return _call(_GLU, x, (out, x), (k, _choice("glu", "act_half", act_half, _HALVES)), stream)


def glu_pair(value, gate, act="silu", out=None, stream=None):
    """y = value * act(gate), one shape (e.g. two strided views of one projection)."""
    return _call(_GLU_PAIR, value, (out, value, gate), (_choice("glu_pair", "act", act, _ACTS),), stream)


def silu_fma(a, b, c, out=None, stream=None):
    """y = silu(a + b * c), one shape (inputs may be broadcast views)."""
    return _call(_SILU_FMA, a, (out, a, b, c), (), stream)


def gated_residual(x, y, gate, out=None, stream=None):
    """out[B, L, D] = x + gate[:, None] * y; gate [B, D] may be a strided chunk of the [B, 6D]
    AdaLN-Zero modulation."""
    return _call(_GATED_RESIDUAL, x, (out, x, y, gate), (), stream)


# --- [position] ------------------------------------------------------------------------------
def rope(q, k, cos, sin, style="interleaved", rotary_dim=None, inplace=False, q_out=None, k_out=None, stream=None):
    """Rotary position embedding of q [B, S, Hq, Dh] and k [B, S, Hk, Dh] (k may be None) in one
    launch: the first rotary_dim channels of each head (None: all) turn by the angles of the
    float32 tables cos, sin ([S, R/2], [S, H, R/2] or [B, S, H, R/2], any strides). style
    "interleaved" rotates pairs (2i, 2i+1) (Flux, LTX-Video, Mochi, GPT-J), "half" pairs
    (i, i + R/2) (NeoX, Llama). Returns (q', k'), or q' when k is None; inplace=True writes q and k."""
    st = _choice("rope", "style", style, _STYLES)
    if _flag("rope", "inplace", inplace):
        q_out, k_out = q, k
    return _call(_ROPE, q, (q_out, k_out, q, k, cos, sin), (st, rotary_dim or 0), stream)


def _f32(a):
    """Lists and NumPy arrays (integer positions, another byte order, strided views) as compact
    native float32 arrays: the tables' inputs are small, so a copy costs nothing."""
    np = _core.np
    if isinstance(a, (list, tuple, np.ndarray)):
        return np.ascontiguousarray(a, np.float32)
    return a


def rope_table_1d(positions, dim, theta=10000.0, stream=None):
    """(cos, sin) float32 [S, dim/2] of positions [S]: angle = pos / theta^(2i/dim)."""
    positions = _f32(positions)
    return _call(_T1D, positions, (None, None, positions), (dim, theta), stream)


def rope_table_axes(ids, axes_dim=(16, 56, 56), theta=10000.0, stream=None):
    """Flux: (cos, sin) float32 [S, sum(axes_dim)/2] of ids [S, n_axes]: per axis a block of
    axes_dim[a]/2 columns, angle = ids[:, a] / theta^(2i/axes_dim[a])."""
    dims = tuple(axes_dim)  # 0-terminated in the attributes: C checks each size
    if len(dims) > 4 or 0 in dims:
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"rope_table_axes: axes_dim is {dims!r}, expected 1 to 4 even "
                    "sizes >= 2")
    ids = _f32(ids)
    return _call(_TAXES, ids, (None, None, ids), (theta,) + dims + (0,) * (4 - len(dims)), stream)


def rope_table_ltx(coords, dim, theta=10000.0, stream=None):
    """LTX-Video: (cos, sin) float32 [S, dim/2] of coords [S, 3] in [0, 1] (frame, height, width
    fractions): frequencies theta^linspace(0, 1, dim//6) * pi/2, angle = freq * (2 coord - 1),
    axes interleaved per frequency, (dim % 6)/2 leading columns cos 1, sin 0."""
    coords = _f32(coords)
    return _call(_TLTX, coords, (None, None, coords), (dim, theta), stream)


def rope_table_mixed(pos, freqs, stream=None):
    """Mochi: (cos, sin) float32 [S, H, F] of pos [S, 3] and learned freqs [3, H, F]:
    angle = sum over the axes of pos * freqs."""
    pos, freqs = _f32(pos), _f32(freqs)
    return _call(_TMIXED, pos, (None, None, pos, freqs), (), stream)


def qk_norm_rope(qkv, cos, sin, q_weight=None, k_weight=None, eps=1e-6, norm="head", style="interleaved",
                 layout="bhsd", rotary_dim=None, out=None, stream=None):
    """The attention prologue in one pass: qkv [B, S, 3, H, Dh] (a packed projection) or a tuple
    (q, k, v) of [B, S, H, Dh] tensors (k, v: Hk heads; any strides; v may be None) ->
    (q', k', v') with q' = rope(rmsnorm(q) * q_weight), k' likewise, v' = v, each written in
    `layout`: "bhsd" [B, H, S, Dh] (SDPA) or "bshd" [B, S, H, Dh] (FlashAttention). norm "head"
    normalizes each head (weights [Dh]: Flux, Mochi), "full" the whole H*Dh row (weights
    [H*Dh]: LTX-Video, Wan), "none" skips it. RoPE as fusedk.rope (tables [S, R/2], [S, H, R/2]
    or [B, S, H, R/2] float32, style, rotary_dim). out=(q_out, k_out, v_out) writes there."""
    q, k, v = _qkv_views("qk_norm_rope", qkv)
    outs = (None, None, None) if out is None else tuple(out)
    if len(outs) != 3:
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"qk_norm_rope: out has {len(outs)} arrays, expected "
                    "(q_out, k_out, v_out)")
    attrs = (eps, _choice("qk_norm_rope", "norm", norm, _QK_NORMS), _choice("qk_norm_rope", "style", style, _STYLES),
             _choice("qk_norm_rope", "layout", layout, _LAYOUTS), rotary_dim or 0)
    return _call(_QKNR, q, outs + (q, k, v, cos, sin, q_weight, k_weight), attrs, stream)


def qk_norm_rope_int8(qkv, cos, sin, q_weight=None, k_weight=None, eps=1e-6, norm="head", style="interleaved",
                      rotary_dim=None, out=None, stream=None):
    """qk_norm_rope with q' and k' written as int8 ScaledTensors ([B, S, H, Dh] data, float32 [B, S,
    H] scales: a (token, head) row's amax / 127), what attention(q, k, v) takes as they are (its
    int8 kernel, no quantization pass): returns (q', k', v) with v the input's view, untouched (no
    mean is taken off k). The arguments as qk_norm_rope's; out=(ScaledTensor, ScaledTensor) writes
    there. fusedk.h's fusedk_qk_norm_rope_int8 has the rules."""
    q, k, v = _qkv_views("qk_norm_rope_int8", qkv)
    outs = (None,) * 4
    if out is not None:
        if len(out) != 2 or not all(isinstance(o, ScaledTensor) for o in out):
            raise Error("FUSEDK_ERR_INVALID_ARGUMENT", "qk_norm_rope_int8: out is not (ScaledTensor, ScaledTensor), "
                        "expected q's and k's int8 data and float32 scales")
        outs = (out[0].data, out[0].scale, out[1].data, out[1].scale)
    attrs = (eps, _choice("qk_norm_rope_int8", "norm", norm, _QK_NORMS),
             _choice("qk_norm_rope_int8", "style", style, _STYLES), rotary_dim or 0)
    r = _call(_QKNR8, q, outs + (q, k, cos, sin, q_weight, k_weight), attrs, stream)
    return ScaledTensor(r[0], r[1]), ScaledTensor(r[2], r[3]), v


def _qkv_views(name, qkv):
    """(q, k, v) of qkv: a [B, S, 3, H, Dh] projection's views, or the tuple itself."""
    if isinstance(qkv, (tuple, list)):
        if len(qkv) != 3:
            raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{name}: qkv is a sequence of {len(qkv)}, expected (q, k, v)")
        return tuple(qkv)
    shape = tuple(getattr(qkv, "shape", ()))
    if len(shape) != 5 or shape[2] != 3:
        raise Error("FUSEDK_ERR_SHAPE", f"{name}: qkv has shape {shape}, expected [B, S, 3, H, Dh] or a tuple "
                    "(q, k, v)")
    return qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]  # views (NumPy, torch, CuPy)


# --- [sampler] -------------------------------------------------------------------------------
def diffusion_step(x, cond, uncond=None, guidance=1.0, sampler="euler", sigma=0.0, sigma_next=0.0, alpha_bar=1.0,
                   alpha_bar_prev=1.0, clamp_x0=None, prev=None, blend=1.0, out=None, stream=None):
    """One sampler step over the latent in one pass: m = uncond + guidance * (cond - uncond) (or
    cond); "euler" (flow matching): x + (sigma_next - sigma) * m; "ddim" (eta 0, epsilon):
    x0 = (x - sqrt(1 - alpha_bar) m) / sqrt(alpha_bar) clamped to +-clamp_x0, then
    sqrt(alpha_bar_prev) x0 + sqrt(1 - alpha_bar_prev) m; then blend * x' + (1 - blend) * prev
    when prev is given. out=x updates the latent in place."""
    smp = _choice("diffusion_step", "sampler", sampler, _SAMPLERS)
    if clamp_x0 is not None and _core.is_number(clamp_x0) and not clamp_x0 > 0:
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"diffusion_step: clamp_x0 is {clamp_x0!r}, expected a value > 0 "
                    "(or None: no clamp)")
    return _call(_STEP, x, (out, x, cond, uncond, prev),
                 (guidance, smp, sigma, sigma_next, alpha_bar, alpha_bar_prev, clamp_x0 or 0.0, blend), stream)


# --- [linear] ---------------------------------------------------------------------------------
def linear(x, w, bias=None, act="none", aux=False, tf32=False, out=None, aux_out=None, stream=None, out_dtype=None):
    """y = act(x @ w.T + bias) through cuBLASLt: x [..., K], w [N, K] (nn.Linear's weight), bias
    [N]; act "none", "relu", "gelu_tanh" (in cuBLASLt's epilogue), "gelu" (erf) or "silu" (the
    GEMM, then one fusedk pass). aux=True also returns the pre-activation x @ w.T + bias, what
    linear_backward needs: (y, aux). float32 inputs use TF32 tensor cores only with tf32=True.
    x and w given as FP8 ScaledTensors (quantize_fp8's): linear_fp8, y of out_dtype. w an int8
    ScaledTensor (quantize_int8's) and x a plain array: linear_w8 (weight-only, y of x's dtype)."""
    if isinstance(w, ScaledTensor) and not isinstance(x, ScaledTensor) and _is_int8(w.data):
        if out_dtype is not None and _core.scalar_of(out_dtype) != _core.scalar_of(x.dtype):
            raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"linear: out_dtype is {out_dtype!r} with int8 weights "
                        f"(linear_w8), expected None or x's dtype {x.dtype}")
        return linear_w8(x, w, bias, act, aux, out, aux_out, stream)
    if isinstance(x, ScaledTensor) or isinstance(w, ScaledTensor):
        return linear_fp8(x, w, bias, act, aux, out, aux_out, stream, out_dtype)
    a = _choice("linear", "act", act, _LINEAR_ACTS)
    want = 1 if _flag("linear", "aux", aux) or aux_out is not None else 0
    return _call(_LINEAR, x, (out, aux_out, x, w, bias), (a, _flag("linear", "tf32", tf32), want), stream)


def linear_backward(dy, x, w, aux=None, act="none", dx=True, dw=True, db=True, tf32=False, stream=None):
    """Gradients of y = act(x @ w.T + b): with dz = dy * act'(aux) (aux: linear's aux; dz = dy
    for "none"), dx = dz @ w, dw = dz.T @ x (over every leading dim of x), db = dz summed over
    the rows. Returns (dx, dw, db), None for each not asked for."""
    a = _choice("linear_backward", "act", act, _LINEAR_ACTS)
    dx, dw, db = (_flag("linear_backward", n, f) for n, f in (("dx", dx), ("dw", dw), ("db", db)))
    if not (dx or dw or db):  # nothing asked for: nothing to run
        return None, None, None
    r = _call(_LINEAR_BWD, dy, (None, None, None, dy, x, w, aux), (a, _flag("linear_backward", "tf32", tf32), dx, dw,
                                                                   db), stream)
    return _core.spread(r, (dx, dw, db))


def quantize_fp8(x, out=None, stream=None):
    """x [..., K] (float32, float16, bfloat16) as an FP8 ScaledTensor: data float8_e4m3fn [..., K],
    scale float32 [...] (x's leading dims; [1] for a 1-d x), a row at a time: scale = amax / 448,
    data = x / scale rounded to nearest even (torchao's per-row scaling, in one pass). What
    linear takes for x, and for a weight [N, K] (an output channel a row). out=: a ScaledTensor
    to write. fusedk.h's fusedk_quantize_fp8 has the rules (zero and NaN rows)."""
    d, sc = _scaled_out("quantize_fp8", out)
    return ScaledTensor(*_call(_QUANT8, x, (d, sc, x), (), stream))


def glu_fp8(x, act="silu", act_half="first", out=None, stream=None):
    """glu(x, act, act_half) written as an FP8 ScaledTensor [..., H] (each row quantized as
    quantize_fp8 quantizes one): a SwiGLU MLP's hidden state for its second GEMM (linear on
    ScaledTensors), without the 16-bit pass between. out=: a ScaledTensor to write."""
    k, h = _choice("glu_fp8", "act", act, _ACTS), _choice("glu_fp8", "act_half", act_half, _HALVES)
    d, sc = _scaled_out("glu_fp8", out)
    return ScaledTensor(*_call(_GLU8, x, (d, sc, x), (k, h), stream))


def dequantize_fp8(x, out_dtype=None, out=None, stream=None):
    """x.data * x.scale (a scale a row of the last dim) as out_dtype (float32, float16 or bfloat16;
    default out's dtype, else bfloat16): x an FP8 ScaledTensor."""
    _scaled_in("dequantize_fp8", "x", x)
    dt = _out_scalar(out_dtype, out)
    return _call(_DEQUANT8, x.data, (out, x.data, x.scale), (dt,), stream)


def linear_fp8(x, w, bias=None, act="none", aux=False, out=None, aux_out=None, stream=None, out_dtype=None,
               fast_accum=True):
    """linear on FP8 tensor cores: y = act((x.data @ w.data.T) * x.scale[:, None] * w.scale + bias)
    with x a ScaledTensor [..., K] (quantize_fp8 of the activation) and w one [N, K] (quantize_fp8
    of nn.Linear's weight: a scale an output channel); y [..., N] of out_dtype (float16 or
    bfloat16; default out's, else aux_out's, else bias's, else bfloat16). act and aux as linear's. fast_accum
    (torch._scaled_mm's use_fast_accum, on as in torchao): the FP8 tensor cores' own accumulator
    over all of K; False: sums promoted to float32 every few k-steps (slower). Error against
    float64: README, "FP8"."""
    for n, v in (("x", x), ("w", w)):
        _scaled_in("linear_fp8", n, v)
    a = _choice("linear_fp8", "act", act, _LINEAR_ACTS)
    want = 1 if _flag("linear_fp8", "aux", aux) or aux_out is not None else 0
    dt = _out_scalar(out_dtype, out if out is not None else aux_out if aux_out is not None else bias)
    return _call(_LINEAR8, x.data, (out, aux_out, x.data, x.scale, w.data, w.scale, bias),
                 (a, want, dt, _flag("linear_fp8", "fast_accum", fast_accum)), stream)


def quantize_int8(x, out=None, stream=None):
    """x [..., K] (float32, float16, bfloat16) as an int8 ScaledTensor: data int8 [..., K], scale
    float32 [...], a row at a time as torchao's symmetric int8 (Int8WeightOnlyConfig): scale =
    amax / 127.5, data = x * (1 / scale) in float32 rounded to nearest even within [-128, 127]
    (torchao's bits for float32 rows). For weights (a scale an output channel) that linear_w8
    reads. out=: a ScaledTensor to write."""
    d, sc = _scaled_out("quantize_int8", out)
    return ScaledTensor(*_call(_QUANT_I8, x, (d, sc, x), (), stream))


def linear_w8(x, w, bias=None, act="none", aux=False, out=None, aux_out=None, stream=None):
    """Weight-only int8 linear for few rows (a DiT's modulation, decoding): y = act((x @ w.data.T)
    * w.scale + bias), x [..., K] float32/float16/bfloat16 as it is, w an int8 ScaledTensor [N, K]
    (quantize_int8 of nn.Linear's weight), y [..., N] of x's dtype. A matrix-vector kernel whose
    time is w's bytes, once per 4 rows of x: past a few rows, quantize x and use linear_fp8.
    act and aux as linear's. An inference op: no gradient flows through it (as linear_fp8's)."""
    _scaled_in("linear_w8", "w", w)
    a = _choice("linear_w8", "act", act, _LINEAR_ACTS)
    want = 1 if _flag("linear_w8", "aux", aux) or aux_out is not None else 0
    return _call(_LINEAR_W8, x, (out, aux_out, x, w.data, w.scale, bias), (a, want), stream)


def _is_int8(a):
    return str(getattr(a, "dtype", "")).replace("torch.", "") == "int8"


def _scaled_in(op, name, x):
    if not isinstance(x, ScaledTensor):
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{op}: {name} is a {type(x).__name__}, expected a "
                    "fusedk.ScaledTensor(data, scale) (fusedk.quantize_fp8's)")


def _scaled_out(op, out):
    if out is None:
        return None, None
    if not isinstance(out, ScaledTensor):
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{op}: out is a {type(out).__name__}, expected a "
                    "fusedk.ScaledTensor(data, scale) to write")
    return out.data, out.scale


def _out_scalar(out_dtype, like):
    """out_dtype= as a fusedk_scalar: given, else like's dtype (out=, bias), else bfloat16."""
    if out_dtype is None:
        out_dtype = getattr(like, "dtype", None) if like is not None else None
    return _core.lib.FUSEDK_BF16 if out_dtype is None else _core.scalar_of(out_dtype)


# --- [attention] ------------------------------------------------------------------------------
def attention(q, k, v, scale=None, causal=False, kv_len=None, return_lse=False, out=None, lse_out=None,
              precision=None, stream=None):
    """softmax(q @ k.T * scale) @ v per head: q [B, Sq, Hq, Dh], k and v [B, Sk, Hkv, Dh] (Hq a
    multiple of Hkv: GQA, MQA), any strides but a contiguous last dim ([B, H, S, D] tensors
    through .transpose(1, 2), views of one packed qkv); out [B, Sq, Hq, Dh]. scale: default
    1/sqrt(Dh). causal: query i sees keys j <= i + Sk - Sq (bottom-right, as FlashAttention).
    kv_len: int32 [B], keys at or past kv_len[b] masked (padded text tokens); a value outside
    [0, Sk] is refused in host memory (NumPy, a list, CPU tensors) and clamps on a CUDA device
    (checking it there would cost a host sync). return_lse=True
    also returns lse, float32 [B, Hq, Sq], the log of each row's sum of exp(scores): (out, lse).
    A row whose keys are all masked gives 0 (lse -inf). precision: None (q's dtype) or "int8"
    (attention_int8: q and k quantized to int8, q k^T on integer tensor cores). q and k given as
    ScaledTensor (int8 already): attention_int8_scaled, whatever the precision (None or "int8")."""
    op = _PRECISIONS.get(precision) if isinstance(precision, (str, type(None))) else None
    if op is None:
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"attention: precision is {precision!r}, expected None (q's "
                    "dtype) or 'int8'")
    if isinstance(q, ScaledTensor) or isinstance(k, ScaledTensor):
        return attention_int8_scaled(q, k, v, scale, causal, kv_len, return_lse, out, lse_out, stream)
    return _call(op, q, *_attention_args(op, q, k, v, scale, causal, kv_len, return_lse, out, lse_out), stream)


def attention_int8(q, k, v, scale=None, causal=False, kv_len=None, return_lse=False, out=None, lse_out=None,
                   stream=None):
    """attention(..., precision="int8"): q and k quantized to int8 per token and head (k less its
    mean over the keys), q k^T in int32 sums; P V as attention's (P in 16 bits, v as given).
    Errors against float64: README, "8-bit attention"."""
    return _call(_ATTENTION_INT8, q, *_attention_args(_ATTENTION_INT8, q, k, v, scale, causal, kv_len, return_lse,
                                                      out, lse_out), stream)


class ScaledTensor(_collections.namedtuple("ScaledTensor", ["data", "scale"])):
    """An 8-bit tensor with a scale a row: element (..., k) stands for data[..., k] * scale[...].
    int8 q and k of attention: data [B, S, H, Dh], scale float32 [B, S, H] (attention_int8's
    quantization of q: scale = amax / 127 of the row, data = round(x / scale); qk_norm_rope_int8
    writes them). FP8 operands of linear: data float8_e4m3fn [..., K], scale float32 [...]
    (quantize_fp8: scale = amax / 448); int8 weights of linear_w8 (quantize_int8: scale = amax /
    127.5, a scale an output channel). Any strides with a contiguous last dim, in the caller's
    framework (NumPy through ml_dtypes, torch, JAX)."""
    __slots__ = ()


def attention_int8_scaled(q, k, v, scale=None, causal=False, kv_len=None, return_lse=False, out=None, lse_out=None,
                          stream=None):
    """attention_int8's kernel on q and k quantized already (ScaledTensor each: no quantization
    pass): softmax(scale dq(q) dq(k)^T) v with dq(x) = x.data * |x.scale| (k's scale read to 22
    significant bits), no mean taken off k; out takes v's dtype and q.data's shape. The rest as
    attention's. fusedk.h's fusedk_attention_int8_scaled has the rules."""
    for name, x in (("q", q), ("k", k)):
        if not isinstance(x, ScaledTensor):
            raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"attention_int8_scaled: {name} is a {type(x).__name__}, "
                        "expected a fusedk.ScaledTensor(data, scale) (int8 data and its float32 scales)")
    tensors, attrs = _attention_args(_ATTENTION_SCALED, q.data, k.data, v, scale, causal, kv_len, return_lse, out,
                                     lse_out)
    out, lse_out, _, _, v, kv_len = tensors
    return _call(_ATTENTION_SCALED, q.data, (out, lse_out, q.data, q.scale, k.data, k.scale, v, kv_len), attrs,
                 stream)


def _attention_args(op, q, k, v, scale, causal, kv_len, return_lse, out, lse_out):
    name = _core.OPS[op].name
    if scale is not None and not scale:
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{name}: scale is {scale!r}, expected a nonzero number (None: "
                    "1/sqrt(Dh))")
    kv_len = _ids(kv_len, name, "kv_len", "key counts (0 to Sk)")
    want = 1 if _flag(name, "return_lse", return_lse) or lse_out is not None else 0
    return (out, lse_out, q, k, v, kv_len), (scale or 0.0, _flag(name, "causal", causal), want)


# --- [lowrank] --------------------------------------------------------------------------------
def lowrank_update(x, v, u_t, codes=None, scaling=1.0, y=None, beta=1.0, out=None, stream=None):
    """BEM's generated update, a LoRA's delta: out = beta * y + scaling * ((x @ v) * codes) @ u_t
    with x [..., K1], v [K1, r] (rank 1..128), codes [..., r] (optional), u_t [r, K2] (U
    pre-transposed, as BEM keeps it; a LoRA's B.T), y [..., K2] (optional: without it, or with
    beta 0, out is the update alone and y is not read). In place: lowrank_update(x, v, u_t, y=y,
    out=y). On the GPU x is read once and y once, the [M, r] product kept on chip (in
    L2 as float32 sums where the rows are few: two kernels)."""
    return _call(_LOWRANK, x, (out, x, v, codes, u_t, y), (scaling, beta), stream)


def lowrank_prepare(w, b, scaling=1.0, out=None, stream=None):
    """A LoRA's weights for linear_lowrank: w_cat [N, K + rp] = [w | scaling * b | 0] with w [N, K]
    (the base nn.Linear's weight), b [N, r] (peft's lora_B.weight), rp = r rounded up to 8; or
    several adapters, b [A, N, r] stacked: [w | s b_0 | 0 | s b_1 | 0 ...], A rp <= 128. Made once
    (again when w, b or scaling change)."""
    return _call(_LR_PREPARE, w, (out, w, b), (scaling,), stream)


def linear_lowrank(x, w_cat, a, bias=None, codes=None, act="none", adapter_ids=None, out=None, stream=None,
                   aux=False, aux_out=None):
    """A linear with its LoRA in one GEMM: y = act(x @ w.T + bias + ((x @ a.T) * codes) @ (s b).T)
    with w_cat = lowrank_prepare(w, b, s), a [r, K] (peft's lora_A.weight), codes [..., r]
    (optional), act as linear's. Several adapters: a [A, r, K] stacked as lowrank_prepare's b;
    adapter_ids (int32 [M], x's rows flattened): row m takes adapter ids[m] alone (-1: none, the
    base linear's row); without ids every adapter acts on every row (their sum). On the GPU one
    pass writes [x | h] and one GEMM runs over it and w_cat. fusedk.LoRA keeps w_cat and a.
    aux=True also returns the pre-activation, what linear_lowrank_backward needs: (y, aux).
    x may carry room for h: [..., K + A rp] (w_cat's width), x in its first K columns; the call then
    writes h into the last ones and the GEMM reads x in place, without the copy (not under autograd,
    torch.compile or JAX, which keep inputs unchanged)."""
    adapter_ids = _ids(adapter_ids, "linear_lowrank")
    want = 1 if _flag("linear_lowrank", "aux", aux) or aux_out is not None else 0
    return _call(_LINEAR_LOWRANK, x, (out, aux_out, x, w_cat, bias, a, codes, adapter_ids),
                 (_choice("linear_lowrank", "act", act, _LINEAR_ACTS), want), stream)


def _ids(ids, op, name="adapter_ids", what="adapter indices (-1: none)"):
    """An int32 index argument (adapter_ids, kv_len) given as a list or a NumPy array of another
    integer type: checked, then int32 (no wrap-around); any other array goes to the C library as
    it is (int32 is checked there)."""
    if isinstance(ids, (list, tuple)) or (isinstance(ids, _core.np.ndarray) and ids.dtype.kind in "iu" and
                                          ids.dtype != "int32"):
        a = _core.np.asarray(ids)  # a few values on the host: checked, then int32
        if a.size and (a.dtype.kind not in "iu" or a.min() < -2 ** 31 or a.max() >= 2 ** 31):
            raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{op}: {name} holds values outside int32 (or not "
                        f"integers), expected {what}")
        ids = _core.np.ascontiguousarray(a, _core.np.int32)
    return ids


def lowrank_update_backward(dout, x, v, u_t, codes=None, scaling=1.0, dx=True, dv=True, du_t=True, stream=None):
    """Gradients of out = beta * y + scaling * ((x @ v) * codes) @ u_t given dout (y's is beta *
    dout): dx, dv, du_t and dcodes (when codes is given). Returns (dx, dv, du_t, dcodes), None for
    each not asked for. fusedk.torch's lowrank_update differentiates through this."""
    dx, dv, du_t = (_flag("lowrank_update_backward", n, f) for n, f in (("dx", dx), ("dv", dv), ("du_t", du_t)))
    if not (dx or dv or du_t or codes is not None):
        return None, None, None, None
    r = _call(_LOWRANK_BWD, dout, (None, None, None, None, dout, x, v, codes, u_t), (scaling, dx, dv, du_t), stream)
    return _core.spread(r, (dx, dv, du_t, codes is not None))


def linear_lowrank_backward(dy, x, w_cat, a, codes=None, adapter_ids=None, aux=None, act="none", scaling=1.0,
                            dx=True, da=True, db=True, dbias=False, stream=None):
    """Gradients of y = linear_lowrank(x, w_cat, a, bias, codes, act, adapter_ids) with w_cat =
    lowrank_prepare(w, b, scaling), the frozen w not differentiated: dx, da (like a), db (like b:
    [N, r] or [A, N, r]), dcodes (when codes is given), dbias (when asked). aux: the forward's
    pre-activation (aux=True there), needed for act != "none". Returns (dx, da, db, dcodes, dbias),
    None for each not asked for."""
    dx, da, db, dbias = (_flag("linear_lowrank_backward", n, f) for n, f in (("dx", dx), ("da", da), ("db", db),
                                                                             ("dbias", dbias)))
    if not (dx or da or db or dbias or codes is not None):
        return None, None, None, None, None
    adapter_ids = _ids(adapter_ids, "linear_lowrank_backward")
    r = _call(_LINEAR_LOWRANK_BWD, dy, (None, None, None, None, None, dy, x, w_cat, a, codes, adapter_ids, aux),
              (_choice("linear_lowrank_backward", "act", act, _LINEAR_ACTS), scaling, dx, da, db, dbias), stream)
    return _core.spread(r, (dx, da, db, codes is not None, dbias))


class LoRA:
    """A linear layer with a LoRA folded in, prepared once: LoRA(w, a, b, scaling, bias)(x) =
    act(x @ w.T + bias + scaling * (x @ a.T) @ b.T) as one GEMM (linear_lowrank). w [N, K], a [r,
    K], b [N, r] in one dtype, on one device (NumPy arrays: the CPU references); or A adapters
    stacked, a [A, r, K] and b [A, N, r], each row taking the one its adapter_ids entry names (or,
    without ids, all of them). Call prepare() again after changing w, b or scaling in place."""

    def __init__(self, w, a, b, scaling=1.0, bias=None, act="none", stream=None):
        sa, sb = tuple(getattr(a, "shape", ())), tuple(getattr(b, "shape", ()))
        ra, rb = (sa[:-2], sa[-2:-1]), (sb[:-2], sb[-1:])
        if ra != rb:  # w_cat's width tells only A times the rank rounded up to 8
            raise Error("FUSEDK_ERR_SHAPE", f"LoRA: a has shape {sa} and b {sb}, expected [r, K] and [N, r] (or "
                        "[A, r, K] and [A, N, r]) with the same A and r")
        self.w, self.a, self.b, self.scaling, self.bias, self.act = w, a, b, scaling, bias, act
        self.prepare(stream)

    def prepare(self, stream=None):
        self.w_cat = lowrank_prepare(self.w, self.b, self.scaling, stream=stream)
        return self

    def __call__(self, x, codes=None, adapter_ids=None, out=None, stream=None):
        return linear_lowrank(x, self.w_cat, self.a, self.bias, codes, self.act, adapter_ids, out, stream)


def conv(x, w, bias=None, residual=None, stride=1, padding=0, act="none", stride_t=1, pad_t=0, pad_t_back=0,
         time_pad="zeros", pad="zeros", upsample=1, out=None, stream=None):
    """Convolution over channels-last images and videos, bias, activation and a residual in its
    epilogue: out = act(conv(x, w) + bias) + residual. x [N, H, W, Ci] or [N, T, H, W, Ci] (a
    torch NCHW tensor in channels_last memory is x.permute(0, 2, 3, 1), NCDHW in channels_last_3d
    x.permute(0, 2, 3, 4, 1)); w [Co, kh, kw, Ci] or [Co, kt, kh, kw, Ci] (torch's weight permuted
    the same way); out [N, (To,) Ho, Wo, Co]. stride and padding act on H and W, the padding zeros
    or, pad="replicate", the edge pixels repeated (torch's padding_mode="replicate"); stride_t,
    pad_t frames in front and pad_t_back behind on T, as zeros or, time_pad="replicate", the first
    and last frame repeated (a causal video conv: pad_t = kt - 1, pad_t_back = 0). upsample=u: x
    read as its nearest-neighbour upsampling by u on H and W (Upsample2D + conv in one op, the
    upsampled image never written). act: "none", "silu", "relu", "gelu", "gelu_tanh". GPU:
    float16/bfloat16 on tensor cores."""
    a = _choice("conv", "act", act, _LINEAR_ACTS)
    rep = _choice("conv", "time_pad", time_pad, _PADS) | 2 * _choice("conv", "pad", pad, _PADS)
    return _call(_CONV, x, (out, x, w, bias, residual), (stride, padding, stride_t, pad_t, pad_t_back, rep, a, upsample),
                 stream)


def fold_batchnorm(w, bias, gamma, beta, mean, var, eps=1e-5, out=None, stream=None):
    """BatchNorm's running statistics folded into the conv (or linear) before it: returns (w', b')
    with s = gamma / sqrt(var + eps), w' = w * s (per output channel, w's first dim), b' = (bias -
    mean) * s + beta, so conv(x, w', b') = BatchNorm(conv(x, w, bias)) in eval mode. bias, gamma
    and beta may be None (no conv bias; affine=False). Double math, one rounding. out=: (w_out,
    b_out) to write (w_out may be w itself)."""
    wo, bo = (None, None) if out is None else out
    return tuple(_call(_FOLD_BN, w, (wo, bo, w, bias, gamma, beta, mean, var), (eps,), stream))


def fused_conv_bn_silu(x, w, bias, gamma, beta, mean, var, eps=1e-5, stride=1, padding=1, out=None, stream=None):
    """Conv + BatchNorm (eval) + SiLU as one conv: fold_batchnorm, then conv with the SiLU epilogue.
    x, w channels-last as conv's. For a module used many times, fold once and call conv."""
    wf, bf = fold_batchnorm(w, bias, gamma, beta, mean, var, eps, stream=stream)
    return conv(x, wf, bf, stride=stride, padding=padding, act="silu", out=out, stream=stream)


def group_norm(x, groups, weight=None, bias=None, eps=1e-6, scale=None, shift=None, act="none", out=None,
               stream=None):
    """Channels-last GroupNorm: x [N, ..., C] (a torch NCHW tensor in channels_last memory:
    x.permute(0, 2, 3, 1)), per sample and group of C / groups channels the mean and (biased)
    variance over all its pixels; y = act(((x - mean) / sqrt(var + eps) * weight + bias) * (1 +
    scale) + shift), weight and bias [C], scale and shift [N, C] (a conditioned norm), each
    optional; act "none", "silu" (GroupNorm + SiLU in one op), "relu", "gelu", "gelu_tanh". out=x:
    in place."""
    a = _choice("group_norm", "act", act, _LINEAR_ACTS)
    return _call(_GN, x, (out, x, weight, bias, scale, shift), (groups, eps, a), stream)


def channel_rmsnorm(x, weight=None, bias=None, eps=1e-6, scale=None, shift=None, clamp=False, act="none", out=None,
                    stream=None):
    """The video VAEs' RMSNorm over each pixel's channels (x [N, ..., C] channels-last) with their
    modulation and activation: y = act((x * r * weight + bias) * (1 + scale) + shift), r =
    rsqrt(mean(x^2) + eps) (torch's RMSNorm: LTX-Video's VAE, eps 1e-8), or with clamp=True r = 1
    / max(sqrt(mean(x^2)), eps) (Wan's F.normalize(x) * sqrt(C) * gamma: eps = 1e-12 / sqrt(C),
    weight = gamma). weight, bias [C], scale, shift [N, C] (per sample: LTX-Video's timestep
    conditioning) optional; act "none", "silu", "relu", "gelu", "gelu_tanh". out=x: in place."""
    a = _choice("channel_rmsnorm", "act", act, _LINEAR_ACTS)
    return _call(_CRMS, x, (out, x, weight, bias, scale, shift), (eps, _flag("channel_rmsnorm", "clamp", clamp), a),
                 stream)
