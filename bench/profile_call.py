#!/usr/bin/env python3
"""Where a Python call's host time goes: each step of fusedk's torch and CuPy call paths timed
alone in a loop (µs per step), next to the whole call and the frameworks' own ops, plus a
cProfile of the CuPy call. Host time only: outputs are small (1x64), kernels queue behind.

    PYTHONPATH=bindings/python python3 bench/profile_call.py"""
import cProfile
import io
import pstats
import timeit


def per_call(fn, n=20000):
    fn()
    return min(timeit.repeat(fn, number=n, repeat=5)) / n * 1e6


def main():
    import fusedk
    from fusedk import _core
    from fusedk._ffi import lib, pylib
    rows = []

    def row(name, fn):
        rows.append((name, per_call(fn)))
        print(f"{name:58s} {rows[-1][1]:7.2f} µs", flush=True)

    try:
        import torch
        import torch.nn.functional as F
        x = torch.randn(1, 64, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(64, device="cuda", dtype=torch.bfloat16)
        y = torch.empty_like(x)
        row("torch: F.rms_norm(x, (64,), w)", lambda: F.rms_norm(x, (64,), w, 1e-6))
        row("torch: fusedk.rmsnorm(x, w)", lambda: fusedk.rmsnorm(x, w))
        row("torch: fusedk.rmsnorm(x, w, out=y)", lambda: fusedk.rmsnorm(x, w, out=y))
        args = (None, None, x, None, w)
        route = _core._PATHS[torch.Tensor].route
        attrs = _core._ATTRS(1e-6)
        row("torch:   _core.call (the C builtin, whole C path)", lambda: _core.call(0, x, args, (1e-6,), None))
        row("torch:   the same through ctypes (fusedk_py_call_route)",
            lambda: pylib.fusedk_py_call_route(route, 0, args, attrs, -1))
        row("torch:   torch.empty_like(x)", lambda: torch.empty_like(x))
        row("torch:   x + x (an eager op)", lambda: x + x)
        torch.cuda.synchronize()
    except Exception as e:  # noqa: BLE001
        print(f"torch rows skipped: {e}")
    try:
        import cupy
        a = cupy.random.standard_normal((1, 64), dtype=cupy.float32).astype(cupy.float16)
        w = cupy.ones(64, cupy.float16)
        row("cupy: cupy.add(a, a)", lambda: cupy.add(a, a))
        row("cupy: fusedk.rmsnorm(a, w)", lambda: fusedk.rmsnorm(a, w))
        route = _core._PATHS[cupy.ndarray].route
        print(f"cupy route through CuPy's C entry points: {bool(pylib.fusedk_py_route_native(route))}")
        args = (None, None, a, None, w)
        y = cupy.empty_like(a)
        row("cupy:   _core.call (the C builtin, whole C path)", lambda: _core.call(0, a, args, (1e-6,), None))
        row("cupy:   the same with out= (no allocation)",
            lambda: _core.call(0, a, (y, None, a, None, w), (1e-6,), None))
        row("cupy:   cupy.empty(a.shape, a.dtype)", lambda: cupy.empty(a.shape, a.dtype))
        row("cupy:   cupy.ndarray(a.shape, a.dtype)", lambda: cupy.ndarray(a.shape, a.dtype))
        row("cupy:   a.data.ptr", lambda: a.data.ptr)
        row("cupy:   a.data.device_id", lambda: a.data.device_id)
        row("cupy:   a.shape, a.strides", lambda: (a.shape, a.strides))
        row("cupy:   _core.dtype_code(a.dtype)", lambda: _core.dtype_code(a.dtype))
        row("cupy:   cupy.cuda.runtime.getDevice()", lambda: cupy.cuda.runtime.getDevice())
        row("cupy:   cupy.cuda.get_current_stream().ptr", lambda: cupy.cuda.get_current_stream().ptr)
        row("cupy:   pack(a)", lambda: _core.pack(a.data.ptr, 2, a.data.device_id, a.shape, a.strides,
                                                  _core.dtype_code(a.dtype)))
        parts = [_core.pack(t.data.ptr, 2, t.data.device_id, t.shape, t.strides, _core.dtype_code(t.dtype))
                 for t in (a, a, w)]
        parts.insert(1, _core._ABSENT)
        parts.insert(3, _core._ABSENT)
        buf = b"".join(parts)
        s = cupy.cuda.get_current_stream().ptr
        row("cupy:   fusedk_op_call_packed (cffi, C path + launch)",
            lambda: lib.fusedk_op_call_packed(0, buf, len(buf), 1e-6, 0.0, 0.0, 0.0, s))
        cupy.cuda.get_current_stream().synchronize()
        pr = cProfile.Profile()
        pr.enable()
        for _ in range(20000):
            fusedk.rmsnorm(a, w)
        pr.disable()
        out = io.StringIO()
        pstats.Stats(pr, stream=out).sort_stats("tottime").print_stats(14)
        print(out.getvalue())
    except Exception as e:  # noqa: BLE001
        print(f"cupy rows skipped: {e}")


if __name__ == "__main__":
    main()
