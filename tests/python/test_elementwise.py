"""[elementwise] act, silu_fma, gated_residual, glu and glu_pair: the CPU references (through the bindings, on
NumPy arrays) against float64 NumPy oracles, over every dtype, awkward shapes, strided and
broadcast views, out= and in place, and a bad value for every argument."""
import numpy as np
import pytest

import fusedk
import oracle
from oracle import DTYPES, assert_close

rng = np.random.default_rng()
SHAPES = [(1, 1), (3, 7), (2, 5, 64), (1, 3072), (4, 1000), (2, 3, 4, 9)]
KINDS = ["gelu", "gelu_tanh", "silu", "relu"]


def rand(shape, dtype, scale=2.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_act(shape, dtype, kind):
    x = rand(shape, dtype, 4.0)
    y = fusedk.act(x, kind)
    assert y.dtype == dtype and y.shape == shape
    assert_close(y, oracle.act(x, kind), dtype, what=f"act {kind}")


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the oracle's own inf * 0
def test_act_specials_and_in_place():
    x = np.array([[np.nan, np.inf, -np.inf, 0.0, -0.0, 30.0, -30.0, 1e-30]], np.float32)
    for kind in KINDS:
        assert_close(fusedk.act(x, kind), oracle.act(x, kind), np.float32, what=f"act {kind} specials")
    y = rand((3, 64), np.float32)
    want = oracle.act(y, "silu")
    assert fusedk.act(y, "silu", out=y) is y
    assert_close(y, want, np.float32, what="act in place")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_silu_fma(shape, dtype):
    a, b, c = rand(shape, dtype), rand(shape, dtype), rand(shape, dtype)
    assert_close(fusedk.silu_fma(a, b, c), oracle.silu_fma(a, b, c), dtype, what="silu_fma")


def test_silu_fma_broadcast_and_strided_views():
    a = rand((4, 96), np.float32)
    b = np.broadcast_to(rand((96,), np.float32), (4, 96))  # stride 0 over rows
    big = rand((4, 3 * 96), np.float32)
    c = big[:, 96:192]  # a strided view (a chunk of a projection)
    assert_close(fusedk.silu_fma(a, b, c), oracle.silu_fma(a, b, c), np.float32, what="silu_fma views")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1, 1), (2, 5, 64), (3, 17, 1152), (1, 4, 3072)], ids=str)
def test_gated_residual(shape, dtype):
    x, y = rand(shape, dtype), rand(shape, dtype)
    mod = rand((shape[0], 6 * shape[2]), dtype)
    gate = mod[:, 2 * shape[2]:3 * shape[2]]  # a chunk of the [B, 6D] AdaLN-Zero modulation
    out = fusedk.gated_residual(x, y, gate)
    assert_close(out, oracle.gated_residual(x, y, gate), dtype, what="gated_residual")
    g1 = np.broadcast_to(rand((1, shape[2]), dtype), (shape[0], shape[2]))  # one gate for every sample
    assert_close(fusedk.gated_residual(x, y, g1), oracle.gated_residual(x, y, g1), dtype, what="broadcast gate")


@pytest.mark.parametrize("dtype", [np.dtype(np.float16), oracle.BF16], ids=str)
def test_gated_residual_float32_gate(dtype):
    """16-bit rows with a float32 gate (a modulation kept in float32): read as float32."""
    x, y = rand((2, 5, 64), dtype), rand((2, 5, 64), dtype)
    gate = rand((2, 6 * 64), np.float32)[:, 64:128]
    out = fusedk.gated_residual(x, y, gate)
    assert out.dtype == dtype
    assert_close(out, oracle.gated_residual(x, y, gate), dtype, what="gated_residual float32 gate")
    other = np.float16 if dtype == oracle.BF16 else oracle.BF16
    with pytest.raises(fusedk.Error, match=r"gate has dtype .*, expected .* \(the dtype of x\) or float32"):
        fusedk.gated_residual(x, y, gate.astype(other))


def test_gated_residual_in_place():
    x, y, g = rand((2, 9, 32), np.float16), rand((2, 9, 32), np.float16), rand((2, 32), np.float16)
    want = oracle.gated_residual(x, y, g)
    assert fusedk.gated_residual(x, y, g, out=x) is x
    assert_close(x, want, np.float16, what="gated_residual in place")


