"""Arrays in and out of fusedk: NumPy through its buffer, everything else through DLPack.

Inputs are consumed as legacy "dltensor" capsules (every producer offers them) and released as
soon as the call returns. Outputs on a framework's device are allocated by libfusedk and
exported back as DLPack (legacy or versioned, as the consumer asks) with the deleter in C, so the
caller gets its own type: NumPy in -> NumPy out, torch in -> torch out, and so on. fusedk only
ever touches a framework through sys.modules, i.e. one the caller has already imported."""
import ctypes
import sys

import numpy as np

from ._ffi import ffi, lib

try:  # bfloat16 for NumPy
    import ml_dtypes

    _BF16 = np.dtype(ml_dtypes.bfloat16)
except ImportError:  # pragma: no cover - ml_dtypes is a dependency
    _BF16 = None

CPU, CUDA, CUDA_HOST, CUDA_MANAGED = 1, 2, 3, 13
_GPU = (CUDA, CUDA_MANAGED)


class Error(RuntimeError):
    """A fusedk call failed; .status is the C status name, .reason the C failure reason."""

    def __init__(self, status, reason):
        super().__init__(f"{reason} [{status}]")
        self.status = status
        self.reason = reason


def check(status):
    if status != lib.FUSEDK_OK:
        raise Error(ffi.string(lib.fusedk_status_name(status)).decode(),
                    ffi.string(lib.fusedk_failure_reason()).decode())


# --- PyCapsule through ctypes.pythonapi (holds the GIL; cffi would release it) -----------------
_api = ctypes.pythonapi
_Destructor = ctypes.CFUNCTYPE(None, ctypes.c_void_p)
_api.PyCapsule_New.restype = ctypes.py_object
_api.PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, _Destructor]
_api.PyCapsule_GetPointer.restype = ctypes.c_void_p
_api.PyCapsule_GetPointer.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_SetName.restype = ctypes.c_int
_api.PyCapsule_SetName.argtypes = [ctypes.py_object, ctypes.c_char_p]
_api.PyCapsule_IsValid.restype = ctypes.c_int
_api.PyCapsule_IsValid.argtypes = [ctypes.c_void_p, ctypes.c_char_p]
# the destructor receives the capsule as a bare pointer
_capsule_pointer_raw = ctypes.PYFUNCTYPE(ctypes.c_void_p, ctypes.c_void_p, ctypes.c_char_p)(
    ("PyCapsule_GetPointer", ctypes.pythonapi))
# capsule names must outlive every capsule: module-level constants
_LEGACY, _VERSIONED = b"dltensor", b"dltensor_versioned"
_USED_LEGACY = b"used_dltensor"


@_Destructor
def _destroy_capsule(cap):
    # Runs when a capsule we produced dies. A consumer that took it renamed it "used_..." and
    # owns the tensor; otherwise nobody did, and the C deleter frees it here.
    if _api.PyCapsule_IsValid(cap, _LEGACY):
        m = ffi.cast("fusedk_dlmanaged *", _capsule_pointer_raw(cap, _LEGACY))
        m.deleter(m)
    elif _api.PyCapsule_IsValid(cap, _VERSIONED):
        m = ffi.cast("fusedk_dlmanaged_versioned *", _capsule_pointer_raw(cap, _VERSIONED))
        m.deleter(m)


# --- frameworks, known only through sys.modules ----------------------------------------------
def framework_of(obj):
    root = type(obj).__module__.split(".")[0]
    return "jax" if root in ("jax", "jaxlib") else root


def current_stream(fw, device_id):
    """The caller's current CUDA stream for its framework, as an int (0 = legacy default)."""
    if fw == "torch":
        return int(sys.modules["torch"].cuda.current_stream(device_id).cuda_stream)
    if fw == "cupy":
        cupy = sys.modules["cupy"]
        with cupy.cuda.Device(device_id):
            return int(cupy.cuda.get_current_stream().ptr)
    return 0  # JAX and unknown producers: the legacy default stream (DLPack's stream=1)


def stream_int(stream):
    """stream= as the caller may give it: an int (cudaStream_t), a torch or CuPy stream."""
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            return int(getattr(stream, attr))
    return int(stream)


def _from_dlpack(fw, holder):
    if fw == "torch":
        return sys.modules["torch"].from_dlpack(holder)
    if fw == "cupy":
        return sys.modules["cupy"].from_dlpack(holder)
    if fw == "jax":
        return sys.modules["jax"].dlpack.from_dlpack(holder)
    mod = sys.modules.get(fw)
    if mod is not None and hasattr(mod, "from_dlpack"):
        return mod.from_dlpack(holder)
    return holder  # an object with __dlpack__: any consumer can take it


