"""A pytest plugin for diffusers' own test suite: every Flux, LTX-Video, Mochi and Wan transformer
gets fusedk.diffusers.apply() right after its construction (its __init__, which from_pretrained and
from_config go through too), as a user's one call would. tools/diffusers_suite.sh loads it with
`-p diffusers_apply` (tools/ on PYTHONPATH) to run the same tests on stock and on patched models."""
import functools

COUNT = {"models": 0, "blocks": 0}
MODELS = ("FluxTransformer2DModel", "LTXVideoTransformer3DModel", "MochiTransformer3DModel", "WanTransformer3DModel")


def _applied(init):
    @functools.wraps(init)  # diffusers reads the config's names off __init__'s signature
    def init_then_apply(self, *args, **kwargs):
        init(self, *args, **kwargs)
        import fusedk.diffusers
        report = fusedk.diffusers.apply(self)
        COUNT["models"] += 1
        COUNT["blocks"] += len(report.patched)
    init_then_apply.fusedk = True
    return init_then_apply


def pytest_configure(config):
    import diffusers
    for name in MODELS:
        cls = getattr(diffusers, name, None)
        if cls is not None and not getattr(cls.__init__, "fusedk", False):
            cls.__init__ = _applied(cls.__init__)


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"fusedk.diffusers.apply: {COUNT['models']} models built, {COUNT['blocks']} blocks "
                                "patched")
