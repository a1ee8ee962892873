"""[norm] The CPU references (through the bindings, on NumPy arrays) against float64 NumPy oracles,
the binding's behaviour (types, out=, errors), and kernel_info."""
import numpy as np
import pytest

import fusedk
import oracle
from oracle import BF16, DTYPES, assert_close

rng = np.random.default_rng()


def rand(shape, dtype, scale=1.0, mean=0.0):
    return (mean + scale * rng.standard_normal(shape)).astype(dtype)


SHAPES = [(1, 1), (3, 2), (5, 7), (19, 111), (2, 3, 64), (4, 1000), (1, 3584), (2, 5120), (1, 65536)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_rmsnorm(shape, dtype):
    x, w = rand(shape, dtype), rand(shape[-1:], dtype, 0.2, 1.0)
    assert_close(fusedk.rmsnorm(x, w), oracle.rmsnorm(x, w)[0], dtype, what="rmsnorm")
    assert_close(fusedk.rmsnorm(x), oracle.rmsnorm(x)[0], dtype, what="rmsnorm no weight")
    res = rand(shape, dtype)
    y, r = fusedk.rmsnorm(x, w, residual=res)
    want_y, want_r = oracle.rmsnorm(x, w, residual=res)
    assert_close(y, want_y, dtype, what="rmsnorm + residual")
    assert_close(r, want_r, dtype, what="residual_out")
    assert y.dtype == dtype and r.dtype == dtype and y.shape == shape


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_layernorm(shape, dtype):
    x, w, b = rand(shape, dtype, 1, 0.5), rand(shape[-1:], dtype, 0.2, 1.0), rand(shape[-1:], dtype, 0.2)
    assert_close(fusedk.layernorm(x, w, b), oracle.layernorm(x, w, b), dtype, what="layernorm")
    assert_close(fusedk.layernorm(x), oracle.layernorm(x), dtype, what="layernorm plain")
    assert_close(fusedk.layernorm(x, bias=b), oracle.layernorm(x, None, b), dtype, what="layernorm bias only")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("norm", ["layer", "rms"])
@pytest.mark.parametrize("shape", [(2, 77, 1152), (1, 1, 64), (3, 5, 111)], ids=str)
def test_adaln_modulation_views(shape, dtype, norm):
    B, L, D = shape
    x = rand(shape, dtype)
    mod = rand((B, 6 * D), dtype, 0.5)  # AdaLN-Zero: shift, scale, gate, ... as column chunks
    shift, scale = mod[:, 0:D], mod[:, D:2 * D]
    assert B == 1 or not scale.flags.c_contiguous
    w = rand((D,), dtype, 0.2, 1.0)
    b = rand((D,), dtype, 0.2) if norm == "layer" else None
    got = fusedk.adaln(x, scale, shift, norm=norm, weight=w, bias=b)
    assert_close(got, oracle.adaln(x, scale, shift, norm, 1e-6, w, b), dtype, what=f"adaln {norm}")
    # stride-0 broadcast of one modulation row over the batch
    s0 = np.broadcast_to(scale[:1], scale.shape)
    got = fusedk.adaln(x, s0, shift, norm=norm)
    assert_close(got, oracle.adaln(x, s0, shift, norm), dtype, what="adaln broadcast scale")


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), BF16], ids=str)
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_adaln_float32_modulation(dtype, norm):
    """16-bit rows with a float32 scale and shift (a model that keeps its modulation in float32,
    as Wan): read as float32, one rounding of the result; views and broadcast as in x's dtype."""
    B, L, D = 2, 7, 96
    x = rand((B, L, D), dtype)
    mod = rand((B, 6 * D), np.float32, 0.5)
    shift, scale = mod[:, 0:D], mod[:, D:2 * D]
    got = fusedk.adaln(x, scale, shift, norm=norm)
    assert got.dtype == dtype
    assert_close(got, oracle.adaln(x, scale, shift, norm), dtype, what=f"adaln {norm} float32 modulation")
    s0 = np.broadcast_to(scale[:1], scale.shape)
    assert_close(fusedk.adaln(x, s0, shift, norm=norm), oracle.adaln(x, s0, shift, norm), dtype,
                 what="adaln float32 broadcast scale")
    with pytest.raises(fusedk.Error, match=r"adaln: shift has dtype .*, expected float32 \(the dtype of scale\)"):
        fusedk.adaln(x, scale, shift.astype(dtype), norm=norm)
    other = np.float16 if dtype == BF16 else BF16
    with pytest.raises(fusedk.Error, match=r"adaln: scale has dtype .*, expected .* \(the dtype of x\) or float32"):
        fusedk.adaln(x, scale.astype(other), shift.astype(other), norm=norm)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 33, 3072), (1, 1, 1), (3, 7, 111)], ids=str)
