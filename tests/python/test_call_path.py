"""The C call path (bindings/c/fusedk_py.c) without a GPU: the builtin every op goes through, its
routes, and the CuPy route's use of CuPy's C entry points, exercised with a CuPy-like stand-in
type whose allocator and stream capsules are ctypes callbacks. Arrays are empty or the call
fails before any launch, so nothing here touches device memory (it runs in CI and on the GPU
machine alike)."""
import ctypes

import numpy as np
import pytest

import fusedk
from fusedk import _core
from fusedk._ffi import pylib

INIT_SIG = (b"struct __pyx_obj_4cupy_5_core_4core__ndarray_base *(PyObject *, "
            b"__pyx_t_4cupy_5_core_7_carray_shape_t const &, PyObject *, PyObject *)")
STREAM_SIG = b"intptr_t (void)"
_capsule_new = ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p)(
    ("PyCapsule_New", ctypes.pythonapi))
KEEP = []  # callbacks and capsule names must outlive the routes (the process)


def capsule(fn, name):
    KEEP.extend([fn, name])
    return _capsule_new(ctypes.cast(fn, ctypes.c_void_p).value, name, None)


class Mem:
    def __init__(self, ptr, device_id=0):
        self.ptr, self.device_id = ptr, device_id


def fake_type(name):
    """A CuPy-like array type: .data.ptr/.device_id, .shape, .strides (bytes), .dtype; made as
    cupy.ndarray is, T(shape, dtype)."""
    def init(self, shape, dtype, ptr=0x1000):
        self.shape, self.dtype = tuple(int(s) for s in shape), np.dtype(dtype)
        st, acc = [], self.dtype.itemsize
        for s in reversed(self.shape):
            st.append(acc)
            acc *= s
        self.strides, self.data = tuple(reversed(st)), Mem(ptr)
    return type(name, (), {"__init__": init})


