#!/usr/bin/env python3
"""[lowrank] fusedk.lowrank_update against the unfused chain in torch eager and torch.compile, the
frozen base linear beside it, and a device-to-device copy of the same bytes: one run.

    PYTHONPATH=bindings/python python3 bench/bench_lowrank.py [--out DIR] [--rounds 3]

Shapes (issue 26): BEM's f16 M=16384 K=768 r=8 (seed 001), bf16 M=8192 K=N=4096 r=16, Flux's MLP
fc1 4608x3072 -> 12288 r=32. Two forms each: "delta" = scaling ((x v) * codes) u_t (BEM's
generated update; the chain: ((x @ v) * codes) @ u_t * s), and "lora" = y + scaling (x v) u_t
into y (a LoRA's delta added to the base layer's output, in place; the chain: y + (x @ v) @ u_t
* s, as peft adds it). Kernel time: bench.py's method (K calls in one CUDA graph over input sets
that outgrow L2, replays timed by events, median of --rounds rotated rounds). The eager call
(no out=, no graph): a loop of calls to a sync, per call. Minimum bytes: x, v, codes, u_t and
out once, y once when read; the copy ceiling: a 1 GiB device-to-device copy. The base linear:
fusedk.linear(x, w) with w [K2, K1] (what an adapter's cost is measured against), timed after
every other row: a long GEMM leaves the SM clock lower for the calls after it. Writes
DIR/bench_lowrank.json and .md and prints the table."""
import argparse
import datetime
import os
import statistics
import subprocess
import time

import torch

import bench
import fusedk

SHAPES = [("BEM f16", 16384, 768, 8, 768, torch.float16), ("bf16 4096", 8192, 4096, 16, 4096, torch.bfloat16),
          ("Flux fc1", 4608, 3072, 32, 12288, torch.bfloat16)]


def eager_us(fn, calls=200, reps=5):
    """per call: wall time of `calls` calls to a synchronize, median of reps"""
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    t = []
    for _ in range(reps):
        t0 = time.perf_counter()
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
        t.append((time.perf_counter() - t0) / calls * 1e6)
    return statistics.median(t)


