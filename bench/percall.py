#!/usr/bin/env python3
"""The user's call: what `y = fusedk.rmsnorm(x, w)` costs from Python, next to the frameworks' own
ops and to fusedk's kernel alone.

    PYTHONPATH=bindings/python python3 bench/percall.py [--out DIR] [--calls 200] [--reps 7]

Needs a CUDA GPU and torch; CuPy, JAX and Liger rows appear where those import. Every eager row
is a loop of --calls calls as users write them (no out=, no graphs, outputs dropped), timed by
wall clock from the first call to a synchronize after the last, median of --reps loops, per call.
The calls compared in one row group alternate loop by loop (their ratios are the result; a
host's speed drifts). "kernel" is fusedk's kernel alone: 20 of the same call captured in a CUDA graph, replays timed with
CUDA events, per call. JAX rows are back-to-back calls of jitted functions (fusedk through fusedk.jax, XLA FFI),
timed the same way, and 10 independent calls on 10 distinct inputs inside one jitted function (per
op: the op's cost inside a user's jit, JAX's own per-call dispatch paid once, nothing to fuse). Writes DIR/percall.json and DIR/percall.md and prints the table."""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import bench  # bench/bench.py: the shared timing method

os.environ.setdefault("XLA_PYTHON_CLIENT_PREALLOCATE", "false")  # before any jax import

EPS = 1e-6
SHAPES = [(1, 64), (1, 1024, 2048), (4, 4096, 3072)]


def loop_times(fns, sync, calls, reps, host_only=False):
    """For each fn: median over reps of (wall time of `calls` calls + final sync) / calls, in µs.
    The fns' loops alternate within each rep, so that a host's clock drift (turbo, a noisy
    neighbour) falls on all of them alike: their ratios are what this measures. host_only: the
    final sync is left out of the time (what the calls cost the Python thread; work still queued
    is waited for before the next loop)."""
    for fn in fns:
        for _ in range(3):
            fn()
    sync()
    ts = [[] for _ in fns]
    for _ in range(reps):
        for k, fn in enumerate(fns):
            t0 = time.perf_counter()
            for _ in range(calls):
                fn()
            if not host_only:
                sync()
            ts[k].append((time.perf_counter() - t0) / calls * 1e6)
            sync()
    return [statistics.median(t) for t in ts]


