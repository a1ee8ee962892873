"""fusedk for JAX: every fusedk op as an XLA custom call (jax.ffi), inside and outside jax.jit.

    import fusedk.jax as fk
    y = jax.jit(lambda x, w: fk.rmsnorm(x, w, eps=1e-6))(x, w)

Importing this module registers the C handlers of bindings/c/fusedk_xla.c with XLA, one target
per registry op ("fusedk_rmsnorm", ...): on XLA:CPU they run fusedk's C reference, on XLA:GPU
the CUDA kernel on XLA's stream (allowed into XLA's CUDA graphs). XLA allocates the outputs.
fusedk's own functions send JAX arrays and tracers here as well, so fusedk.rmsnorm(jax_array)
is fusedk.jax.rmsnorm(jax_array). The functions here also take NumPy arrays and return JAX
arrays.

- Attributes (eps, norm, exact) are static: each value is its own compiled program. Eager calls
  run a jax.jit cached per (op, optional inputs given, attributes): no retrace on repeat.
- Forward only: differentiating through an op (jax.grad, jvp, vjp) raises fusedk.Error, but for
  lowrank_update, linear_lowrank and lowrank_prepare, which have a custom_vjp (a LoRA trains as
  linear_lowrank(x, lowrank_prepare(w, b, s), a, ...): cotangents reach x, a, b, codes and bias;
  the frozen base weight w gets zeros, and so do w_cat's first K columns; linear_lowrank's aux
  output, when asked for, passes no cotangent back).
- vmap runs the op once per batch element (vmap_method="sequential").
- Dtypes and ndims are checked at trace time (fusedk.Error). Shapes are checked by the C library
  when the op runs: an eager call raises fusedk.Error; inside your own jax.jit, XLA raises its
  runtime error carrying the same message ("fusedk: <reason> [FUSEDK_ERR_...]").
"""
import ctypes
import os
import re
import sys
import warnings

import jax
import numpy as np

from . import _core
from ._core import MAX_DIMS, OPS, Error
from ._ffi import lib, pylib

try:
    from jax.core import Tracer as _Tracer
except ImportError:  # pragma: no cover - older or newer layouts of jax
    from jax._src.core import Tracer as _Tracer

__all__ = [o.name for o in OPS]

_IN, _IN_OPT, _F32 = lib.FUSEDK_ARG_IN, lib.FUSEDK_ARG_IN_OPT, lib.FUSEDK_ATTR_F32
_DTYPES = frozenset((np.dtype(np.float32), np.dtype(np.float16), np.dtype(jax.numpy.bfloat16)))
_TARGETS = {o.id: "fusedk_" + o.name for o in OPS}


# --- registration --------------------------------------------------------------------------
# Our own PyCapsule_New prototype: jax.ffi.pycapsule re-types the shared ctypes.pythonapi one.
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
pylib.fusedk_xla_api_version.restype = ctypes.c_int32


def _capsule(symbol):
    return _capsule_new(ctypes.cast(getattr(pylib, symbol), ctypes.c_void_p).value, None, None)


def _jaxlib_ffi_version():
    """(major, minor) of jaxlib's XLA FFI API, from the header it ships; None if unknown."""
    try:
        with open(os.path.join(jax.ffi.include_dir(), "xla", "ffi", "api", "c_api.h")) as f:
            text = f.read()
        return tuple(int(re.search(rf"#define XLA_FFI_API_{k} (\d+)", text).group(1)) for k in ("MAJOR", "MINOR"))
    except Exception:  # noqa: BLE001 - no header: XLA checks the version itself
        return None


def _register():
    """Registers every op on XLA:CPU and XLA:GPU; returns why not, or None.

    XLA registers a target when its backend starts (at once if it already has) and then asks
    the handler for its FFI API version: one it rejects would stop the whole backend from
    starting, so the version is compared here first. The CUDA targets are registered whether
    or not this library has its GPU half (the handler then says how to build it) and whether or
    not jax has a GPU backend (without one they are never used)."""
    ours = divmod(int(pylib.fusedk_xla_api_version()), 1000)
    theirs = _jaxlib_ffi_version()
    if theirs is not None and (theirs[0] != ours[0] or theirs < ours):
        return (f"jaxlib's XLA FFI API is {theirs[0]}.{theirs[1]}, fusedk's handlers are built for "
                f"{ours[0]}.{ours[1]}; upgrade jax and jaxlib")
    for platform, symbol in (("cpu", "fusedk_xla_cpu"), ("CUDA", "fusedk_xla_cuda")):
        for o in OPS:
            try:
                jax.ffi.register_ffi_target(_TARGETS[o.id], _capsule(symbol), platform=platform)
            except Exception as e:  # noqa: BLE001 - reported on use; the import goes on
                return f"registering {_TARGETS[o.id]} on {platform} failed: {type(e).__name__}: {e}"
    return None


