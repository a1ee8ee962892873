"""Loads libfusedk twice over: through cffi (ABI mode; the cdef is the marked section of fusedk.h
itself, so the bindings cannot drift from the C API) for GIL-free calls, and through
ctypes.PyDLL for the few entry points that handle Python objects and must keep the GIL
(bindings/c/fusedk_py.c: they set up the C builtin that op calls go through)."""
import ctypes
import os
import re

import cffi

_HERE = os.path.dirname(os.path.abspath(__file__))


_SRC = os.path.normpath(os.path.join(_HERE, "..", "..", ".."))  # the repository, when run from its tree


def _find(env, names, tree):
    """$env, else next to the package (pip install), else the source tree's (PYTHONPATH=bindings/python)."""
    if os.environ.get(env):
        return os.environ[env]
    for path in [os.path.join(_HERE, n) for n in names] + [os.path.join(_SRC, tree)]:
        if os.path.exists(path):
            return path
    raise ImportError(f"fusedk: cannot find {names[0]} next to the package or in the source tree's {tree}; set "
                      f"{env} to its path")


def cdef_from_header(text):
    """The declarations between FUSEDK_CDEF_BEGIN and FUSEDK_CDEF_END, as cffi accepts them."""
    m = re.search(r"/\* FUSEDK_CDEF_BEGIN \*/(.*)/\* FUSEDK_CDEF_END \*/", text, re.S)
    if not m:
        raise ImportError("fusedk: fusedk.h has no FUSEDK_CDEF_BEGIN/END section")
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    body = re.sub(r"//[^\n]*", "", body)
    return body.replace("FUSEDK_DEF ", "")


HEADER = _find("FUSEDK_HEADER", ["fusedk.h"], "fusedk.h")
LIBRARY = _find("FUSEDK_LIBRARY", ["libfusedk.so", "libfusedk.dylib", "fusedk.dll"], os.path.join("build", "libfusedk.so"))

ffi = cffi.FFI()
with open(HEADER) as f:
    ffi.cdef(cdef_from_header(f.read()))
# the binding entry points of bindings/c/fusedk_py.c (not part of the C API in fusedk.h)
# (the stream as uintptr_t: the same register as the C function's pointer, and cffi then takes a
# plain int with no ffi.cast per call)
ffi.cdef("int32_t fusedk_op_call_packed(int32_t op, const void *buf, size_t len, const double *attrs,"
         " uintptr_t stream);")
lib = ffi.dlopen(LIBRARY)

# --- the GIL-holding half -------------------------------------------------------------------
pylib = ctypes.PyDLL(LIBRARY)
_p = ctypes.c_void_p
_o = ctypes.py_object
pylib.fusedk_py_route.argtypes = [_o, _p, _o, _o, _o, _o, _o]
pylib.fusedk_py_route.restype = ctypes.c_int
pylib.fusedk_py_route_native.argtypes = [ctypes.c_int]
pylib.fusedk_py_route_native.restype = ctypes.c_int
pylib.fusedk_py_call_route.argtypes = [ctypes.c_int, ctypes.c_int32, _o, ctypes.POINTER(ctypes.c_double),
                                       ctypes.c_int64]
pylib.fusedk_py_call_route.restype = _o  # a new reference
pylib.fusedk_py_fast.argtypes = [_o, _o]
pylib.fusedk_py_fast.restype = _o
pylib.fusedk_py_last.argtypes = []
pylib.fusedk_py_last.restype = ctypes.c_int
pylib.fusedk_py_init.argtypes = [_p, ctypes.c_int]
pylib.fusedk_py_init.restype = None
_CPYTHON = ("Py_IncRef", "Py_DecRef", "PyTuple_New", "PyTuple_SetItem", "PyTuple_GetItem", "PyTuple_Size",
            "PyErr_Clear", "PyObject_GetAttrString", "PyLong_AsLongLong", "PyDict_GetItem", "PyObject_Call",
            "PyObject_IsInstance", "PyObject_Type", "PyFloat_AsDouble", "PyErr_Occurred", "PyCapsule_GetPointer",
            "PyCFunction_NewEx", "PyLong_FromLongLong")  # the order of fusedk_py.c's table, after Py_None
_fns = (_p * (1 + len(_CPYTHON)))(id(None), *(ctypes.cast(getattr(ctypes.pythonapi, n), _p) for n in _CPYTHON))
pylib.fusedk_py_init(_fns, len(_fns))