def test_residual_tanh_gated_rmsnorm(shape, dtype):
    B, L, D = shape
    x, xr, g = rand(shape, dtype), rand(shape, dtype, 2.0), rand((B, D), dtype)
    fast = fusedk.residual_tanh_gated_rmsnorm(x, xr, g, exact=False)
    assert_close(fast, oracle.mochi(x, xr, g), dtype, aux=x, what="mochi exact=False")
    # exact=True: PyTorch's rounding points; against the NumPy float32 rendering of that formula
    ex = fusedk.residual_tanh_gated_rmsnorm(x, xr, g, exact=True)
    want = oracle.mochi_exact(x, xr, g)
    same = np.mean(ex.view(np.uint8 if dtype.itemsize == 1 else f"u{dtype.itemsize}")
                   == want.view(f"u{dtype.itemsize}"))
    assert same >= 0.99, f"exact mode matches the float32 formula bitwise on only {same:.4f}"
    # exact mode also rounds n = y - x: one ulp of n may show (|n| <= |x| + |y|)
    assert_close(ex, want, dtype, aux=np.abs(x.astype(np.float64)) + np.abs(want.astype(np.float64)),
                 what="mochi exact=True")


def test_exact_modes_differ_where_rounding_points_do():
    # bf16 with large |x|: the two-rounding result is not the single-rounding one everywhere
    x, xr, g = rand((2, 64, 256), BF16, 8.0), rand((2, 64, 256), BF16), rand((2, 256), BF16)
    a = fusedk.residual_tanh_gated_rmsnorm(x, xr, g, exact=True)
    b = fusedk.residual_tanh_gated_rmsnorm(x, xr, g, exact=False)
    assert (a.view(np.uint16) != b.view(np.uint16)).any()


def test_bf16_rounding_is_single_and_to_nearest_even():
    # the reference rounds its float64 result once: equal to ml_dtypes' rounding of the oracle
    # except where the two float64 sums differ across a rounding boundary (vanishingly rare)
    x, w = rand((64, 3072), BF16), rand((3072,), BF16, 0.2, 1.0)
    got = fusedk.rmsnorm(x, w).view(np.uint16)
    want = oracle.rmsnorm(x, w)[0].astype(BF16).view(np.uint16)
    assert np.mean(got == want) > 0.9999


def test_strided_rows_and_in_place():
    base = rand((8, 3, 200), np.float32)
    x = base[:, 1, :100]  # row stride 600 elements, last dim contiguous
    assert_close(fusedk.rmsnorm(x), oracle.rmsnorm(x)[0], np.float32, what="strided rows")
    x2 = rand((6, 128), np.float16)
    want = oracle.layernorm(x2)
    out = fusedk.layernorm(x2, out=x2)
    assert out is x2
    assert_close(x2, want, np.float16, what="in place")
    flipped = rand((5, 64), np.float32)[::-1]  # negative row stride
    assert_close(fusedk.rmsnorm(flipped), oracle.rmsnorm(flipped)[0], np.float32, what="negative stride")


def test_residual_in_place():
    x, res = rand((4, 256), BF16), rand((4, 256), BF16)
    want_y, want_r = oracle.rmsnorm(x, None, residual=res)
    y, r = fusedk.rmsnorm(x, residual=res, residual_out=res)
    assert r is res
    assert_close(res, want_r, BF16, what="residual updated in place")
    assert_close(y, want_y, BF16, what="y")


def test_nan_and_inf_propagate():
    x = rand((3, 16), np.float32)
    x[0, 3], x[1, 0] = np.nan, np.inf
    y = fusedk.rmsnorm(x)
    with np.errstate(invalid="ignore"):
        want = oracle.rmsnorm(x)[0]  # NaN row; Inf row: NaN at the Inf, +-0 elsewhere
    assert np.isnan(y[0]).all() and np.isnan(y[1, 0]) and (y[1, 1:] == 0).all() and np.isfinite(y[2]).all()
    assert_close(y, want, np.float32, what="NaN/Inf rows")


