"""fusedk: fused GPU kernels for diffusion and transformer blocks, with CPU references.

Every op takes NumPy arrays (runs the C reference; bfloat16 through ml_dtypes) or CUDA arrays of
PyTorch, CuPy or JAX (runs the GPU kernel on the caller's current stream, or `stream=`) and
returns the caller's own type; outputs come from the caller's framework allocator. `out=` writes
into the caller's array. Errors raise fusedk.Error with the C library's reason. JAX arrays (and
tracers, under jax.jit) go through XLA custom calls: see fusedk.jax. torch.compile: import
fusedk.torch. The formulas are in fusedk.h."""
import json as _json

from . import _core
from ._core import Error

__all__ = ["Error", "rmsnorm", "layernorm", "adaln", "residual_tanh_gated_rmsnorm", "act", "silu_fma",
           "gated_residual", "glu", "glu_pair", "kernel_info", "__version__"]
__version__ = _core.ffi.string(_core.lib.fusedk_version()).decode()

_call = _core.call
_RMSNORM, _LAYERNORM, _ADALN, _MOCHI = (_core.lib.FUSEDK_OP_RMSNORM, _core.lib.FUSEDK_OP_LAYERNORM,
                                        _core.lib.FUSEDK_OP_ADALN, _core.lib.FUSEDK_OP_RESIDUAL_TANH_GATED_RMSNORM)
_NORMS = {"layer": _core.lib.FUSEDK_NORM_LAYER, "rms": _core.lib.FUSEDK_NORM_RMS}
_ACT, _SILU_FMA, _GATED_RESIDUAL = _core.lib.FUSEDK_OP_ACT, _core.lib.FUSEDK_OP_SILU_FMA, _core.lib.FUSEDK_OP_GATED_RESIDUAL
_GLU, _GLU_PAIR = _core.lib.FUSEDK_OP_GLU, _core.lib.FUSEDK_OP_GLU_PAIR
_HALVES = {"first": _core.lib.FUSEDK_GLU_FIRST, "second": _core.lib.FUSEDK_GLU_SECOND}
_ACTS = {"gelu": _core.lib.FUSEDK_ACT_GELU, "gelu_tanh": _core.lib.FUSEDK_ACT_GELU_TANH,
         "silu": _core.lib.FUSEDK_ACT_SILU, "relu": _core.lib.FUSEDK_ACT_RELU}


def __dir__():
    return sorted(__all__ + ["jax", "torch"])


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
    return _call(_RMSNORM, x, (out, residual_out, x, residual, weight), eps, 0.0, stream)


def layernorm(x, weight=None, bias=None, eps=1e-5, out=None, stream=None):
    """y = (x - mean) * rsqrt(var + eps) * weight + bias over the last dim (biased variance)."""
    return _call(_LAYERNORM, x, (out, x, weight, bias), eps, 0.0, stream)


def adaln(x, scale, shift, norm="layer", eps=1e-6, weight=None, bias=None, out=None, stream=None):
    """y[B,L,D] = norm(x) * (1 + scale[:, None]) + shift[:, None], norm = "layer" or "rms";
    scale and shift are [B, D] and may be strided views (e.g. chunks of a [B, 6D] modulation)."""
    kind = _NORMS.get(norm)
    if kind is None:
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"adaln: norm is {norm!r}, expected 'layer' or 'rms'")
    return _call(_ADALN, x, (out, x, scale, shift, weight, bias), kind, eps, stream)


def residual_tanh_gated_rmsnorm(x, x_res, gate, eps=1e-6, exact=True, out=None, stream=None):
    """Mochi: y = x + cast(x_res * rsqrt(mean(x_res^2) + eps) * tanh(gate)[:, None]).
    exact=True reproduces PyTorch's rounding points; exact=False rounds once."""
    return _call(_MOCHI, x, (out, x, x_res, gate), eps, 1 if exact else 0, stream)


# --- [elementwise] -------------------------------------------------------------------------
def _act_code(op, name, kind):
    k = _ACTS.get(kind)
    if k is None:
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{op}: {name} is {kind!r}, expected 'gelu', 'gelu_tanh', 'silu' "
                    "or 'relu'")
    return k


def act(x, kind="gelu", out=None, stream=None):
    """y = act(x): kind "gelu" (erf), "gelu_tanh", "silu" or "relu"."""
    return _call(_ACT, x, (out, x), _act_code("act", "kind", kind), 0.0, stream)


def glu(x, act="silu", act_half="first", gate=None, out=None, stream=None):
    """Gated linear unit. x[..., 2H] -> y[..., H] = act(h_a) * h_b, h_a the half named by act_half
    ("first": x[..., :H]), h_b the other: SwiGLU = glu(x, "silu", "first"), diffusers' GEGLU =
    glu(x, "gelu", "second"). With gate=: y = x * act(gate), one shape (fusedk.glu_pair)."""
    k = _act_code("glu", "act", act)
    if gate is not None:
        return _call(_GLU_PAIR, x, (out, x, gate), k, 0.0, stream)
    h = _HALVES.get(act_half)
    if h is None:
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"glu: act_half is {act_half!r}, expected 'first' or 'second'")
    return _call(_GLU, x, (out, x), k, h, stream)


def glu_pair(value, gate, act="silu", out=None, stream=None):
    """y = value * act(gate), one shape (e.g. two strided views of one projection)."""
    return _call(_GLU_PAIR, value, (out, value, gate), _act_code("glu_pair", "act", act), 0.0, stream)


def silu_fma(a, b, c, out=None, stream=None):
    """y = silu(a + b * c), one shape (inputs may be broadcast views)."""
    return _call(_SILU_FMA, a, (out, a, b, c), 0.0, 0.0, stream)


def gated_residual(x, y, gate, out=None, stream=None):
    """out[B, L, D] = x + gate[:, None] * y; gate [B, D] may be a strided chunk of the [B, 6D]
    AdaLN-Zero modulation."""
    return _call(_GATED_RESIDUAL, x, (out, x, y, gate), 0.0, 0.0, stream)
