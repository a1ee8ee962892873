"""Inputs nobody planned for, through the NumPy path: byte order (every op, every argument
position: a non-native array is refused, naming it, and an out= array is left untouched), dtype
names as NumPy writes them, and the exception types (fusedk.Error, and the built-in type of its
status, which NumPy, PyTorch and JAX users already catch)."""
import pickle

import ml_dtypes
import numpy as np
import pytest

import fusedk
from fusedk import _core

rng = np.random.default_rng(0)


def f32(*shape):
    return rng.standard_normal(shape).astype(np.float32)


def i8(*shape):
    return rng.integers(-127, 128, shape).astype(np.int8)


def f8(*shape):
    return f32(*shape).astype(ml_dtypes.float8_e4m3fn)


# registry-order tensors of one valid call (outputs None: allocated) and its leading attributes
B, L, D, S, H, DH = 2, 3, 8, 4, 2, 8
VALID = {
    "rmsnorm": lambda: ([None, None, f32(B, L, D), f32(B, L, D), f32(D)], ()),
    "layernorm": lambda: ([None, f32(B, L, D), f32(D), f32(D)], ()),
    "adaln": lambda: ([None, f32(B, L, D), f32(B, D), f32(B, D), f32(D), f32(D)], ()),
    "residual_tanh_gated_rmsnorm": lambda: ([None, f32(B, L, D), f32(B, L, D), f32(B, D)], ()),
    "act": lambda: ([None, f32(B, L, D)], ()),
    "silu_fma": lambda: ([None, f32(B, L, D), f32(B, L, D), f32(B, L, D)], ()),
    "gated_residual": lambda: ([None, f32(B, L, D), f32(B, L, D), f32(B, D)], ()),
    "glu": lambda: ([None, f32(B, L, D)], ()),
    "glu_pair": lambda: ([None, f32(B, L, D), f32(B, L, D)], ()),
    "rope": lambda: ([None, None, f32(1, S, H, DH), f32(1, S, H, DH), f32(S, DH // 2), f32(S, DH // 2)], ()),
    "rope_table_1d": lambda: ([None, None, f32(S)], (DH,)),
    "rope_table_axes": lambda: ([None, None, f32(S, 3)], ()),
    "rope_table_ltx": lambda: ([None, None, f32(S, 3)], (12,)),
    "rope_table_mixed": lambda: ([None, None, f32(S, 3), f32(3, H, DH // 2)], ()),
    "diffusion_step": lambda: ([None, f32(B, L, D), f32(B, L, D), f32(B, L, D), f32(B, L, D)], (2.0,)),
    "qk_norm_rope": lambda: ([None, None, None, f32(1, S, H, DH), f32(1, S, H, DH), f32(1, S, H, DH),
                              f32(S, DH // 2), f32(S, DH // 2), f32(DH), f32(DH)], ()),
    "linear": lambda: ([None, None, f32(3, D), f32(5, D), f32(5)], ()),
    "linear_backward": lambda: ([None, None, None, f32(3, 5), f32(3, D), f32(5, D), None], ()),
    "attention": lambda: ([None, None, f32(B, S, H, DH), f32(B, L, 1, DH), f32(B, L, 1, DH), np.full(B, 2, np.int32)],
                          ()),
    "attention_int8": lambda: ([None, None, f32(B, S, H, DH), f32(B, L, 1, DH), f32(B, L, 1, DH),
                                np.full(B, 2, np.int32)], ()),
    "attention_int8_scaled": lambda: ([None, None, i8(B, S, H, DH), f32(B, S, H), i8(B, L, 1, DH), f32(B, L, 1),
                                       f32(B, L, 1, DH), np.full(B, 2, np.int32)], ()),
    "qk_norm_rope_int8": lambda: ([None] * 4 + [f32(1, S, H, DH), f32(1, S, H, DH), f32(S, DH // 2), f32(S, DH // 2),
                                               f32(DH), f32(DH)], ()),
    "quantize_fp8": lambda: ([None, None, f32(B, L, D)], ()),
    "rmsnorm_fp8": lambda: ([None, None, None, f32(B, L, D), f32(B, L, D), f32(D)], ()),
    "layernorm_fp8": lambda: ([None, None, f32(B, L, D), f32(D), f32(D)], ()),
    "adaln_fp8": lambda: ([None, None, f32(B, L, D), f32(B, D), f32(B, D), f32(D), f32(D)], ()),
    "dequantize_fp8": lambda: ([None, f8(B, L, D), f32(B, L)], ()),
    "glu_fp8": lambda: ([None, None, f32(B, L, D)], (2, 1)),
    "linear_fp8": lambda: ([None, None, f8(3, 16), f32(3), f8(5, 16), f32(5), None], ()),
    "quantize_int8": lambda: ([None, None, f32(B, L, D)], ()),
    "linear_w8": lambda: ([None, None, f32(3, 16), i8(5, 16), f32(5), None], ()),
    "conv": lambda: ([None, f32(B, 5, 4, D), f32(3, 3, 3, D), f32(3), None], (1, 1)),
    "fold_batchnorm": lambda: ([None, None, f32(3, 3, 3, D), f32(3), f32(3), f32(3), f32(3), f32(3) ** 2 + 0.5], ()),
    "group_norm": lambda: ([None, f32(B, 5, 4, D), f32(D), f32(D), f32(B, D), f32(B, D)], (4,)),
    "channel_rmsnorm": lambda: ([None, f32(B, 5, 4, D), f32(D), f32(D), f32(B, D), f32(B, D)], ()),
    "lowrank_update": lambda: ([None, f32(B, L, D), f32(D, 4), f32(B, L, 4), f32(4, 6), f32(B, L, 6)], (0.5, 1.0)),
    "lowrank_prepare": lambda: ([None, f32(6, D), f32(6, 3)], (0.5,)),
    "linear_lowrank": lambda: ([None, None, f32(B, L, D), f32(6, D + 8), f32(6), f32(3, D), f32(B, L, 3),
                                np.zeros(B * L, np.int32)], (1,)),
    "lowrank_update_backward": lambda: ([None] * 4 + [f32(B, L, 6), f32(B, L, D), f32(D, 4), f32(B, L, 4), f32(4, 6)],
                                        (0.5,)),
    "linear_lowrank_backward": lambda: ([None] * 5 + [f32(B, L, 6), f32(B, L, D), f32(6, D + 8), f32(3, D),
                                                      f32(B, L, 3), np.zeros(B * L, np.int32), f32(B, L, 6)],
                                        (1, 0.5, 1, 1, 1, 1)),
}


def test_every_op_has_a_valid_call():
    assert set(VALID) == {o.name for o in _core.OPS}


def swapped(a, fill=None):
    """a in the other byte order, same values (or filled with `fill`)."""
    b = a.astype(a.dtype.newbyteorder("S"))
    if fill is not None:
        b[...] = fill
    return b


@pytest.mark.parametrize("name", sorted(VALID))
def test_non_native_byte_order_is_refused_in_every_position(name):
    o = next(o for o in _core.OPS if o.name == name)
    args, attrs = VALID[name]()
    r = _core.call(o.id, args[o.inputs[0]], tuple(args), attrs)
    outs = list(r) if isinstance(r, tuple) else [r]
    given = {i: args[i] for i in o.inputs if args[i] is not None}
    given.update({i: a for (i, _, _), a in zip([t for t in o.outputs if o.exists(t[0], args, o.values(attrs))], outs)})
    assert len(given) >= 2
    for i, a in given.items():
        if a.dtype.itemsize == 1:  # int8 data: one byte has no byte order
            continue
        bad = list(args)
        out = i not in o.inputs
        bad[i] = swapped(a, 7.0) if out else swapped(a)
        with pytest.raises(fusedk.DTypeError, match=rf"^{name}: {o.py_name(i)} has dtype >{bad[i].dtype.str[1:]} "
                           r"\(big-endian\), "
                           r"expected the machine's byte order"):
            _core.call(o.id, bad[o.inputs[0]], tuple(bad), attrs)
        if out:
            assert (bad[i] == 7.0).all(), f"{name}: out= {o.tensors[i][0]} was written"
    # the same call with native outputs given runs (the refusal was the byte order, not the call)
    good = list(args)
    for i, a in given.items():
        if i not in o.inputs:
            good[i] = np.empty_like(a)
    _core.call(o.id, good[o.inputs[0]], tuple(good), attrs)


def test_non_native_byte_order_through_the_public_functions():
    x = f32(2, 5, 16) + 1
    with pytest.raises(fusedk.DTypeError, match="rmsnorm: x has dtype >f4 .big-endian."):
        fusedk.rmsnorm(x.astype(">f4"))
    with pytest.raises(TypeError, match="rmsnorm: weight has dtype >f4"):
        fusedk.rmsnorm(x, x[0, 0].astype(">f4"))
    out = np.full(x.shape, 3.0, ">f4")
    with pytest.raises(TypeError, match=r"rmsnorm: out has dtype >f4 .*\.astype\('<f4'\)"):
        fusedk.rmsnorm(x, out=out)
    assert (out == 3.0).all()
    with pytest.raises(TypeError, match="act: x has dtype >f2"):
        fusedk.act(x.astype(">f2"))
    # explicitly native and little-endian spellings are the same array kind
    np.testing.assert_array_equal(fusedk.rmsnorm(x.astype("<f4")), fusedk.rmsnorm(x.astype("=f4")))


@pytest.mark.parametrize("dt,named", [(object, "object"), ("U3", "<U3"), ("S2", "|S2"), ("M8[s]", "datetime64[s]"),
                                      (np.float64, "float64"), (np.int32, "int32"), (bool, "bool"),
                                      (np.complex64, "complex64")])
def test_dtype_names_are_numpys(dt, named):
    x = np.ones((2, 3), dtype=dt)
    with pytest.raises(fusedk.DTypeError) as e:
        fusedk.rmsnorm(x)
    assert e.value.reason.startswith(f"rmsnorm: x has dtype {named}, expected float32, float16 or bfloat16")
    assert "opaque" not in str(e.value)


BAD = [  # (call, the fusedk subclass, the built-in type it also is, status)
    (lambda x: fusedk.rmsnorm(x, np.ones(5, np.float32)), fusedk.ShapeError, ValueError, "FUSEDK_ERR_SHAPE"),
    (lambda x: fusedk.rmsnorm(x[:, :, ::2]), fusedk.LayoutError, ValueError, "FUSEDK_ERR_LAYOUT"),
    (lambda x: fusedk.rmsnorm(x, eps=-1.0), fusedk.InvalidArgumentError, ValueError, "FUSEDK_ERR_INVALID_ARGUMENT"),
    (lambda x: fusedk.act(x, "tanh"), fusedk.InvalidArgumentError, ValueError, "FUSEDK_ERR_INVALID_ARGUMENT"),
    (lambda x: fusedk.rmsnorm(x.astype(np.int8)), fusedk.DTypeError, TypeError, "FUSEDK_ERR_DTYPE"),
    (lambda x: fusedk.rmsnorm(x, x[0, 0].astype(np.float16)), fusedk.DTypeError, TypeError, "FUSEDK_ERR_DTYPE"),
]


@pytest.mark.parametrize("call,cls,builtin,status", BAD)
def test_exception_types(call, cls, builtin, status):
    x = f32(2, 3, 8)
    with pytest.raises(builtin) as e:
        call(x)
    err = e.value
    assert type(err) is cls and isinstance(err, fusedk.Error) and isinstance(err, RuntimeError)
    assert err.status == status and str(err) == f"{err.reason} [{status}]"
    back = pickle.loads(pickle.dumps(err))
    assert type(back) is cls and back.status == err.status and back.reason == err.reason


def test_error_picks_its_subclass_from_the_status():
    assert type(fusedk.Error("FUSEDK_ERR_DEVICE", "r")) is fusedk.DeviceError
    assert isinstance(fusedk.DeviceError("FUSEDK_ERR_DEVICE", "r"), (RuntimeError, ValueError))
    assert isinstance(fusedk.Error("FUSEDK_ERR_OUT_OF_MEMORY", "r"), MemoryError)
    for status in ("FUSEDK_ERR_CUDA", "FUSEDK_ERR_CUBLAS", "FUSEDK_ERR_UNSUPPORTED", "FUSEDK_ERR_NO_CUDA"):
        e = fusedk.Error(status, "r")
        assert type(e) is fusedk.Error and not isinstance(e, (ValueError, TypeError))


def _public_calls():
    """A valid call of every public op function: (function, positional arguments)."""
    x, g = f32(B, L, D), f32(B, D)
    q = f32(1, S, H, DH)
    cs = f32(S, DH // 2)
    return [
        (fusedk.rmsnorm, (x,)), (fusedk.layernorm, (x,)), (fusedk.adaln, (x, g, g)),
        (fusedk.residual_tanh_gated_rmsnorm, (x, x, g)), (fusedk.act, (x,)), (fusedk.glu, (x,)),
        (fusedk.glu_pair, (x, x)), (fusedk.silu_fma, (x, x, x)), (fusedk.gated_residual, (x, x, g)),
        (fusedk.rope, (q, q, cs, cs)), (fusedk.rope_table_1d, (f32(S), DH)), (fusedk.rope_table_axes, (f32(S, 3),)),
        (fusedk.rope_table_ltx, (f32(S, 3), 12)), (fusedk.rope_table_mixed, (f32(S, 3), f32(3, H, DH // 2))),
        (fusedk.qk_norm_rope, ((q, q, q), cs, cs)), (fusedk.qk_norm_rope_int8, ((q, q, q), cs, cs)),
        (fusedk.diffusion_step, (x, x)),
        (fusedk.linear, (f32(3, D), f32(5, D))), (fusedk.linear_backward, (f32(3, 5), f32(3, D), f32(5, D))),
        (fusedk.attention, (f32(B, S, H, DH), f32(B, L, 1, DH), f32(B, L, 1, DH))),
        (fusedk.attention_int8, (f32(B, S, H, DH), f32(B, L, 1, DH), f32(B, L, 1, DH))),
        (fusedk.attention_int8_scaled, (fusedk.ScaledTensor(i8(B, S, H, DH), f32(B, S, H)),
                                        fusedk.ScaledTensor(i8(B, L, 1, DH), f32(B, L, 1)), f32(B, L, 1, DH))),
        (fusedk.quantize_fp8, (x,)), (fusedk.rmsnorm_fp8, (x,)), (fusedk.layernorm_fp8, (x,)),
        (fusedk.adaln_fp8, (x, g, g)), (fusedk.dequantize_fp8, (fusedk.ScaledTensor(f8(B, L, D), f32(B, L)),)),
        (fusedk.glu_fp8, (x,)), (fusedk.quantize_int8, (x,)),
        (fusedk.linear_w8, (f32(3, 16), fusedk.ScaledTensor(i8(5, 16), f32(5)))),
        (fusedk.linear_fp8, (fusedk.ScaledTensor(f8(3, 16), f32(3)), fusedk.ScaledTensor(f8(5, 16), f32(5)))),
        (fusedk.lowrank_update, (x, f32(D, 4), f32(4, 6))), (fusedk.lowrank_prepare, (f32(6, D), f32(6, 3))),
        (fusedk.linear_lowrank, (x, f32(6, D + 8), f32(3, D))),
        (fusedk.lowrank_update_backward, (f32(B, L, 6), x, f32(D, 4), f32(4, 6))),
        (fusedk.linear_lowrank_backward, (f32(B, L, 6), x, f32(6, D + 8), f32(3, D))),
        (fusedk.conv, (f32(B, 5, 4, D), f32(3, 3, 3, D))),
        (fusedk.fold_batchnorm, (f32(3, 3, 3, D), None, None, None, f32(3), f32(3) ** 2 + 0.5)),
        (fusedk.group_norm, (f32(B, 5, 4, D), 4)), (fusedk.channel_rmsnorm, (f32(B, 5, 4, D),)),
    ]


def test_every_public_op_has_a_call_here():
    assert {f.__name__ for f, _ in _public_calls()} == {o.name for o in _core.OPS}


@pytest.mark.parametrize("fn,args", _public_calls(), ids=lambda v: getattr(v, "__name__", ""))
def test_scalar_arguments_that_are_not_numbers_raise_type_error(fn, args):
    """Every numeric or yes/no keyword (eps, theta, exact, causal, tf32, scaling, ...) given a str or
    None: a TypeError that is also a fusedk.Error, naming the argument; the valid call runs."""
    import inspect
    fn(*args)
    params = [p for p in inspect.signature(fn).parameters.values()
              if isinstance(p.default, (bool, int, float)) and p.name != "stream"]
    for p in params:
        for bad in ("1", None) if not isinstance(p.default, bool) else ("False",):
            with pytest.raises(TypeError, match=rf"^{fn.__name__}: {p.name} is {bad!r} \(a ") as e:
                fn(*args, **{p.name: bad})
            assert isinstance(e.value, fusedk.InvalidArgumentError)


@pytest.mark.parametrize("fn,args", [c for c in _public_calls() if "out" in __import__("inspect").signature(c[0])
                                     .parameters and c[0] not in (fusedk.qk_norm_rope, fusedk.qk_norm_rope_int8, fusedk.quantize_fp8,
                                                                fusedk.dequantize_fp8, fusedk.linear_fp8,
                                                                fusedk.rmsnorm_fp8, fusedk.layernorm_fp8,
                                                                fusedk.adaln_fp8, fusedk.glu_fp8,
                                                                fusedk.quantize_int8, fusedk.fold_batchnorm)],
                         # (theirs: tuples, (q_out, ...), (w_out, b_out) and (ScaledTensor, ScaledTensor); the FP8 ops' out
                         # takes out_dtype from out= itself: test_fp8 has their out= cases)
                         ids=lambda v: getattr(v, "__name__", ""))
def test_out_errors_name_out(fn, args):
    """A wrong out= (dtype, read-only) is named `out`, the keyword the caller passed, not the C
    argument's name (rmsnorm's y, lowrank_prepare's w_cat); the array is left untouched."""
    want = fn(*args)
    want = want[0] if isinstance(want, tuple) else want
    wrong = np.zeros(want.shape, np.float16)
    with pytest.raises(fusedk.DTypeError, match=rf"^{fn.__name__}: out has dtype float16"):
        fn(*args, out=wrong)
    assert not wrong.any()
    frozen = np.zeros_like(want)
    frozen.flags.writeable = False
    with pytest.raises(fusedk.InvalidArgumentError, match=rf"^{fn.__name__}: out is read-only"):
        fn(*args, out=frozen)
