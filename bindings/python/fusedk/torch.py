"""fusedk's ops as PyTorch custom operators, for torch.compile and CUDA graphs (opt-in: importing
this module imports torch; `import fusedk` alone never does).

    import fusedk.torch as fkt
    y = fkt.rmsnorm(x, w)                     # same signatures as fusedk.rmsnorm & co.
    f = torch.compile(block, fullgraph=True)  # no graph breaks; mode="reduce-overhead" works

Every registry op of fusedk.h becomes two operators in the `fusedk` namespace, their schemas
derived from the registry: `fusedk::<op>` (functional: returns new tensors) and
`fusedk::<op>_out` (writes the caller's out=/residual_out= tensors, declared as mutated), each
with a fake (meta) implementation. The ops are forward-only: backward through one raises an
error that says so, but for those that train, eager or compiled: `linear` (its backward is
`linear_backward`), `lowrank_update` (`lowrank_update_backward`), and a LoRA as
`linear_lowrank(x, lowrank_prepare(w, b, s), a, ...)` (`linear_lowrank_backward`: gradients
reach x, a, b, codes and bias; the base weight w is frozen: w_cat's first K columns get none). Plain `fusedk.rmsnorm(x)` & co. need no import of
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
        args = args_of(a[:n_in], ())
        if torch.is_grad_enabled():  # the kernel itself, below autograd: the C path, never back here
            with torch.no_grad():
                r = _core.call(o.id, a[0], args, tuple(a[n_in:]), None)
        else:  # inference mode, compiled inference graphs: no context to enter
            r = _core.call(o.id, a[0], args, tuple(a[n_in:]), None)
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
        args, attrs = args_of(a[:n_in], a[n_in + n_attr:]), tuple(a[n_in:n_in + n_attr])
        if torch.is_grad_enabled():
            with torch.no_grad():
                _core.call(o.id, a[0], args, attrs, None)
        else:
            _core.call(o.id, a[0], args, attrs, None)

    @torch.library.register_fake(qual_out)
    def out_fake(*a):
        _relate(o, args_of(a[:n_in], ()))
        return None

    def backward(ctx, *grads):
        raise RuntimeError(f"fusedk.torch.{o.name} is forward-only: it has no backward, so no gradient flows "
                           "through it (run it under torch.no_grad(), or use a differentiable op for training)")

    if o.name in _GRADS:
        setup, grad = _GRADS[o.name]
        torch.library.register_autograd(qual, grad, setup_context=setup)
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


def _run(ctx, name, inputs, attrs):
    """Registry op `name` on its inputs (registry order) and attributes: through the custom operator
    (what torch.compile traces), or, from an eager autograd.Function (ctx.eager), the C call."""
    if not getattr(ctx, "eager", False):
        return getattr(torch.ops.fusedk, name)(*inputs, *attrs)
    o = _BY_NAME[name]
    args = [None] * len(o.tensors)
    for i, v in zip(o.inputs, inputs):
        args[i] = v
    return _core.call(o.id, inputs[0], tuple(args), tuple(attrs), None)


# lowrank_update's gradients: lowrank_update_backward (y's: beta dout)
def _lowrank_setup(ctx, inputs, output):
    x, v, codes, u_t, y, scaling, beta = inputs
    ctx.scaling, ctx.beta = scaling, beta
    ctx.save_for_backward(x, v, codes, u_t)


def _lowrank_backward(ctx, dout):
    x, v, codes, u_t = ctx.saved_tensors
    n = ctx.needs_input_grad  # x, v, codes, u_t, y
    dy = dout * ctx.beta if n[4] else None
    if not (n[0] or n[1] or n[2] or n[3]):
        return None, None, None, None, dy, None, None
    want = (n[0], n[1], n[3], codes is not None)
    r = _run(ctx, "lowrank_update_backward", (dout.contiguous(), x, v, codes, u_t),
             (ctx.scaling, *(int(w) for w in want[:3])))
    dx, dv, du_t, dcodes = _core.spread(r, want)
    return dx, dv, dcodes if n[2] else None, du_t, dy, None, None


# linear_lowrank's: linear_lowrank_backward with scaling 1, whose db is then w_cat's adapter
# columns' gradient (lowrank_prepare's backward scales it into b's)
def _lora_setup(ctx, inputs, output):
    x, w_cat, bias, a, codes, ids, act, _ = inputs
    ctx.act, ctx.has_bias = act, bias is not None
    if len(output) > 1:
        ctx.mark_non_differentiable(output[1])
    ctx.save_for_backward(x, w_cat, a, codes, ids, output[1] if len(output) > 1 else None)


def _lora_backward(ctx, grads):
    x, w_cat, a, codes, ids, z = ctx.saved_tensors
    dy = grads[0]
    n = ctx.needs_input_grad  # x, w_cat, bias, a, codes, adapter_ids
    if ctx.act != _core.lib.FUSEDK_ACT_NONE and z is None:
        raise RuntimeError("fusedk.torch.linear_lowrank: no pre-activation was kept for the backward (call it with "
                           "aux=True, or with grad mode on when an input requires grad)")
    want = (n[0], n[3], n[1], codes is not None, ctx.has_bias and n[2])
    if dy is None or not (want[0] or want[1] or want[2] or want[4] or n[4]):
        return (None,) * 8
    r = _run(ctx, "linear_lowrank_backward", (dy.contiguous(), x, w_cat, a, codes, ids, z),
             (ctx.act, 1.0, int(want[0]), int(want[1]), int(want[2]), int(want[4])))
    dx, da, db, dcodes, dbias = _core.spread(r, want)
    dw_cat = None
    if db is not None:  # [N, K + A rp]: zeros for w, db's [A, N, r] in the adapters' slots
        N, r_ = db.shape[-2], db.shape[-1]
        A, rp, K = (db.shape[0] if db.dim() == 3 else 1), (db.shape[-1] + 7) // 8 * 8, x.shape[-1]
        dw_cat = w_cat.new_zeros(w_cat.shape)
        dw_cat[:, K:].view(N, A, rp)[:, :, :r_] = db.reshape(A, N, r_).transpose(0, 1)
    return dx, dw_cat, dbias, da, dcodes if n[4] else None, None, None, None


# lowrank_prepare's: b's gradient is scaling times w_cat's adapter columns'; w is frozen
def _prepare_setup(ctx, inputs, output):
    w, b, scaling = inputs
    ctx.scaling, ctx.K, ctx.b_shape = scaling, w.shape[1], b.shape


def _prepare_backward(ctx, g):
    if ctx.needs_input_grad[0]:
        raise RuntimeError("fusedk.torch.lowrank_prepare: w, the frozen base weight, gets no gradient (a LoRA "
                           "trains a and b): call w.requires_grad_(False), or pass w.detach()")
    if g is None or not ctx.needs_input_grad[1]:
        return None, None, None
    shape = ctx.b_shape
    A, N, r = (shape[0] if len(shape) == 3 else 1), shape[-2], shape[-1]
    rp = (r + 7) // 8 * 8
    db = g[:, ctx.K:].reshape(N, A, rp)[:, :, :r].transpose(0, 1) * ctx.scaling
    return None, db.reshape(shape), None


# Eager calls under autograd: the same gradients through torch.autograd.Function and fusedk's C
# calls, without the custom operators' dispatch into Python and its autograd wrapper; torch.compile
# traces the operators instead.
class _LowrankFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, v, codes, u_t, y, scaling, beta):
        ctx.eager, ctx.scaling, ctx.beta = True, scaling, beta
        ctx.save_for_backward(x, v, codes, u_t)
        return _run(ctx, "lowrank_update", (x, v, codes, u_t, y), (scaling, beta))

    @staticmethod
    def backward(ctx, dout):
        return _lowrank_backward(ctx, dout)


class _LoraFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, x, w_cat, bias, a, codes, ids, act, want_aux):
        ctx.eager, ctx.act, ctx.has_bias = True, act, bias is not None
        keep = act != _core.lib.FUSEDK_ACT_NONE and any(ctx.needs_input_grad)
        r = _run(ctx, "linear_lowrank", (x, w_cat, bias, a, codes, ids), (act, int(keep)))
        y, z = r if keep else (r, None)
        ctx.save_for_backward(x, w_cat, a, codes, ids, z)
        return y

    @staticmethod
    def backward(ctx, dy):
        return _lora_backward(ctx, (dy,))


class _PrepareFn(torch.autograd.Function):
    @staticmethod
    def forward(ctx, w, b, scaling):
        ctx.eager, ctx.scaling, ctx.K, ctx.b_shape = True, scaling, w.shape[1], b.shape
        return _run(ctx, "lowrank_prepare", (w, b), (scaling,))

    @staticmethod
    def backward(ctx, g):
        return _prepare_backward(ctx, g)


def _keeps_aux(o, args, attrs):
    """linear, linear_lowrank under autograd: the backward needs the pre-activation, kept though
    not asked for."""
    k = _AUX.get(o.id)
    return (k is not None and len(attrs) > k and not attrs[k] and attrs[0] != _core.lib.FUSEDK_ACT_NONE
            and args[0] is None and args[1] is None and torch.is_grad_enabled()
            and any(t is not None and t.requires_grad for t in args[2:]))


def _new(o, i, args, attrs):
    """Output i of op o, allocated like its like input (fusedk_op_out_shape's rule, sizes kept
    symbolic under torch.compile)."""
    like = args[o.tensors[i][2]]
    values = o.values(attrs)
    shape, dt = o.sym_shape(i, [None if a is None else a.shape for a in args], values), o.out_dtype(i, values)
    return like.new_empty(shape) if dt is None else like.new_empty(shape, dtype=_core.torch_dtype(dt))


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
    _core.refuse_room(o, args, "under autograd or torch.compile (fusedk's operators leave their inputs as "
                      "they are)")
    inputs = [args[i] for i in o.inputs]
    attrs = o.typed(attrs)  # every attribute: the schema's int and float arguments
    given = [args[i] for i, _, _ in o.outputs]
    f = _FUNCTIONS.get(o.name)  # eager, differentiable: the autograd.Function (it keeps aux itself)
    if (f is not None and all(g is None for g in given) and not torch.compiler.is_compiling()
            and (o.id != _LINEAR_LOWRANK or not attrs[1])):
        return f.apply(*inputs, *attrs)
    if _keeps_aux(o, args, attrs):
        k = _AUX[o.id]
        return getattr(torch.ops.fusedk, o.name)(*inputs, *attrs[:k], 1, *attrs[k + 1:])[0]
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
_AUX = {_core.lib.FUSEDK_OP_LINEAR: 2, _core.lib.FUSEDK_OP_LINEAR_LOWRANK: 1}  # want_aux's attribute index
_BY_NAME = {o.name: o for o in OPS}
_LINEAR_LOWRANK = _core.lib.FUSEDK_OP_LINEAR_LOWRANK
_FUNCTIONS = {"lowrank_update": _LowrankFn, "linear_lowrank": _LoraFn, "lowrank_prepare": _PrepareFn}
_GRADS = {"linear": (_linear_setup, _linear_backward), "lowrank_update": (_lowrank_setup, _lowrank_backward),
          "linear_lowrank": (_lora_setup, _lora_backward), "lowrank_prepare": (_prepare_setup, _prepare_backward)}
for _o in OPS:
    _register(_o)
    globals()[_o.name] = _core.rebind(getattr(_pkg, _o.name), _route)  # fusedk's function through the operators
del _o
_core.register_adapter("torch", _route)  # torch.compile's traces and autograd's eager calls come here
