"""[norm] The GPU kernels through the bindings with CuPy, JAX and PyTorch CUDA arrays: results against
the CPU reference (same tolerance as the C GPU suite), the caller's type back, out=, streams
(capture inside torch's CUDA graph proves the op runs on the caller's stream), DLPack capsules
released, and Mochi's exact mode against the PyTorch formula. Skipped where a framework or a
CUDA device is missing."""
import gc

import numpy as np
import pytest

import fusedk
from oracle import BF16, EPS, assert_close, np_of

if not fusedk.kernel_info()["cuda"].get("devices"):
    pytest.skip("no CUDA device (or fusedk built without its GPU half)", allow_module_level=True)

rng = np.random.default_rng()


def host(shape, dtype, scale=1.0, mean=0.0):
    return (mean + scale * rng.standard_normal(shape)).astype(dtype)


# --- PyTorch --------------------------------------------------------------------------------
try:
    import torch
except ImportError:  # pragma: no cover
    torch = None
needs_torch = pytest.mark.skipif(torch is None or not torch.cuda.is_available(), reason="PyTorch with CUDA not installed")

TORCH_DT = {np.dtype(np.float32): "float32", np.dtype(np.float16): "float16", BF16: "bfloat16"}


def to_torch(a):
    dt = getattr(torch, TORCH_DT[a.dtype])
    return torch.from_numpy(a.view(np.uint16) if a.dtype == BF16 else a).view(dt).cuda()


@needs_torch
@pytest.mark.parametrize("dtype", [np.dtype(np.float32), np.dtype(np.float16), BF16], ids=str)
@pytest.mark.parametrize("shape", [(4, 4096, 3072), (1, 1, 111), (3, 2048), (7, 65536)], ids=str)
def test_torch_rmsnorm_matches_reference(shape, dtype):
    x, w, r = host(shape, dtype), host(shape[-1:], dtype, 0.2, 1.0), host(shape, dtype)
    y, ro = fusedk.rmsnorm(to_torch(x), to_torch(w), residual=to_torch(r))
    assert isinstance(y, torch.Tensor) and y.is_cuda and y.shape == shape and str(y.dtype).endswith(TORCH_DT[dtype])
    want_y, want_r = fusedk.rmsnorm(x, w, residual=r)  # the CPU reference
    assert_close(np_of(y), want_y, dtype, what="torch rmsnorm")
    assert_close(np_of(ro), want_r, dtype, what="torch residual_out")


@needs_torch
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_torch_adaln_views_and_layernorm(norm):
    B, L, D = 2, 4096, 1152
    x, mod = host((B, L, D), BF16), host((B, 6 * D), BF16, 0.5)
    tx, tmod = to_torch(x), to_torch(mod)
    shift, scale = tmod.chunk(6, dim=1)[:2]  # strided views, no copies
    got = fusedk.adaln(tx, scale, shift, norm=norm)
    want = fusedk.adaln(x, mod[:, D:2 * D], mod[:, :D], norm=norm)
    assert_close(np_of(got), want, BF16, what=f"torch adaln {norm}")
    w, b = host((D,), BF16, 0.2, 1.0), host((D,), BF16, 0.2)
    got = fusedk.layernorm(tx, to_torch(w), to_torch(b))
    assert_close(np_of(got), fusedk.layernorm(x, w, b), BF16, what="torch layernorm")


@needs_torch
def test_torch_out_and_graph_capture_on_current_stream():
    x = to_torch(host((1024, 2048), BF16))
    out = torch.empty_like(x)
    y = fusedk.rmsnorm(x, out=out)
    assert y is out
    want = fusedk.rmsnorm(np_of(x))
    assert_close(np_of(out), want, BF16, what="out=")
    # graph capture runs on a side stream: a launch anywhere else would break the capture
    out.fill_(float("nan"))
    g = torch.cuda.CUDAGraph()
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fusedk.rmsnorm(x, out=out)  # warm-up on the side stream
    torch.cuda.current_stream().wait_stream(s)
    with torch.cuda.graph(g):
        fusedk.rmsnorm(x, out=out)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    assert_close(np_of(out), want, BF16, what="graph replay")


