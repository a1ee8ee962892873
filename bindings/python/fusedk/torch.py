"""fusedk's ops as PyTorch custom operators, for torch.compile and CUDA graphs (opt-in: importing
this module imports torch; `import fusedk` alone never does).

    import fusedk.torch as fkt
    y = fkt.rmsnorm(x, w)                     # same signatures as fusedk.rmsnorm & co.
    f = torch.compile(block, fullgraph=True)  # no graph breaks; mode="reduce-overhead" works

Every registry op of fusedk.h becomes two operators in the `fusedk` namespace, their schemas
derived from the registry: `fusedk::<op>` (functional: returns new tensors) and
`fusedk::<op>_out` (writes the caller's out=/residual_out= tensors, declared as mutated), each
with a fake (meta) implementation. The ops are forward-only: backward through one raises an
error that says so, but for `linear`, whose backward is `linear_backward` (so
`fusedk.torch.linear` trains, eager or compiled). Plain `fusedk.rmsnorm(x)` & co. need no import of
this module: under torch.compile they become these operators, and so do eager calls autograd
records; other eager calls take fusedk's C path (no dispatcher), the faster one."""
import sys

import torch

from . import _core
from ._core import OPS, Error

_IN_OPT, _OUT_OPT, _F32 = _core.lib.FUSEDK_ARG_IN_OPT, _core.lib.FUSEDK_ARG_OUT_OPT, _core.lib.FUSEDK_ATTR_F32

__all__ = [o.name for o in OPS]


def _arg(name):
    return name + "_" if name == "out" else name  # torch reserves `out` for its out= overloads


def _schemas(o):
    ins = ", ".join(f"Tensor{'?' if o.tensors[i][1] == _IN_OPT else ''} {_arg(o.tensors[i][0])}" for i in o.inputs)
    attrs = "".join(f", {'float' if t == _F32 else 'int'} {n}" for n, t, _ in o.attrs)
    n_opt = sum(o.tensors[i][1] == _OUT_OPT for i, _, _ in o.outputs)
    rets = "Tensor[]" if n_opt else ("Tensor" if len(o.outputs) == 1 else f"({', '.join(['Tensor'] * len(o.outputs))})")
    outs = "".join(f", Tensor({chr(97 + k)}!){'?' if o.tensors[i][1] == _OUT_OPT else ''} {_arg(o.tensors[i][0])}"
                   for k, (i, _, _) in enumerate(o.outputs))
    return f"({ins}{attrs}) -> {rets}", f"({ins}{attrs}{outs}) -> ()"


def _relate(o, args):
    """The sizes the C rule needs equal that a graph does not tie on its own, told to the tracer
    (torch._check): a rope table's positions and q's S. A size known at trace time then guards
    the symbolic one, so a compiled graph never runs a table of another video size (an input
    computed from sizes a guard fixed)."""
    names = [t[0] for t in o.tensors]
    if "cos" not in names:
        return
    q = args[names.index("q")]
    for t in ("cos", "sin"):
        tab = args[names.index(t)]
        if tab is not None and q is not None and 2 <= tab.dim() <= 4 and q.dim() == 4:
            s = tab.shape[1 if tab.dim() == 4 else 0]
            torch._check(s == q.shape[1], lambda: f"fusedk.{o.name}: {t} has {s} positions, q has {q.shape[1]}")


def _register(o):
    fn_schema, out_schema = _schemas(o)
    qual, qual_out = f"fusedk::{o.name}", f"fusedk::{o.name}_out"
    torch.library.define(qual, fn_schema)
    torch.library.define(qual_out, out_schema)
    n_in, listed = len(o.inputs), any(o.tensors[i][1] == _OUT_OPT for i, _, _ in o.outputs)

    def args_of(inputs, outputs):  # registry order for _core.call
        args = [None] * len(o.tensors)
        for i, v in zip(o.inputs, inputs):
            args[i] = v
        for (i, _, _), v in zip(o.outputs, outputs):
            args[i] = v
        return tuple(args)

    @torch.library.impl(qual, ("cpu", "cuda"))
    def functional(*a):
        with torch.no_grad():  # the kernel itself, below autograd: the C path, never back here
            r = _core.call(o.id, a[0], args_of(a[:n_in], ()), tuple(a[n_in:]), None)
        r = list(r) if isinstance(r, tuple) else [r]
        return r if listed else (r[0] if len(r) == 1 else tuple(r))

    @torch.library.register_fake(qual)
    def functional_fake(*a):
        args, attrs = args_of(a[:n_in], ()), a[n_in:]
        _relate(o, args)
        values = o.values(attrs)
        r = [_new(o, i, args, attrs) for i, like, when in o.outputs if o.exists(i, args, values)]
        return r if listed else (r[0] if len(r) == 1 else tuple(r))

    @torch.library.impl(qual_out, ("cpu", "cuda"))
    def out(*a):
        n_attr = len(o.attrs)
        with torch.no_grad():
            _core.call(o.id, a[0], args_of(a[:n_in], a[n_in + n_attr:]), tuple(a[n_in:n_in + n_attr]), None)

    @torch.library.register_fake(qual_out)
    def out_fake(*a):
        _relate(o, args_of(a[:n_in], ()))
        return None

    def backward(ctx, *grads):
        raise RuntimeError(f"fusedk.torch.{o.name} is forward-only: it has no backward, so no gradient flows "
                           "through it (run it under torch.no_grad(), or use a differentiable op for training)")

    if o.name == "linear":
        torch.library.register_autograd(qual, _linear_backward, setup_context=_linear_setup)
    else:
        torch.library.register_autograd(qual, backward, setup_context=lambda ctx, inputs, output: None)


