"""fusedk.jax: every op as an XLA custom call, under jax.jit and eagerly.

CPU (XLA:CPU runs the same C reference as NumPy): results BITWISE equal to fusedk's NumPy path
and close to the float64 oracles; the residual form, adaln's norms, Mochi's exact modes, static
attributes, a jitted chain of ops, errors (fusedk.Error naming the argument), no derivative, no
retrace on repeated eager calls. GPU (XLA:GPU runs the kernel on XLA's stream): against the CPU
reference with the GPU suites' tolerance, outputs on the GPU, and inside XLA's CUDA graphs.
Skipped without jax; the GPU half without a jax GPU backend or a CUDA device for fusedk."""
import os
import subprocess
import sys

import numpy as np
import pytest

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")
try:
    import jax
    import jax.numpy as jnp
except ImportError as e:  # pragma: no cover - CI without jax
    pytest.skip(f"jax not importable: {e}", allow_module_level=True)

import fusedk  # noqa: E402
import fusedk.jax as fk  # noqa: E402
import oracle  # noqa: E402
from oracle import BF16, DTYPES, assert_close, assert_close_gpu, bits  # noqa: E402

rng = np.random.default_rng(7)
CPU = jax.devices("cpu")[0]


def rand(shape, dtype, scale=1.0, mean=0.0):
    return (mean + scale * rng.standard_normal(shape)).astype(dtype)


def on_cpu(*arrays):
    return [None if a is None else jax.device_put(a, CPU) for a in arrays]


def assert_same(got, want, what):
    """bitwise: XLA:CPU and NumPy run the same C reference"""
    assert isinstance(got, jax.Array), f"{what}: got {type(got)}"
    got = np.asarray(got)
    assert (got.dtype, got.shape) == (want.dtype, want.shape), f"{what}: {got.dtype}{got.shape}"
    assert np.array_equal(bits(got), bits(want)), f"{what}: not bitwise equal to the NumPy path"


def run(f, jit, *args):
    """f(*args) eagerly, or jitted with args as its (traced) arguments."""
    return jax.jit(f)(*args) if jit else f(*args)


MODES = pytest.mark.parametrize("jit", [False, True], ids=["eager", "jit"])
TYPES = pytest.mark.parametrize("dtype", DTYPES, ids=str)


# --- CPU: each op against the NumPy path and the oracles ------------------------------------------
@MODES
@TYPES
@pytest.mark.parametrize("form", ["plain", "weight", "residual"])
def test_rmsnorm(form, dtype, jit):
    shape = (2, 33, 96)
    x, w, r = rand(shape, dtype), rand(shape[-1:], dtype, 0.2, 1.0), rand(shape, dtype)
    w = w if form != "plain" else None
    r = r if form == "residual" else None
    jx, jw, jr = on_cpu(x, w, r)
    got = run(lambda x, w, r: fk.rmsnorm(x, w, eps=1e-5, residual=r), jit, jx, jw, jr)
    want = fusedk.rmsnorm(x, w, eps=1e-5, residual=r)
    want_y, want_r = oracle.rmsnorm(x, w, 1e-5, r)
    if form == "residual":
        assert isinstance(got, tuple) and len(got) == 2
        assert_same(got[0], want[0], "rmsnorm y")
        assert_same(got[1], want[1], "rmsnorm residual_out")
        assert_close(np.asarray(got[0]), want_y, dtype, what="rmsnorm y vs oracle")
        assert_close(np.asarray(got[1]), want_r, dtype, what="rmsnorm residual_out vs oracle")
    else:
        assert_same(got, want, "rmsnorm")
        assert_close(np.asarray(got), want_y, dtype, what="rmsnorm vs oracle")


@MODES
@TYPES
@pytest.mark.parametrize("affine", ["none", "weight", "both"])
def test_layernorm(affine, dtype, jit):
    shape = (3, 7, 200)
    x = rand(shape, dtype, 2.0, 0.5)
    w = rand(shape[-1:], dtype, 0.2, 1.0) if affine != "none" else None
    b = rand(shape[-1:], dtype, 0.2) if affine == "both" else None
    got = run(lambda x, w, b: fk.layernorm(x, w, b), jit, *on_cpu(x, w, b))
    assert_same(got, fusedk.layernorm(x, w, b), "layernorm")
    assert_close(np.asarray(got), oracle.layernorm(x, w, b), dtype, what="layernorm vs oracle")


