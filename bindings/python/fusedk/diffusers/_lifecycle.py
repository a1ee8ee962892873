"""apply() and revert(), and what keeps a patched block right between them: each block's State
(its fused weights, the modules they hang on, its handle for the block operator), the eager
checks before each call (_ready: weights still the model's, adapters unchanged, no hook inside),
the checks a torch.compile trace can make (_traced_hooked), and the fused forward swapped in and
out."""
import copy
import importlib
import types
import warnings

import torch

from .. import _core
from ._block_op import compiling, exporting, new_handle, register
from ._common import PerForward, eps_of, records_grad, warn_once
from ._lora import fuse_projections, groups_why_not, lora_signature
from ._pieces import OPS, Pieces
from . import vae as _vae


class Report:
    """What apply() did: patched (module name, class), skipped (module name, class, why), and what
    runs the patched blocks' attention."""

    def __init__(self):
        self.patched, self.skipped, self.attention = [], [], "diffusers' dispatch"
        self.projections = "the model's dtype"

    def __repr__(self):
        lines = [f"fusedk.diffusers: {len(self.patched)} blocks patched, {len(self.skipped)} left alone; attention: "
                 f"{self.attention}; projections: {self.projections}"]
        counts = {}
        for _, cls in self.patched:
            counts[cls] = counts.get(cls, 0) + 1
        lines += [f"  patched {n} x {cls}" for cls, n in counts.items()]
        lines += [f"  left alone {name} ({cls}): {why}" for name, cls, why in self.skipped]
        return "\n".join(lines)


_PATCHERS = {}


def _patchers():
    """{diffusers block class: its Patcher}, for the models this diffusers has; made once, so that
    every apply() registers the same kinds with the block operator (its list does not grow)."""
    if not _PATCHERS:
        for name in ("flux", "ltx", "mochi", "wan"):
            try:
                _PATCHERS.update(importlib.import_module(f".{name}", __package__).patchers())
            except ImportError:  # this diffusers lacks the model
                continue
    return _PATCHERS


def _roots(model):
    """The transformers of a pipeline (.transformer, and .transformer_2 of two-expert pipelines
    such as Wan 2.2 A14B), or the model itself."""
    ts = [getattr(model, a, None) for a in ("transformer", "transformer_2")]
    ts = [t for t in ts if isinstance(t, torch.nn.Module)]
    if not ts and not isinstance(model, torch.nn.Module):
        raise _core.Error("FUSEDK_ERR_INVALID_ARGUMENT", f"fusedk.diffusers: model is a {type(model).__name__}, "
                          "expected a diffusers model, one of its blocks, or a pipeline with a .transformer")
    return ts or [model]