def row(name, M, K1, r, K2, dt, form, rounds, iters, base_only=False):
    es = torch.tensor([], dtype=dt).element_size()
    lora = form == "lora"
    one = (M * K1 + M * K2 * (2 if lora else 1)) * es
    n_sets = max(2, -(-150 * 2 ** 20 // one))  # cycled through: more than L2 between reuses
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, device="cuda", generator=g)).to(dt)  # noqa: E731
    v, u_t, w, s = mk(K1, r, scale=K1 ** -0.5), mk(r, K2, scale=r ** -0.5), mk(K2, K1, scale=K1 ** -0.5), 0.5
    sets = [(mk(M, K1), mk(M, r), mk(M, K2), torch.empty(M, K2, device="cuda", dtype=dt)) for _ in range(n_sets)]
    if lora:
        fk = lambda i: fusedk.lowrank_update(sets[i % n_sets][0], v, u_t, scaling=s, y=sets[i % n_sets][2],  # noqa: E731
                                             out=sets[i % n_sets][2])
        chain = lambda x, y: y + (x @ v) @ u_t * s  # noqa: E731
        calls = {"fusedk": fk, "eager": lambda i: chain(sets[i % n_sets][0], sets[i % n_sets][2])}
        cc = torch.compile(chain)
        calls["compile"] = lambda i: cc(sets[i % n_sets][0], sets[i % n_sets][2])
        nbytes = (M * K1 + K1 * r + r * K2 + 2 * M * K2) * es
        eager_f = lambda: fusedk.lowrank_update(sets[0][0], v, u_t, scaling=s, y=sets[0][2], out=sets[0][2])  # noqa: E731
        eager_c = lambda: chain(sets[0][0], sets[0][2])  # noqa: E731
    else:
        fk = lambda i: fusedk.lowrank_update(sets[i % n_sets][0], v, u_t, sets[i % n_sets][1], scaling=s,  # noqa: E731
                                             out=sets[i % n_sets][3])
        chain = lambda x, c: ((x @ v) * c) @ u_t * s  # noqa: E731
        calls = {"fusedk": fk, "eager": lambda i: chain(sets[i % n_sets][0], sets[i % n_sets][1])}
        cc = torch.compile(chain)
        calls["compile"] = lambda i: cc(sets[i % n_sets][0], sets[i % n_sets][1])
        nbytes = (M * K1 + K1 * r + M * r + r * K2 + M * K2) * es
        eager_f = lambda: fusedk.lowrank_update(sets[0][0], v, u_t, sets[0][1], scaling=s)  # noqa: E731
        eager_c = lambda: chain(sets[0][0], sets[0][1])  # noqa: E731
    base = {"base linear": lambda i: fusedk.linear(sets[i % n_sets][0], w, out=sets[i % n_sets][3])}
    if base_only:
        return bench.time_rounds(base, max(1, min(20, n_sets * 4)), iters, rounds)
    # correctness of what is timed: fusedk against the chain in float64
    x0, c0, y0 = sets[0][0], sets[0][1], sets[0][2]
    want = (x0.double() @ v.double()) @ u_t.double() * s + y0.double() if lora else \
        ((x0.double() @ v.double()) * c0.double()) @ u_t.double() * s
    got = fusedk.lowrank_update(x0, v, u_t, None if lora else c0, scaling=s, y=y0 if lora else None)
    err = (got.double() - want).abs().max().item()
    us, meth, errs = bench.time_rounds(calls, max(1, min(20, n_sets * 4)), iters, rounds)
    eager = {"fusedk": eager_us(eager_f), "eager": eager_us(eager_c)}
    med = {k: statistics.median(t) for k, t in us.items() if t}
    return {"name": name, "form": form, "M": M, "K1": K1, "r": r, "K2": K2, "dtype": str(dt).replace("torch.", ""),
            "min_bytes": nbytes, "us": med, "rounds_us": us, "method": meth, "errors": errs, "eager_call_us": eager,
            "max_abs_err_vs_float64": err}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    bench.torch = torch  # bench.py binds torch in its own main()
    ceil = bench.copy_ceiling(20)
    rows = [row(*sh, form, a.rounds, a.iters) for sh in SHAPES for form in ("delta", "lora")]
    for r in rows:  # the base GEMMs after everything else (they leave the SM clock lower for a while)
        sh = next(sh for sh in SHAPES if sh[0] == r["name"])
        for d, b in zip((r["rounds_us"], r["method"], r["errors"]), row(*sh, r["form"], a.rounds, a.iters, True)):
            d.update(b)
        if r["rounds_us"].get("base linear"):
            r["us"]["base linear"] = statistics.median(r["rounds_us"]["base linear"])
    try:
        commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                                cwd=os.path.dirname(__file__)).stdout.strip()
    except OSError:
        commit = ""
    meta = {"gpu": torch.cuda.get_device_name(), "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M UTC"),
            "torch": torch.__version__, "copy_ceiling_gbps": ceil, "commit": commit, "rounds": a.rounds}
    lines = [f"# fusedk lowrank_update — {meta['gpu']} — {meta['date']}", "",
             f"torch {meta['torch']}; CUDA-graph replays, median of {a.rounds} rotated rounds (bench/bench_lowrank.py); "
             f"copy ceiling {ceil:.0f} GB/s (1 GiB D2D copy, read + write); commit {commit}.", "",
             "| shape | form | fusedk µs | GB/s | % of copy | eager chain µs | torch.compile µs | base linear µs | "
             "fusedk / base | eager call: fusedk / chain µs | max err vs f64 |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        u = r["us"]
        f = u.get("fusedk")
        gbs = r["min_bytes"] / (f * 1e-6) / 1e9 if f else 0
        cell = lambda k: f"{u[k]:.1f}" if k in u else "error"  # noqa: E731
        lines.append(f"| {r['name']} M{r['M']} K{r['K1']} r{r['r']} N{r['K2']} {r['dtype']} | {r['form']} | "
                     f"{cell('fusedk')} | {gbs:.0f} | {100 * gbs / ceil:.0f} % | {cell('eager')} | {cell('compile')} | "
                     f"{cell('base linear')} | {f / u['base linear']:.2f}x | {r['eager_call_us']['fusedk']:.1f} / "
                     f"{r['eager_call_us']['eager']:.1f} | {r['max_abs_err_vs_float64']:.2e} |")
    md = "\n".join(lines) + "\n"
    bench.save(a.out, "bench_lowrank", {"meta": meta, "rows": rows}, md)


if __name__ == "__main__":
    main()