_UNAVAILABLE = _register()
if _UNAVAILABLE:
    warnings.warn(f"fusedk.jax: the XLA custom calls are not available: {_UNAVAILABLE}", RuntimeWarning,
                  stacklevel=2)


# --- one call ------------------------------------------------------------------------------
class _Call:
    """An op with a given set of optional inputs and attribute values: the custom call, with
    a derivative rule that refuses, and its jit for eager use."""

    def __init__(self, op, mask, attrs):
        self.op, self.mask, self.attrs = op, mask, attrs
        given = [i for i in op.inputs if op.tensors[i][1] == _IN or (mask >> i) & 1]
        pos = {i: k for k, i in enumerate(given)}
        outs = []  # (output index, the operand it copies shape and dtype from)
        values = op.values(attrs)
        for i, like, when in op.outputs:
            if not op.exists(i, [0 if k in pos else None for k in range(len(op.tensors))], values):
                continue
            if like not in pos:  # pragma: no cover - the registry's outputs copy required inputs
                raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{op.name}: {op.tensors[like][0]} is None, expected "
                            f"a tensor ({op.tensors[i][0]} takes its shape)")
            outs.append((i, pos[like]))
        kw = {"op": np.int32(op.id), "present": np.int32(mask)}
        for (name, typ, _), v in zip(op.attrs, attrs):
            kw[name] = np.float32(v) if typ == _F32 else np.int32(v)
        target, single = _TARGETS[op.id], len(outs) == 1
        self.checks = [(op.tensors[i][0], op.out_dtype(i, values)) for i in given]  # what _check reads

        def impl(*xs):
            shapes = [None] * len(op.tensors)
            for i, a in zip(given, xs):
                shapes[i] = a.shape
            res = [jax.ShapeDtypeStruct(op.out_shape(i, shapes, attrs), _or(op.out_dtype(i, values), xs[k].dtype))
                   for i, k in outs]
            r = jax.ffi.ffi_call(target, res, vmap_method="sequential")(*xs, **kw)
            return r[0] if single else tuple(r)

        impl.__name__ = impl.__qualname__ = target
        self.impl, self.given = impl, given

        def no_derivative(primals, tangents):
            raise Error("FUSEDK_ERR_UNSUPPORTED", f"{op.name}: fusedk ops are forward-only; fusedk.jax's XLA custom "
                        "calls have no derivative rule (JVP/VJP), so jax.grad, jvp and vjp cannot go through them")

        if op.name in _VJPS:
            self.traced = jax.custom_vjp(impl)
            self.traced.defvjp(*_VJPS[op.name](self))
        else:
            self.traced = jax.custom_jvp(impl)
            self.traced.defjvp(no_derivative)
        self.eager = jax.jit(self.traced)


# --- the derivative rules: (fwd, bwd) for jax.custom_vjp, from a _Call -------------------------
def _named(c, xs):
    """The call's inputs by registry name (None for those not given)."""
    d = {c.op.tensors[i][0]: None for i in c.op.inputs}
    d.update((c.op.tensors[i][0], a) for i, a in zip(c.given, xs))
    return d


def _cotangents(c, xs, grads):
    """grads (by name) in the order of the given inputs; zeros for the rest (float0 for integers)."""
    out = []
    for i, a in zip(c.given, xs):
        g = grads.get(c.op.tensors[i][0])
        if g is None:
            g = (np.zeros(a.shape, jax.dtypes.float0) if jax.numpy.issubdtype(a.dtype, jax.numpy.integer)
                 else jax.numpy.zeros_like(a))
        out.append(g)
    return tuple(out)