def apply(model, ops=None, attention=False, precision=None, bf16_weights="host", vae=True):
    """Swaps fusedk's fused forwards into every supported block of `model` (a diffusers
    transformer, one of its blocks, or a pipeline with a .transformer). ops: the fused pieces to
    use (a subset of fusedk.diffusers.OPS; None: all). attention=True: fusedk's attention kernel
    in the patched blocks' attention instead of diffusers' dispatch; "int8": fusedk's int8
    attention kernel (on the CPU, and Dh 64, 128 and 256 on sm_90a: other GPUs refuse it by name),
    q and k straight from qk_norm_rope_int8 where the block's prologue is qk_norm_rope (no k mean:
    ops without "qk_norm_rope" keep attention_int8's), fusedk's at the inputs' precision for
    other head sizes. precision="fp8": the blocks' projections on FP8 tensor cores (linear_fp8):
    each weight quantized once a row (e4m3, a scale an output channel), its input made in FP8 by
    the op before it (adaln_fp8) or quantized a row at a time (quantize_fp8); the modulation
    GEMMs (one row of temb a sample) weight-only in int8 (linear_w8: half their weight bytes, temb
    in the model's dtype; Gaussian-like rows keep a third of e4m3's error: 0.0085 against 0.026);
    projections with LoRA adapters and everything outside the blocks stay in the model's dtype.
    bf16_weights: "host" (default) moves the 8-bit projections' bf16 weights to host memory,
    freeing the device's (the parameters become
    empty tensors on their device): revert copies them back bit for bit, and whatever would run a
    block's stock forward (autograd recording, a hook inside it, torch.export), a move of the
    model or a change of its weights raises fusedk.Error until revert; "keep" leaves them where
    they are (the stock forward keeps working; the e4m3 copies add half their bytes). vae (True):
    also the pipeline's VAE decoder (pipe.vae, or model itself: an AutoencoderKL, AutoencoderKLWan,
    AutoencoderKLLTXVideo or AutoencoderKLMochi):
    its ResNet blocks and convs through fusedk's channels-last conv, group_norm and channel_rmsnorm
    (vae.py; the VAE runs in its own dtype whatever precision says). Returns a Report: what was patched and what was left alone,
    and why, and what runs the attention and the projections. Applying twice patches nothing new."""
    use = OPS if ops is None else frozenset(ops)
    if not use <= OPS:
        raise _core.Error("FUSEDK_ERR_INVALID_ARGUMENT", f"fusedk.diffusers.apply: ops has {sorted(use - OPS)}, "
                          f"expected names from {sorted(OPS)}")
    if not any(attention is a for a in (True, False)) and attention != "int8":
        raise _core.Error("FUSEDK_ERR_INVALID_ARGUMENT", f"fusedk.diffusers.apply: attention is {attention!r}, "
                          "expected True, False or 'int8'")
    use = use | {"attention"} if attention else use
    use = use | {"attention_int8"} if attention == "int8" else use
    if precision not in (None, "fp8"):
        raise _core.Error("FUSEDK_ERR_INVALID_ARGUMENT", f"fusedk.diffusers.apply: precision is {precision!r}, "
                          "expected None (the model's dtype) or 'fp8'")
    use = use | {"fp8"} if precision == "fp8" else use
    if bf16_weights not in ("keep", "host"):
        raise _core.Error("FUSEDK_ERR_INVALID_ARGUMENT", f"fusedk.diffusers.apply: bf16_weights is "
                          f"{bf16_weights!r}, expected 'keep' or 'host'")
    use = use | {"fp8_host"} if precision == "fp8" and bf16_weights == "host" else use
    if vae is not True and vae is not False:
        raise _core.Error("FUSEDK_ERR_INVALID_ARGUMENT", f"fusedk.diffusers.apply: vae is {vae!r}, expected True "
                          "or False")
    table, report, hooked = _patchers(), Report(), 0
    if precision == "fp8":
        report.projections = ("FP8 (e4m3 weights a scale an output channel, inputs a scale a row; the "
                              "modulation GEMMs weight-only int8, their one row a sample in the model's dtype; "
                              "LoRA'd projections and layers outside the blocks in the model's dtype)" +
                              ("; their bf16 weights in host memory" if bf16_weights == "host" else ""))
    report.attention = {True: "fusedk", "int8": "fusedk int8 (on the CPU, and Dh 64, 128 and 256 on sm_90a; "
                        "fusedk's at the inputs' precision for other head sizes)"}.get(attention, "diffusers' dispatch")
    for root in _roots(model):
        for name, m in root.named_modules():
            patcher = table.get(type(m))
            if patcher is None or getattr(m, "_fusedk", None) is not None:
                continue
            chain = _chain(root, name)
            why = _why_not(m, patcher, chain)
            if why:
                report.skipped.append((name or type(m).__name__, type(m).__name__, why))
                hooked += "hooks" in why
                continue
            _patch(m, patcher, Pieces(use), chain)
            report.patched.append((name or type(m).__name__, type(m).__name__))
    for name, v in _vae.vaes(model) if vae else ():
        _vae.apply(v, name, report)
    if hooked:  # a cache, offloading or casting enabled before apply(): say so where users look
        first = next(f"{n}: {why}" for n, _, why in report.skipped if "hooks" in why)
        warnings.warn(f"fusedk.diffusers.apply: {hooked} blocks left alone (they run their stock forward) because of "
                      f"hooks, e.g. {first}", RuntimeWarning, stacklevel=2)
    return report


