"""Loads libfusedk through cffi (ABI mode). The cdef is the marked section of fusedk.h itself,
so the bindings cannot drift from the C API."""
import os
import re

import cffi

_HERE = os.path.dirname(os.path.abspath(__file__))


def _find(env, names):
    if os.environ.get(env):
        return os.environ[env]
    for name in names:
        path = os.path.join(_HERE, name)
        if os.path.exists(path):
            return path
    raise ImportError(f"fusedk: cannot find {names[0]} next to the package; set {env} to its path "
                      "(meson test sets it to the build tree's)")


def cdef_from_header(text):
    """The declarations between FUSEDK_CDEF_BEGIN and FUSEDK_CDEF_END, as cffi accepts them."""
    m = re.search(r"/\* FUSEDK_CDEF_BEGIN \*/(.*)/\* FUSEDK_CDEF_END \*/", text, re.S)
    if not m:
        raise ImportError("fusedk: fusedk.h has no FUSEDK_CDEF_BEGIN/END section")
    body = re.sub(r"/\*.*?\*/", "", m.group(1), flags=re.S)
    body = re.sub(r"//[^\n]*", "", body)
    return body.replace("FUSEDK_DEF ", "")


HEADER = _find("FUSEDK_HEADER", ["fusedk.h"])
LIBRARY = _find("FUSEDK_LIBRARY", ["libfusedk.so", "libfusedk.dylib", "fusedk.dll"])

ffi = cffi.FFI()
with open(HEADER) as f:
    ffi.cdef(cdef_from_header(f.read()))
lib = ffi.dlopen(LIBRARY)
