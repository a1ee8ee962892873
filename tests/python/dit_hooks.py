"""diffusers' hooks as users turn them on (diffusers.hooks, 0.42): each entry enables one on a model
and says what a run of it needs (the denoising step's timestep some caches read). Shared by
test_diffusers_hooks.py (CPU and GPU)."""
import torch


class Steps:
    """The timestep a cache's callback reads, set before each step by the test."""

    def __init__(self):
        self.t = 1000

    def __call__(self):
        return self.t


def _cache(make):
    def enable(model, steps):
        model.enable_cache(make(steps))
    return enable


def _faster(steps):
    from diffusers import FasterCacheConfig
    return FasterCacheConfig(spatial_attention_block_skip_range=2, spatial_attention_timestep_skip_range=(-1, 901),
                             tensor_format="BCHW", current_timestep_callback=steps, is_guidance_distilled=True)


def _pab(steps):
    from diffusers import PyramidAttentionBroadcastConfig
    return PyramidAttentionBroadcastConfig(spatial_attention_block_skip_range=2, current_timestep_callback=steps)


def _fbc(steps):
    from diffusers import FirstBlockCacheConfig
    return FirstBlockCacheConfig(threshold=1.0)


def _mag(steps):
    from diffusers import MagCacheConfig
    return MagCacheConfig(num_inference_steps=3, retention_ratio=0.0, threshold=100.0, mag_ratios=[1.0, 1.0, 1.0])


def _sea(steps):
    from diffusers.hooks import SeaCacheConfig
    return SeaCacheConfig(threshold=100.0, retention_steps=1, max_consecutive_cached=2)


def _taylor(steps):
    from diffusers import TaylorSeerCacheConfig
    return TaylorSeerCacheConfig(cache_interval=2, disable_cache_before_step=1, max_order=1, taylor_factors_dtype=None)


def _text_kv(steps):
    from diffusers.hooks import TextKVCacheConfig
    return TextKVCacheConfig()


def _layer_skip(attention, ff):
    def enable(model, steps):
        from diffusers.hooks import LayerSkipConfig, apply_layer_skip
        apply_layer_skip(model, LayerSkipConfig(indices=[0], fqn="auto", skip_attention=attention, skip_ff=ff))
    return enable


def _casting(model, steps):
    model.enable_layerwise_casting(storage_dtype=torch.float8_e4m3fn, compute_dtype=next(model.parameters()).dtype)


def _offload(kind):
    def enable(model, steps):
        dev = next(model.parameters()).device
        model.enable_group_offload(dev, offload_device=torch.device("cpu"), offload_type=kind,
                                   **({"num_blocks_per_group": 1} if kind == "block_level" else {}))
    return enable


# name: (enable(model, steps), how the fused blocks take it: "fused" where the hook sits on whole
# blocks (they call the fused forward, or skip it), "stock" where it sits inside blocks or moves
# the weights (those blocks run their stock forward, with a warning))
HOOKS = {
    "faster_cache": (_cache(_faster), "stock"),
    "pyramid_attention_broadcast": (_cache(_pab), "stock"),
    "first_block_cache": (_cache(_fbc), "fused"),
    "mag_cache": (_cache(_mag), "fused"),
    "sea_cache": (_cache(_sea), "fused"),
    "taylorseer_cache": (_cache(_taylor), "stock"),
    "text_kv_cache": (_cache(_text_kv), "fused"),
    "layer_skip_blocks": (_layer_skip(True, True), "stock"),  # its block hook, and one on the block's ff
    "layer_skip_attention": (_layer_skip(True, False), "stock"),
    "layerwise_casting": (_casting, "stock"),
    "group_offload_blocks": (_offload("block_level"), "stock"),
    "group_offload_leaves": (_offload("leaf_level"), "stock"),
}
