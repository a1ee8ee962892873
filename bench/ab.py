#!/usr/bin/env python3
"""A/B of libfusedk builds in one process. Each build is loaded as its own copy of the Python
package (its own libfusedk), and every row times the builds in turn, round after round, with
bench.py's method (CUDA-graph replays cycling input sets past 2x L2) on the same inputs. Peers
(eager, Liger) can ride along as columns. Separate bench.py processes of one build spread by up
to 7 % on single-wave shapes (1x1024x2048); here the builds share the process, the inputs, the
clocks and the minute, so a few-percent difference between builds is measurable. Every build
goes through this tree's Python package and fusedk.h: the builds compared must share the C API
(kernel changes, not registry or binding changes).

    python3 bench/ab.py --lib base=build-a/libfusedk.so --lib new=build-b/libfusedk.so
                        [--rows layernorm:1x1024x2048:bf16,adaln:4x4096x3072:bf16,attention:2x16x4096x64:bf16]
                        [--rounds 3] [--iters 100] [--peers eager,liger] [--out FILE.json]

Prints, per row, the median over rounds of each build (and peer) in µs and each build's speedup
over the first (the first's time / the build's); writes every round's numbers to --out. Rows
besides bench.py's ops: attention:BxHxSxDh[c], lowrank:MxK1xrxK2[y], lora:MxKxrxN[xA] and
lrgrad:MxK1xrxK2[c] (lowrank_update_backward), each described by its ab_ function. Build
variants: meson setup DIR -Dtests=false "-Dcuda_args=['-DFLAG']" (bench/NOTES.md names the flags
each A/B used)."""
import argparse
import importlib.util
import json
import os
import statistics
import sys
import types
import zlib

HERE = os.path.dirname(os.path.abspath(__file__))
PKG = os.path.join(HERE, "..", "bindings", "python", "fusedk")


