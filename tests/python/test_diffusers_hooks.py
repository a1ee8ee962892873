"""fusedk.diffusers with diffusers' own hooks (diffusers.hooks: the caches, layer skip, layerwise
casting, group offloading; dit_hooks.py), each enabled before and after apply(): over three
denoising steps a patched model gives what the stock model with the same hook gives (the cached or
skipped computation honoured). A hook on whole blocks keeps them fused; a hook inside a block or one
that moves the weights makes those blocks run their stock forward, with one warning; a block whose
cache is disabled runs fused again."""
import copy
import warnings

import pytest

pytest.importorskip("torch")
pytest.importorskip("diffusers")
import fusedk.diffusers as fd  # noqa: E402
import torch  # noqa: E402
from dit_hooks import HOOKS, Steps  # noqa: E402
from test_diffusers import DEVICES, MODELS  # noqa: E402  (its module-level skips apply here too)

STEPS = (1000, 500, 400)


def denoise(mod, model, xs, steps):
    """Three steps as a pipeline runs them (a cache context around each call; the timestep the
    caches' callbacks read), the latent moving between them: the outputs."""
    outs = []
    for t, x in zip(STEPS, xs):
        steps.t = t
        with torch.no_grad(), model.cache_context("cond"):
            outs.append(mod.output(model(**x)).float())
    return outs


def fused_blocks(mod, model):
    return sum(getattr(b, "_fusedk", None) is not None for b in mod.blocks(model))


@pytest.mark.parametrize("when", ["before", "after"])
@pytest.mark.parametrize("hook", sorted(HOOKS))
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_hook_is_honoured(name, device, hook, when):
    enable, how = HOOKS[hook]
    mod = MODELS[name]
    torch.manual_seed(0)
    base = mod.build().to(device).eval()  # float32: patched and stock agree to rounding
    x = mod.inputs(base, device)
    g = torch.Generator().manual_seed(7)
    xs = [x] + [dict(x, hidden_states=x["hidden_states"] + 0.05 * k * torch.randn(
        x["hidden_states"].shape, generator=g).to(device)) for k in (1, 2)]
    stock, patched, plain = copy.deepcopy(base), copy.deepcopy(base), copy.deepcopy(base)
    ss, ps = Steps(), Steps()
    try:
        enable(stock, ss)
    except (AttributeError, ValueError, NotImplementedError, TypeError) as e:  # diffusers' own limits
        pytest.skip(f"diffusers does not take {hook} on {name}: {type(e).__name__}: {e}")
    want = denoise(mod, stock, xs, ss)
    fd._warned.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        if when == "before":
            enable(patched, ps)
            report = fd.apply(patched)
        else:
            report = fd.apply(patched)
            enable(patched, ps)
        got = denoise(mod, patched, xs, ps)
    said = [str(m.message) for m in w if "fusedk.diffusers" in str(m.message)]
    for k, (a, b) in enumerate(zip(got, want)):
        err = ((a - b).norm() / b.norm()).item()
        assert err < 1e-4, (hook, when, "step", k, err, report)
    if how == "fused":
        assert fused_blocks(mod, patched) == len(mod.blocks(patched)) and not report.skipped, report
        assert not said, said
    else:  # said once (a block class, a reason); at apply() when it left blocks alone. (A block a skip
        # hook never calls, or one a cache does not hook on this model, has nothing to say.)
        assert len(set(said)) == len(said) and all("hook" in s for s in said), said
        assert said or not report.skipped, report
    if hasattr(patched, "disable_cache") and patched.is_cache_enabled and when == "after":
        patched.disable_cache()  # the hooks are gone: the fused forward again, where it was left patched
        before = fused_blocks(mod, patched)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            again = denoise(mod, patched, xs[:1], ps)[0]
        clean = denoise(mod, plain, xs[:1], Steps())[0]
        assert ((again - clean).norm() / clean.norm()).item() < 1e-4
        assert not [m for m in w if "fusedk.diffusers" in str(m.message)] and fused_blocks(mod, patched) == before


def test_hooks_change_what_the_model_computes():
    """The comparisons above can fail: with these settings each cache and skip changes the output of
    at least one step against the model without it (text_kv_cache on these models, and offloading
    compute the same by design; layerwise casting and SeaCache are left out: at these sizes casting's
    float8 round trip and SeaCache's three steps change nothing measurable here)."""
    name = "flux" if "flux" in MODELS else sorted(MODELS)[0]
    mod = MODELS[name]
    torch.manual_seed(0)
    base = mod.build().eval()
    x = mod.inputs(base, "cpu")
    xs = [x] + [dict(x, hidden_states=x["hidden_states"] + 0.05 * k * torch.ones_like(x["hidden_states"]))
                for k in (1, 2)]
    plain = denoise(mod, base, xs, Steps())
    for hook, (enable, _) in sorted(HOOKS.items()):
        if hook in ("text_kv_cache", "group_offload_blocks", "group_offload_leaves", "layerwise_casting", "sea_cache"):
            continue
        model, steps = copy.deepcopy(base), Steps()
        try:
            enable(model, steps)
        except (AttributeError, ValueError, NotImplementedError, TypeError):
            continue
        got = denoise(mod, model, xs, steps)
        assert any(a.shape != b.shape or not torch.allclose(a, b, atol=1e-5) for a, b in zip(got, plain)), hook


@pytest.mark.parametrize("hook", ["pyramid_attention_broadcast", "first_block_cache", "faster_cache"])
@pytest.mark.parametrize("device", DEVICES)
def test_a_hook_is_honoured_under_compile(device, hook):
    """torch.compile(model) of a patched model with a hook inside its blocks (PAB, FasterCache: the
    traced forward reads the hooks and runs stock) or on whole blocks (FirstBlockCache: fused), over
    three steps, against the stock model with the same hook run eagerly"""
    name = "flux" if "flux" in MODELS else sorted(MODELS)[0]
    enable, mod = HOOKS[hook][0], MODELS[name]
    torch.manual_seed(0)
    base = mod.build().to(device).eval()
    x = mod.inputs(base, device)
    xs = [x] + [dict(x, hidden_states=x["hidden_states"] + 0.05 * k) for k in (1, 2)]
    stock, patched = copy.deepcopy(base), copy.deepcopy(base)
    ss, ps = Steps(), Steps()
    enable(stock, ss)
    fd.apply(patched)
    enable(patched, ps)
    want = denoise(mod, stock, xs, ss)
    torch._dynamo.reset()
    got = denoise(mod, torch.compile(patched), xs, ps)
    torch._dynamo.reset()
    for k, (a, b) in enumerate(zip(got, want)):
        assert ((a - b).norm() / b.norm()).item() < 1e-4, (hook, k)
