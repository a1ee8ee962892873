#!/usr/bin/env python3
"""[linear] fusedk.linear / linear_backward (cuBLASLt GEMM + epilogue) against a plain cuBLASLt GEMM,
PyTorch eager, torch.compile and autograd, bf16, and the host time of a cached call.

    PYTHONPATH=bindings/python python3 bench/bench_linear.py [--out DIR] [--rounds 3] [--quick]

Shapes are M x K x N (tokens x in-features x out-features): 8192x4096x4096, 4096x3072x12288 and
a DiT MLP's fc1, 2*4096 x 1152 x 4608. Method (bench.py's): K calls captured in one CUDA graph,
replays timed with CUDA events, per call = median replay / K; every implementation timed --rounds
times, the order rotated each round, median reported. The backward's peer, autograd, replays the
same layer's recorded graph (torch.autograd.grad, retain_graph) in an eager loop timed by events,
and fusedk's backward is timed that way too (the "eager" column) besides its graph replay.
TFLOP/s = 2 M N K / time (the backward: 4 M N K, dx and dw). Host time: a loop of --calls calls
as users write them (no out=), wall clock to a synchronize after the last (and, apart, the
Python thread's time alone), median of 7 loops, the loops of the calls compared alternating
(bench/percall.py's loop_times).
With FUSEDK_LINEAR_TUNE set to other than 1 (fusedk's algorithm search, fusedk.h [linear]) the
files are named bench_linear-tune<level>.*.
Writes DIR/bench_linear.json and DIR/bench_linear.md and prints the table."""
import argparse
import datetime
import json
import os
import statistics

import bench
import percall