def warm_up(seconds=1.0):
    """Busy host work first: the first rows should not pay the CPU's clock ramp."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        sum(range(1000))


def graph_time(fn, k=20, reps=200):
    """fn's device time alone: k calls in one CUDA graph, replays timed with CUDA events, per call
    (bench.py's method: a replay's own launch latency is spread over k kernels)."""
    return bench.time_graph(lambda i: fn(), k, reps)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=None)
    ap.add_argument("--calls", type=int, default=200)
    ap.add_argument("--reps", type=int, default=7)
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    bench.torch = torch  # bench.py binds torch in its own main()
    if not torch.cuda.is_available():
        sys.exit("percall.py needs a CUDA GPU and torch")
    import fusedk  # fails loudly: this bench is about fusedk's call
    if not fusedk.kernel_info()["cuda"]["devices"]:
        sys.exit("percall.py: fusedk was built without its GPU half (or sees no device)")
    torch.set_grad_enabled(False)
    warm_up()
    rows = []
    tsync = torch.cuda.synchronize

    def row(group, shape, dtype, impl, us, note=""):
        rows.append(dict(group=group, shape="×".join(map(str, shape)), dtype=dtype, impl=impl, us=round(us, 2),
                         note=note))
        print(f"{group:6s} {rows[-1]['shape']:>14s} {dtype:5s} {impl:34s} {us:9.2f} µs {note}", file=sys.stderr,
              flush=True)

    # --- torch ------------------------------------------------------------------------------
    try:
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction
        liger = lambda x, w: LigerRMSNormFunction.apply(x, w, EPS)  # noqa: E731
    except Exception:  # noqa: BLE001 - an optional peer
        liger = None
    for shape in SHAPES:
        x = torch.randn(shape, device="cuda", dtype=torch.bfloat16)
        w = torch.randn(shape[-1], device="cuda", dtype=torch.bfloat16)
        out = torch.empty_like(x)
        n = (shape[-1],)
        impls = {"fusedk.rmsnorm(x, w)": lambda: fusedk.rmsnorm(x, w),
                 "fusedk.rmsnorm(x, w, out=y)": lambda: fusedk.rmsnorm(x, w, out=out),
                 "F.rms_norm(x, (D,), w)": lambda: F.rms_norm(x, n, w, EPS)}
        if liger:
            impls["Liger rms_norm"] = lambda: liger(x, w)
        for name, us in zip(impls, loop_times(list(impls.values()), tsync, args.calls, args.reps)):
            row("torch", shape, "bf16", name, us)
        row("torch", shape, "bf16", "kernel (fusedk, graph replay)", graph_time(lambda: fusedk.rmsnorm(x, w, out=out)))
        row("torch", shape, "bf16", "kernel (F.rms_norm, graph replay)", graph_time(lambda: F.rms_norm(x, n, w, EPS)))
        del x, w, out
    # --- CuPy (fp16: CuPy has no bfloat16 arithmetic for its own add) ------------------------
    try:
        import cupy
    except Exception:  # noqa: BLE001
        cupy = None
    if cupy is not None:
        csync = lambda: cupy.cuda.get_current_stream().synchronize()  # noqa: E731
        for shape in SHAPES:
            a = cupy.random.standard_normal(shape, dtype=cupy.float32).astype(cupy.float16)
            b = cupy.random.standard_normal(shape, dtype=cupy.float32).astype(cupy.float16)
            w = cupy.random.standard_normal(shape[-1], dtype=cupy.float32).astype(cupy.float16)
            mine, theirs = loop_times([lambda: fusedk.rmsnorm(a, w), lambda: cupy.add(a, b)], csync, args.calls,
                                      args.reps)
            row("cupy", shape, "fp16", "fusedk.rmsnorm(x, w)", mine)
            row("cupy", shape, "fp16", "cupy.add(a, b)", theirs)
            del a, b, w
            cupy.get_default_memory_pool().free_all_blocks()
    # --- JAX: back-to-back jitted calls --------------------------------------------------------
    try:
        import jax
        import jax.numpy as jnp
        import fusedk.jax as fkj
        gpu = jax.devices("gpu")[0]
    except Exception as e:  # noqa: BLE001
        jax = None
        print(f"JAX rows skipped: {type(e).__name__}: {e}", file=sys.stderr)
    if jax is not None:
        def j_rms(x, w):
            xf = x.astype(jnp.float32)
            return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + EPS)).astype(x.dtype) * w

        def j_adaln(x, scale, shift):
            xf = x.astype(jnp.float32)
            m = xf.mean(-1, keepdims=True)
            nrm = ((xf - m) * jax.lax.rsqrt(jnp.square(xf - m).mean(-1, keepdims=True) + EPS)).astype(x.dtype)
            return nrm * (1 + scale[:, None]) + shift[:, None]

        f_rms, p_rms = jax.jit(lambda x, w: fkj.rmsnorm(x, w, eps=EPS)), jax.jit(j_rms)
        f_ad, p_ad = jax.jit(lambda x, s, h: fkj.adaln(x, s, h, eps=EPS)), jax.jit(j_adaln)
        key = jax.random.PRNGKey(0)
        cases = [("rmsnorm", s, f_rms, p_rms, lambda s: (jax.random.normal(key, s, jnp.bfloat16),
                                                           jax.random.normal(key, s[-1:], jnp.bfloat16)))
                 for s in SHAPES]
        cases.append(("adaln", (2, 4096, 1152), f_ad, p_ad,
                      lambda s: (jax.random.normal(key, s, jnp.bfloat16), jax.random.normal(key, (s[0], s[2]), jnp.bfloat16),
                                 jax.random.normal(key, (s[0], s[2]), jnp.bfloat16))))
        def batch(fn, n=10):
            # n independent ops in one jitted function (n distinct inputs, none feeding another, so
            # XLA cannot fuse one op into the next): JAX's own dispatch (~30-45 µs a jitted call on
            # these hosts) is paid once; per op = what the op costs inside a user's jit
            def f(xs, *rest):
                return [fn(x, *rest) for x in xs]
            return jax.jit(f)

        for name, shape, f, p, make in cases:
            xs = jax.device_put(make(shape), gpu)
            last = [None]

            def runner(fn):
                def go():
                    last[0] = fn(*xs)
                return go
            jsync = lambda: last[0].block_until_ready()  # noqa: E731
            mine, theirs = loop_times([runner(f), runner(p)], jsync, args.calls, args.reps)
            row("jax", shape, "bf16", f"jit(fusedk.jax.{name})", mine)
            row("jax", shape, "bf16", f"jit(pure JAX {name})", theirs)
            if shape in ((1, 64), (2, 4096, 1152)):  # where JAX's own dispatch sets the pace
                mine, theirs = loop_times([runner(f), runner(p)], jsync, args.calls, args.reps, host_only=True)
                row("jax", shape, "bf16", f"jit(fusedk.jax.{name}): host time only", mine)
                row("jax", shape, "bf16", f"jit(pure JAX {name}): host time only", theirs)
            if shape != (1, 64):
                many = [xs[0] + jnp.asarray(k, xs[0].dtype) for k in range(10)]  # 10 distinct inputs
                rest = xs[1:]
                calls = max(args.calls // 10, 20)

                def many_runner(fn):
                    def go():
                        last[0] = fn(many, *rest)[-1]
                    return go
                mine, theirs = loop_times([many_runner(batch(f)), many_runner(batch(p))], jsync, calls, args.reps)
                row("jax", shape, "bf16", f"jit(10 x fusedk.jax.{name}) per op", mine / 10)
                row("jax", shape, "bf16", f"jit(10 x pure JAX {name}) per op", theirs / 10)
                del many
            del xs, last
    # --- report ---------------------------------------------------------------------------------
    prop = torch.cuda.get_device_properties(0)
    meta = {"gpu": prop.name, "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "calls": args.calls, "reps": args.reps, "torch": torch.__version__,
            "fusedk": fusedk.__version__, "cupy": getattr(cupy, "__version__", None),
            "jax": getattr(jax, "__version__", None)}
    md = [f"# The user's call: µs per call ({meta['gpu']}, {meta['date']})", "",
          f"Eager loops of {args.calls} calls without `out=` (median of {args.reps} loops, wall clock to a final "
          "sync); `kernel` = 20 of the same call captured in one CUDA graph, replays timed with CUDA events, per "
          "call. The calls of one row group alternate loop by loop (a host's speed drifts; their ratios are the "
          "result). JAX: back-to-back calls of jitted functions; `host time only`: the same loop timed without "
          "its final sync (what the calls cost the Python thread).", "",
          "| framework | shape | dtype | call | µs/call | vs reference |", "|---|---|---|---|---:|---|"]
    ref_of = {"torch": "F.rms_norm(x, (D,), w)", "cupy": "cupy.add(a, b)"}
    for r in rows:
        ref = ref_of.get(r["group"]) or (r["impl"].replace("fusedk.jax.", "pure JAX ") if "fusedk" in r["impl"] else None)
        base = next((q["us"] for q in rows if q["group"] == r["group"] and q["shape"] == r["shape"] and q["impl"] == ref), None)
        rel = f"{r['us'] / base:.2f}× {ref}" if base and r["impl"] != ref and "kernel" not in r["impl"] else ""
        if r["group"] == "torch" and r["impl"] == "fusedk.rmsnorm(x, w)":
            k = next((q["us"] for q in rows if q["group"] == "torch" and q["shape"] == r["shape"]
                      and q["impl"].startswith("kernel (fusedk")), None)
            rel += f"; {r['us'] / k:.2f}× fusedk's kernel" if k else ""
        md.append(f"| {r['group']} | {r['shape']} | {r['dtype']} | `{r['impl']}` | {r['us']:.2f} | {rel} |")
    text = "\n".join(md) + "\n"
    if args.out:
        os.makedirs(args.out, exist_ok=True)
        with open(os.path.join(args.out, "percall.json"), "w") as f:
            json.dump({"meta": meta, "rows": rows}, f, indent=1)
        with open(os.path.join(args.out, "percall.md"), "w") as f:
            f.write(text)
    print(text)


if __name__ == "__main__":
    main()