def fp8_error(model, *args, **kwargs):
    """How far precision="fp8" moves your model: model(*args, **kwargs) run as it is, then with
    apply(model, precision="fp8"), then reverted. Prints and returns the relative L2 of the FP8
    output against the model's own (its first output tensor). The model must not be patched yet."""
    if any(getattr(m, "_fusedk", None) is not None for r in _roots(model) for m in r.modules()):
        raise _core.Error("FUSEDK_ERR_INVALID_ARGUMENT", "fusedk.diffusers.fp8_error: the model is patched "
                          "already; revert it first")

    def first(out):
        out = out[0] if isinstance(out, (tuple, list)) else getattr(out, "sample", out)
        return out.double()
    with torch.no_grad():
        want = first(model(*args, **kwargs))
        apply(model, precision="fp8", bf16_weights="keep")  # reverted at once: no trip to the host
        try:
            got = first(model(*args, **kwargs))
        finally:
            revert(model)
    e = ((got - want).norm() / want.norm()).item()
    print(f"fusedk.diffusers.fp8_error: relative L2 of the FP8 output against the model's own: {e:.4g}")
    return e


# diffusers hooks (HookRegistry names) and accelerate's that move or recast weights (group
# offloading, layerwise casting, device maps): the fused weights apply() made would go stale, and
# hold device memory the offloading is there to free
_WEIGHT_HOOKS = frozenset({"group_offloading", "layer_execution_tracker", "lazy_prefetch_group_offloading",
                           "layerwise_casting", "peft_autocast_disable"})


def _hook_names(mod):
    """The diffusers hooks on module mod (their registry names), and "accelerate" for accelerate's."""
    d = mod.__dict__
    reg = d.get("_diffusers_hook")
    names = list(getattr(reg, "_hook_order", ()) or ())
    return names + ["accelerate"] * ("_hf_hook" in d)


def _weight_hooks(mods):
    """A reason when a module of mods has a hook that moves or recasts its weights, else None."""
    bad = sorted({n for _, mod in mods for n in _hook_names(mod) if n in _WEIGHT_HOOKS or n == "accelerate"})
    return f"{', '.join(bad)} hooks move or recast the weights apply() fused" if bad else None


def _traced_hooked(st):
    """What _ready finds, as torch.compile traces it (attribute reads and identities it guards on;
    no data pointers), whether the block runs its stock forward: a hook that moves or recasts
    weights on the block or above it. A block run as fusedk_diffusers::block (as_op) reads the
    rest when the operator runs (_ready): the trace reads nothing a LoRA adapter loaded or swapped
    in place changes, and so recompiles nothing (peft's hotswap). Other blocks: a hook inside, or
    a Linear given new parameters since apply()."""
    for _, mod in st.chain:
        reg = getattr(mod, "_diffusers_hook", None)
        if reg is not None and any(n in _WEIGHT_HOOKS for n in reg.hooks) or hasattr(mod, "_hf_hook"):
            return True
    if as_op(st.chain[-1][1]):
        return False
    if not _fresh(st, traced=True):
        return True
    for _, mod in st.subs:
        reg = getattr(mod, "_diffusers_hook", None)
        if reg is not None and reg.hooks or hasattr(mod, "_hf_hook") or mod._forward_hooks or mod._forward_pre_hooks:
            return True
    return False


def _sub_hooks(subs):
    """A reason when a module inside the block has hooks the fused forward would skip (it never
    calls the block's submodules: a cache's or a layer skip's hook on its attention or
    feed-forward, a torch hook), else None."""
    for name, sub in subs:
        d = sub.__dict__
        names = _hook_names(sub)
        replaced = "forward" in d and not _own_forward(sub, d["forward"])  # (a removed hook leaves its own)
        if names or replaced or sub._forward_hooks or sub._forward_pre_hooks:
            what = ", ".join(names) + " hooks" if names else "hooks"
            return f"{name} has {what} (the fused forward does not call it)"
    return None