SHAPES = [(8192, 4096, 4096), (4096, 3072, 12288), (8192, 1152, 4608)]
_t = os.environ.get("FUSEDK_LINEAR_TUNE", "")
TUNE = _t if _t in ("0", "1", "2", "3") else "1"  # fusedk's algorithm search, read as the library reads it
SUFFIX = "" if TUNE == "1" else f"-tune{TUNE}"
ACTS = ["relu", "gelu_tanh", "silu"]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--quick", action="store_true")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    import fusedk
    bench.torch = torch
    torch.backends.cuda.matmul.allow_tf32 = False
    dt = torch.bfloat16
    act_fn = {"none": lambda t: t, "relu": torch.relu, "gelu": F.gelu, "silu": F.silu,
              "gelu_tanh": lambda t: F.gelu(t, approximate="tanh")}
    K_CALLS, ITERS = (2, 10) if args.quick else (4, 30)
    rows = []
    shapes = SHAPES[:1] if args.quick else SHAPES
    for M, K, N in shapes:
        sets = []
        for _ in range(2):  # two input sets, alternating
            x = torch.randn(M, K, device="cuda", dtype=dt)
            w = torch.randn(N, K, device="cuda", dtype=dt) / K ** 0.5
            b = torch.randn(N, device="cuda", dtype=dt)
            sets.append((x, w, b))
        flop = 2.0 * M * N * K
        gemm = {"gemm (fusedk, no epilogue)": lambda i: fusedk.linear(sets[i % 2][0], sets[i % 2][1]),
                "torch.mm": lambda i: torch.mm(sets[i % 2][0], sets[i % 2][1].t())}
        us, meth, err = bench.time_rounds(gemm, K_CALLS, ITERS, args.rounds)
        base = {k: statistics.median(v) for k, v in us.items() if v}
        bench.log(f"{M}x{K}x{N} gemm: {base}")
        for act in (["gelu_tanh"] if args.quick else ACTS):
            f = act_fn[act]
            comp = torch.compile(lambda x, w, b, f=f: f(F.linear(x, w, b)))
            # the plain GEMM again, in the same rotated rounds: the ratio to it is the goal, and the
            # clock drifts by a few % between separate measurements (H100 under GEMM load)
            calls = {"gemm": gemm["gemm (fusedk, no epilogue)"],
                     "fusedk": lambda i, a=act: fusedk.linear(*sets[i % 2], act=a),
                     "eager": lambda i, f=f: f(F.linear(*sets[i % 2])),
                     "compile": lambda i, c=comp: c(*sets[i % 2])}
            if act in ("relu", "gelu_tanh"):
                calls["fusedk +aux"] = lambda i, a=act: fusedk.linear(*sets[i % 2], act=a, aux=True)
            if act == "relu":  # the bias epilogue alone
                calls["fusedk bias"] = lambda i: fusedk.linear(*sets[i % 2])
            us, meth, err = bench.time_rounds(calls, K_CALLS, ITERS, args.rounds)
            t = {k: statistics.median(v) for k, v in us.items() if v}
            row = dict(kind="forward", shape=[M, K, N], act=act, us=t, rounds_us=us, errors=err, gemm_us=base,
                       tflops={k: flop / v / 1e6 for k, v in t.items()})
            g = t.get("gemm")
            row["vs_gemm"] = g / t["fusedk"] if g and "fusedk" in t else None
            row["vs_eager"] = t["eager"] / t["fusedk"] if "eager" in t and "fusedk" in t else None
            row["vs_compile"] = t["compile"] / t["fusedk"] if "compile" in t and "fusedk" in t else None
            rows.append(row)
            bench.log(f"{M}x{K}x{N} {act}: {t}")
        # backward, relu and gelu_tanh (cuBLASLt's epilogue acts) and silu
        for act in (["gelu_tanh"] if args.quick else ["relu", "gelu_tanh"]):
            x, w, b = (t.clone().requires_grad_() for t in sets[0])
            y = act_fn[act](F.linear(x, w, b))
            dy = torch.randn_like(y)
            _, z = fusedk.linear(*sets[0], act=act, aux=True)
            xs, ws = sets[0][0], sets[0][1]
            bwd = lambda i, a=act: fusedk.linear_backward(dy, xs, ws, z, act=a)
            auto = lambda i: torch.autograd.grad(y, (x, w, b), dy, retain_graph=True)
            graph_us, _, _ = bench.time_rounds({"fusedk": bwd}, K_CALLS, ITERS, args.rounds)
            loop_us, _, err = bench.time_rounds({"fusedk eager": bwd, "autograd": auto}, K_CALLS, ITERS, args.rounds,
                                                timer=lambda c, k, n: (bench.time_loop(c, k, n), "events-loop"))
            t = {"fusedk": statistics.median(graph_us["fusedk"]),
                 **{k: statistics.median(v) for k, v in loop_us.items() if v}}
            row = dict(kind="backward", shape=[M, K, N], act=act, us=t, errors=err,
                       tflops={k: 2 * flop / v / 1e6 for k, v in t.items()})
            row["vs_autograd"] = t["autograd"] / t["fusedk eager"] if "autograd" in t else None
            rows.append(row)
            bench.log(f"{M}x{K}x{N} backward {act}: {t}")
            del x, w, b, y, dy, z
        del sets
        torch.cuda.empty_cache()
    # host time of a cached call at a small shape, against F.linear's
    M, K, N = 64, 1152, 1152
    x = torch.randn(M, K, device="cuda", dtype=dt)
    w = torch.randn(N, K, device="cuda", dtype=dt) / K ** 0.5
    b = torch.randn(N, device="cuda", dtype=dt)
    fns = {"fusedk.linear(x, w, b)": lambda: fusedk.linear(x, w, b),
           "F.linear(x, w, b)": lambda: F.linear(x, w, b),
           "fusedk.linear(x, w, b, act='gelu_tanh')": lambda: fusedk.linear(x, w, b, act="gelu_tanh"),
           "F.gelu(F.linear(x, w, b), approximate='tanh')": lambda: F.gelu(F.linear(x, w, b), approximate="tanh")}
    t = percall.loop_times(list(fns.values()), torch.cuda.synchronize, args.calls, 7)
    th = percall.loop_times(list(fns.values()), torch.cuda.synchronize, args.calls, 7, host_only=True)
    host = dict(shape=[M, K, N], us=dict(zip(fns, t)), host_us=dict(zip(fns, th)))
    bench.log(f"host {host}")
    meta = dict(gpu=torch.cuda.get_device_name(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                fusedk=fusedk.__version__, info=fusedk.kernel_info()["cuda"], rounds=args.rounds, calls=K_CALLS,
                iters=ITERS, tune=TUNE, **bench.versions())
    res = dict(meta=meta, rows=rows, host=host)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"bench_linear{SUFFIX}.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = markdown(res)
    with open(os.path.join(args.out, f"bench_linear{SUFFIX}.md"), "w") as f:
        f.write(md)
    print(md)


def markdown(res):
    m = res["meta"]
    L = [f"# fusedk linear — {m['gpu']} — {m['date'][:16]} UTC", "",
         f"bf16, float32 accumulation; torch {m['torch']}, cuBLASLt {m['info'].get('cublasLt')}; shapes M x K x N; "
         f"CUDA-graph replays, median of {m['rounds']} rotated rounds (bench/bench_linear.py); "
         f"FUSEDK_LINEAR_TUNE={m.get('tune', '1')}; commit {m.get('git')}. The plain GEMM column is "
         "fusedk.linear(x, w) timed in the same rounds as the row's other calls.", "",
         "## Forward: y = act(x w^T + b)", "",
         "| shape | act | fusedk µs | TFLOP/s | plain GEMM µs | fusedk / GEMM rate | eager µs | compile µs | fusedk +aux µs | vs eager | vs compile |",
         "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    f = lambda v, d=1: "—" if v is None else f"{v:.{d}f}"  # noqa: E731
    for r in res["rows"]:
        if r["kind"] != "forward":
            continue
        u = r["us"]
        L.append(f"| {'x'.join(map(str, r['shape']))} | {r['act']} | {f(u.get('fusedk'))} | {f(r['tflops'].get('fusedk'))} "
                 f"| {f(u.get('gemm', r['gemm_us'].get('gemm (fusedk, no epilogue)')))} | {f(r['vs_gemm'], 3)} | {f(u.get('eager'))} "
                 f"| {f(u.get('compile'))} | {f(u.get('fusedk +aux'))} | {f(r['vs_eager'], 2)}x | {f(r['vs_compile'], 2)}x |")
    L += ["", "Bias epilogue alone (act none): " + "; ".join(
        f"{'x'.join(map(str, r['shape']))}: {f(r['us'].get('fusedk bias'))} µs" for r in res["rows"]
        if r["kind"] == "forward" and "fusedk bias" in r["us"])]
    L += ["", "Plain GEMMs, timed apart from the rows above: " + "; ".join(
        f"{'x'.join(map(str, r['shape']))}: fusedk (cuBLASLt, no epilogue) {f(r['gemm_us'].get('gemm (fusedk, no epilogue)'))} µs, "
        f"torch.mm {f(r['gemm_us'].get('torch.mm'))} µs" for r in res["rows"] if r["kind"] == "forward" and r["act"] == "gelu_tanh"),
          "", "## Backward: dx, dw, db of the same layer", "",
          "| shape | act | fusedk µs (graph) | fusedk µs (eager loop) | autograd µs (eager loop) | TFLOP/s fusedk | vs autograd |",
          "|---|---|---:|---:|---:|---:|---:|"]
    for r in res["rows"]:
        if r["kind"] != "backward":
            continue
        u = r["us"]
        L.append(f"| {'x'.join(map(str, r['shape']))} | {r['act']} | {f(u.get('fusedk'))} | {f(u.get('fusedk eager'))} "
                 f"| {f(u.get('autograd'))} | {f(r['tflops'].get('fusedk'))} | {f(r['vs_autograd'], 2)}x |")
    h = res["host"]
    L += ["", f"## Host time of a cached call, {'x'.join(map(str, h['shape']))} bf16 (µs a call, loop to a sync)", "",
          "| call | µs a call, to the sync | µs of the Python thread alone |", "|---|---:|---:|"] + [
              f"| `{k}` | {v:.2f} | {h['host_us'][k]:.2f} |" for k, v in h["us"].items()]
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