@needs_torch
def test_torch_side_stream_and_explicit_stream():
    x = to_torch(host((2048, 3072), np.float16))
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        y = fusedk.layernorm(x)
        y2 = fusedk.layernorm(x, stream=s)  # the same stream, named
    s.synchronize()
    want = fusedk.layernorm(np_of(x))
    assert_close(np_of(y), want, np.float16, what="side stream")
    assert_close(np_of(y2), want, np.float16, what="stream=")


@needs_torch
def test_torch_mochi_exact_matches_pytorch_formula():
    B, L, D, eps = 4, 4096, 3072, 1e-6
    x = torch.randn(B, L, D, device="cuda", dtype=torch.bfloat16)
    xr = 2 * torch.randn(B, L, D, device="cuda", dtype=torch.bfloat16)
    g = torch.randn(B, D, device="cuda", dtype=torch.bfloat16)
    xr32 = xr.float()
    ref = x + (xr32 * torch.rsqrt(xr32.pow(2).mean(-1, keepdim=True) + eps) * torch.tanh(g).unsqueeze(1)).type_as(x)
    got = fusedk.residual_tanh_gated_rmsnorm(x, xr, g, eps=eps, exact=True)
    same = (got.view(torch.int16) == ref.view(torch.int16)).float().mean().item()
    # the normalized term alone (x = 0 makes y = cast(n) exactly): at most 1 ulp from PyTorch's,
    # where the float32 mean(x_res^2) of the two reduction orders rounds differently
    zero = torch.zeros_like(x)
    n_got = fusedk.residual_tanh_gated_rmsnorm(zero, xr, g, eps=eps, exact=True)
    n_ref = (xr32 * torch.rsqrt(xr32.pow(2).mean(-1, keepdim=True) + eps) * torch.tanh(g).unsqueeze(1)).type_as(x)
    # (0 + n turns n = -0 into +0: compare values, count ulps only where they differ)
    eq = n_got == n_ref
    n_ulps = torch.where(eq, 0, (n_got.view(torch.int16).int() - n_ref.view(torch.int16).int()).abs()).max().item()
    n_same = eq.float().mean().item()
    print(f"mochi exact vs PyTorch: y {same * 100:.4f}% bitwise equal; normalized term {n_same * 100:.4f}% "
          f"bitwise equal, max {n_ulps} ulp")
    assert same >= 0.999 and n_same >= 0.999 and n_ulps <= 1
    # where y differs, it is by that one ulp of n (plus y's own rounding)
    d = (got.float() - ref.float()).abs()
    n_ulp = torch.finfo(torch.bfloat16).eps * (n_ref.float().abs() + got.float().abs())
    assert bool((d <= n_ulp).all())
    fast = fusedk.residual_tanh_gated_rmsnorm(x, xr, g, eps=eps, exact=False)
    err = (fast.float() - ref.float()).abs() / (ref.float().abs() + x.float().abs() + 1e-6)
    assert err.max().item() <= 2 * EPS[BF16]


@needs_torch
def test_torch_cpu_tensors_run_the_reference():
    x = torch.randn(8, 64)
    y = fusedk.rmsnorm(x)
    assert isinstance(y, torch.Tensor) and y.device.type == "cpu"
    assert_close(y.numpy(), fusedk.rmsnorm(x.numpy()), np.float32, what="torch cpu")


@needs_torch
def test_outputs_are_freed():
    x = to_torch(host((4096, 4096), BF16))  # 32 MiB outputs
    torch.cuda.synchronize()
    free0 = torch.cuda.mem_get_info()[0]
    for _ in range(200):  # 6.4 GiB if leaked
        y = fusedk.rmsnorm(x)
        del y
    gc.collect()
    torch.cuda.synchronize()
    assert torch.cuda.mem_get_info()[0] > free0 - (256 << 20)