def load_build(name, path):
    """The fusedk package once more, as module fusedk_ab_<name>, bound to the library at path."""
    old = os.environ.get("FUSEDK_LIBRARY")
    os.environ["FUSEDK_LIBRARY"] = os.path.abspath(path)  # read once, at import
    try:
        mod = f"fusedk_ab_{name}"
        spec = importlib.util.spec_from_file_location(mod, os.path.join(PKG, "__init__.py"),
                                                      submodule_search_locations=[PKG])
        m = importlib.util.module_from_spec(spec)
        sys.modules[mod] = m
        spec.loader.exec_module(m)
        return m
    finally:
        if old is None:
            os.environ.pop("FUSEDK_LIBRARY", None)
        else:
            os.environ["FUSEDK_LIBRARY"] = old


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--lib", action="append", required=True, help="name=path/to/libfusedk.so (first: the base)")
    ap.add_argument("--rows", default="layernorm:1x1024x2048:bf16,layernorm:4x4096x3072:bf16",
                    help="comma list of op:shape:dtype (bench.py's op names)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=100, help="graph replays a timing")
    ap.add_argument("--peers", default="", help="comma list of eager, liger (torch.compile: use bench.py)")
    ap.add_argument("--out")
    args = ap.parse_args()
    builds = [tuple(s.split("=", 1)) for s in args.lib]
    if any(len(b) != 2 or not all(b) for b in builds) or len({n for n, _ in builds}) != len(builds):
        ap.error("--lib wants distinct name=path/to/libfusedk.so")
    bad = [p for p in args.peers.split(",") if p and p not in ("eager", "liger")]
    if bad:
        ap.error(f"--peers: {bad} (eager, liger)")
    mods = {n: load_build(n, p) for n, p in builds}
    import torch
    import torch.nn.functional as F
    sys.path.insert(0, HERE)
    import bench
    bench.torch, bench.F = torch, F
    peers = [p for p in args.peers.split(",") if p]
    cargs = types.SimpleNamespace(no_compile=True, no_liger="liger" not in peers, no_jax=True)
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    names = [n for n, _ in builds]
    report = {"gpu": torch.cuda.get_device_name(), "builds": dict(builds), "peers": peers, "rows": []}
    print(f"# A/B on {report['gpu']}: " + ", ".join(f"{n}={p}" for n, p in builds) + f"; {args.rounds} rounds")
    print("| op | shape | dtype | " + " | ".join(names + peers) + " | " + " | ".join(f"{n} speedup" for n in names[1:]) + " |")
    print("|---|---|---|" + "---:|" * (2 * len(names) - 1 + len(peers)))
    for spec in args.rows.split(","):
        op, shape_s, dtype = spec.split(":")
        if op == "attention":
            report["rows"].append(ab_attention(mods, names, shape_s, dtype, args))
            continue
        if op == "lowrank":
            report["rows"].append(ab_lowrank(mods, names, shape_s, dtype, args, l2))
            continue
        if op == "lora":
            report["rows"].append(ab_lora(mods, names, shape_s, dtype, args))
            continue
        if op == "lrgrad":
            report["rows"].append(ab_lrgrad(mods, names, shape_s, dtype, args, l2))
            continue
        shape = tuple(int(v) for v in shape_s.split("x"))
        bench.fusedk = mods[names[0]]
        c = bench.Case(op, shape, dtype, cargs)
        R, K = bench.sizing(c.nbytes, l2)
        torch.manual_seed(zlib.crc32(f"{op}{shape}{dtype}".encode()))
        sets = [c.make() for _ in range(R)]
        outs = [c.outs(s) for s in sets]
        ref = [t.clone() for t in bench.as_list(c.ref(sets[0]))]
        tol = bench.REL_TOL[dtype] * max(t.float().abs().max().item() for t in ref)
        calls = {}
        for n in names:
            bench.fusedk = mods[n]
            c.fk(sets[0], outs[0])
            e = bench.max_err(c.got(outs[0]), ref)
            if not e <= tol:
                raise SystemExit(f"{n} {spec}: max abs error {e:.3g} > {tol:.3g}")
            calls[n] = lambda i, m=mods[n]: (setattr(bench, "fusedk", m), c.fk(sets[i % R], outs[i % R]))[1]
        for p in peers:
            if p in c.peers and not isinstance(c.peers[p], Exception):
                calls[p] = lambda i, fn=c.peers[p]: fn(sets[i % R])
        times, _, errs = bench.time_rounds(calls, K, args.iters, args.rounds,
                                           timer=lambda f, k, n: (bench.time_graph(f, k, n), "cuda-graph"))
        if errs:
            raise SystemExit(f"{spec}: {errs}")
        med = {k: statistics.median(v) for k, v in times.items()}
        cols = [f"{med[k]:.2f}" if k in med else "—" for k in names + peers]
        ratios = [f"{med[names[0]] / med[n]:.3f}x" for n in names[1:]]
        print(f"| {op} | {shape_s} | {dtype} | " + " | ".join(cols + ratios) + " |", flush=True)
        report["rows"].append(dict(op=op, shape=shape_s, dtype=dtype, R=R, K=K, us=times, median=med))
    if args.out:
        with open(args.out, "w") as fh:
            json.dump(report, fh, indent=1)


def timed_row(op, shape_s, dtype, names, calls, K, err, args):
    """Times calls {build: call(i)} in rotated rounds (graphs of K calls), prints the row (each
    build's median µs and its max difference err[build] from the first build's output, then the
    speedups over the first) and returns it for the report."""
    import bench
    times, _, errs = bench.time_rounds(calls, K, args.iters, args.rounds,
                                       timer=lambda f, kk, n: (bench.time_graph(f, kk, n), "cuda-graph"))
    if errs:
        raise SystemExit(f"{op} {shape_s}: {errs}")
    med = {n: statistics.median(t) for n, t in times.items()}
    cols = [f"{med[n]:.2f} (diff {err[n]:.1e})" for n in names]
    ratios = [f"{med[names[0]] / med[n]:.3f}x" for n in names[1:]]
    print(f"| {op} | {shape_s} | {dtype} | " + " | ".join(cols + ratios) + " |", flush=True)
    return dict(op=op, shape=shape_s, dtype=dtype, us=times, median=med, diff=err)


def ab_lowrank(mods, names, shape_s, dtype, args, l2):
    """A row lowrank:MxK1xrxK2[y]:f16 — lowrank_update's delta form (codes, out new) or, with y, the
    LoRA form (y += scaling x v u_t in place); input sets cycled past L2; each build's max error
    against the first's."""
    import torch
    import bench
    lora = shape_s.endswith("y")
    M, K1, r, K2 = (int(v) for v in shape_s.rstrip("y").split("x"))
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=dt, generator=g)  # noqa: E731
    R = max(2, -(-3 * l2 // ((M * K1 + 2 * M * K2) * 2)))
    v, u = mk(K1, r) * K1 ** -0.5, mk(r, K2) * r ** -0.5
    sets = [(mk(M, K1), mk(M, r), mk(M, K2), torch.empty(M, K2, device="cuda", dtype=dt)) for _ in range(R)]

    def call(m, i):
        x, c, y, o = sets[i % R]
        return m.lowrank_update(x, v, u, scaling=0.5, y=y, out=y) if lora else \
            m.lowrank_update(x, v, u, c, scaling=0.5, out=o)
    outs = {n: mods[n].lowrank_update(sets[0][0], v, u, None if lora else sets[0][1], scaling=0.5,
                                      y=sets[0][2] if lora else None) for n in names}
    err = {n: (outs[n].float() - outs[names[0]].float()).abs().max().item() for n in names}
    calls = {n: (lambda i, m=mods[n]: call(m, i)) for n in names}
    return timed_row("lowrank", shape_s, dtype, names, calls, 2 * R, err, args)


def ab_lrgrad(mods, names, shape_s, dtype, args, l2):
    """A row lrgrad:MxK1xrxK2[c]:bf16 — lowrank_update_backward's dx, dv, du_t (and dcodes, with
    c); input sets cycled past L2; each build's max difference from the first's (all gradients)."""
    import torch
    codes = shape_s.endswith("c")
    M, K1, r, K2 = (int(v) for v in shape_s.rstrip("c").split("x"))
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=dt, generator=g)  # noqa: E731
    R = max(2, -(-3 * l2 // ((2 * M * K1 + M * K2) * 2)))
    v, u = mk(K1, r) * K1 ** -0.5, mk(r, K2) * r ** -0.5
    sets = [(mk(M, K2), mk(M, K1), mk(M, r) if codes else None) for _ in range(R)]

    def call(m, i):
        dout, x, c = sets[i % R]
        return m.lowrank_update_backward(dout, x, v, u, c, scaling=0.5)
    outs = {n: [t for t in call(mods[n], 0) if t is not None] for n in names}
    err = {n: max((a.float() - b.float()).abs().max().item() for a, b in zip(outs[n], outs[names[0]]))
           for n in names}
    calls = {n: (lambda i, m=mods[n]: call(m, i)) for n in names}
    return timed_row("lrgrad", shape_s, dtype, names, calls, 2 * R, err, args)


def ab_lora(mods, names, shape_s, dtype, args):
    """A row lora:MxKxrxN[xA]:bf16 — linear_lowrank with bias (A stacked adapters with random
    adapter_ids where A > 1), two input sets; each build's max difference from the first's."""
    import torch
    import bench
    M, K, r, N, *rest = (int(v) for v in shape_s.split("x"))
    A = rest[0] if rest else 1
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *s: torch.randn(*s, device="cuda", dtype=dt, generator=g)  # noqa: E731
    w, bias = mk(N, K) * K ** -0.5, mk(N)
    a, b = (mk(A, r, K) * K ** -0.5, mk(A, N, r)) if A > 1 else (mk(r, K) * K ** -0.5, mk(N, r))
    ids = torch.randint(0, A, (M,), device="cuda", generator=g, dtype=torch.int32) if A > 1 else None
    sets = [(mk(M, K), torch.empty(M, N, device="cuda", dtype=dt)) for _ in range(2)]
    loras = {n: mods[n].LoRA(w, a, b, scaling=0.5, bias=bias) for n in names}
    outs = {n: loras[n](sets[0][0], adapter_ids=ids) for n in names}
    err = {n: (outs[n].float() - outs[names[0]].float()).abs().max().item() for n in names}
    calls = {n: (lambda i, lo=loras[n]: lo(sets[i % 2][0], adapter_ids=ids, out=sets[i % 2][1])) for n in names}
    return timed_row("lora", shape_s, dtype, names, calls, 8, err, args)


def ab_attention(mods, names, shape_s, dtype, args):
    """A row attention:BxHxSxDh[c]:bf16 (c: causal): q, k, v [B, S, H, Dh]; each build's error
    against float64 (bench_attention's rows) and its graph-replay time, TFLOP/s printed."""
    import torch
    import bench
    from bench_attention import reference_err
    causal = shape_s.endswith("c")
    B, H, S, Dh = (int(v) for v in shape_s.rstrip("c").split("x"))
    dt = {"bf16": torch.bfloat16, "f16": torch.float16}[dtype]
    g = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(B, S, H, Dh, device="cuda", dtype=dt, generator=g) for _ in range(3))
    calls, err = {}, {}
    for n in names:
        err[n] = reference_err(torch, mods[n].attention(q, k, v, causal=causal), q, k, v, causal)
        calls[n] = lambda i, m=mods[n]: m.attention(q, k, v, causal=causal)
    times, _, errs = bench.time_rounds(calls, 3, args.iters, args.rounds,
                                       timer=lambda f, kk, n: (bench.time_graph(f, kk, n), "cuda-graph"))
    if errs:
        raise SystemExit(f"attention {shape_s}: {errs}")
    med = {n: statistics.median(v) for n, v in times.items()}
    flop = 4.0 * B * H * S * S * Dh / (2 if causal else 1)
    cols = [f"{med[n]:.1f} ({flop / med[n] / 1e6:.0f} TF/s, err {err[n]:.1e})" for n in names]
    ratios = [f"{med[names[0]] / med[n]:.3f}x" for n in names[1:]]
    print(f"| attention | {shape_s} | {dtype} | " + " | ".join(cols + ratios) + " |", flush=True)
    return dict(op="attention", shape=shape_s, dtype=dtype, us=times, median=med, max_err=err)


if __name__ == "__main__":
    main()
