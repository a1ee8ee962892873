"""fusedk inside diffusers' transformers: one call puts fused forwards into a loaded model.

    import fusedk.diffusers
    report = fusedk.diffusers.apply(pipe)      # a pipeline, or its transformer
    print(report)                              # what was patched, what was left alone and why
    image = pipe(prompt).images[0]             # eager, or after torch.compile / compile_repeated_blocks
    fusedk.diffusers.revert(pipe)              # the stock forwards again, bit for bit

Each supported block class gets an instance-level `forward` that runs the block's math through
fusedk's ops (flux.py, ...: AdaLN modulation + norm in one `adaln`, the q/k/v projections
concatenated once into one GEMM, `qk_norm_rope` from the packed projection straight into the
layout attention takes, MLP Linear+GELU(tanh) in cuBLASLt's epilogue, gated residuals in one
pass). Attention stays diffusers' dispatch (SDPA, or the backend the model is set to) unless
apply(..., attention=True) puts fusedk's flash attention there (f16/bf16 on the GPU, every dtype
on the CPU; a call the kernel does not take, float32 on the GPU, goes to the dispatch).

    fusedk.diffusers.apply(pipe, attention=True)

- Exactness: a block is patched only when every part of it is one the fused forward reproduces;
  anything else (another attention processor, an unknown norm or activation, weights under
  offloading or casting hooks) leaves it unpatched, and the report says why. A hook on one of its
  modules runs it stock while the hook is there (below).
- LoRA (Flux): peft's LoRA layers on the block's projections (loaded with load_lora_weights or
  added with add_adapter; several active adapters with their set_adapters weights) fold into the
  projection's GEMM: w_cat = [w | s_1 b_1 | s_2 b_2 ...] made by apply (the base weight becomes
  a view into it: no second copy), then linear_lowrank. Adapters in another float dtype than the
  base are cast to it once; DoRA and other variants, LoRA biases, dropout in training mode and more
  than 128 adapter columns a GEMM (A times r rounded up to 8, the q/k/v adapters together) leave
  the block unpatched. A change to the adapters after apply (set_adapters, another LoRA, fuse_lora,
  disable) is seen at the next eager call and the block prepared again; under torch.compile, at
  the next call of the compiled model (each Flux block is one operator that checks, no recompile:
  peft's hotswap on a compiled patched model; Inductor's CUDA graphs run around that operator).
  Blocks without LoRA support (LTX-Video, Mochi, Wan) that get a LoRA layer after apply run their
  stock forward, eager or compiled.
- Training: fusedk's fused forwards have no backward. A patched block that autograd would
  record (grad mode on and a parameter or input that requires grad) runs its stock forward,
  and a warning says so once.
- Weights: concatenated projections are made once by `apply`; the original parameters become
  views into them (same Parameter objects, same values, no extra memory). `revert` gives each
  its own storage again.
- Works eager, under torch.compile (fusedk's calls become `torch.ops.fusedk` custom operators),
  in CUDA graphs, and on CPU tensors (fusedk's C references). torch.export traces the stock
  forwards: AOTInductor's packages cannot call fusedk's operators (Python custom ops).
- diffusers' hooks: those on whole blocks (FirstBlockCache, MagCache, SeaCache, a layer skip of
  whole blocks) call the fused forward or skip it, enabled before or after apply. Where a hook sits
  inside a block (FasterCache, Pyramid Attention Broadcast, TaylorSeer, a layer skip of attention
  or feed-forward, any torch hook) the block runs its stock forward while the hook is there; hooks
  that move or recast weights (group offloading, layerwise casting, accelerate's device maps) make
  blocks stock for good (their fused weights are released). Each says so in one warning.
- A patched block moved after apply (.to(), .cuda(), .half()) fuses its weights again at once, so
  the first call of a compiled model built, patched and then moved runs fused.

diffusers (and torch) are imported by this module only."""
import copy
import types
import warnings
import weakref

import torch

from .. import _core

__all__ = ["apply", "revert", "Report", "OPS"]

# the fused pieces a patched forward may use; apply(model, ops=...) picks a subset (the rest run
# the stock torch expression: for A/B measurements and bisecting)
OPS = frozenset({"adaln", "linear", "qk_norm_rope", "gated_residual", "residual_tanh_gated_rmsnorm", "glu"})


class Report:
    """What apply() did: patched (module name, class) and skipped (module name, class, why)."""

    def __init__(self):
        self.patched, self.skipped = [], []

    def __repr__(self):
        lines = [f"fusedk.diffusers: {len(self.patched)} blocks patched, {len(self.skipped)} left alone"]
        counts = {}
        for _, cls in self.patched:
            counts[cls] = counts.get(cls, 0) + 1
        lines += [f"  patched {n} x {cls}" for cls, n in counts.items()]
        lines += [f"  left alone {name} ({cls}): {why}" for name, cls, why in self.skipped]
        return "\n".join(lines)