@needs_torch
def test_gpu_errors_raise_with_the_reason():
    x = to_torch(host((4, 64), np.float32))
    with pytest.raises(fusedk.Error, match="weight is on device"):
        fusedk.rmsnorm(x, weight=np.ones(64, np.float32))
    with pytest.raises(fusedk.Error, match="residual has shape"):
        fusedk.rmsnorm(x, residual=x[:2])


# --- CuPy -----------------------------------------------------------------------------------
try:
    import cupy
except ImportError:  # pragma: no cover
    cupy = None
needs_cupy = pytest.mark.skipif(cupy is None, reason="CuPy not installed")


@needs_cupy
@pytest.mark.parametrize("dtype", [np.float32, np.float16], ids=str)
def test_cupy_in_cupy_out_and_streams(dtype):
    x, w, b = host((19, 5120), dtype), host((5120,), dtype, 0.2, 1), host((5120,), dtype, 0.2)
    cx = cupy.asarray(x)
    y = fusedk.layernorm(cx, cupy.asarray(w), cupy.asarray(b))
    assert isinstance(y, cupy.ndarray)
    want = fusedk.layernorm(x, w, b)
    assert_close(cupy.asnumpy(y), want, dtype, what="cupy layernorm")
    with cupy.cuda.Stream(non_blocking=True) as s:
        out = cupy.empty_like(cx)
        r = fusedk.layernorm(cx, cupy.asarray(w), cupy.asarray(b), out=out)
        s.synchronize()
    assert r is out
    assert_close(cupy.asnumpy(out), want, dtype, what="cupy out= on a side stream")


@needs_cupy
def test_cupy_bf16_mochi():
    x, xr, g = host((2, 300, 3072), BF16), host((2, 300, 3072), BF16, 2.0), host((2, 3072), BF16)
    # CuPy has no bfloat16 dtype of its own: the arrays come from torch through DLPack
    if torch is None:
        pytest.skip("bf16 CuPy arrays need a DLPack producer for bfloat16")
    y = fusedk.residual_tanh_gated_rmsnorm(cupy.from_dlpack(to_torch(x)), cupy.from_dlpack(to_torch(xr)),
                                           cupy.from_dlpack(to_torch(g)))
    got = np_of(torch.from_dlpack(y))
    want = fusedk.residual_tanh_gated_rmsnorm(x, xr, g)
    assert_close(got, want, BF16, aux=np.abs(x.astype(np.float64)) + np.abs(want.astype(np.float64)), what="cupy bf16 mochi")


# --- JAX ------------------------------------------------------------------------------------
try:
    import os
    os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
    import jax
    import jax.numpy as jnp
    _jax_gpu = any(d.platform == "gpu" for d in jax.devices())
except Exception:  # pragma: no cover - no JAX or no GPU backend
    jax, _jax_gpu = None, False
needs_jax = pytest.mark.skipif(not _jax_gpu, reason="JAX with a GPU backend not installed")


@needs_jax
@pytest.mark.parametrize("dtype", [np.float32, BF16], ids=str)
def test_jax_in_jax_out(dtype):
    x, w = host((2, 1024, 2048), dtype), host((2048,), dtype, 0.2, 1.0)
    jx = jax.device_put(jnp.asarray(x), jax.devices("gpu")[0])
    y = fusedk.rmsnorm(jx, jnp.asarray(w, device=jax.devices("gpu")[0]))
    assert isinstance(y, jax.Array) and y.devices() == jx.devices()
    got = np.asarray(y)
    assert_close(got, fusedk.rmsnorm(x, w), dtype, what="jax rmsnorm")
    z = jnp.sum(y.astype(jnp.float32))  # usable by JAX afterwards
    assert np.isfinite(float(z))
    with pytest.raises(fusedk.Error, match="JAX arrays are immutable"):
        fusedk.rmsnorm(jx, out=jx)
