"""BEM's helpers (Bolt-on Expert Modules, seed 001) over fusedk.lowrank_update, for the calls a BEM
user makes: the fused generated update, its accuracy against the unfused chain, and its speed
against the chain and the frozen base layer. Needs PyTorch (imported here, never by `import
fusedk`).

    from fusedk.bem import fused_generated_update, validate_numerical_accuracy, benchmark_kernel_performance
    dy = fused_generated_update(X, V, codes, U, scaling)  # ((X @ V) * codes) @ U * scaling
"""
import statistics

import torch

import fusedk

__all__ = ["fused_generated_update", "validate_numerical_accuracy", "benchmark_kernel_performance"]


def fused_generated_update(X, V, codes, U, scaling=1.0, out=None):
    """((X @ V) * codes) @ U * scaling, fused (fusedk.lowrank_update): X [..., K1], V [K1, r], codes
    [..., r] (or None), U [r, K2] (BEM's pre-transposed U)."""
    return fusedk.lowrank_update(X, V, U, codes, scaling=scaling, out=out)


def _operands(batch_size, seq_len, input_dim, intermediate_dim, output_dim, dtype, device, seed):
    g = torch.Generator(device=device).manual_seed(seed)
    dt = getattr(torch, dtype) if isinstance(dtype, str) else dtype
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, device=device, generator=g)).to(dt)  # noqa: E731
    return (mk(batch_size * seq_len, input_dim), mk(input_dim, intermediate_dim, scale=input_dim ** -0.5),
            mk(batch_size * seq_len, intermediate_dim), mk(intermediate_dim, output_dim, scale=intermediate_dim ** -0.5))


def validate_numerical_accuracy(batch_size=8, seq_len=256, input_dim=768, intermediate_dim=8, output_dim=768,
                                dtype="float16", device="cuda", scaling=2.0, seed=0):
    """The fused update and the unfused chain (X @ V, * codes, @ U, * scaling, each rounded to the
    dtype), both against float64. passed: the fused update is no less accurate than the chain
    (its largest and mean errors at most the chain's)."""
    X, V, codes, U = _operands(batch_size, seq_len, input_dim, intermediate_dim, output_dim, dtype, device, seed)
    fused = fused_generated_update(X, V, codes, U, scaling)
    chain = ((X @ V) * codes) @ U * scaling
    want = ((X.double() @ V.double()) * codes.double()) @ U.double() * scaling
    e, f = (fused.double() - want).abs(), (chain.double() - want).abs()
    r = {"max_abs_diff": e.max().item(), "mean_abs_diff": e.mean().item(), "max_abs_diff_chain": f.max().item(),
         "mean_abs_diff_chain": f.mean().item(), "max_abs_diff_vs_chain": (fused.double() - chain.double()).abs().max().item()}
    r["passed"] = r["max_abs_diff"] <= r["max_abs_diff_chain"] and r["mean_abs_diff"] <= r["mean_abs_diff_chain"]
    return r


def _per_call_ms(fn, iters):
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(5):
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        for _ in range(iters):
            fn()
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b) / iters)
    return statistics.median(times)


def benchmark_kernel_performance(batch_size=32, seq_len=512, input_dim=768, intermediate_dim=8, output_dim=768,
                                 dtype="float16", iters=100, scaling=2.0, seed=0):
    """ms a call (eager calls back to back, CUDA events, median of 5 loops) of the fused update,
    the unfused PyTorch chain and the frozen base layer (X @ W.T, W [output_dim, input_dim]);
    comparison: speedup_ratio = chain / fused, overhead_percent = 100 fused / base (what the
    update adds to the layer it rides on)."""
    if not torch.cuda.is_available():
        raise fusedk.DeviceError("FUSEDK_ERR_DEVICE", "benchmark_kernel_performance: no CUDA device")
    X, V, codes, U = _operands(batch_size, seq_len, input_dim, intermediate_dim, output_dim, dtype, "cuda", seed)
    W = torch.randn(output_dim, input_dim, device="cuda", dtype=X.dtype) * input_dim ** -0.5
    fused = _per_call_ms(lambda: fused_generated_update(X, V, codes, U, scaling), iters)
    chain = _per_call_ms(lambda: ((X @ V) * codes) @ U * scaling, iters)
    base = _per_call_ms(lambda: X @ W.T, iters)
    return {"fused_ms": fused, "pytorch_ms": chain, "base_ms": base,
            "comparison": {"speedup_ratio": chain / fused, "overhead_percent": 100.0 * fused / base}}