@MODES
@TYPES
@pytest.mark.parametrize("norm", ["layer", "rms"])
def test_adaln(norm, dtype, jit):
    B, L, D = 2, 17, 128
    x, mod = rand((B, L, D), dtype), rand((B, 6 * D), dtype, 0.5)
    shift, scale = mod[:, :D], mod[:, D:2 * D]  # chunks: XLA hands compact copies
    w = rand((D,), dtype, 0.2, 1.0)
    b = rand((D,), dtype, 0.2) if norm == "layer" else None
    jx, jmod, jw, jb = on_cpu(x, mod, w, b)
    got = run(lambda x, mod, w, b: fk.adaln(x, mod[:, D:2 * D], mod[:, :D], norm=norm, weight=w, bias=b), jit,
              jx, jmod, jw, jb)
    assert_same(got, fusedk.adaln(x, scale, shift, norm=norm, weight=w, bias=b), f"adaln {norm}")
    assert_close(np.asarray(got), oracle.adaln(x, scale, shift, norm, 1e-6, w, b), dtype, what=f"adaln {norm}")
    plain = run(lambda x, s, h: fk.adaln(x, s, h, norm=norm), jit, *on_cpu(x, scale, shift))
    assert_same(plain, fusedk.adaln(x, scale, shift, norm=norm), f"adaln {norm} without affine")


@MODES
@TYPES
@pytest.mark.parametrize("exact", [True, False])
def test_residual_tanh_gated_rmsnorm(exact, dtype, jit):
    B, L, D = 2, 9, 160
    x, xr, g = rand((B, L, D), dtype), rand((B, L, D), dtype, 2.0), rand((B, D), dtype)
    got = run(lambda x, xr, g: fk.residual_tanh_gated_rmsnorm(x, xr, g, exact=exact), jit, *on_cpu(x, xr, g))
    want = fusedk.residual_tanh_gated_rmsnorm(x, xr, g, exact=exact)
    assert_same(got, want, f"mochi exact={exact}")
    if exact:
        ref = oracle.mochi_exact(x, xr, g)
        aux = np.abs(x.astype(np.float64)) + np.abs(ref.astype(np.float64))
    else:
        ref, aux = oracle.mochi(x, xr, g), x
    assert_close(np.asarray(got), ref, dtype, aux=aux, what=f"mochi exact={exact} vs oracle")


def test_fusedk_functions_route_jax_arrays_here():
    x, w, r = on_cpu(rand((4, 64), np.float32), rand((64,), np.float32), rand((4, 64), np.float32))
    y, ro = fusedk.rmsnorm(x, w, residual=r)  # fusedk's own function, JAX arrays in
    assert isinstance(y, jax.Array) and isinstance(ro, jax.Array)
    assert_same(y, fusedk.rmsnorm(np.asarray(x), np.asarray(w), residual=np.asarray(r))[0], "fusedk.rmsnorm(jax)")
    # tracers too, and the NumPy inputs of fusedk.jax give JAX arrays
    assert isinstance(jax.jit(lambda x: fusedk.layernorm(x))(x), jax.Array)
    assert isinstance(fk.layernorm(np.asarray(x)), jax.Array)
    assert fk.__all__ == ["rmsnorm", "layernorm", "adaln", "residual_tanh_gated_rmsnorm", "act", "silu_fma",
                          "gated_residual", "glu", "glu_pair", "rope", "rope_table_1d", "rope_table_axes",
                              "rope_table_ltx", "rope_table_mixed", "diffusion_step", "qk_norm_rope", "linear",
                          "linear_backward", "attention", "lowrank_update", "lowrank_prepare", "linear_lowrank",
                          "lowrank_update_backward", "linear_lowrank_backward", "attention_int8",
                          "attention_int8_scaled", "qk_norm_rope_int8", "quantize_fp8", "dequantize_fp8",
                          "linear_fp8", "rmsnorm_fp8", "layernorm_fp8", "adaln_fp8", "glu_fp8", "quantize_int8",
                          "linear_w8", "conv", "fold_batchnorm", "group_norm", "channel_rmsnorm"]