def _inner(m):
    """(holder, attribute) of the reference through which diffusers' hooks on block m call its own
    forward (the innermost hook's), or None when no diffusers hook wraps it."""
    refs = getattr(m.__dict__.get("_diffusers_hook"), "_fn_refs", None)
    if not refs:
        return None
    ref = refs[0]
    return ref, "original_forward" if ref.original_forward is not None else "forward"


def _own_forward(m, f):
    """Whether f is block m's own forward bound to it (the class's, or apply()'s)."""
    fn = getattr(f, "__func__", None)
    return getattr(f, "__self__", None) is m and fn is not None and (fn is type(m).forward
                                                                     or fn is _FORWARDS.get(type(m)))


def _patch(m, patcher, pieces, chain):
    """Block m fused: its State (its GEMMs made from the model's groups of projections, weights,
    the modules inside it, chain: _chain's from its model's root to it) and its forward and _apply
    swapped in."""
    st = State(pieces)
    for name, lins in patcher.groups(m).items():
        st.proj(name, lins)
    patcher.prepare(m, st)
    st.patcher, st.links = patcher, _links(m, st.views + st.kept)
    st.subs = [(n, s) for n, s in m.named_modules() if s is not m]
    st.chain = chain
    if patcher.op is not None:  # block_op's handle: a tensor, so that blocks of a class share one compiled
        # graph; the same one when the block is prepared again (inside the operator, under
        # inference_mode perhaps): a compiled graph guards on its dispatch keys
        old = getattr(m.__dict__.get("_fusedk"), "handle", None)
        st.handle = old if old is not None and int(old) == id(m) else new_handle(m)
        register(patcher)
    parent = {c: (p, n) for p in m.modules() for n, c in p.named_children()}
    st.mods = [(*parent[lin], lin, lora_signature(lin)) for lin in st.projected]
    m._fusedk = st
    if "fp8_host" in pieces.use and st.fp8:
        _to_host(m, st)
    inner = _inner(m)
    if inner is not None:  # diffusers hooks on the block (a block cache, a layer skip): they call the fused forward
        setattr(*inner, types.MethodType(_forward_of(type(m)), m))
    elif "forward" not in vars(m) or _own_forward(m, vars(m)["forward"]):
        m.forward = types.MethodType(_forward_of(type(m)), m)
    m._apply = types.MethodType(_apply_then_fuse, m)