def make_route(t, native):
    """Registers a route for t; native: through stand-ins of CuPy's C entry points, which record
    what the route asked of them."""
    seen = {"init": [], "stream": 0}
    init = stream = None
    if native:
        @ctypes.PYFUNCTYPE(ctypes.py_object, ctypes.py_object, ctypes.c_void_p, ctypes.py_object, ctypes.py_object)
        def init_fn(subtype, vec, dtype, obj):
            begin, end = ctypes.cast(vec, ctypes.POINTER(ctypes.c_void_p))[0:2]
            shape = tuple((ctypes.c_int64 * ((end - begin) // 8)).from_address(begin)) if end != begin else ()
            seen["init"].append((subtype, shape, dtype, obj))
            return subtype(shape, dtype, 0x2000)

        @ctypes.PYFUNCTYPE(ctypes.c_ssize_t)
        def stream_fn():
            seen["stream"] += 1
            return 0x77

        init, stream = capsule(init_fn, INIT_SIG), capsule(stream_fn, STREAM_SIG)

    class S:
        ptr = 0x55

    def get_stream():
        seen["stream"] -= 1
        return S()
    i = pylib.fusedk_py_route(t, None, _core._CUPY_DT, init, stream, get_stream, None)
    assert i >= 0
    _core._PATHS[t] = _core.routed_path(i)
    return i, seen


def test_call_is_a_builtin():
    assert type(_core.call).__name__ == "builtin_function_or_method"
    x = np.ones((2, 8), np.float32)
    np.testing.assert_allclose(_core.call(0, x, (None, None, x, None, None), (1e-6,), None),
                               fusedk.rmsnorm(x))


@pytest.mark.parametrize("native", [True, False], ids=["cupy-c-api", "python-level"])
def test_attribute_route_allocates_and_returns_outputs(native):
    T = fake_type(f"Arr{native}")
    i, seen = make_route(T, native)
    assert pylib.fusedk_py_route_native(i) == int(native)
    x, w = T((0, 16), np.float16), T((16,), np.float16)
    y = fusedk.rmsnorm(x, w)  # empty: validated, nothing launched
    assert type(y) is T and y.shape == (0, 16) and y.dtype == np.float16
    y, r = fusedk.rmsnorm(x, w, residual=T((0, 16), np.float16))  # two outputs, a tuple
    assert type(r) is T and r.shape == (0, 16)
    if native:
        assert y.data.ptr == 0x2000
        assert [(s, d) for _, s, d, _ in seen["init"]] == [((0, 16), np.float16)] * 3
        assert all(sub is T and obj is None for sub, _, _, obj in seen["init"])
        assert seen["stream"] == 2  # CuPy's current stream, from its C entry point
    else:
        assert seen["stream"] == -2  # cupy.cuda.get_current_stream().ptr
    out = T((0, 16), np.float16)
    assert fusedk.rmsnorm(x, w, out=out) is out


def test_attribute_route_failures():
    T = fake_type("ArrFail")
    make_route(T, True)
    x, w = T((3, 16), np.float16), T((8,), np.float16)
    with pytest.raises(fusedk.Error, match=r"rmsnorm: weight has shape \[8\], expected \[16\]"):
        fusedk.rmsnorm(x, w)
    with pytest.raises(fusedk.Error, match="dtype"):
        fusedk.rmsnorm(T((0, 16), np.float16), T((16,), np.float32))
    # an int64 array: the route leaves it to the generic path (which raises for this stand-in)
    with pytest.raises(fusedk.Error):
        fusedk.rmsnorm(T((0, 16), np.int64))


def test_attribute_route_makes_fixed_dtype_outputs():
    # the table builders' cos/sin are float32 whatever the op: made by the route from a float32
    # input; from another dtype the route allocates nothing and leaves the call to the generic
    # path (which cannot view this stand-in type and raises)
    T = fake_type("ArrTable")
    _, seen = make_route(T, True)
    cos, sin = fusedk.rope_table_1d(T((0,), np.float32), 8)
    assert type(cos) is T and type(sin) is T and cos.shape == sin.shape == (0, 4) and cos.dtype == np.float32
    assert [(s, d) for _, s, d, _ in seen["init"]] == [((0, 4), np.float32)] * 2
    with pytest.raises(fusedk.Error):
        fusedk.rope_table_1d(T((0,), np.float16), 8)
    assert len(seen["init"]) == 2  # no float16 (nor float32) outputs made for it


def test_attribute_route_hands_unusual_calls_to_python():
    T = fake_type("ArrSlow")
    make_route(T, True)
    x = T((0, 16), np.float16)

    class Stream:  # a stream object: the Python path reads its .ptr
        ptr = 5

    assert fusedk.rmsnorm(x, stream=Stream()).shape == (0, 16)
    assert fusedk.rmsnorm(x, eps=np.float32(1e-5)).shape == (0, 16)
    with pytest.raises(fusedk.Error, match="rmsnorm: eps is 'small' \\(a str\\), expected a number"):
        fusedk.rmsnorm(x, eps="small")
    with pytest.raises(fusedk.Error, match="rmsnorm: eps is 'small' \\(a str\\), expected a number"):
        fusedk.rmsnorm(np.ones((2, 4), np.float32), eps="small")  # the generic path (NumPy)
    with pytest.raises(TypeError):
        _core.call(0, x)  # the builtin's arity, checked by the Python path


def test_torch_route_on_cpu():
    torch = pytest.importorskip("torch")
    if not _core.exchange_api(torch.Tensor):
        pytest.skip("this torch has no DLPack C exchange API")
    x, w = torch.randn(3, 16), torch.randn(16)
    y = fusedk.rmsnorm(x, w)
    assert isinstance(y, torch.Tensor)
    torch.testing.assert_close(y, torch.nn.functional.rms_norm(x, (16,), w, 1e-6))
    assert _core._PATHS[torch.Tensor].route >= 0
    with pytest.raises(fusedk.Error, match="rmsnorm: weight has shape"):
        fusedk.rmsnorm(x, torch.randn(8))
    y, r = fusedk.rmsnorm(x, w, residual=x.clone(), stream=0)
    torch.testing.assert_close(r, 2 * x)