def test_every_registry_op_has_a_target():
    from fusedk import _core
    assert [o.name for o in _core.OPS] == fk.__all__
    assert fk._UNAVAILABLE is None
    for o in _core.OPS:  # the generic entry point, all optional inputs absent
        D = 8
        ins = {"x": np.ones((2, 3, D), np.float32), "x_res": np.ones((2, 3, D), np.float32),
               "scale": np.zeros((2, D), np.float32), "shift": np.zeros((2, D), np.float32),
               "gate": np.zeros((2, D), np.float32), "y": np.ones((2, 3, D), np.float32)}
        for name in ("a", "b", "c", "value"):
            ins[name] = ins["x"]
        if o.name == "glu_pair":  # a row gate, not a per-sample one
            ins = dict(ins, gate=ins["x"])
        attrs, want = tuple(a[2] for a in o.attrs), (2, 3, D // 2 if o.name == "glu" else D)
        if o.name == "rope":
            ins = dict(q=np.ones((2, 3, 4, D), np.float32), cos=np.ones((3, D // 2), np.float32),
                       sin=np.zeros((3, D // 2), np.float32))
            want = (2, 3, 4, D)
        elif o.name.startswith("rope_table"):  # (cos, sin) float32 tables of 5 positions
            ins = dict(positions=np.arange(5, dtype=np.float32), ids=np.ones((5, 3), np.float32),
                       coords=np.ones((5, 3), np.float32), pos=np.ones((5, 3), np.float32),
                       freqs=np.ones((3, 2, 4), np.float32))
            attrs = (12,) + attrs[1:] if o.attrs and o.attrs[0][0] == "dim" else attrs
            want = {"rope_table_1d": (5, 6), "rope_table_axes": (5, 64), "rope_table_ltx": (5, 6)}.get(o.name, (5, 2, 4))
        elif o.name == "diffusion_step":
            ins = dict(x=ins["x"], cond=ins["x"])
        elif o.name in ("qk_norm_rope", "qk_norm_rope_int8"):  # q and k in, [B, H, S, Dh] out (qk_norm_rope's default)
            ins = dict(q=np.ones((2, 3, 4, D), np.float32), k=np.ones((2, 3, 2, D), np.float32),
                       cos=np.ones((3, D // 2), np.float32), sin=np.zeros((3, D // 2), np.float32))
        elif o.name == "linear":  # x [2, 3, D] by w [5, D]
            ins = dict(x=ins["x"], w=np.ones((5, D), np.float32))
            want = (2, 3, 5)
        elif o.name == "linear_backward":  # dx, dw and db by default
            ins = dict(dy=np.ones((2, 3, 5), np.float32), x=ins["x"], w=np.ones((5, D), np.float32))
        elif o.name in ("attention", "attention_int8"):  # q [2, 3, 4, D], k and v [2, 5, 2, D], kv_len int32
            ins = dict(q=np.ones((2, 3, 4, D), np.float32), k=np.ones((2, 5, 2, D), np.float32),
                       v=np.ones((2, 5, 2, D), np.float32), kv_len=np.array([5, 2], np.int32))
            want = (2, 3, 4, D)
        elif o.name == "attention_int8_scaled":  # q, k int8 with float32 scales a row, v [2, 5, 2, D]
            ins = dict(q=np.ones((2, 3, 4, D), np.int8), q_scale=np.ones((2, 3, 4), np.float32),
                       k=np.ones((2, 5, 2, D), np.int8), k_scale=np.ones((2, 5, 2), np.float32),
                       v=np.ones((2, 5, 2, D), np.float32), kv_len=np.array([5, 2], np.int32))
            want = (2, 3, 4, D)
        elif o.name == "lowrank_update":  # x [2, 3, D], v [D, 4], u_t [4, 5]
            ins = dict(x=ins["x"], v=np.ones((D, 4), np.float32), u_t=np.ones((4, 5), np.float32))
            want = (2, 3, 5)
        elif o.name == "lowrank_prepare":  # w [5, D], b [5, 3]: [5, D + 8]
            ins = dict(w=np.ones((5, D), np.float32), b=np.ones((5, 3), np.float32))
            want = (5, D + 8)
        elif o.name == "linear_lowrank":  # x [2, 3, D], w_cat [5, D + 8], a [3, D]
            ins = dict(x=ins["x"], w_cat=np.ones((5, D + 8), np.float32), a=np.ones((3, D), np.float32))
            want = (2, 3, 5)
        elif o.name == "lowrank_update_backward":  # dx, dv, du_t by default
            ins = dict(dout=np.ones((2, 3, 5), np.float32), x=ins["x"], v=np.ones((D, 4), np.float32),
                       u_t=np.ones((4, 5), np.float32))
        elif o.name == "linear_lowrank_backward":  # dx, da, db by default
            ins = dict(dy=np.ones((2, 3, 5), np.float32), x=ins["x"], w_cat=np.ones((5, D + 8), np.float32),
                       a=np.ones((3, D), np.float32))
        elif o.name in ("dequantize_fp8", "linear_fp8"):  # e4m3 x [2, 3, D] with a scale a row (w [5, D])
            f8 = jax.numpy.float8_e4m3fn
            ins = dict(x=np.ones((2, 3, D), f8), x_scale=np.ones((2, 3), np.float32), w=np.ones((5, D), f8),
                       w_scale=np.ones(5, np.float32))
            want = (2, 3, 5) if o.name == "linear_fp8" else want
        elif o.name == "linear_w8":  # float32 x [2, 3, D], int8 w [5, D] with a scale a row
            ins = dict(x=ins["x"], w=np.ones((5, D), np.int8), w_scale=np.ones(5, np.float32))
            want = (2, 3, 5)
        elif o.name == "conv":  # x [2, 6, 5, D] by a 3x3 w [4, 3, 3, D], no padding
            ins = dict(x=np.ones((2, 6, 5, D), np.float32), w=np.ones((4, 3, 3, D), np.float32))
            want = (2, 4, 3, 4)
        elif o.name == "group_norm":  # x [2, 5, 4, D] channels-last, 32 groups by default: 4 here
            ins = dict(x=np.ones((2, 5, 4, D), np.float32))
            attrs, want = (4,) + attrs[1:], (2, 5, 4, D)
        elif o.name == "fold_batchnorm":  # w [4, 3, 3, D], mean and var [4]: (w', b')
            ins = dict(w=np.ones((4, 3, 3, D), np.float32), mean=np.zeros(4, np.float32), var=np.ones(4, np.float32))
        out = fk.call(o, [ins.get(o.tensors[i][0]) for i in o.inputs], attrs)
        if o.name == "lowrank_update_backward":
            assert [t.shape for t in out] == [(2, 3, D), (D, 4), (4, 5)], o.name
        elif o.name == "linear_lowrank_backward":
            assert [t.shape for t in out] == [(2, 3, D), (3, D), (5, 3)], o.name
        elif o.name == "linear_backward":
            assert [t.shape for t in out] == [(2, 3, D), (5, D), (5,)], o.name
        elif o.name == "qk_norm_rope":
            assert all(isinstance(t, jax.Array) and t.dtype == np.float32 for t in out), o.name
            assert [t.shape for t in out] == [(2, 4, 3, D), (2, 2, 3, D)], o.name
        elif o.name == "qk_norm_rope_int8":  # q's and k's int8 data and float32 scales, [B, S, H, Dh] and [B, S, H]
            assert [(t.shape, t.dtype) for t in out] == [((2, 3, 4, D), np.int8), ((2, 3, 4), np.float32),
                                                         ((2, 3, 2, D), np.int8), ((2, 3, 2), np.float32)], o.name
        elif o.name.startswith("rope_table"):
            assert all(isinstance(t, jax.Array) and t.shape == want and t.dtype == np.float32 for t in out), o.name
        elif o.name in ("quantize_fp8", "rmsnorm_fp8", "layernorm_fp8", "adaln_fp8"):  # e4m3 data, float32 scales
            assert [(t.shape, t.dtype.name) for t in out] == [((2, 3, D), "float8_e4m3fn"), ((2, 3), "float32")], o.name
        elif o.name == "quantize_int8":  # int8 data, float32 scales
            assert [(t.shape, t.dtype.name) for t in out] == [((2, 3, D), "int8"), ((2, 3), "float32")], o.name
        elif o.name == "glu_fp8":  # half of x's last dim
            assert [(t.shape, t.dtype.name) for t in out] == [((2, 3, D // 2), "float8_e4m3fn"), ((2, 3), "float32")]
        elif o.name == "fold_batchnorm":
            assert [t.shape for t in out] == [(4, 3, 3, D), (4,)], o.name
        elif o.name in ("dequantize_fp8", "linear_fp8"):  # out_dtype's default: bfloat16
            assert isinstance(out, jax.Array) and out.shape == want and out.dtype.name == "bfloat16", o.name
        else:
            assert isinstance(out, jax.Array) and out.shape == want, o.name


def test_attributes_are_static():
    x = on_cpu(rand((3, 50), np.float32, 1e-2))[0]
    for eps in (1e-6, 1e-2, 0.5):
        f = jax.jit(lambda x: fk.rmsnorm(x, eps=eps))  # eps closed over: a compile-time constant
        assert_same(f(x), fusedk.rmsnorm(np.asarray(x), eps=eps), f"eps={eps}")
    a = np.asarray(jax.jit(lambda x: fk.rmsnorm(x, eps=1e-6))(x))
    b = np.asarray(jax.jit(lambda x: fk.rmsnorm(x, eps=0.5))(x))
    assert not np.array_equal(a, b)
    # the attribute reaches the handler as a typed scalar attribute of the custom call
    text = jax.jit(lambda x: fk.rmsnorm(x, eps=0.25)).lower(x).as_text()
    assert "fusedk_rmsnorm" in text and "eps = 2.500000e-01 : f32" in text, text


def test_jitted_chain():
    B, L, D, dt = 2, 16, 64, BF16
    x, r, mod = rand((B, L, D), dt), rand((B, L, D), dt), rand((B, 3 * D), dt, 0.5)
    w, xr = rand((D,), dt, 0.2, 1.0), rand((B, L, D), dt, 2.0)

    @jax.jit
    def block(x, r, mod, w, xr):
        h, r2 = fk.rmsnorm(x, w, residual=r)
        a = fk.adaln(h, mod[:, D:2 * D], mod[:, :D], norm="rms", weight=w)
        return fk.residual_tanh_gated_rmsnorm(r2, a + xr, mod[:, 2 * D:]), r2

    y, r2 = block(*on_cpu(x, r, mod, w, xr))
    h, want_r2 = fusedk.rmsnorm(x, w, residual=r)
    a = fusedk.adaln(h, mod[:, D:2 * D], mod[:, :D], norm="rms", weight=w)
    a_xr = np.asarray(jax.device_put(a, CPU) + jax.device_put(xr, CPU))  # the bf16 add XLA:CPU does
    assert_same(r2, want_r2, "chain residual")
    assert_same(y, fusedk.residual_tanh_gated_rmsnorm(want_r2, a_xr, mod[:, 2 * D:]), "chain")


def test_vmap_runs_per_batch_element():
    x, w = rand((3, 4, 32), np.float32), rand((32,), np.float32)
    got = jax.vmap(lambda x: fk.rmsnorm(x, w))(*on_cpu(x))
    assert_same(got, fusedk.rmsnorm(x, w), "vmap")


def test_empty_and_noncompact_inputs():
    x = jnp.zeros((2, 0, 8), jnp.float32, device=CPU)
    assert fk.adaln(x, jnp.zeros((2, 8), device=CPU), jnp.zeros((2, 8), device=CPU)).shape == (2, 0, 8)
    # a transposed view: XLA makes it compact before the call
    xt = rand((64, 3), np.float32)
    assert_same(jax.jit(lambda a: fk.layernorm(a.T))(*on_cpu(xt)), fusedk.layernorm(np.ascontiguousarray(xt.T)),
                "transposed input")


# --- errors -----------------------------------------------------------------------------------
def test_errors_name_the_argument():
    x, w = on_cpu(rand((2, 8, 16), np.float32), rand((16,), np.float32))
    with pytest.raises(fusedk.Error, match=r"rmsnorm: weight has shape \[5\], expected \[16\]") as e:
        fk.rmsnorm(x, w[:5])  # eager: the C library's check, as fusedk.Error
    assert e.value.status == "FUSEDK_ERR_SHAPE"
    with pytest.raises(fusedk.Error, match=r"rmsnorm: x has dtype float64, expected float32, float16 or bfloat16"):
        fk.rmsnorm(np.ones((2, 16)))
    with pytest.raises(fusedk.Error, match=r"rmsnorm: weight has dtype float64, expected float32, float16 or bfloat16"):
        fk.rmsnorm(x, np.ones(16))
    x64 = getattr(jax, "enable_x64", None)
    if x64 is None:  # older jax
        x64 = getattr(__import__("jax.experimental").experimental, "enable_x64", None)
    if x64 is not None:  # a float64 JAX array
        with x64(True), pytest.raises(fusedk.Error, match=r"layernorm: x has dtype float64"):
            jax.jit(fk.layernorm)(jnp.ones((2, 16), jnp.float64, device=CPU))
    with pytest.raises(fusedk.Error, match=r"layernorm: x has dtype int32"):
        jax.jit(fk.layernorm)(jnp.ones((2, 16), jnp.int32, device=CPU))
    with pytest.raises(fusedk.Error, match=r"adaln: bias has dtype float16, expected float32"):
        fk.adaln(x, x[:, 0], x[:, 0], bias=jnp.ones(16, jnp.float16))
    with pytest.raises(fusedk.Error, match=r"rmsnorm: x has ndim 0"):
        fk.rmsnorm(jnp.float32(1.0))
    with pytest.raises(fusedk.Error, match=r"adaln: scale is None, expected a tensor"):
        fk.adaln(x, None, x[:, 0])
    with pytest.raises(fusedk.Error, match=r"adaln: norm is 'group'"):
        fk.adaln(x, x[:, 0], x[:, 0], norm="group")
    with pytest.raises(fusedk.Error, match=r"adaln: scale has shape \[2, 8\], expected \[2, 16\]"):
        fk.adaln(x, x[:, :, :8][:, 0], x[:, 0])
    with pytest.raises(fusedk.Error, match=r"eps is -1, expected a finite value >= 0"):
        fk.layernorm(x, eps=-1.0)
    with pytest.raises(fusedk.Error, match=r"rmsnorm: eps is a .*Tracer, expected a Python or NumPy number"):
        jax.jit(lambda x, e: fk.rmsnorm(x, eps=e))(x, 1e-6)
    assert_same(fk.rmsnorm(x, eps=jnp.float32(0.5)), fusedk.rmsnorm(np.asarray(x), eps=0.5), "eps as a JAX scalar")
    with pytest.raises(fusedk.Error, match=r"exact is 2, expected 0 or 1"):
        fk.call(fusedk._core.OPS[3], [x, x, x[:, 0]], (1e-6, 2))
    # inside the caller's own jit the C check runs when XLA executes: XLA's error, same message
    with pytest.raises(Exception, match=r"fusedk: rmsnorm: weight has shape \[5\], expected \[16\].*"
                                        r"\[FUSEDK_ERR_SHAPE\]"):
        jax.jit(lambda x, w: fk.rmsnorm(x, w))(x, w[:5]).block_until_ready()
    with pytest.raises(fusedk.Error, match="JAX arrays are immutable"):
        fusedk.rmsnorm(x, out=x)


def test_handler_rejects_malformed_calls():
    # straight to the C handler through jax.ffi, past fusedk.jax's own checks: errors, never UB
    x = jax.device_put(rand((2, 3, 8), np.float32), CPU)
    one = jax.ShapeDtypeStruct(x.shape, x.dtype)

    def bad(match, args=(x,), results=(one,), **attrs):
        with pytest.raises(Exception, match=match):
            jax.ffi.ffi_call("fusedk_rmsnorm", list(results), vmap_method="sequential")(*args, **attrs)[0] \
                .block_until_ready()

    bad(r"fusedk: xla: no attribute op")
    n = len(fusedk._core.OPS)
    bad(rf"attribute op is {n}, expected a registry id 0\.\.{n - 1}", op=np.int32(n))
    bad(r"attribute op is 1\.5", op=np.float32(1.5))
    bad(r"attribute op is not an int32 scalar", op="rmsnorm")
    bad(r"attribute present is -1", op=np.int32(0), present=np.int32(-1))
    bad(r"rmsnorm: XLA passed 1 operands, expected 2", op=np.int32(0), present=np.int32(1 << 4))
    bad(r"rmsnorm: XLA passed 2 operands, expected 1", args=(x, x), op=np.int32(0))
    bad(r"rmsnorm: XLA expects 2 results, the op has 1", results=(one, one), op=np.int32(0))
    bad(r"rmsnorm: unknown attribute 'epsilon'", op=np.int32(0), epsilon=np.float32(1e-6))
    bad(r"rmsnorm: attribute eps is not a float32 scalar", op=np.int32(0), eps=np.array([1.0, 2.0], np.float32))
    bad(r"adaln: attribute norm is not an int32 scalar", args=(x, x[:, 0], x[:, 0]), op=np.int32(2),
        norm=np.float32(0.5))
    x9 = jax.device_put(np.ones((1,) * 8 + (4,), np.float32), CPU)
    bad(r"rmsnorm: x has ndim 9, expected 1\.\.8", args=(x9,), results=(jax.ShapeDtypeStruct(x9.shape, x9.dtype),),
        op=np.int32(0))
    xi = jax.device_put(np.ones((2, 4), np.int32), CPU)
    bad(r"rmsnorm: x has dtype int32, expected float32, float16 or bfloat16", args=(xi,),
        results=(jax.ShapeDtypeStruct(xi.shape, xi.dtype),), op=np.int32(0))
    # attributes are optional: the registry's defaults (eps 1e-6 here)
    got = jax.ffi.ffi_call("fusedk_rmsnorm", one, vmap_method="sequential")(x, op=np.int32(0))
    assert_same(got, fusedk.rmsnorm(np.asarray(x)), "registry defaults")


def test_grad_is_refused_clearly():
    x = on_cpu(rand((2, 16), np.float32))[0]
    with pytest.raises(fusedk.Error, match=r"rmsnorm: fusedk ops are forward-only") as e:
        jax.grad(lambda x: fk.rmsnorm(x).sum())(x)
    assert e.value.status == "FUSEDK_ERR_UNSUPPORTED"
    with pytest.raises(fusedk.Error, match=r"layernorm: fusedk ops are forward-only"):
        jax.jit(jax.jacfwd(fk.layernorm))(x)
    # differentiating something else around it is fine (the op's inputs are constants there)
    assert np.isfinite(float(jax.grad(lambda s: (s * fk.rmsnorm(x)).sum())(1.0)))


def test_repeated_eager_calls_do_not_retrace(monkeypatch):
    traces = []
    real = jax.ffi.ffi_call

    def counting(*a, **k):
        traces.append(a[0])
        return real(*a, **k)

    monkeypatch.setattr(jax.ffi, "ffi_call", counting)
    x, w = on_cpu(rand((5, 48), np.float16), rand((48,), np.float16))
    for _ in range(4):
        y = fk.rmsnorm(x, w, eps=3.25e-4)  # eps and shape unused elsewhere: one fresh trace
    assert traces == ["fusedk_rmsnorm"], traces
    assert_same(y, fusedk.rmsnorm(np.asarray(x), np.asarray(w), eps=3.25e-4), "cached")
    fk.rmsnorm(x, w, eps=3.25e-4, residual=x)  # another set of optional inputs: its own program
    assert traces == ["fusedk_rmsnorm"] * 2, traces


# --- GPU: XLA:GPU runs the kernels on XLA's stream -----------------------------------------------
try:
    GPU = jax.devices("gpu")[0]
except RuntimeError:
    GPU = None
needs_gpu = pytest.mark.skipif(GPU is None or not fusedk.kernel_info()["cuda"].get("devices"),
                               reason="no jax GPU backend, or no CUDA device for fusedk")


def on_gpu(*arrays):
    return [None if a is None else jax.device_put(a, GPU) for a in arrays]


def check_gpu(got, want, dtype, what, aux=None):
    """GPU vs the CPU reference: not bitwise; the tolerance of the GPU suites"""
    assert isinstance(got, jax.Array) and got.devices() == {GPU}, f"{what}: not a JAX array on the GPU"
    assert_close_gpu(np.asarray(got), want, dtype, aux=aux, what=what)


@needs_gpu
@MODES
@TYPES
def test_gpu_ops_match_cpu_reference(dtype, jit):
    B, L, D = 2, 512, 1152
    x, r, xr = rand((B, L, D), dtype), rand((B, L, D), dtype), rand((B, L, D), dtype, 2.0)
    w, b, mod = rand((D,), dtype, 0.2, 1.0), rand((D,), dtype, 0.2), rand((B, 3 * D), dtype, 0.5)
    gx, gr, gxr, gw, gb, gmod = on_gpu(x, r, xr, w, b, mod)
    y, ro = run(lambda x, w, r: fk.rmsnorm(x, w, residual=r), jit, gx, gw, gr)
    want_y, want_r = fusedk.rmsnorm(x, w, residual=r)
    check_gpu(y, want_y, dtype, "gpu rmsnorm")
    check_gpu(ro, want_r, dtype, "gpu residual_out")
    check_gpu(run(lambda x, w, b: fk.layernorm(x, w, b), jit, gx, gw, gb), fusedk.layernorm(x, w, b), dtype,
              "gpu layernorm")
    for norm in ("layer", "rms"):
        got = run(lambda x, m, w: fk.adaln(x, m[:, D:2 * D], m[:, :D], norm=norm, weight=w), jit, gx, gmod, gw)
        check_gpu(got, fusedk.adaln(x, mod[:, D:2 * D], mod[:, :D], norm=norm, weight=w), dtype, f"gpu adaln {norm}")
    for exact in (True, False):
        g = mod[:, 2 * D:]
        got = run(lambda x, xr, m: fk.residual_tanh_gated_rmsnorm(x, xr, m[:, 2 * D:], exact=exact), jit, gx, gxr, gmod)
        want = fusedk.residual_tanh_gated_rmsnorm(x, xr, g, exact=exact)
        check_gpu(got, want, dtype, f"gpu mochi exact={exact}",
                  aux=np.abs(x.astype(np.float64)) + np.abs(want.astype(np.float64)))


@needs_gpu
def test_gpu_jitted_chain_and_errors():
    B, L, D, dt = 2, 256, 768, BF16
    x, r, mod, w = rand((B, L, D), dt), rand((B, L, D), dt), rand((B, 2 * D), dt, 0.5), rand((D,), dt, 0.2, 1.0)

    @jax.jit
    def block(x, r, mod, w):
        h, r2 = fk.rmsnorm(x, w, residual=r)
        return fk.adaln(h, mod[:, D:], mod[:, :D], norm="rms", weight=w), r2

    y, r2 = block(*on_gpu(x, r, mod, w))
    h, want_r2 = fusedk.rmsnorm(x, w, residual=r)
    check_gpu(r2, want_r2, dt, "gpu chain residual")
    # the kernel's h differs from the reference's by an ulp here and there: compare the second op on
    # the GPU's own h
    h_gpu = np.asarray(fk.rmsnorm(*on_gpu(x, w), residual=on_gpu(r)[0])[0])
    check_gpu(y, fusedk.adaln(h_gpu, mod[:, D:], mod[:, :D], norm="rms", weight=w), dt, "gpu chain")
    # an eager call: fusedk.Error where XLA reports the handler's failure at the call, XLA's own
    # error (same message) where it reports it when the result is awaited
    gx, gw = on_gpu(rand((4, 64), np.float32), rand((5,), np.float32))
    with pytest.raises(Exception, match=r"rmsnorm: weight has shape \[5\], expected \[64\]"):
        fk.rmsnorm(gx, gw).block_until_ready()


@needs_gpu
def test_gpu_inside_xla_command_buffers(tmp_path):
    # XLA records custom calls whose handler says COMMAND_BUFFER_COMPATIBLE into CUDA graphs when
    # asked to; a fresh process, since XLA_FLAGS is read when the backend starts
    script = r"""
import numpy as np, jax, fusedk, fusedk.jax as fk
x = np.random.default_rng(0).standard_normal((4, 256, 1024)).astype(np.float32)
f = jax.jit(lambda x: fk.layernorm(fk.rmsnorm(x) * 2.0))
gx = jax.device_put(x, jax.devices("gpu")[0])
for _ in range(3):
    y = np.asarray(f(gx))
want = fusedk.layernorm((fusedk.rmsnorm(x) * np.float32(2.0)).astype(np.float32))
err = np.max(np.abs(y - want) / (1e-5 * np.abs(want) + 1e-5))  # the GPU tolerance, two ops deep
print("maxrel", err)
assert err <= 2, err
"""
    env = dict(os.environ, XLA_FLAGS="--xla_gpu_enable_command_buffer=FUSION,CUSTOM_CALL "
                                     f"--xla_gpu_graph_min_graph_size=1 --xla_dump_to={tmp_path}")
    p = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, text=True, timeout=600)
    out = p.stdout + p.stderr
    if p.returncode > 0 and "fusedk" not in out and "maxrel" not in out and "flag" in out.lower():
        pytest.skip("this XLA does not take the command buffer flags: " + out.strip().splitlines()[-1])
    assert p.returncode == 0, out  # a crash (signal) fails too
    dumps = [f.read_text() for f in tmp_path.glob("*after_optimizations.txt")]
    if not any("command_buffer" in d and "fusedk_rmsnorm" in d for d in dumps):
        pytest.skip("results right, but this XLA put no fusedk custom call into a command buffer")


@needs_gpu
@MODES
def test_gpu_attention(jit):
    """attention on XLA's stream (GQA, causal, kv_len, lse) against the CPU reference: out within
    eps_T (|ref| + max |v|) (P rounds to the dtype before P v), lse within 2^-20 of the scores"""
    B, S, H, D, dt = 2, 300, 4, 128, BF16
    q, k, v = rand((B, S, H, D), dt), rand((B, S + 7, 2, D), dt), rand((B, S + 7, 2, D), dt)
    n = np.array([S // 2, S + 7], np.int32)
    got, lse = run(lambda q, k, v, n: fusedk.attention(q, k, v, causal=True, kv_len=n, return_lse=True), jit,
                   *on_gpu(q, k, v, n))
    want, want_lse = fusedk.attention(q, k, v, causal=True, kv_len=n, return_lse=True)
    check_gpu(got, want, dt, "gpu attention", aux=np.full(want.shape, np.abs(v.astype(np.float64)).max()))
    smax = D ** -0.5 * D * np.abs(q.astype(np.float64)).max() * np.abs(k.astype(np.float64)).max()
    assert_close(np.asarray(lse), want_lse, np.float32, aux=np.full(want_lse.shape, smax), what="gpu attention lse",
                 eps={np.dtype(np.float32): 2.0 ** -20}, atol=1e-5)
