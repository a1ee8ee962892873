"""fusedk: fused GPU kernels for diffusion and transformer blocks, with CPU references.

Every op takes NumPy arrays (runs the C reference; bfloat16 through ml_dtypes) or CUDA arrays of
any DLPack framework (CuPy, JAX, PyTorch: runs the GPU kernel on the caller's current stream, or
`stream=`), and returns the caller's own type, zero-copy. `out=` writes into the caller's array.
Errors raise fusedk.Error with the C library's reason. The formulas are in fusedk.h."""
import json

from ._dlpack import Call, Error, check
from ._ffi import HEADER, LIBRARY, ffi, lib

__all__ = ["Error", "rmsnorm", "layernorm", "adaln", "residual_tanh_gated_rmsnorm", "kernel_info",
           "__version__"]
__version__ = ffi.string(lib.fusedk_version()).decode()

_NORMS = {"layer": lib.FUSEDK_NORM_LAYER, "rms": lib.FUSEDK_NORM_RMS}


def kernel_info():
    """Version, build (CUDA on/off, archs, cuBLASLt), devices, and each op with its dtypes."""
    n = lib.fusedk_kernel_info(ffi.NULL, 0)
    buf = ffi.new("char[]", n + 1)
    lib.fusedk_kernel_info(buf, n + 1)
    info = json.loads(ffi.string(buf).decode())
    info["library"], info["header"] = LIBRARY, HEADER
    return info


def rmsnorm(x, weight=None, eps=1e-6, residual=None, out=None, residual_out=None, stream=None):
    """y = r * rsqrt(mean(r^2, -1) + eps) * weight with r = x + residual (if given).
    Returns y, or (y, r) when residual is given (r rounded to x's dtype; the unrounded sum is
    what gets normalized). residual_out=residual updates the residual in place."""
    with Call("rmsnorm", stream) as c:
        tx = c.tensor(x, "x")
        tr, tw = c.tensor(residual, "residual"), c.tensor(weight, "weight")
        ty, y = c.output(out, "y", x, tx)
        tro, ro = c.output(residual_out, "residual_out", x, tx) if residual is not None else (ffi.NULL, None)
        check(lib.fusedk_rmsnorm(ty, tro, tx, tr, tw, eps, c.launch_stream()))
        return (c.result(y), c.result(ro)) if residual is not None else c.result(y)


def layernorm(x, weight=None, bias=None, eps=1e-5, out=None, stream=None):
    """y = (x - mean) * rsqrt(var + eps) * weight + bias over the last dim (biased variance)."""
    with Call("layernorm", stream) as c:
        tx = c.tensor(x, "x")
        tw, tb = c.tensor(weight, "weight"), c.tensor(bias, "bias")
        ty, y = c.output(out, "y", x, tx)
        check(lib.fusedk_layernorm(ty, tx, tw, tb, eps, c.launch_stream()))
        return c.result(y)


def adaln(x, scale, shift, norm="layer", eps=1e-6, weight=None, bias=None, out=None, stream=None):
    """y[B,L,D] = norm(x) * (1 + scale[:, None]) + shift[:, None], norm = "layer" or "rms";
    scale and shift are [B, D] and may be strided views (e.g. chunks of a [B, 6D] modulation)."""
    if norm not in _NORMS:
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"adaln: norm is {norm!r}, expected 'layer' or 'rms'")
    with Call("adaln", stream) as c:
        tx = c.tensor(x, "x")
        tsc, tsh = c.tensor(scale, "scale"), c.tensor(shift, "shift")
        tw, tb = c.tensor(weight, "weight"), c.tensor(bias, "bias")
        ty, y = c.output(out, "y", x, tx)
        check(lib.fusedk_adaln(ty, tx, tsc, tsh, _NORMS[norm], tw, tb, eps, c.launch_stream()))
        return c.result(y)


def residual_tanh_gated_rmsnorm(x, x_res, gate, eps=1e-6, exact=True, out=None, stream=None):
    """Mochi: y = x + cast(x_res * rsqrt(mean(x_res^2) + eps) * tanh(gate)[:, None]).
    exact=True reproduces PyTorch's rounding points; exact=False rounds once."""
    with Call("residual_tanh_gated_rmsnorm", stream) as c:
        tx = c.tensor(x, "x")
        tr, tg = c.tensor(x_res, "x_res"), c.tensor(gate, "gate")
        ty, y = c.output(out, "y", x, tx)
        check(lib.fusedk_residual_tanh_gated_rmsnorm(ty, tx, tr, tg, eps, 1 if exact else 0, c.launch_stream()))
        return c.result(y)