# linear's gradients: linear_backward on the saved x, w and pre-activation (aux)
def _linear_setup(ctx, inputs, output):
    x, w, bias, act, tf32, _ = inputs
    ctx.act, ctx.tf32, ctx.has_bias = act, tf32, bias is not None
    if len(output) > 1:  # aux is returned for a hand-written backward: no gradient flows through it
        ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, w, output[1] if len(output) > 1 else None)


def _linear_backward(ctx, grads):
    x, w, z = ctx.saved_tensors
    dy = grads[0]
    if ctx.act != _core.lib.FUSEDK_ACT_NONE and z is None:
        raise RuntimeError("fusedk.torch.linear: no pre-activation was kept for the backward (call it with "
                           "aux=True, or with grad mode on when an input requires grad)")
    need = (ctx.needs_input_grad[0], ctx.needs_input_grad[1], ctx.has_bias and ctx.needs_input_grad[2])
    if dy is None or not any(need):
        return None, None, None, None, None, None
    r = torch.ops.fusedk.linear_backward(dy.contiguous(), x, w, z, ctx.act, ctx.tf32, *(int(n) for n in need))
    dx, dw, db = _core.spread(r, need)
    return dx, dw, db, None, None, None


def _keeps_aux(o, args, attrs):
    """linear under autograd: its backward needs the pre-activation, kept though not asked for."""
    return (o.id == _LINEAR and len(attrs) > 2 and not attrs[2] and attrs[0] != _core.lib.FUSEDK_ACT_NONE
            and args[0] is None and args[1] is None and torch.is_grad_enabled()
            and any(t is not None and t.requires_grad for t in args[2:]))


def _new(o, i, args, attrs):
    """Output i of op o, allocated like its like input (fusedk_op_out_shape's rule, sizes kept
    symbolic under torch.compile)."""
    like = args[o.tensors[i][2]]
    shape = o.sym_shape(i, [None if a is None else a.shape for a in args], o.values(attrs))
    return like.new_empty(shape, dtype=torch.float32) if i in o.float32 else like.new_empty(shape)


def _route(op, x, args, attrs, stream):
    """fusedk's call through the registered operators: what torch.compile traces in place of
    fusedk's C call, and what an eager call autograd records takes."""
    o = OPS[op]
    if stream is not None:  # the operators run on torch's current stream: make stream= that one
        if torch.compiler.is_compiling():
            raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{o.name}: stream= is not taken under torch.compile; use "
                        "`with torch.cuda.stream(s):`")
        if not torch.cuda.is_available():
            return _route(op, x, args, attrs, None)
        with torch.cuda.stream(torch.cuda.ExternalStream(_core.stream_int(stream))):
            return _route(op, x, args, attrs, None)
    inputs = [args[i] for i in o.inputs]
    attrs = o.typed(attrs)  # every attribute: the schema's int and float arguments
    if _keeps_aux(o, args, attrs):
        return getattr(torch.ops.fusedk, o.name)(*inputs, *attrs[:2], 1, *attrs[3:])[0]
    given = [args[i] for i, _, _ in o.outputs]
    if any(g is not None for g in given) and torch.is_grad_enabled() and any(
            t is not None and t.requires_grad for t in inputs):
        raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{o.name}: out= is given and an input requires grad; out= "
                    "calls are not differentiable (as torch's own out= ops): leave out= unset, or call it under "
                    "torch.no_grad()")
    if all(g is None for g in given):
        r = getattr(torch.ops.fusedk, o.name)(*inputs, *attrs)
        return tuple(r) if isinstance(r, list) and len(r) > 1 else (r[0] if isinstance(r, list) else r)
    outs = []  # out= given: the missing outputs are made here, then all are written in place
    for (i, like, when), g in zip(o.outputs, given):
        if g is None and o.exists(i, args, attrs):
            g = _new(o, i, args, attrs)
        outs.append(g)
    getattr(torch.ops.fusedk, f"{o.name}_out")(*inputs, *attrs, *outs)
    outs = [g for g in outs if g is not None]
    return outs[0] if len(outs) == 1 else tuple(outs)


_pkg = sys.modules[__package__]
_LINEAR = _core.lib.FUSEDK_OP_LINEAR
for _o in OPS:
    _register(_o)
    globals()[_o.name] = _core.rebind(getattr(_pkg, _o.name), _route)  # fusedk's function through the operators
del _o