def _lowrank_vjp(c):
    scaling, beta = c.attrs

    def bwd(xs, dout):
        a = _named(c, xs)
        r = call(OPS[lib.FUSEDK_OP_LOWRANK_UPDATE_BACKWARD], [dout, a["x"], a["v"], a["codes"], a["u_t"]],
                 (scaling, 1, 1, 1))
        g = {"x": r[0], "v": r[1], "u_t": r[2], "codes": r[3] if a["codes"] is not None else None,
             "y": dout * beta if a["y"] is not None else None}
        return _cotangents(c, xs, g)

    return (lambda *xs: (c.impl(*xs), xs)), bwd


def _slots(db, K, N, A, r):
    """w_cat's [N, K + A rp] cotangent from its adapter columns' [A, N, r]: zeros elsewhere."""
    rp = (r + 7) // 8 * 8
    blk = jax.numpy.zeros((N, A, rp), db.dtype).at[:, :, :r].set(jax.numpy.transpose(db.reshape(A, N, r), (1, 0, 2)))
    return jax.numpy.concatenate([jax.numpy.zeros((N, K), db.dtype), blk.reshape(N, A * rp)], axis=1)


def _lora_vjp(c):
    act, want_aux = c.attrs
    none = act == lib.FUSEDK_ACT_NONE

    def fwd(*xs):
        if none and not want_aux:
            return c.impl(*xs), (xs, None)
        y, z = _call_for(c.op, c.mask, (act, 1)).impl(*xs)  # the pre-activation, for the backward
        return ((y, z) if want_aux else y), (xs, None if none else z)

    def bwd(res, ct):
        xs, z = res
        a = _named(c, xs)
        dy = ct[0] if want_aux else ct
        has_b = a["bias"] is not None
        r = list(call(OPS[lib.FUSEDK_OP_LINEAR_LOWRANK_BACKWARD],
                      [dy, a["x"], a["w_cat"], a["a"], a["codes"], a["adapter_ids"], z], (act, 1.0, 1, 1, 1, int(has_b))))
        g = {"x": r.pop(0), "a": r.pop(0)}
        db = r.pop(0)
        g["codes"] = r.pop(0) if a["codes"] is not None else None
        g["bias"] = r.pop(0) if has_b else None
        N, K = a["w_cat"].shape[0], a["x"].shape[-1]
        g["w_cat"] = _slots(db, K, N, db.shape[0] if db.ndim == 3 else 1, db.shape[-1])
        return _cotangents(c, xs, g)

    return fwd, bwd


def _prepare_vjp(c):
    (scaling,) = c.attrs

    def bwd(xs, g):
        w, b = xs
        A, N, r = (b.shape[0] if b.ndim == 3 else 1), b.shape[-2], b.shape[-1]
        rp = (r + 7) // 8 * 8
        db = g[:, w.shape[1]:].reshape(N, A, rp)[:, :, :r].transpose(1, 0, 2) * scaling
        return jax.numpy.zeros_like(w), db.reshape(b.shape).astype(b.dtype)

    return (lambda *xs: (c.impl(*xs), xs)), bwd


_VJPS = {"lowrank_update": _lowrank_vjp, "linear_lowrank": _lora_vjp, "lowrank_prepare": _prepare_vjp}
_CALLS = {}
_REASON = re.compile(r"fusedk: (.*) \[(FUSEDK_\w+)\]", re.S)


def _attr_values(op, attrs):
    """The attribute values as Python numbers (Op.typed): compile-time constants of the custom call."""
    for (name, _, _), v in zip(op.attrs, attrs):
        try:
            float(v)
        except Exception:  # noqa: BLE001 - a tracer (or not a number at all)
            raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{op.name}: {name} is a {type(v).__name__}, expected a "
                        "Python or NumPy number (attributes are static, compiled into the call)") from None
    return tuple(op.typed(attrs))


def _or(dt, default):
    return default if dt is None else dt  # (a NumPy dtype's truth is its field count: 0)


