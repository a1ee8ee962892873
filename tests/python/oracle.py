"""Independent float64 NumPy oracles of every op (the semantics of fusedk.h), and the
tolerance shared by the tests."""
import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]
# eps_T: one unit in the last place relative to the value (2^-(p-1)); float32 outputs of the
# double-accumulating references differ from float64 only by their final rounding
EPS = {np.dtype(np.float32): 2.0 ** -23, np.dtype(np.float16): 2.0 ** -10, BF16: 2.0 ** -7}


def f64(a):
    return None if a is None else np.asarray(a).astype(np.float64)


def rmsnorm(x, weight=None, eps=1e-6, residual=None):
    r = f64(x) + (0 if residual is None else f64(residual))
    y = r / np.sqrt((r * r).mean(-1, keepdims=True) + np.float64(np.float32(eps)))
    return (y if weight is None else y * f64(weight)), r


def layernorm(x, weight=None, bias=None, eps=1e-5):
    x = f64(x)
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + np.float64(np.float32(eps)))
    if weight is not None:
        y = y * f64(weight)
    return y if bias is None else y + f64(bias)


def adaln(x, scale, shift, norm="layer", eps=1e-6, weight=None, bias=None):
    n = layernorm(x, weight, bias, eps) if norm == "layer" else rmsnorm(x, weight, eps)[0]
    return n * (1 + f64(scale)[:, None, :]) + f64(shift)[:, None, :]


def mochi(x, x_res, gate, eps=1e-6):
    """exact=False semantics: everything in float64, one rounding."""
    xr = f64(x_res)
    n = xr / np.sqrt((xr * xr).mean(-1, keepdims=True) + np.float64(np.float32(eps)))
    return f64(x) + n * np.tanh(f64(gate))[:, None, :]


def mochi_exact(x, x_res, gate, eps=1e-6):
    """exact=True: the PyTorch formula's rounding points, written in NumPy float32."""
    dt = np.asarray(x).dtype
    xr = np.asarray(x_res).astype(np.float32)
    ms = (xr.astype(np.float64) ** 2).mean(-1, keepdims=True).astype(np.float32)
    rstd = (1.0 / np.sqrt((ms + np.float32(eps)).astype(np.float64))).astype(np.float32)
    tg = np.tanh(f64(gate)).astype(dt).astype(np.float32)[:, None, :]
    n = ((xr * rstd).astype(np.float32) * tg).astype(np.float32).astype(dt)
    return (np.asarray(x).astype(np.float32) + n.astype(np.float32)).astype(dt)


def act(x, kind="gelu"):
    from math import erf
    x = f64(x)
    if kind == "gelu":
        return 0.5 * x * (1 + np.vectorize(erf)(x / np.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    if kind == "silu":
        return x / (1 + np.exp(-x))
    return np.where(np.isnan(x), x, np.maximum(x, 0))


def silu_fma(a, b, c):
    return act(f64(a) + f64(b) * f64(c), "silu")


def gated_residual(x, y, gate):
    return f64(x) + f64(gate)[:, None, :] * f64(y)


def glu(x, kind="silu", act_half="first"):
    a, b = np.split(f64(x), 2, axis=-1)
    return act(a, kind) * b if act_half == "first" else a * act(b, kind)


def glu_pair(value, gate, kind="silu"):
    return f64(value) * act(gate, kind)


def assert_close(got, want, dtype, aux=None, what="", eps=None, atol=1e-6):
    """|got - want| <= eps_T * (|want| + aux) + atol: within one unit in the last place of the
    output dtype (aux adds terms whose own rounding can show, e.g. |x| for Mochi)."""
    got, want = f64(got), f64(want)
    tol = (eps or EPS)[np.dtype(dtype)] * (np.abs(want) + (0 if aux is None else np.abs(f64(aux)))) + atol
    bad = ~((np.abs(got - want) <= tol) | (got == want) | (np.isnan(got) & np.isnan(want)))
    if bad.any():
        idx = np.argwhere(bad)[:5]
        rows = [f"{tuple(i)}: got {got[tuple(i)]!r} want {want[tuple(i)]!r} tol {tol[tuple(i)]!r}" for i in idx]
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} elements off\n  " + "\n  ".join(rows))


# GPU kernels against the CPU reference (float32 math, another summation order): the tolerance of
# the C GPU suite and the README, eps_T = 2^-7 bf16, 2^-10 f16, 1e-5 f32, plus 1e-5 absolute
GPU_EPS = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 2.0 ** -10, BF16: 2.0 ** -7}


def assert_close_gpu(got, want, dtype, aux=None, what=""):
    assert_close(got, want, dtype, aux, what, eps=GPU_EPS, atol=1e-5)