# --- outputs allocated by fusedk -------------------------------------------------------------
class DLPackBuffer:
    """A compact tensor allocated by libfusedk, exported once through __dlpack__."""

    def __init__(self, device, dtype, shape, producer_stream):
        h = ffi.new("fusedk_dlpack **")
        dev = ffi.new("fusedk_device *", {"device_type": device[0], "device_id": device[1]})
        shp = ffi.new("int64_t[]", list(shape) or [1])
        check(lib.fusedk_dlpack_alloc(dev[0], dtype, len(shape), shp, h))
        self._h = h[0]
        self._device = device
        self._stream = producer_stream
        self.tensor = ffi.addressof(self._h.legacy, "dl_tensor")

    def __dlpack_device__(self):
        return self._device

    def __dlpack__(self, *, stream=None, max_version=None, dl_device=None, copy=None):
        if self._h is None:
            raise BufferError("fusedk: this buffer was already exported")
        if dl_device is not None and tuple(dl_device) != tuple(self._device):
            raise BufferError("fusedk: cannot export to another device")
        if copy:
            raise BufferError("fusedk: copy=True is not supported; the export is zero-copy")
        if self._device[0] in _GPU and stream is not None and stream != -1:
            # make fusedk's work visible on the consumer's stream (DLPack: 1 = legacy default,
            # 2 = per-thread default; both are valid cudaStream_t handles as they are)
            check(lib.fusedk_stream_wait(self._device[1], ffi.cast("struct CUstream_st *", self._stream),
                                         ffi.cast("struct CUstream_st *", stream)))
        versioned = max_version is not None and max_version[0] >= 1
        part = self._h.versioned if versioned else self._h.legacy
        ptr = int(ffi.cast("uintptr_t", ffi.addressof(part)))
        cap = _api.PyCapsule_New(ptr, _VERSIONED if versioned else _LEGACY, _destroy_capsule)
        self._h = None  # the capsule (or its consumer) owns the memory now
        return cap

    def __del__(self):
        if getattr(self, "_h", None) is not None:
            lib.fusedk_dlpack_free(self._h)
            self._h = None


# --- one op call: converts arguments, owns their capsules, picks the stream -------------------
def _numpy_dtype_desc(dt):
    if _BF16 is not None and dt == _BF16:
        return (4, 16, 1)
    code = {"f": 2, "i": 0, "u": 1, "b": 6, "c": 5}.get(dt.kind, 255)
    return (code, dt.itemsize * 8, 1)


class Call:
    def __init__(self, op, stream):
        self.op = op
        self._stream_arg = stream
        self.stream = None  # an int once known
        self._keep = []
        self._capsules = []
        self.fw = None  # the framework of x: decides the output type
        self.device = (CPU, 0)

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        # release every consumed capsule: rename, then the producer's deleter
        for cap in self._capsules:
            ptr = _api.PyCapsule_GetPointer(cap, _LEGACY)
            _api.PyCapsule_SetName(cap, _USED_LEGACY)
            m = ffi.cast("fusedk_dlmanaged *", ptr)
            if m.deleter != ffi.NULL:
                m.deleter(m)
        self._capsules.clear()
        self._keep.clear()
        return False

    def _numpy_tensor(self, arr, name, writable):
        if writable and not arr.flags.writeable:
            raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{self.op}: {name} is read-only, expected a writable array")
        item = arr.dtype.itemsize
        if any(s % item for s in arr.strides):
            raise Error("FUSEDK_ERR_LAYOUT", f"{self.op}: {name} has strides {arr.strides} bytes, "
                        f"not a multiple of its {item}-byte elements")
        t = ffi.new("fusedk_tensor *")
        shp = ffi.new("int64_t[]", list(arr.shape) or [1])
        st = ffi.new("int64_t[]", [s // item for s in arr.strides] or [1])
        code, bits, lanes = _numpy_dtype_desc(arr.dtype)
        t.data = ffi.cast("void *", arr.__array_interface__["data"][0])
        t.device.device_type, t.device.device_id = CPU, 0
        t.ndim = arr.ndim
        t.dtype.code, t.dtype.bits, t.dtype.lanes = code, bits, lanes
        t.shape, t.strides, t.byte_offset = shp, st, 0
        self._keep += [arr, shp, st, t]
        return t

    def tensor(self, obj, name, writable=False):
        """A fusedk_tensor* for obj (NULL for None). The first tensor fixes framework and stream."""
        if obj is None:
            return ffi.NULL
        if isinstance(obj, np.ndarray) or not hasattr(obj, "__dlpack__"):
            arr = obj if isinstance(obj, np.ndarray) else np.asarray(obj)
            if self.fw is None:
                self.fw = "numpy"
            return self._numpy_tensor(arr, name, writable)
        dev = tuple(int(v) for v in obj.__dlpack_device__())
        fw = framework_of(obj)
        if self.fw is None:
            self.fw, self.device = fw, dev
        if dev[0] in _GPU:
            if self.stream is None:
                self.stream = (stream_int(self._stream_arg) if self._stream_arg is not None
                               else current_stream(fw, dev[1]))
            cap = obj.__dlpack__(stream=self.stream or 1)  # DLPack: 1 = legacy default stream
        else:
            cap = obj.__dlpack__()
        ptr = _api.PyCapsule_GetPointer(cap, _LEGACY)
        self._capsules.append(cap)
        return ffi.cast("fusedk_tensor *", ptr)  # DLManagedTensor starts with its DLTensor

    def output(self, out, name, like, like_t):
        """(tensor*, result holder): the caller's out= array, or a new one like x (the array
        `like` and its tensor `like_t`): same shape, dtype, device and kind."""
        shape = tuple(like_t.shape[i] for i in range(like_t.ndim))
        if out is not None:
            if framework_of(out) == "jax":
                raise Error("FUSEDK_ERR_INVALID_ARGUMENT", f"{self.op}: {name} (out=) is a JAX array; JAX "
                            "arrays are immutable, leave out= unset to get a new one")
            return self.tensor(out, name, writable=True), out
        if self.fw == "numpy":
            arr = np.empty(shape, dtype=np.asarray(like).dtype)  # no copy for an ndarray
            return self._numpy_tensor(arr, name, True), arr
        stream = self.stream or 0
        buf = DLPackBuffer(self.device, like_t.dtype, shape, stream)
        self._keep.append(buf)
        return buf.tensor, buf

    def result(self, holder):
        if isinstance(holder, DLPackBuffer):
            return _from_dlpack(self.fw, holder)
        return holder

    def launch_stream(self):
        return ffi.cast("struct CUstream_st *", self.stream or 0)