@pytest.mark.parametrize("half", ["first", "second"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 2), (3, 14), (2, 5, 128), (2, 9216), (2, 3, 4, 18)], ids=str)
def test_glu(shape, dtype, kind, half):
    x = rand(shape, dtype)
    y = fusedk.glu(x, kind, half)
    assert y.shape == shape[:-1] + (shape[-1] // 2,) and y.dtype == dtype
    assert_close(y, oracle.glu(x, kind, half), dtype, what=f"glu {kind} {half}")


def test_glu_forms_of_the_models_and_views():
    x = rand((4, 2 * 96), np.float32)
    h, g = np.split(x, 2, axis=-1)  # diffusers' GEGLU: h, g = x.chunk(2); h * gelu(g)
    assert_close(fusedk.glu(x, act="gelu", act_half="second"), oracle.f64(h) * oracle.act(g, "gelu"), np.float32,
                 what="GEGLU")
    assert_close(fusedk.glu(x), oracle.act(h, "silu") * oracle.f64(g), np.float32, what="SwiGLU")
    proj = rand((4, 3, 2 * 96), np.float16)[:, 1]  # strided rows
    assert_close(fusedk.glu(proj, "gelu_tanh"), oracle.glu(proj, "gelu_tanh"), np.float16, what="glu strided rows")
    v, gate = proj[:, :96], proj[:, 96:]  # two strided views of one projection
    assert_close(fusedk.glu(v, act="silu", gate=gate), oracle.glu_pair(v, gate), np.float16, what="glu gate=")
    assert_close(fusedk.glu_pair(v, gate, "relu"), oracle.glu_pair(v, gate, "relu"), np.float16, what="glu_pair")
    out = np.empty((4, 96), np.float32)
    assert fusedk.glu(x, out=out) is out


@pytest.mark.parametrize("case, status, reason", [
    (lambda x, g: fusedk.glu(x[..., :15]), "SHAPE", "glu: x has last dim 15, expected an even size"),
    (lambda x, g: fusedk.glu(x, out=np.empty((2, 3, 16), np.float32)), "SHAPE",
     "glu: out has shape [2, 3, 16], expected [2, 3, 8] (x with half its last dim)"),
    (lambda x, g: fusedk.glu(x, act_half="middle"), "INVALID_ARGUMENT", "glu: act_half is 'middle'"),
    (lambda x, g: fusedk.glu(x, act="tanh"), "INVALID_ARGUMENT", "glu: act is 'tanh'"),
    (lambda x, g: fusedk.glu(x, gate=x[:, :2]), "SHAPE", "glu_pair: gate has shape [2, 2, 16], expected [2, 3, 16]"),
    (lambda x, g: fusedk.act(x, "swish"), "INVALID_ARGUMENT", "act: kind is 'swish'"),
    (lambda x, g: fusedk.act(x.astype(np.float64)), "DTYPE", "act: x has dtype float64"),
    (lambda x, g: fusedk.act(x, out=np.empty((2, 3, 8), np.float32)), "SHAPE", "act: out has shape [2, 3, 8], expected [2, 3, 16]"),
    (lambda x, g: fusedk.act(x, out=np.empty((2, 3, 16), np.float16)), "DTYPE", "act: out has dtype float16"),
    (lambda x, g: fusedk.act(x[..., ::2]), "LAYOUT", "act: x has stride 2 in its last dim"),
    (lambda x, g: fusedk.silu_fma(x, x, x[:, :2]), "SHAPE", "silu_fma: c has shape [2, 2, 16], expected [2, 3, 16] (same as a)"),
    (lambda x, g: fusedk.silu_fma(x, x.astype(np.float16), x), "DTYPE", "silu_fma: b has dtype float16, expected float32 (the dtype of a)"),
    (lambda x, g: fusedk.silu_fma(x, x, None), "INVALID_ARGUMENT", "silu_fma: c is NULL"),
    (lambda x, g: fusedk.gated_residual(x, x, g[:1]), "SHAPE", "gated_residual: gate has shape [1, 16], expected [2, 16]"),
    (lambda x, g: fusedk.gated_residual(x[0], x[0], g), "SHAPE", "gated_residual: x has ndim 2, expected 3"),
    (lambda x, g: fusedk.gated_residual(x, x[:, :, :8], g), "SHAPE", "gated_residual: y has shape"),
    (lambda x, g: fusedk.gated_residual(x, x, g, out=np.lib.stride_tricks.as_strided(
        x.copy(), x.shape, (x.strides[0], 0, x.strides[2]))), "LAYOUT", "gated_residual: output out has stride 0"),
])
def test_bad_arguments(case, status, reason):
    x, g = rand((2, 3, 16), np.float32), rand((2, 16), np.float32)
    with pytest.raises(fusedk.Error) as e:
        case(x, g)
    assert e.value.status == "FUSEDK_ERR_" + status and reason in e.value.reason, e.value


# --- the GPU kernels through torch and CuPy, against the CPU reference ---------------------------
@pytest.mark.skipif(not oracle.gpu_frameworks(), reason="no CUDA device with torch or CuPy")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 37, 1), (2, 37, 111), (3, 257, 1152), (1, 2, 65536), (2, 33, 2 * 4608)],
                         ids=str)
def test_gpu_matches_the_reference(shape, dtype):
    from oracle import assert_close_gpu
    x, y, z = rand(shape, dtype), rand(shape, dtype), rand(shape, dtype)
    g = rand((shape[0], 6 * shape[2]), dtype)[:, shape[2]:2 * shape[2]]
    for fw, to_dev, to_host, _ in oracle.gpu_frameworks():
        dev = [to_dev(a) for a in (x, y, z, g)]
        if any(d is None for d in dev):
            continue  # CuPy has no bfloat16 arrays
        for kind in KINDS:
            assert_close_gpu(to_host(fusedk.act(dev[0], kind)), fusedk.act(x, kind), dtype, what=f"{fw} act {kind}")
        assert_close_gpu(to_host(fusedk.silu_fma(*dev[:3])), fusedk.silu_fma(x, y, z), dtype, what=f"{fw} silu_fma")
        assert_close_gpu(to_host(fusedk.gated_residual(dev[0], dev[1], dev[3])), fusedk.gated_residual(x, y, g), dtype,
                         what=f"{fw} gated_residual")
        if shape[-1] % 2 == 0:
            for kind, half in (("silu", "first"), ("gelu", "second"), ("gelu_tanh", "first")):
                assert_close_gpu(to_host(fusedk.glu(dev[0], kind, half)), fusedk.glu(x, kind, half), dtype,
                                 what=f"{fw} glu {kind} {half}")
        assert_close_gpu(to_host(fusedk.glu_pair(dev[0], dev[1], "gelu")), fusedk.glu_pair(x, y, "gelu"), dtype,
                         what=f"{fw} glu_pair")