def _to_host(m, st):
    """apply(bf16_weights="host"): each FP8 projection's fused bf16 weight copied to host memory
    (pinned beside a CUDA device) and its device storage released: the parameters viewing it
    become empty tensors of their dtype and device, Proj.w a meta tensor (the fused forwards
    read its shape and dtype only). st.host: (Proj, host copy, [(parameter, first row, shape)])."""
    st.host = []
    for P in st.p.values():
        if P.w8 is None:
            continue
        base, meta = P.w.untyped_storage().data_ptr(), torch.empty(P.w.shape, dtype=P.w.dtype, device="meta")
        host = P.w.detach().to("cpu", copy=True)
        host = host.pin_memory() if P.w.is_cuda and torch.cuda.is_available() else host
        parts = []
        for _, _, _, _, p, _ in st.links:
            if p.untyped_storage().data_ptr() == base and p.dim() == 2:
                parts.append((p, (p.storage_offset() - P.w.storage_offset()) // P.w.stride(0), tuple(p.shape)))
        for p, _, _ in parts:
            p.data = torch.empty(0, dtype=p.dtype, device=p.device)
        st.host.append((P, host, parts))
        P.w = meta  # (P.w may be one of the parameters just emptied)
    st.links = _links(m, st.views + st.kept)  # the empty tensors' pointers: what _fresh compares
    st.fp8 = [(p, _version(p)) for _, _, parts in st.host for p, _, _ in parts]
    root = st.chain[0][1]  # a move of the whole model refused before any module of it is touched
    if root is not m and "_apply" not in vars(root):
        root._apply = types.MethodType(_apply_unless_hosted, root)


def _apply_unless_hosted(self, fn, recurse=True):
    """The model's nn.Module._apply while a block of it keeps its bf16 weights in host memory:
    refused (fusedk.Error) before anything moves, else the class's."""
    for mod in self.modules():
        _hosted(mod.__dict__.get("_fusedk"), "the model is being moved or cast")
    return type(self)._apply(self, fn, recurse)


def _hosted(st, why):
    """A fusedk.Error when st's bf16 weights are in host memory (bf16_weights="host"): what would
    need them (why) cannot run until revert."""
    if st is not None and getattr(st, "host", None):
        raise _core.Error("FUSEDK_ERR_UNSUPPORTED", f"fusedk.diffusers: {why}, but apply(precision='fp8') moved this "
                          "block's bf16 weights to host memory (bf16_weights='host', the default); call "
                          "fusedk.diffusers.revert(model) first, or apply with bf16_weights='keep'")


def _apply_then_fuse(self, fn, recurse=True):
    """A patched block's nn.Module._apply (what .to(), .cuda(), .half() run): the move, then the
    fused weights made again from the moved parameters at once, so that a model moved after
    apply() is ready for a torch.compile'd first call (which cannot prepare anything)."""
    _hosted(self._fusedk, "the block is being moved or cast")
    type(self)._apply(self, fn, recurse)
    if self.__dict__.get("_fusedk") is not None:
        _refresh(self)
    return self


def _marked(mods):
    """The (name, module) of mods that carry anything a hook leaves (a diffusers or accelerate
    registry, an instance forward, torch hooks): one pass of dict reads, what each eager call pays."""
    return [(n, m) for n, m in mods if "_diffusers_hook" in m.__dict__ or "_hf_hook" in m.__dict__
            or "forward" in m.__dict__ or m._forward_hooks or m._forward_pre_hooks]


def _refresh(block, marked=None):
    """After a change to a patched block's weights or hooks (checked eagerly): the fused weights
    made again, or the stock forward from now on where it can no longer be patched (a warning
    says why). Whether it is still patched. marked: _marked(st.chain + st.subs), if known."""
    st = block._fusedk
    moved = _weight_hooks(_marked(st.chain + st.subs) if marked is None else marked)
    if not moved and _fresh(st):
        return True
    _hosted(st, "its weights or hooks changed after apply()")
    why = moved or _why_not(block, st.patcher, st.chain, patched=True)
    if why:
        warn_once(f"fusedk.diffusers: {type(block).__name__} changed after apply() and runs its stock forward from "
                  f"now on: {why}")
        _unpatch(block)
        return False
    _patch(block, st.patcher, st.k, st.chain)  # new storage (.to(), a new state dict): fused again
    return True


def _ready(block):
    """The eager checks before a patched block runs fused (its eager calls, and the
    fusedk_diffusers::block operator, which runs eagerly): its fused weights still the model's
    (else made again, or the block unpatched: _refresh) and no hook inside it (else its stock
    forward while the hook is there); a warning says why, once. Whether the fused forward may run."""
    st = block.__dict__.get("_fusedk")
    if st is None:
        return False
    inside = _marked(st.subs)
    if not _refresh(block, _marked(st.chain) + inside):
        return False
    if block._fusedk is not st:  # prepared again: its modules now (a LoRA layer's among them)
        inside = _marked(block._fusedk.subs)
    why = _sub_hooks(inside)
    if why:
        warn_once(f"fusedk.diffusers: {type(block).__name__} runs its stock forward while {why}; remove the hook "
                  "(e.g. disable_cache()) to run fused again")
        return False
    return True


def _chain(root, path):
    """(name, module) of root, the modules between it and the block at path (its name in root),
    and the block: whose hooks _weight_hooks reads."""
    parts = path.split(".") if path else []
    out, mod = [("", root)], root
    for i, part in enumerate(parts):
        mod = mod._modules[part]
        out.append((".".join(parts[:i + 1]), mod))
    return out


def _links(m, views):
    """Where each fused parameter hangs (parent module, child name, the Linear, its attribute, the
    parameter, its data pointer): what _fresh checks before every eager call."""
    parent = {c: (p, n) for p in m.modules() for n, c in p.named_children()}
    ids = {id(v) for v in views}
    return [(*parent[sub], sub, name, p, p.data_ptr()) for sub in m.modules()
            for name, p in sub.named_parameters(recurse=False) if id(p) in ids]


def _fresh(st, traced=False):
    """Whether the fused weights are still the model's: no projection replaced (a LoRA layer added
    after apply, or unloaded), no parameter given new storage (.to(), load_state_dict(assign=True)),
    the adapters as they were (weights, scalings, active set); hooks are _marked's. Every block's
    eager call runs it: the modules' dicts are read directly (nn.Module.__getattr__ is the slow path
    for every attribute). traced: what torch.compile can trace of it (identities: no data pointers,
    no adapter signatures)."""
    return all(parent._modules.get(name) is lin and type(lin) is torch.nn.Linear and lin._parameters.get(attr) is p
               and (traced or p.data_ptr() == ptr) for parent, name, lin, attr, p, ptr in st.links) and all(
        parent._modules.get(name) is lin and (traced or lora_signature(lin) == sig)
        for parent, name, lin, sig in st.mods) and (traced or all(_version(t) == v for t, v in st.fp8))


def _version(t):
    """t's in-place version counter (None for an inference-mode tensor, which has none)"""
    try:
        return t._version
    except RuntimeError:
        return None


def _checked_forward(self, *args, **kwargs):
    """A patched block's forward: the fused one while apply()'s fused weights are still the
    model's and no hook sits inside the block (both checked eagerly). After a change to the
    weights, the block is prepared again, or runs its stock forward from then on where it no
    longer can be patched (offloading or casting hooks: its fused weights are released); while a
    hook sits on one of its modules (a cache's, a layer skip's), it runs its stock forward, which
    calls them. A warning says why, once."""
    st = self.__dict__.get("_fusedk")
    if st is None or exporting():  # reverted while a diffusers hook still held this
        # forward; or torch.export, whose programs AOTInductor packages: fusedk's operators are
        # Python custom ops such a package cannot call
        if st is not None:
            _hosted(st, "torch.export traces the block's stock forward")
        return type(self).forward(self, *args, **kwargs)
    # a call autograd records runs stock before anything is prepared again: a training step
    # (LoRA dropout on, adapter weights just stepped) neither unpatches the block nor re-fuses it
    if records_grad(self, *args, *kwargs.values()) or (_traced_hooked(st) if compiling() else not _ready(self)):
        _hosted(st, "this call needs the block's stock forward (autograd records it, or a hook sits inside it)")
        return type(self).forward(self, *args, **kwargs)
    return self._fusedk.patcher.forward(self, *args, **kwargs)


_FORWARDS = {}  # block class -> its blocks' _checked_forward


def _forward_of(cls):
    """_checked_forward with a code object of its own for block class cls: torch.compile counts
    recompiles a code object, and diffusers' compile_repeated_blocks allows one graph a class."""
    f = _FORWARDS.get(cls)
    if f is None:
        code = _checked_forward.__code__
        code = code.replace(**{"co_qualname" if hasattr(code, "co_qualname") else "co_name":
                               f"{cls.__name__}.forward (fusedk)"})
        f = _FORWARDS[cls] = types.FunctionType(code, _checked_forward.__globals__, "forward")
        f.__doc__, f.__module__ = _checked_forward.__doc__, _checked_forward.__module__
    return f


def revert(model):
    """Undoes apply(): the stock forwards, each parameter in its own storage again (the VAE's conv
    weights contiguous again). Returns the number of blocks (and VAE modules) reverted."""
    n = 0
    for m in (m for root in _roots(model) for m in root.modules()):
        st = getattr(m, "_fusedk", None)
        if st is None:
            continue
        for P, host, parts in getattr(st, "host", None) or ():  # bf16_weights="host": the weights back
            for p, row, shape in parts:
                p.data = host[row:row + shape[0]].to(p.device, copy=True)
        st.host = None
        views = {id(v) for v in st.views}
        for parent, name, lin, attr, p, ptr in st.links:
            if id(p) in views and p.data_ptr() == ptr:  # still a view into the fused weight
                p.data = p.data.clone()
        _unpatch(m)
        n += 1
    for root in _roots(model):
        for mod in root.modules():  # the models' guards against moves (bf16_weights="host")
            if getattr(vars(mod).get("_apply"), "__func__", None) is _apply_unless_hosted:
                del mod._apply
    for cache in PerForward.every:
        cache.entry = (None, None, None)  # the last forward's tables go with the patch
    for _, v in _vae.vaes(model):
        n += _vae.revert(v)
    return n


def _unpatch(m):
    inner = _inner(m)
    if inner is not None and getattr(getattr(*inner), "__func__", None) is _FORWARDS.get(type(m)):
        setattr(*inner, types.MethodType(type(m).forward, m))  # the hooks call the class's forward again
    if getattr(vars(m).get("forward"), "__func__", None) is _FORWARDS.get(type(m)):
        del m.forward  # the class's forward again
    if getattr(vars(m).get("_apply"), "__func__", None) is _apply_then_fuse:
        del m._apply
    del m._fusedk


def _why_not(m, patcher, chain, patched=False):
    """Why block m (chain: _chain's from its model's root) cannot be patched: a reason, or None.
    patched: m is patched already (its forward is apply()'s)."""
    inner = _inner(m)
    f = getattr(*inner) if inner is not None else vars(m).get("forward")
    if "forward" in vars(m) and not patched and not _own_forward(m, f):
        return "its forward is replaced by something other than diffusers' hooks"
    subs = [(n, s) for n, s in m.named_modules() if s is not m]
    why = _weight_hooks(chain + subs)  # (hooks inside the block: stock while they are there)
    if why:
        return why
    # peft's LoRA layers: those on the projections fold into their GEMMs; those inside a module the
    # fused forward calls as it is run there; any other the fused forward would drop
    taken = {id(x) for x in patcher.projections(m)} | {id(x) for c in patcher.calls(m) for x in c.modules()}
    for name, sub in subs:
        if (hasattr(sub, "lora_A") or hasattr(sub, "base_layer")) and id(sub) not in taken:
            return f"{name} is a LoRA/adapter layer (peft) the fused forward does not take: it would drop it"
    # one dtype, but for the float32 parameters the model keeps so (its _keep_in_fp32_modules, as
    # from_pretrained(torch_dtype=...) loads them): the model's forward handles those; and an
    # adapter's own (cast to the block's once)
    keep = getattr(chain[0][1], "_keep_in_fp32_modules", None) or ()
    dts = {p.dtype for n, p in m.named_parameters() if not (p.dtype == torch.float32 and any(k in n for k in keep))
           and ".lora_" not in f".{n}"}
    if not dts <= {torch.float32, torch.float16, torch.bfloat16} or len(dts) > 1:
        return f"its parameters have dtypes {sorted(str(d) for d in dts)}, expected one of float32, float16, bfloat16"
    # (the model's root: not a weak reference, so that a deep copy's blocks find the copy's)
    return groups_why_not(patcher.groups(m)) or patcher.why_not(m, chain[0][1])


def as_op(block):
    """Under torch.compile, whether patched block `block` runs as one fusedk_diffusers::block
    operator (block_op): always where its patcher says so (Flux), else while a projection is a
    peft LoRA layer: the operator checks the adapters each time it runs (an in-place hotswap, a
    set_adapters), which a traced forward cannot, or while its GEMMs hold adapters a projection
    had when the block was prepared (unloaded since: the operator prepares the block again). Its
    other calls trace the fused forward."""
    st = block._fusedk
    return st.patcher.op_always or any(type(x) is not torch.nn.Linear for x in st.patcher.projections(block)) or any(
        type(lin) is not torch.nn.Linear for _, _, lin, _ in st.mods)


class Patcher:
    """How one block class is patched, by a model file (flux.py, ...):
    groups(block) -> {name: [projections]}: the block's GEMMs, each over the nn.Linear layers (or
        peft LoRA layers over one, their adapters folded in) it runs, their rows in that order;
    why_not(block, model) -> a reason or None: the block's other checks;
    prepare(block, st): what the fused forward keeps beside its GEMMs (State st.p) in st;
    forward(block, ...): the fused forward;
    op: (run(block, tensors) -> [tensors], shapes(tensors) -> [empty tensors], stock(block,
        tensors) -> run's outputs by the stock forward): the fused forward as one operator under
        torch.compile (block_op; outputs that alias no input), used where as_op says;
    op_always: the block runs as that operator whenever it is compiled (else while it has LoRA layers);
    calls(block) -> [modules]: what the fused forward calls as it is (LTX's cross-attention),
        whose LoRA layers run there as peft runs them."""

    def __init__(self, groups, why_not, prepare, forward, op, op_always=False, calls=None):
        self.groups, self.why_not, self.prepare, self.forward = groups, why_not, prepare, forward
        self.op, self.op_always, self._calls = op, op_always, calls

    def projections(self, m):
        return [x for lins in self.groups(m).values() for x in lins]

    def calls(self, m):
        return self._calls(m) if self._calls else ()

    def run_op(self, m, xs):
        """block_op's body for block m, which runs eagerly: what the trace could not check (new
        weights, adapters swapped in place, hooks) is checked here, as an eager call does."""
        if not _ready(m):
            _hosted(m._fusedk, "this call needs the block's stock forward (a hook sits inside it)")
            return self.op[2](m, xs)  # the block's stock forward
        return m._fusedk.patcher.op[0](m, xs)


class State:
    """What a patched block keeps: its pieces, its GEMMs (p: {group name: Proj}), the parameters
    apply() made views into them, and what its model's prepare adds (heads, eps, ...)."""

    def __init__(self, pieces):
        self.k, self.views, self.projected, self.p = pieces, [], [], {}
        self.kept = []  # parameters a Proj holds as they are (no view made): checked as the views are
        self.fp8 = []  # (tensor, its version when w8 was made) for the FP8 Projs' weights

    def __deepcopy__(self, memo):
        """A deep copy of the model: its blocks' States, the patcher shared (block_op's kind is its
        place in its list of kinds), the handle naming the copied block (chain's last module)."""
        new = memo[id(self)] = type(self).__new__(type(self))
        for name, value in self.__dict__.items():
            setattr(new, name, value if name == "patcher" else copy.deepcopy(value, memo))
        if "handle" in new.__dict__:
            new.handle = new_handle(new.chain[-1][1])
        return new

    def proj(self, name, lins):
        """p[name]: one GEMM for the projections lins (nn.Linear or peft LoRA layers over one), their
        adapters folded in (Proj). precision="fp8": w8, its e4m3 weight, or int8 for the modulation
        ("mod": one row a sample, a matrix-vector product that reads x in 16 bits: linear_w8)."""
        P, views = fuse_projections(lins)
        if "fp8" in self.k.use and P.a is None and P.w.dtype in (torch.float16, torch.bfloat16):
            with torch.no_grad():
                P.w8 = (self.k.fk.quantize_int8 if name == "mod" else self.k.fk.quantize_fp8)(P.w.detach())
            # w8 is a copy: the version of w and of each parameter viewing it (a parameter whose .data
            # became a view keeps a counter of its own) tells an in-place change since
            self.fp8 = self.fp8 + [(t, _version(t)) for t in [P.w, *views, *(x.weight for x in lins
                                                                            if hasattr(x, "weight"))]]
        self.p[name], self.views, self.projected = P, self.views + views, self.projected + list(lins)
        ids = {id(v) for v in self.views}
        self.kept += [t for t in (P.w, P.b) if isinstance(t, torch.nn.Parameter) and id(t) not in ids]
        return P

    def attention(self, attn, head_dim):
        """The self-attention's heads, head dim and q/k norm eps (its q, k, v: the GEMM p["qkv"])."""
        self.heads, self.dh = attn.heads, head_dim
        self.eps_qk = eps_of(attn.norm_q, self.p["qkv"].w.dtype)
