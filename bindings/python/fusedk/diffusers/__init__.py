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

apply(..., precision="fp8") runs the blocks' projections on FP8 tensor cores (linear_fp8: e4m3
weights with a scale an output channel, inputs with a scale a row, made by adaln_fp8 where the
block's norm feeds them, by glu_fp8 for a SwiGLU MLP's hidden state, else by quantize_fp8; the
modulation GEMMs, one row a sample, weight-only int8 through linear_w8) and
moves their bf16 weights to host memory until revert (bf16_weights="keep" leaves them);
fp8_error(model, **inputs) prints how far that moves your model's output.

- Exactness: a block is patched only when every part of it is one the fused forward reproduces;
  anything else (another attention processor, an unknown norm or activation, weights under
  offloading or casting hooks) leaves it unpatched, and the report says why. A hook on one of its
  modules runs it stock while the hook is there (below).
- LoRA: peft's LoRA layers on the block's projections (loaded with load_lora_weights or added
  with add_adapter; several active adapters with their set_adapters weights) fold into the
  projection's GEMM, in every model alike (_lora.py): w_cat = [w | s_1 b_1 | s_2 b_2 ...] made by
  apply (the base weight becomes a view into it: no second copy), then linear_lowrank. Adapters in
  another float dtype than the base are cast to it once; DoRA and other variants, LoRA biases,
  dropout in training mode and more than 128 adapter columns a GEMM (A times r rounded up to 8,
  the q/k/v adapters together) leave the block unpatched. A change to the adapters after apply
  (set_adapters, another LoRA, fuse_lora, disable, unload) is seen at the next eager call and the
  block prepared again; under torch.compile, at the next call of the compiled model: a block with
  LoRA layers (and every Flux block) is one operator that checks, no recompile (peft's hotswap on
  a compiled patched model; Inductor's CUDA graphs run around that operator).
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

- The VAE: apply(pipe) also patches pipe.vae's decoder where it is an AutoencoderKL,
  AutoencoderKLWan, AutoencoderKLLTXVideo or AutoencoderKLMochi (vae.py: its ResNet blocks as
  fusedk's channels-last group_norm or channel_rmsnorm + SiLU and conv, the residual in conv2's
  epilogue, Wan's frame cache kept; its other convs as fusedk.conv); vae=False leaves it alone.

The package: _lifecycle.py (apply, revert, each block's State and checks), _lora.py (the
projections' fusion, LoRA adapters folded in), vae.py (the VAE decoder), _pieces.py (the fused pieces and their torch
expressions), _block_op.py (a block as one operator under torch.compile), _common.py (checks the
models share), and a file a model (flux.py, ltx.py, mochi.py, wan.py). diffusers (and torch) are
imported by this package only."""
from ._common import _warned  # noqa: F401  (cleared by tests: warnings said once a process)
from ._lifecycle import Report, apply, fp8_error, revert
from ._pieces import OPS, Pieces

__all__ = ["apply", "revert", "fp8_error", "Report", "OPS", "Pieces"]