def _patchers():
    """{diffusers block class: its model module}, for the models this diffusers has."""
    import importlib
    table = {}
    for name in ("flux", "ltx", "mochi", "wan"):
        try:
            table.update(importlib.import_module(f".{name}", __name__).patchers())
        except ImportError:  # this diffusers lacks the model
            continue
    return table


def _roots(model):
    """The transformers of a pipeline (.transformer, and .transformer_2 of two-expert pipelines
    such as Wan 2.2 A14B), or the model itself."""
    ts = [getattr(model, a, None) for a in ("transformer", "transformer_2")]
    ts = [t for t in ts if isinstance(t, torch.nn.Module)]
    if not ts and not isinstance(model, torch.nn.Module):
        raise _core.Error("FUSEDK_ERR_INVALID_ARGUMENT", f"fusedk.diffusers: model is a {type(model).__name__}, "
                          "expected a diffusers model, one of its blocks, or a pipeline with a .transformer")
    return ts or [model]


def apply(model, ops=None, attention=False):
    """Swaps fusedk's fused forwards into every supported block of `model` (a diffusers
    transformer, one of its blocks, or a pipeline with a .transformer). ops: the fused pieces to
    use (a subset of fusedk.diffusers.OPS; None: all). attention=True: fusedk's attention kernel
    in the patched blocks' attention instead of diffusers' dispatch. Returns a Report: what was
    patched and what was left alone, and why. Applying twice patches nothing new."""
    use = OPS if ops is None else frozenset(ops)
    if not use <= OPS:
        raise _core.Error("FUSEDK_ERR_INVALID_ARGUMENT", f"fusedk.diffusers.apply: ops has {sorted(use - OPS)}, "
                          f"expected names from {sorted(OPS)}")
    if attention not in (True, False):
        raise _core.Error("FUSEDK_ERR_INVALID_ARGUMENT", f"fusedk.diffusers.apply: attention is {attention!r}, "
                          "expected True or False")
    use = use | {"attention"} if attention else use
    table, report, hooked = _patchers(), Report(), 0
    for root in _roots(model):
        for name, m in root.named_modules():
            patcher = table.get(type(m))
            if patcher is None or getattr(m, "_fusedk", None) is not None:
                continue
            chain = _chain(root, name)
            why = _common_why_not(m, chain, lora=patcher.projections(m)) or patcher.why_not(m, root)
            if why:
                report.skipped.append((name or type(m).__name__, type(m).__name__, why))
                hooked += "hooks" in why
                continue
            _patch(m, patcher, Pieces(use), chain)
            report.patched.append((name or type(m).__name__, type(m).__name__))
    if hooked:  # a cache, offloading or casting enabled before apply(): say so where users look
        first = next(f"{n}: {why}" for n, _, why in report.skipped if "hooks" in why)
        warnings.warn(f"fusedk.diffusers.apply: {hooked} blocks left alone (they run their stock forward) because of "
                      f"hooks, e.g. {first}", RuntimeWarning, stacklevel=2)
    return report


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
    weights on the block or above it. A block run as fusedk_diffusers::block reads the rest when
    the operator runs (_ready): the trace reads nothing a LoRA adapter loaded or swapped in place
    changes, and so recompiles nothing (peft's hotswap). Other blocks: a hook inside, or a Linear
    replaced (a LoRA layer) or given new parameters since apply()."""
    for _, mod in st.chain:
        reg = getattr(mod, "_diffusers_hook", None)
        if reg is not None and any(n in _WEIGHT_HOOKS for n in reg.hooks) or hasattr(mod, "_hf_hook"):
            return True
    if st.patcher.opaque:
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
    """Block m fused: its State (weights, the modules inside it, chain: _chain's from its model's
    root to it) and its forward and _apply swapped in."""
    st = patcher.prepare(m, pieces)
    st.patcher, st.links = patcher, _links(m, st.views + st.kept)
    st.subs = [(n, s) for n, s in m.named_modules() if s is not m]
    st.chain = chain
    if patcher.opaque:  # block_op's handle: a tensor, so that blocks of a class share one compiled graph;
        # the same one when the block is prepared again (inside the operator, under inference_mode
        # perhaps): a compiled graph guards on its dispatch keys
        old = getattr(m.__dict__.get("_fusedk"), "handle", None)
        st.handle = old if old is not None and int(old) == id(m) else _new_handle(m)
        if patcher not in _KINDS:
            _KINDS.append(patcher)
        _block_op()  # defined before any trace meets it
    parent = {c: (p, n) for p in m.modules() for n, c in p.named_children()}
    st.mods = [(*parent[lin], lin, lora_signature(lin)) for lin in st.projected]
    m._fusedk = st
    inner = _inner(m)
    if inner is not None:  # diffusers hooks on the block (a block cache, a layer skip): they call the fused forward
        setattr(*inner, types.MethodType(_forward_of(type(m)), m))
    elif "forward" not in vars(m) or _own_forward(m, vars(m)["forward"]):
        m.forward = types.MethodType(_forward_of(type(m)), m)
    m._apply = types.MethodType(_apply_then_fuse, m)


def _new_handle(m):
    """Block m's handle for block_op (its id in a CPU tensor), m registered under it."""
    _BLOCKS[id(m)] = weakref.ref(m)
    with torch.inference_mode(False):
        return torch.tensor(id(m))


def _apply_then_fuse(self, fn, recurse=True):
    """A patched block's nn.Module._apply (what .to(), .cuda(), .half() run): the move, then the
    fused weights made again from the moved parameters at once, so that a model moved after
    apply() is ready for a torch.compile'd first call (which cannot prepare anything)."""
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
    root = st.chain[0][1]  # (not a weak reference: a deep copy's blocks find the copy's root)
    why = moved or (_common_why_not(block, st.chain, patched=True, lora=st.patcher.projections(block))
                    or st.patcher.why_not(block, root))
    if why:
        _warn_once(f"fusedk.diffusers: {type(block).__name__} changed after apply() and runs its stock forward from "
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
        _warn_once(f"fusedk.diffusers: {type(block).__name__} runs its stock forward while {why}; remove the hook "
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
    """Whether the fused weights are still the model's: no Linear replaced (a LoRA layer added
    after apply), no parameter given new storage (.to(), load_state_dict(assign=True)); hooks are
    _marked's. Every block's eager call runs it: the modules' dicts are read directly
    (nn.Module.__getattr__ is the slow path for every attribute). traced: what torch.compile can
    trace of it (identities: no data pointers, no adapter signatures)."""
    return all(parent._modules.get(name) is lin and type(lin) is torch.nn.Linear and lin._parameters.get(attr) is p
               and (traced or p.data_ptr() == ptr) for parent, name, lin, attr, p, ptr in st.links) and (
        traced or all(parent._modules.get(name) is lin and lora_signature(lin) == sig
                      for parent, name, lin, sig in st.mods))


def _checked_forward(self, *args, **kwargs):
    """A patched block's forward: the fused one while apply()'s fused weights are still the
    model's and no hook sits inside the block (both checked eagerly). After a change to the
    weights, the block is prepared again, or runs its stock forward from then on where it no
    longer can be patched (offloading or casting hooks: its fused weights are released); while a
    hook sits on one of its modules (a cache's, a layer skip's), it runs its stock forward, which
    calls them. A warning says why, once."""
    st = self.__dict__.get("_fusedk")
    if st is None or _exporting():  # reverted while a diffusers hook still held this
        # forward; or torch.export, whose programs AOTInductor packages: fusedk's operators are
        # Python custom ops such a package cannot call
        return type(self).forward(self, *args, **kwargs)
    if _traced_hooked(st) if compiling() else not _ready(self):
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


def _warn_once(text):
    """A warning once a process (every block of a class says the same)."""
    if text not in _warned:
        _warned.add(text)
        warnings.warn(text, RuntimeWarning, stacklevel=3)


def revert(model):
    """Undoes apply(): the stock forwards, each parameter in its own storage again. Returns the
    number of blocks reverted."""
    n = 0
    for m in (m for root in _roots(model) for m in root.modules()):
        st = getattr(m, "_fusedk", None)
        if st is None:
            continue
        views = {id(v) for v in st.views}
        for parent, name, lin, attr, p, ptr in st.links:
            if id(p) in views and p.data_ptr() == ptr:  # still a view into the fused weight
                p.data = p.data.clone()
        _unpatch(m)
        n += 1
    for cache in PerForward.every:
        cache.entry = (None, None, None)  # the last forward's tables go with the patch
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


def _common_why_not(m, chain, patched=False, lora=()):
    """Why block m (chain: _chain's from its model's root) cannot be patched whatever its model: a
    reason, or None. lora: the projections the model's fused forward takes (peft LoRA layers among
    them fold in)."""
    inner = _inner(m)
    f = getattr(*inner) if inner is not None else vars(m).get("forward")
    if "forward" in vars(m) and not patched and not _own_forward(m, f):
        return "its forward is replaced by something other than diffusers' hooks"
    subs = [(n, s) for n, s in m.named_modules() if s is not m]
    why = _weight_hooks(chain + subs)  # (hooks inside the block: stock while they are there)
    if why:
        return why
    for name, sub in subs:
        if (hasattr(sub, "lora_A") or hasattr(sub, "base_layer")) and not any(sub is x for x in lora):
            return f"{name} is a LoRA/adapter layer (peft) the fused forward does not take: it would drop it"
    # one dtype, but for the float32 parameters the model keeps so (its _keep_in_fp32_modules, as
    # from_pretrained(torch_dtype=...) loads them): the model's forward handles those; and an
    # adapter's own (cast to the block's once)
    keep = getattr(chain[0][1], "_keep_in_fp32_modules", None) or ()
    dts = {p.dtype for n, p in m.named_parameters() if not (p.dtype == torch.float32 and any(k in n for k in keep))
           and ".lora_" not in f".{n}"}
    if not dts <= {torch.float32, torch.float16, torch.bfloat16} or len(dts) > 1:
        return f"its parameters have dtypes {sorted(str(d) for d in dts)}, expected one of float32, float16, bfloat16"
    return None


def linears_why_not(lins, lora=False):
    """Why the fused forward cannot take these as plain torch.nn.Linear layers (quantized layers
    compute otherwise) or, with lora, peft LoRA layers over them: a reason, or None."""
    for x in lins:
        why = lora_of(x) if lora else (None if type(x) is torch.nn.Linear else
                                       f"{type(x).__name__} where a torch.nn.Linear is expected")
        if isinstance(why, str):
            return why
    return None


def _peft_linear():
    try:
        from peft.tuners.lora.layer import Linear
        return Linear
    except ImportError:  # no peft: no LoRA layers to meet
        return None


def lora_of(lin):
    """A projection as a fused forward takes it: (its base nn.Linear, its active LoRA adapters as
    [(a [r, K], b [N, r], scaling)]) for an nn.Linear (no adapters) or a peft LoRA Linear over one
    (merged or disabled: none); or why it cannot be taken (a str)."""
    if type(lin) is torch.nn.Linear:
        return lin, []
    peft_linear = _peft_linear()
    if peft_linear is None or type(lin) is not peft_linear:
        return f"{type(lin).__name__} where a torch.nn.Linear (or peft's LoRA Linear over one) is expected"
    base = lin.base_layer
    if type(base) is not torch.nn.Linear:
        return f"a peft LoRA layer over {type(base).__name__}, expected over a torch.nn.Linear"
    if lin.disable_adapters and lin.merged:
        return "a merged LoRA is disabled (peft unmerges it at its next forward): run it once, or unmerge first"
    if lin.disable_adapters or lin.merged:
        return base, []
    out = []
    for ad in lin.active_adapters:
        if ad not in lin.lora_A:
            continue
        A, B, drop = lin.lora_A[ad], lin.lora_B[ad], lin.lora_dropout[ad]
        if ad in getattr(lin, "lora_variant", {}) or getattr(lin, "use_dora", {}).get(ad, False):
            return f"LoRA adapter {ad!r} is a variant (DoRA, ...) the fused GEMM does not compute"
        if type(A) is not torch.nn.Linear or type(B) is not torch.nn.Linear or A.bias is not None or B.bias is not None:
            return f"LoRA adapter {ad!r} has a bias or non-Linear factors"
        if not (type(drop) is torch.nn.Identity or (type(drop) is torch.nn.Dropout and (drop.p == 0 or not drop.training))):
            return f"LoRA adapter {ad!r} has dropout in training mode"
        if not A.weight.is_floating_point() or A.weight.device != base.weight.device:
            return f"LoRA adapter {ad!r} is on {A.weight.device} in {A.weight.dtype}, the base on {base.weight.device}"
        out.append((A.weight, B.weight, float(lin.scaling[ad])))
    return base, out


def lora_signature(lin):
    """What a projection's LoRA state is made of (None for a plain Linear): a change to it after
    apply (set_adapters, another adapter, fuse_lora, disable, new weights) prepares the block again."""
    if type(lin) is torch.nn.Linear:
        return None
    d = lin.__dict__  # peft's own state, read without nn.Module.__getattr__ (checked every eager call)
    return (d.get("_disable_adapters"), tuple(d.get("merged_adapters", ())), str(d.get("_active_adapter")),
            tuple(d["scaling"].items()), tuple((k, w.data_ptr(), w._version) for f in ("lora_A", "lora_B")
                                               for k, m in lin._modules[f]._modules.items()
                                               for w in (m._parameters["weight"],)),
            tuple(m.training for m in lin._modules["lora_dropout"]._modules.values()))


def lora_width(lins):
    """The h columns one GEMM over these projections takes: their adapters, each r rounded up to 8
    (all of them at the largest rank's)."""
    ads = [ad for p in map(lora_of, lins) if not isinstance(p, str) for ad in p[1]]
    return len(ads) * ((max((a.shape[0] for a, _, _ in ads), default=0) + 7) // 8 * 8)


def attention_why_not(attn, processor):
    """The checks every model's attention takes: exactly its stock processor (IP-adapter and custom
    processors compute otherwise), no context parallelism, projections not fused by diffusers, no
    output dropout: a reason, or None."""
    p = attn.processor
    if type(p) is not processor:
        return f"attention processor {type(p).__name__}, expected {processor.__name__}"
    if getattr(p, "_parallel_config", None) is not None:
        return "context-parallel attention"
    if getattr(attn, "fused_projections", False):
        return "diffusers' fuse_qkv_projections() is on (unfuse_qkv_projections() first)"
    out = getattr(attn, "to_out", None)
    if out is not None and len(out) > 1 and (type(out[1]) is not torch.nn.Dropout or out[1].p != 0):
        return "attention output dropout p > 0"
    return None


class Patcher:
    """How one block class is patched: why_not(block, model) -> a reason or None, prepare(block,
    pieces) -> its State, forward(block, ...) the fused forward; projections(block): the modules
    the fused forward runs as projections (where peft LoRA layers may fold in; none by default);
    opaque: (run(block, tensors) -> [tensors], shapes(tensors) -> [empty tensors], stock(block,
    tensors) -> run's outputs by the stock forward), the fused forward as one operator under
    torch.compile (block_op), or None."""

    def __init__(self, why_not, prepare, forward, projections=None, opaque=None):
        self.why_not, self.prepare, self.forward = why_not, prepare, forward
        self._projections, self.opaque = projections, opaque  # opaque: (run, shapes) for block_op

    def projections(self, m):
        return self._projections(m) if self._projections else ()


class State:
    """What a patched block keeps: its pieces, its fused weights (w_<name>, b_<name>) and the
    parameters apply() made views into them."""

    def __init__(self, pieces):
        self.k, self.views, self.projected, self.p = pieces, [], [], {}
        self.kept = []  # parameters a Proj holds as they are (no view made): checked as the views are

    def __deepcopy__(self, memo):
        """A deep copy of the model: its blocks' States, the patcher shared (block_op's kind is its
        place in _KINDS), the handle naming the copied block (chain's last module)."""
        new = memo[id(self)] = type(self).__new__(type(self))
        for name, value in self.__dict__.items():
            setattr(new, name, value if name == "patcher" else copy.deepcopy(value, memo))
        if "handle" in new.__dict__:
            new.handle = _new_handle(new.chain[-1][1])
        return new

    def fuse(self, name, lins):
        """One GEMM's weight and bias for the nn.Linear modules lins: w_<name>, b_<name>."""
        w, b, views = fuse_linears(lins)
        setattr(self, "w_" + name, w)
        setattr(self, "b_" + name, b)
        self.views += views
        return w

    def proj(self, name, lins):
        """p[name]: one GEMM for the projections lins (nn.Linear or peft LoRA layers over one), their
        adapters folded in (Proj)."""
        P, views = fuse_projections(lins)
        self.p[name], self.views, self.projected = P, self.views + views, self.projected + list(lins)
        ids = {id(v) for v in self.views}
        self.kept += [t for t in (P.w, P.b) if isinstance(t, torch.nn.Parameter) and id(t) not in ids]
        return P

    def self_attention(self, attn, head_dim):
        """The self-attention's q, k, v as one GEMM (w_qkv, b_qkv), its heads, head dim and q/k norm eps."""
        self.fuse("qkv", [attn.to_q, attn.to_k, attn.to_v])
        self.heads, self.dh = attn.heads, head_dim
        self.eps_qk = eps_of(attn.norm_q, self.w_qkv.dtype)


def eps_of(norm, dtype):
    """A norm module's eps (None: torch's default, the dtype's machine epsilon)."""
    return norm.eps if norm.eps is not None else torch.finfo(dtype).eps


def gelu_ff_why_not(ff):
    """Why diffusers' FeedForward ff is not Linear + GELU(tanh) + Linear (what linear's epilogue
    and a second linear run): a reason, or None."""
    from diffusers.models.activations import GELU
    net = list(ff.net)
    if len(net) != 3 or type(net[0]) is not GELU or net[0].approximate != "tanh":
        return "feed-forward is not Linear + GELU(tanh) + Linear"
    if type(net[1]) is not torch.nn.Dropout or net[1].p != 0:
        return "feed-forward dropout p > 0"
    return None


def dispatch_attention(attn, q, k, v):
    """[B, S, H, Dh] in and out, through diffusers' dispatch with the processor's backend."""
    from diffusers.models.attention_dispatch import dispatch_attention_fn
    p = attn.processor
    return dispatch_attention_fn(q, k, v, attn_mask=None, backend=p._attention_backend,
                                 parallel_config=p._parallel_config)


def rows(t):
    """t as linear takes it: rows evenly spaced (a slice of a joint sequence is, for B = 1)."""
    return t if t.shape[0] == 1 or t.is_contiguous() else t.contiguous()


def linear_parts(lin):
    """(weight, bias) of an nn.Linear exactly (not a subclass: quantized and LoRA layers differ)."""
    if type(lin) is not torch.nn.Linear:
        raise TypeError(f"{type(lin).__name__} is not a plain torch.nn.Linear")
    return lin.weight, lin.bias


def fuse_linears(lins, into=None):
    """One [sum N, K] weight (and bias) for the nn.Linear modules `lins`, each module's own weight
    and bias then a view into it: the same values, no extra memory. into: a [sum N, K + extra]
    buffer whose first K columns take the weights (linear_lowrank's w_cat). Returns (w, b, views)."""
    ws = [linear_parts(m)[0] for m in lins]
    bs = [m.bias for m in lins]
    if len({b is None for b in bs}) > 1:
        raise TypeError("some of the fused projections have a bias and some not")
    with torch.no_grad():
        w = torch.cat([x.detach() for x in ws]) if into is None else into[:, :ws[0].shape[1]]
        if into is not None:
            w.copy_(torch.cat([x.detach() for x in ws]))
        b = torch.cat([x.detach() for x in bs]) if all(x is not None for x in bs) else None
    views, row = [], 0
    for m, x, y in zip(lins, ws, bs):
        n = x.shape[0]
        x.data = w[row:row + n]
        views.append(x)
        if b is not None:
            y.data = b[row:row + n]
            views.append(y)
        row += n
    return w, b, views


class Proj:
    """A projection's GEMM: w [N, K] and bias b (None) of the base layers; with adapters, w_cat
    [N, K + A rp] (w its first K columns) and a [A, r, K] for linear_lowrank, else None."""

    def __init__(self, w, b, w_cat=None, a=None):
        self.w, self.b, self.w_cat, self.a = w, b, w_cat, a


def fuse_projections(lins):
    """A Proj for the projections lins (their rows in order): fuse_linears' [sum N, K] weight when no
    adapter is active; else w_cat = [w | s_q b_q (in its projection's rows, 0 elsewhere) | 0 ...]
    by lowrank_prepare's layout, fuse_linears' weight its first K columns. Returns (Proj, views)."""
    parts = [lora_of(x) for x in lins]
    bases = [p[0] for p in parts]
    slots = [(i, A, B, s) for i, (_, ads) in enumerate(parts) for A, B, s in ads]
    if not slots:
        if len(bases) == 1:
            return Proj(bases[0].weight, bases[0].bias), []
        w, b, views = fuse_linears(bases)
        return Proj(w, b), views
    w0 = bases[0].weight
    K, dt, ns = w0.shape[1], w0.dtype, [x.weight.shape[0] for x in bases]
    r = max(A.shape[0] for _, A, _, _ in slots)
    rp = (r + 7) // 8 * 8
    with torch.no_grad():
        w_cat = w0.new_zeros(sum(ns), K + len(slots) * rp)
        a = w0.new_zeros(len(slots), r, K)
        row0 = [sum(ns[:i]) for i in range(len(ns))]
        for q, (i, A, B, s) in enumerate(slots):
            a[q, :A.shape[0]] = A.detach().to(dt)
            w_cat[row0[i]:row0[i] + ns[i], K + q * rp:K + q * rp + B.shape[1]] = (B.detach().float() * s).to(dt)
    w, b, views = fuse_linears(bases, into=w_cat)
    return Proj(w, b, w_cat, a), views


def _act_out(y, act, out):
    """The stock expression's tail: act (none or gelu_tanh), then into out when given."""
    if act == "gelu_tanh":
        y = torch.nn.functional.gelu(y, approximate="tanh")
    elif act != "none":
        raise ValueError(act)
    if out is not None:
        out.copy_(y)
        return out
    return y


class Pieces:
    """The fused pieces a patched forward calls: fusedk's op where `use` names it, else the
    stock torch expression (the same formula, in the block's dtype)."""

    def __init__(self, use):
        self.use = use
        import fusedk
        self.fk = fusedk

    def __getstate__(self):  # copy.deepcopy and pickle of a patched model: modules do not pickle
        return {"use": self.use}

    def __setstate__(self, state):
        self.__init__(state["use"])

    def adaln(self, x, scale, shift, eps, norm="layer", out=None):
        if "adaln" in self.use:
            return self.fk.adaln(x, scale, shift, norm=norm, eps=eps, out=out)
        n = (torch.nn.functional.layer_norm(x, x.shape[-1:], eps=eps) if norm == "layer"
             else torch.nn.functional.rms_norm(x, x.shape[-1:], eps=eps))
        return _act_out(n * (1 + scale[:, None]) + shift[:, None], "none", out)

    def room(self, P, like):
        """Where Proj P has adapters and runs as linear_lowrank: a [*like's leading dims, K + A rp]
        buffer for its input, whose producer writes x into the first K columns (out=); the GEMM
        then reads x there, h beside it, without linear_lowrank copying x. Else None."""
        if P.a is None or "linear" not in self.use:
            return None
        return like.new_empty(*like.shape[:-1], P.w_cat.shape[1])

    def linear(self, x, w, b=None, act="none", out=None):
        if "linear" in self.use:
            return self.fk.linear(x, w, b, act=act, out=out)
        return _act_out(torch.nn.functional.linear(x, w, b), act, out)

    def proj(self, x, P, act="none", out=None):
        """x through Proj P: linear, or with adapters linear_lowrank (the stock expression: the base
        linear plus each adapter's (x a_q^T) (s b_q)^T, in the block's dtype)."""
        if P.a is None:
            return self.linear(x, P.w, P.b, act=act, out=out)
        if "linear" in self.use:
            return self.fk.linear_lowrank(x, P.w_cat, P.a, P.b, act=act, out=out)
        A, r, K = P.a.shape
        rp = (r + 7) // 8 * 8
        sb = P.w_cat[:, K:].unflatten(1, (A, rp))[:, :, :r].flatten(1)  # [N, A r]
        F = torch.nn.functional
        return _act_out(F.linear(x, P.w, P.b) + F.linear(F.linear(x, P.a.flatten(0, 1)), sb), act, out)

    def fused_attention(self, q):
        """Whether attention(q, ...) runs fusedk's kernel: apply(attention=True), and a call it
        takes (any CPU tensor; f16/bf16 and Dh <= 256 on the GPU)."""
        return "attention" in self.use and (q.device.type == "cpu" or (
            q.dtype in (torch.float16, torch.bfloat16) and q.shape[-1] <= 256))

    def attention(self, attn, q, k, v, kv_len=None):
        """q [B, Sq, H, Dh], k, v [B, Sk, H, Dh] -> [B, Sq, H, Dh]: fusedk's kernel where
        fused_attention(q), else diffusers' dispatch with the processor's backend. kv_len (int32
        [B]: keys at or past it masked) only where fused_attention(q)."""
        if self.fused_attention(q):
            return self.fk.attention(q, k, v, kv_len=kv_len)
        if kv_len is not None:
            raise ValueError("kv_len needs fusedk's attention")
        return dispatch_attention(attn, q, k, v)

    def gated_residual(self, x, y, gate, out=None):
        if "gated_residual" in self.use:
            return self.fk.gated_residual(x, y, gate, out=out)
        r = x + gate[:, None] * y
        if out is not None:
            out.copy_(r)
            return out
        return r

    def qk_norm_rope(self, qkv, cos, sin, wq, wk, eps, out=None, norm="head", style="interleaved"):
        """qkv [B, S, 3, H, Dh] (or a tuple q, k, v of [B, S, H, Dh] views) -> q, k, v [B, S, H, Dh]:
        RMSNorm of q and k (norm "head": over Dh, "full": over H*Dh, "none") with weights, then
        RoPE (style "interleaved": pairs (2i, 2i+1), "half": (i, i + R/2); tables [S, R/2],
        [S, H, R/2] or [B, S, H, R/2] float32, R <= Dh: the first R channels rotate)."""
        if "qk_norm_rope" in self.use:
            return self.fk.qk_norm_rope(qkv, cos, sin, q_weight=wq, k_weight=wk, eps=eps, norm=norm,
                                        style=style, layout="bshd", rotary_dim=2 * cos.shape[-1], out=out)
        q, k, v = qkv if isinstance(qkv, (tuple, list)) else qkv.unbind(2)
        res = [_rope(_rms(t, w, eps, norm), cos, sin, style) for t, w in ((q, wq), (k, wk))] + [v]
        if out is None:
            return tuple(t.contiguous() for t in res)
        for o, t in zip(out, res):
            o.copy_(t)
        return out

    def glu(self, x, act, act_half):
        """x[..., 2H] -> act(the act_half half) * the other half (silu, gelu, gelu_tanh)."""
        if "glu" in self.use:
            return self.fk.glu(x, act, act_half)
        a, b = x.chunk(2, -1)
        g, v = (a, b) if act_half == "first" else (b, a)
        f = {"silu": torch.nn.functional.silu, "gelu": torch.nn.functional.gelu,
             "gelu_tanh": lambda t: torch.nn.functional.gelu(t, approximate="tanh")}[act]
        return v * f(g)

    def residual_tanh_gated_rmsnorm(self, x, x_res, gate, eps):
        """Mochi: x + (x_res.float() * rsqrt(mean(x_res.float()^2) + eps) * tanh(gate)).type_as(x),
        PyTorch's rounding points (exact mode)."""
        if "residual_tanh_gated_rmsnorm" in self.use:
            return self.fk.residual_tanh_gated_rmsnorm(x, x_res, gate, eps=eps, exact=True)
        xf = x_res.float()
        n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps) * torch.tanh(gate).float()[:, None]
        return x + n.type_as(x)


def _rms(t, w, eps, norm):
    if norm == "none":
        return t
    if norm == "head":
        return torch.nn.functional.rms_norm(t, t.shape[-1:], w, eps)
    flat = t.flatten(-2)
    return torch.nn.functional.rms_norm(flat, flat.shape[-1:], w, eps).unflatten(-1, t.shape[-2:])


def _rope(x, cos, sin, style):
    """x [B, S, H, Dh] rotated by half tables [S, R/2] (or [B, S, H, R/2]), float32 math: the first
    R channels, pairs (2i, 2i+1) for "interleaved" (diffusers' apply_rotary_emb, use_real, unbind
    -1), (i, i + R/2) for "half"; the rest pass through."""
    R = 2 * cos.shape[-1]
    c, s = {2: (cos[None, :, None], sin[None, :, None]), 3: (cos[None], sin[None])}.get(cos.dim(), (cos, sin))
    xr = x[..., :R].float()
    if style == "interleaved":
        c, s = c.repeat_interleave(2, -1), s.repeat_interleave(2, -1)
        re, im = xr.unflatten(-1, (-1, 2)).unbind(-1)
        rot = torch.stack([-im, re], -1).flatten(-2)
    else:
        c, s = torch.cat([c, c], -1), torch.cat([s, s], -1)
        a, b = xr.chunk(2, -1)
        rot = torch.cat([-b, a], -1)
    return torch.cat([(xr * c + rot * s).to(x.dtype), x[..., R:]], -1)


_warned = set()


def records_grad(m, *inputs):
    """Whether autograd would record block m's forward on these inputs (the fused forward then
    gives way to the stock one, with a warning once per block class)."""
    if not torch.is_grad_enabled():
        return False
    if not any(t is not None and t.requires_grad for t in inputs) and not any(p.requires_grad for p in m.parameters()):
        return False
    cls = type(m).__name__
    if cls not in _warned:
        _warned.add(cls)
        warnings.warn(f"fusedk.diffusers: {cls} runs its stock forward while autograd records (fusedk's fused "
                      "forwards have no backward); use torch.no_grad() or torch.inference_mode() for inference",
                      RuntimeWarning, stacklevel=3)
    return True


def compiling():
    """Whether torch.compile traces this call (no host syncs, no data pointers)."""
    return torch.compiler.is_compiling()


def _exporting():
    """Whether torch.export (non-strict, its default) runs this call: is_exporting() alone is true
    under torch.compile's tracing too."""
    return torch.compiler.is_exporting() and not torch.compiler.is_dynamo_compiling()


# Under torch.compile a model may run each patched block as one operator, fusedk_diffusers::block:
# the graph then calls the fused forward once a block, as eager code does, instead of each fusedk
# call through its own custom operator (each a dispatch into Python, and Inductor's copies around
# out= writes into views of the block's buffers).
_BLOCKS = {}  # id of a patched block -> a weak reference to it
_KINDS = []  # the patchers with an opaque form: their index is the operator's `kind`
_BLOCK_OP = []


def block_op(st, xs):
    """The patched block of State st run as one operator on tensors xs: its patcher's run(block, xs)
    -> [tensors], its fake outputs shapes(xs) -> [empty tensors]. The block is named by a CPU
    tensor holding its id (an int would be a constant of the graph: a recompile a block)."""
    return _BLOCK_OP[0](_KINDS.index(st.patcher), st.handle, xs)


def _block_op():
    if not _BLOCK_OP:
        # cudagraph_unsafe: Inductor's CUDA graphs (mode="reduce-overhead") run around the operator,
        # not through it: a replay would skip its checks (adapters swapped in place since the
        # capture) and a block prepared again inside a capture would take its weights from the
        # graph's private pool
        tags = (torch.Tag.cudagraph_unsafe,) if hasattr(torch.Tag, "cudagraph_unsafe") else ()

        @torch.library.custom_op("fusedk_diffusers::block", mutates_args=(), tags=tags)
        def block(kind: int, handle: torch.Tensor, xs: list[torch.Tensor]) -> list[torch.Tensor]:
            m = _BLOCKS[int(handle)]()
            # the operator runs eagerly: what the trace could not check (new weights, adapters
            # swapped in place, hooks) is checked here, as an eager call does
            if not _ready(m):
                return _KINDS[kind].opaque[2](m, xs)  # the block's stock forward
            return m._fusedk.patcher.opaque[0](m, xs)

        @block.register_fake
        def _(kind, handle, xs):
            return _KINDS[kind].opaque[1](xs)
        _BLOCK_OP.append(block)
    return _BLOCK_OP[0]


class PerForward:
    """What a patched forward derives from an object every block of one model forward gets (the
    rope tables' tuple): made by the first block, kept with that object (and `extra`) until
    another comes, so once a forward. Eager only: under torch.compile each trace makes its own."""

    every = []

    def __init__(self):
        self.entry = (None, None, None)  # (object, extra, value): one tuple, read and set at once
        PerForward.every.append(self)

    def get(self, obj, extra, make):
        if compiling():
            return make()
        key, ex, value = self.entry
        if key is not obj or ex != extra:
            value = make()
            self.entry = (obj, extra, value)
        return value


def embedding_why_not(root, attr, cls, tables):
    """Why root's position embedding (root.<attr>) is not `cls`, whose tables the fused forward
    converts (described by `tables`): a reason, or None (no model root: a block patched alone)."""
    pe = getattr(root, attr, None)
    if pe is not None and type(pe) is not cls:
        return f"position embedding {type(pe).__name__}, expected {cls.__name__} ({tables})"
    return None