def test_errors_name_the_argument_and_leave_outputs_untouched():
    x = rand((4, 8), np.float32)
    out = np.full((4, 8), 7.0, np.float32)
    cases = [
        (lambda: fusedk.rmsnorm(x, weight=np.ones(7, np.float32), out=out), "FUSEDK_ERR_SHAPE",
         "rmsnorm: weight has shape [7], expected [8] (last dim of x)"),
        (lambda: fusedk.rmsnorm(x, weight=np.ones(8, np.float16), out=out), "FUSEDK_ERR_DTYPE", "weight has dtype float16"),
        (lambda: fusedk.rmsnorm(x.astype(np.float64)), "FUSEDK_ERR_DTYPE", "x has dtype float64, expected float32"),
        (lambda: fusedk.rmsnorm(x.astype(np.int32)), "FUSEDK_ERR_DTYPE", "x has dtype int32"),
        (lambda: fusedk.rmsnorm(x, weight=[1.0] * 8, out=out), "FUSEDK_ERR_DTYPE",
         "weight has dtype float64, expected float32, float16 or bfloat16 (weight was a list, turned into a float64"),
        (lambda: fusedk.rmsnorm(x, eps=-1.0, out=out), "FUSEDK_ERR_INVALID_ARGUMENT", "eps is -1"),
        (lambda: fusedk.rmsnorm(x[:, ::2], out=out[:, :4]), "FUSEDK_ERR_LAYOUT", "x has stride 2 in its last dim"),
        (lambda: fusedk.layernorm(x, bias=np.ones((2, 8), np.float32), out=out), "FUSEDK_ERR_SHAPE", "bias has shape [2, 8]"),
        (lambda: fusedk.adaln(x, x, x), "FUSEDK_ERR_SHAPE", "x has ndim 2, expected 3"),
        (lambda: fusedk.adaln(x[None], x, x, norm="group"), "FUSEDK_ERR_INVALID_ARGUMENT", "norm is 'group'"),
        (lambda: fusedk.residual_tanh_gated_rmsnorm(x[None], x[None], x[:1, :7]), "FUSEDK_ERR_SHAPE", "gate has shape [1, 7]"),
        (lambda: fusedk.rmsnorm(x, out=np.broadcast_to(out[:1], out.shape)), "FUSEDK_ERR_INVALID_ARGUMENT", "out is read-only"),
    ]
    for fn, status, text in cases:
        with pytest.raises(fusedk.Error) as e:
            fn()
        assert e.value.status == status, (text, e.value)
        assert text in e.value.reason, (text, e.value.reason)
        assert (out == 7.0).all(), text


def test_kernel_info():
    info = fusedk.kernel_info()
    assert info["version"] == fusedk.__version__ == "0.12.0"
    assert set(info["ops"]) == {"rmsnorm", "layernorm", "adaln", "residual_tanh_gated_rmsnorm", "act", "silu_fma",
                                "gated_residual", "glu", "glu_pair", "rope", "rope_table_1d", "rope_table_axes", "rope_table_ltx", "rope_table_mixed", "qk_norm_rope", "diffusion_step", "linear",
                                "linear_backward", "attention", "lowrank_update", "lowrank_prepare", "linear_lowrank",
                                "lowrank_update_backward", "linear_lowrank_backward", "attention_int8",
                                "attention_int8_scaled", "qk_norm_rope_int8", "quantize_fp8", "dequantize_fp8",
                                "linear_fp8", "rmsnorm_fp8", "layernorm_fp8", "adaln_fp8", "glu_fp8",
                                "quantize_int8", "linear_w8", "conv", "fold_batchnorm", "group_norm",
                                "channel_rmsnorm"}
    assert info["ops"]["rmsnorm"] == ["float32", "float16", "bfloat16"]
    assert info["ops"]["linear_fp8"] == ["float16", "bfloat16"]  # y's: its x and w are e4m3
    assert info["ops"]["dequantize_fp8"] == ["float32", "float16", "bfloat16"]
    assert info["ops"]["attention_int8_scaled"] == ["float32", "float16", "bfloat16"]  # v's, not q's int8
    assert info["ops"]["rope_table_1d"] == ["float32"]
    assert isinstance(info["cuda"]["built"], bool)


def test_cdef_comes_from_the_header():
    from fusedk import _ffi
    with open(_ffi.HEADER) as f:
        cdef = _ffi.cdef_from_header(f.read())
    for name in ("fusedk_rmsnorm", "fusedk_adaln", "fusedk_dlpack_alloc", "FUSEDK_ERR_LAYOUT = 5"):
        assert name in cdef