def _check(op, checks, xs):
    """What JAX knows at trace time: dtypes and ndims (the C library's wording); checks: the given
    inputs as (name, the dtype the registry fixes for it: float32, int32, int8, or None)."""
    ref = None
    for (name, fixed), a in zip(checks, xs):
        dt, nd = getattr(a, "dtype", None), getattr(a, "ndim", None)
        if dt is None or nd is None:  # a list or a Python scalar
            a = np.asarray(a)
            dt, nd = a.dtype, a.ndim
        if dt not in _DTYPES:  # the common dtypes skip the conversion: this runs on every call
            dt = np.dtype(dt)
        if fixed is not None:
            if dt != fixed:
                raise Error("FUSEDK_ERR_DTYPE", f"{op.name}: {name} has dtype {dt}, expected {fixed}")
        elif dt not in _DTYPES:
            raise Error("FUSEDK_ERR_DTYPE", f"{op.name}: {name} has dtype {dt}, expected float32, float16 or "
                        "bfloat16")
        elif ref is None:
            ref, ref_name = dt, name
        elif dt != ref:
            raise Error("FUSEDK_ERR_DTYPE", f"{op.name}: {name} has dtype {dt}, expected {ref} (the dtype of "
                        f"{ref_name})")
        if not 1 <= nd <= MAX_DIMS:
            raise Error("FUSEDK_ERR_SHAPE", f"{op.name}: {name} has ndim {nd}, expected 1..{MAX_DIMS}")


def call(op, inputs, attrs):
    """Runs registry op `op` (an fusedk._core.Op) on `inputs` (its inputs in registry order, None
    for absent optional ones: JAX arrays, tracers or NumPy arrays) with `attrs` (its attribute
    values in registry order; missing trailing ones take the registry's defaults). Returns the
    output, or a tuple of the outputs that exist."""
    if _UNAVAILABLE:
        raise Error("FUSEDK_ERR_UNSUPPORTED", f"{op.name}: fusedk.jax is not available: {_UNAVAILABLE}")
    mask, xs = 0, []
    for i, a in zip(op.inputs, inputs):
        if a is None:
            if op.tensors[i][1] == _IN:
                raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{op.name}: {op.tensors[i][0]} is None, expected a tensor")
            continue
        if op.tensors[i][1] == _IN_OPT:
            mask |= 1 << i
        xs.append(a)
    key = (op.id, mask, tuple(attrs))
    try:
        c = _CALLS.get(key)
    except TypeError:  # an unhashable attribute (a JAX scalar): by its value
        key = (op.id, mask, _attr_values(op, key[2]))
        c = _CALLS.get(key)
    if c is None:
        c = _CALLS[key] = _Call(op, mask, _attr_values(op, key[2]))
    _check(op, c.checks, xs)
    for a in xs:
        if isinstance(a, _Tracer):  # inside jit, vmap, grad...: part of the caller's program
            return c.traced(*xs)
    try:
        return c.eager(*xs)
    except Exception as e:  # noqa: BLE001 - the C library's failures come back as fusedk.Error
        m = _REASON.search(str(e))
        if m is None:
            raise
        raise Error(m.group(2), m.group(1)) from None


def _call_for(op, mask, attrs):
    """The _Call of op with these optional inputs and attribute values (made once)."""
    key = (op.id, mask, tuple(attrs))
    if key not in _CALLS:
        _CALLS[key] = _Call(op, mask, tuple(attrs))
    return _CALLS[key]


# --- the ops: fusedk's own functions, every input routed here (NumPy arrays too) --------------
def _route(op, x, args, attrs, stream):
    """fusedk's call through XLA's custom call: JAX arrays are immutable (no out=) and XLA picks
    the stream."""
    o = OPS[op]
    for i, _, _ in o.outputs:
        if args[i] is not None:
            raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{o.name}: {o.py_name(i)} (out=) is given, but the op "
                        "runs through JAX and JAX arrays are immutable: leave it unset to get a new one")
    _core.refuse_room(o, args, "through JAX (its arrays are immutable)")
    if stream is not None:
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{o.name}: stream= is not taken with JAX arrays; "
                    "XLA runs the op on its own stream")
    return call(o, [args[i] for i in o.inputs], attrs)


for _o in OPS:
    globals()[_o.name] = _core.rebind(getattr(sys.modules[__package__], _o.name), _route)
del _o
_core.register_adapter("jax", _route)  # fusedk's own functions send JAX arrays and tracers here
