"""One weight-fusion path for every model's projections: the nn.Linear layers a block runs as
one GEMM (its q, k, v; a modulation for two streams) concatenated once, with peft LoRA layers over
them folded in (w_cat = [w | s_1 b_1 | s_2 b_2 ...], run by linear_lowrank).

A model file describes its block's GEMMs as groups, {name: [its projections, rows in order]};
groups_why_not says whether they can be fused, State.proj (one a group) makes each a Proj, and
the fused forward runs it with Pieces.proj. The op that makes a projection's input writes it,
where the projection has adapters, into a buffer with room for their h (normed, feed_forward), so
that linear_lowrank reads it in place instead of copying it."""
import torch


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
        for f in (A, B):
            if not f.weight.is_floating_point() or f.weight.device != base.weight.device:
                return f"LoRA adapter {ad!r} is on {f.weight.device} in {f.weight.dtype}, the base on {base.weight.device}"
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


def groups_why_not(groups):
    """Why a block's GEMMs cannot be fused ({name: projections}, as a model file describes them): a
    projection that is neither an nn.Linear nor a peft LoRA layer over one (or an adapter a GEMM
    does not compute), a bias on some of one GEMM's projections only, more LoRA columns than one
    GEMM takes. A reason, or None."""
    why = linears_why_not([x for lins in groups.values() for x in lins], lora=True)
    if why:
        return why
    for name, lins in groups.items():
        if len({lora_of(x)[0].bias is None for x in lins}) > 1:
            return f"the projections of its {name} GEMM: some have a bias and some not"
        if lora_width(lins) > 128:
            return (f"the LoRA adapters of its {name} GEMM take {lora_width(lins)} columns (A times r rounded up "
                    "to 8), expected at most 128")
    return None


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
    [N, K + A rp] (w its first K columns) and a [A, r, K] for linear_lowrank, else None. w8: w as an
    8-bit ScaledTensor (apply(precision="fp8"): a scale an output channel; e4m3, or int8 for the
    modulation), else None."""

    def __init__(self, w, b, w_cat=None, a=None):
        self.w, self.b, self.w_cat, self.a, self.w8 = w, b, w_cat, a, None


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


def normed(k, P, x, scale, shift, eps, norm="layer"):
    """adaln(x) (Pieces k) as Proj P's input: into a buffer with room for P's h where P has
    adapters; an FP8 ScaledTensor where P runs in FP8 (adaln_fp8: no quantization pass)."""
    if k.fp8(P):
        return k.adaln(x, scale, shift, eps, norm=norm, fp8=True)
    buf = k.room(P, x)
    n = k.adaln(x, scale, shift, eps, norm=norm, out=None if buf is None else buf[..., :x.shape[-1]])
    return n if buf is None else buf


def feed_forward(k, n, p1, p2, act="gelu_tanh", glu_half=None):
    """p2(act(p1(n))) through Projs p1, p2 (Pieces k): act in p1's GEMM epilogue, or with glu_half
    a gated unit (p1's output twice as wide, act on that half; in FP8 where p2 runs in FP8). What
    p2 reads is written with room for its adapters' h where it has some."""
    hb = k.room(p2, n)
    h = None if hb is None else hb[..., :p2.w.shape[1]]
    if glu_half is None:
        h = k.proj(n, p1, act=act, out=h)
    else:
        h = k.glu(k.proj(n, p1), act, glu_half, out=h, fp8=hb is None and k.fp8(p2))
    return k.proj(h if hb is None else hb, p2)