def test_no_torch_import():
    import subprocess
    import sys
    code = "import sys, fusedk, numpy as np; fusedk.rmsnorm(np.ones((2, 4), np.float32)); print('torch' in sys.modules)"
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert r.stdout.strip() == "False"


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_arrays(dtype):
    # NumPy gives empty arrays strides of 0: no layout to check, nothing to write
    x = np.empty((0, 8), dtype)
    assert fusedk.rmsnorm(x).shape == (0, 8)
    y, r = fusedk.rmsnorm(x, np.ones(8, dtype), residual=x)
    assert y.shape == r.shape == (0, 8) and y.dtype == dtype
    assert fusedk.layernorm(x).shape == (0, 8)
    x3 = np.empty((2, 0, 8), dtype)
    assert fusedk.adaln(x3, np.zeros((2, 8), dtype), np.zeros((2, 8), dtype)).shape == (2, 0, 8)
    assert fusedk.residual_tanh_gated_rmsnorm(x3, x3, np.zeros((2, 8), dtype)).shape == (2, 0, 8)


def test_lists_are_named_when_they_become_float64():
    with pytest.raises(fusedk.Error, match=r"x was a list, turned into a float64 NumPy array"):
        fusedk.rmsnorm([[1.0, 2.0]])
    # a float32 array built from a list is fine
    assert fusedk.rmsnorm(np.asarray([[1.0, 2.0]], np.float32)).dtype == np.float32


def test_public_namespace():
    assert fusedk.Error.__module__ == "fusedk" and repr(fusedk.Error("S", "r")).startswith("Error(")
    assert str(fusedk.Error).startswith("<class 'fusedk.Error'>")
    public = [n for n in dir(fusedk) if not n.startswith("_")]
    assert set(public) == {"Error", "ShapeError", "LayoutError", "InvalidArgumentError", "ArgumentTypeError",
                           "DTypeError", "DeviceError",
                           "OutOfMemoryError", "rmsnorm", "layernorm", "adaln", "residual_tanh_gated_rmsnorm", "act",
                           "silu_fma", "gated_residual", "glu", "glu_pair", "kernel_info", "torch", "jax", "diffusers", "bem",
                           "rope", "rope_table_1d", "rope_table_axes", "rope_table_ltx", "rope_table_mixed", "qk_norm_rope", "diffusion_step",
                           "linear", "linear_backward", "attention", "lowrank_update", "lowrank_prepare", "linear_lowrank",
                           "LoRA", "lowrank_update_backward", "linear_lowrank_backward", "attention_int8",
                           "attention_int8_scaled", "ScaledTensor", "qk_norm_rope_int8", "quantize_fp8",
                           "dequantize_fp8", "linear_fp8", "rmsnorm_fp8", "layernorm_fp8", "adaln_fp8", "glu_fp8",
                           "quantize_int8", "linear_w8", "conv", "fold_batchnorm", "fused_conv_bn_silu", "group_norm", "channel_rmsnorm"}
    for internal in ("json", "ffi", "lib", "check", "Call"):
        assert not hasattr(fusedk, internal), internal


def test_every_registry_op_is_a_python_function():
    from fusedk import _core
    names = [o.name for o in _core.OPS]
    assert names == ["rmsnorm", "layernorm", "adaln", "residual_tanh_gated_rmsnorm", "act", "silu_fma",
                     "gated_residual", "glu", "glu_pair", "rope", "rope_table_1d", "rope_table_axes", "rope_table_ltx", "rope_table_mixed", "diffusion_step", "qk_norm_rope", "linear",
                     "linear_backward", "attention", "lowrank_update", "lowrank_prepare", "linear_lowrank",
                     "lowrank_update_backward", "linear_lowrank_backward", "attention_int8", "attention_int8_scaled",
                     "qk_norm_rope_int8", "quantize_fp8", "dequantize_fp8", "linear_fp8", "rmsnorm_fp8",
                     "layernorm_fp8", "adaln_fp8", "glu_fp8", "quantize_int8", "linear_w8", "conv", "fold_batchnorm",
                     "group_norm", "channel_rmsnorm"]
    assert set(names) <= set(fusedk.__all__) and set(names) == set(fusedk.kernel_info()["ops"])


def test_ndim_limit_and_strides_in_bytes():
    x = rand((1,) * 9 + (4,), np.float32)
    with pytest.raises(fusedk.Error, match="x has ndim 10, expected 1..8"):
        fusedk.rmsnorm(x)
    rec = np.zeros((4, 8), dtype=[("a", np.float32), ("b", np.int8)])["a"]  # 5-byte row step
    with pytest.raises(fusedk.Error, match="not a multiple of its 4-byte elements"):
        fusedk.rmsnorm(rec)
