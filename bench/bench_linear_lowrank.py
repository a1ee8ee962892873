#!/usr/bin/env python3
"""[lowrank] fusedk's LoRA'd linear (lowrank_prepare once, linear_lowrank each call: one GEMM over
[x | h]) against the base linear alone, the same adapter as two fusedk kernels (linear, then
lowrank_update adding the delta into y in place), and peft's unfused chain (F.linear(x, w, bias) +
F.linear(F.linear(x, a), b) * s) in torch eager and torch.compile: one run.

    PYTHONPATH=bindings/python python3 bench/bench_linear_lowrank.py [--out DIR] [--rounds 3]

Shapes (issue 26): BEM's f16 M=16384 K=N=768 r=8 (seed 001), bf16 M=8192 K=N=4096 r=16, Flux's MLP
fc1 4608x3072 -> 12288 r=32, with bias; Flux's fc1 with gelu_tanh too (its FeedForward's act; the
two-kernel form has no act and is not timed there). Kernel time: bench.py's method (K calls in
one CUDA graph over input sets that outgrow L2, replays timed by events, median of --rounds
rotated rounds); the base linear is fusedk.linear(x, w, bias, act) in the same rounds. The eager
call (no out=, no graph): a loop of calls to a sync, per call. Many adapters (issue 26: within
1.1x of the single-adapter call): A stacked rank-16 adapters with adapter_ids, in runs (A
requests of M / A rows) or at random a row, against one rank-16 adapter and against torch's
per-adapter loop (y = F.linear(x, w, bias), then y[rows_q] += s (x[rows_q] a_q^T) b_q^T, the rows
of each adapter gathered by precomputed indices). "x with room": the same call on x written into
the first K columns of a [M, K + A rp] buffer, h going into its last ones (no copy of x).
Writes DIR/bench_linear_lowrank.json and .md and prints the table."""
import argparse
import datetime
import statistics

import torch
import torch.nn.functional as F

import bench
import fusedk
from bench_lowrank import eager_us

def paired(base, other, K, pairs=30):
    """The ratio other / base from graph replays taken in turns (base, other, base, ...), so that
    both see the same clock (a long GEMM's rounds spread 5-10 % on the H100): (median of the
    pairs' ratios, base µs, other µs)"""
    (ga, ka), (gb, kb) = bench.capture(base, K), bench.capture(other, K)
    for _ in range(3):
        ga.replay(), gb.replay()
    ev = [[torch.cuda.Event(enable_timing=True) for _ in range(4)] for _ in range(pairs)]
    for e in ev:
        e[0].record(), ga.replay(), e[1].record(), e[2].record(), gb.replay(), e[3].record()
    torch.cuda.synchronize()
    ta = [e[0].elapsed_time(e[1]) * 1e3 / K for e in ev]
    tb = [e[2].elapsed_time(e[3]) * 1e3 / K for e in ev]
    del ga, gb, ka, kb
    return statistics.median(b / a for a, b in zip(ta, tb)), statistics.median(ta), statistics.median(tb)


SHAPES = [("BEM f16", 16384, 768, 8, 768, torch.float16, "none"),
          ("bf16 4096", 8192, 4096, 16, 4096, torch.bfloat16, "none"),
          ("Flux fc1", 4608, 3072, 32, 12288, torch.bfloat16, "none"),
          ("Flux fc1", 4608, 3072, 32, 12288, torch.bfloat16, "gelu_tanh")]
ACT = {"none": lambda z: z, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh")}


def row(name, M, K, r, N, dt, act, rounds, iters):
    es = torch.tensor([], dtype=dt).element_size()
    n_sets = max(2, -(-150 * 2 ** 20 // ((M * K + M * N) * es)))  # cycled through: more than L2 between reuses
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, device="cuda", generator=g)).to(dt)  # noqa: E731
    w, a, b, bias, s = mk(N, K, scale=K ** -0.5), mk(r, K, scale=K ** -0.5), mk(N, r, scale=r ** -0.5), mk(N), 0.5
    sets = [(mk(M, K), torch.empty(M, N, device="cuda", dtype=dt)) for _ in range(n_sets)]
    lora = fusedk.LoRA(w, a, b, scaling=s, bias=bias, act=act)
    rooms = [torch.zeros(M, lora.w_cat.shape[1], device="cuda", dtype=dt) for _ in range(n_sets)]
    for (x, _), xr in zip(sets, rooms):
        xr[:, :K] = x
    v, u_t = a.t().contiguous(), (b * s).t().contiguous()  # lowrank_update's layout of the same adapter
    chain = lambda x: ACT[act](F.linear(x, w, bias) + F.linear(F.linear(x, a), b) * s)  # noqa: E731
    cc = torch.compile(chain)
    X = lambda i: sets[i % n_sets][0]  # noqa: E731
    Y = lambda i: sets[i % n_sets][1]  # noqa: E731
    calls = {"fusedk": lambda i: lora(X(i), out=Y(i)), "x with room": lambda i: lora(rooms[i % n_sets], out=Y(i)),
             "base linear": lambda i: fusedk.linear(X(i), w, bias, act=act, out=Y(i)),
             "eager": lambda i: chain(X(i)), "compile": lambda i: cc(X(i))}
    if act == "none":
        calls["two kernels"] = lambda i: fusedk.lowrank_update(X(i), v, u_t, y=fusedk.linear(X(i), w, bias, out=Y(i)),
                                                              out=Y(i))
    # correctness of what is timed: fusedk and the chain against float64
    x0 = sets[0][0].double()
    want = ACT[act](x0 @ w.double().T + bias.double() + (x0 @ a.double().T) @ b.double().T * s)
    err = {"fusedk": (lora(sets[0][0]).double() - want).abs().max().item(),
           "x with room": (lora(rooms[0]).double() - want).abs().max().item(),
           "eager": (chain(sets[0][0]).double() - want).abs().max().item()}
    us, meth, errs = bench.time_rounds(calls, max(1, min(20, n_sets * 4)), iters, rounds)
    med = {k: statistics.median(t) for k, t in us.items() if t}
    pair = paired(calls["base linear"], calls["fusedk"], max(1, min(20, n_sets * 4)))
    pair_room = paired(calls["base linear"], calls["x with room"], max(1, min(20, n_sets * 4)))
    eager = {"fusedk": eager_us(lambda: lora(sets[0][0])), "eager": eager_us(lambda: chain(sets[0][0])),
             "base linear": eager_us(lambda: fusedk.linear(sets[0][0], w, bias, act=act))}
    return {"name": name, "M": M, "K": K, "r": r, "N": N, "act": act, "dtype": str(dt).replace("torch.", ""),
            "tflops_base": 2 * M * N * K / 1e12, "us": med, "rounds_us": us, "method": meth, "errors": errs,
            "paired": {"ratio": pair[0], "base_us": pair[1], "fusedk_us": pair[2]},
            "paired_room": {"ratio": pair_room[0], "base_us": pair_room[1], "room_us": pair_room[2]},
            "eager_call_us": eager, "max_abs_err_vs_float64": err}


ADAPTERS = [("Flux fc1", 4608, 3072, 16, 12288, torch.bfloat16, 4, "runs"),
            ("Flux fc1", 4608, 3072, 16, 12288, torch.bfloat16, 8, "random"),
            ("bf16 4096", 8192, 4096, 16, 4096, torch.bfloat16, 4, "runs")]


def adapters_row(name, M, K, r, N, dt, A, kind, rounds, iters):
    g = torch.Generator(device="cuda").manual_seed(1)
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, device="cuda", generator=g)).to(dt)  # noqa: E731
    w, bias, s = mk(N, K, scale=K ** -0.5), mk(N), 0.5
    a, b = mk(A, r, K, scale=K ** -0.5), mk(A, N, r, scale=r ** -0.5)
    ids = (torch.arange(M, device="cuda") * A // M if kind == "runs" else
           torch.randint(0, A, (M,), device="cuda", generator=g)).to(torch.int32)
    rows = [torch.nonzero(ids == q).flatten() for q in range(A)]
    sets = [(mk(M, K), torch.empty(M, N, device="cuda", dtype=dt)) for _ in range(2)]
    many, one = fusedk.LoRA(w, a, b, scaling=s, bias=bias), fusedk.LoRA(w, a[0], b[0], scaling=s, bias=bias)

    def loop(x, y):
        y = torch.addmm(bias, x, w.t(), out=y)
        for q in range(A):
            xq = x.index_select(0, rows[q])
            y.index_add_(0, rows[q], (xq @ a[q].t()) @ b[q].t(), alpha=s)
        return y
    X = lambda i: sets[i % 2][0]  # noqa: E731
    Y = lambda i: sets[i % 2][1]  # noqa: E731
    calls = {"many": lambda i: many(X(i), adapter_ids=ids, out=Y(i)), "one": lambda i: one(X(i), out=Y(i)),
             "base linear": lambda i: fusedk.linear(X(i), w, bias, out=Y(i)), "torch loop": lambda i: loop(X(i), Y(i))}
    x0 = sets[0][0].double()
    want = x0 @ w.double().T + bias.double()
    for q in range(A):
        want[rows[q]] += (x0[rows[q]] @ a[q].double().T) @ b[q].double().T * s
    err = {"fusedk": (many(sets[0][0], adapter_ids=ids).double() - want).abs().max().item(),
           "torch loop": (loop(sets[0][0], torch.empty_like(sets[0][1])).double() - want).abs().max().item()}
    us, meth, errs = bench.time_rounds(calls, 8, iters, rounds)
    med = {k: statistics.median(t) for k, t in us.items() if t}
    pair = paired(calls["one"], calls["many"], 8)
    eager = {"many": eager_us(lambda: many(sets[0][0], adapter_ids=ids)), "torch loop": eager_us(
        lambda: loop(sets[0][0], torch.empty_like(sets[0][1])))}
    return {"name": name, "M": M, "K": K, "r": r, "N": N, "A": A, "ids": kind, "dtype": str(dt).replace("torch.", ""),
            "us": med, "rounds_us": us, "method": meth, "errors": errs, "eager_call_us": eager,
            "paired": {"ratio": pair[0], "one_us": pair[1], "many_us": pair[2]}, "max_abs_err_vs_float64": err}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--commit", default="")
    o = ap.parse_args()
    bench.torch = torch  # bench.py binds torch in its own main()
    rows = [row(*sh, o.rounds, o.iters) for sh in SHAPES]
    arows = [adapters_row(*sh, o.rounds, o.iters) for sh in ADAPTERS]
    meta = {"gpu": torch.cuda.get_device_name(), "date": datetime.datetime.utcnow().strftime("%Y-%m-%dT%H:%M UTC"),
            "versions": bench.versions(), "commit": o.commit, "rounds": o.rounds}
    lines = [f"# fusedk linear_lowrank — {meta['gpu']} — {meta['date']}", "",
             f"torch {torch.__version__}; CUDA-graph replays, median of {o.rounds} rotated rounds "
             f"(bench/bench_linear_lowrank.py); commit {o.commit or '(not given)'}. Goal: fusedk / base linear <= 1.03.",
             " \"paired\": the ratio's median over 30 pairs of replays taken in turns (base, fusedk, base, ...): "
             "both at the same clock.", "",
             "| shape | act | base linear µs | fusedk µs | fusedk / base | paired | x with room µs | room / base | "
             "paired | two kernels µs | peft eager µs | "
             "peft compile µs | eager call: fusedk / peft / base µs | max err vs f64: fusedk / room / peft |",
             "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        u = r["us"]
        cell = lambda k: f"{u[k]:.1f}" if k in u else "-"  # noqa: E731
        ratio = f"{u['fusedk'] / u['base linear']:.3f}x" if "fusedk" in u and "base linear" in u else "-"
        room = f"{u['x with room'] / u['base linear']:.3f}x" if "x with room" in u and "base linear" in u else "-"
        e = r["eager_call_us"]
        lines.append(f"| {r['name']} M{r['M']} K{r['K']} N{r['N']} r{r['r']} {r['dtype']} | {r['act']} | "
                     f"{cell('base linear')} | {cell('fusedk')} | {ratio} | {r['paired']['ratio']:.3f}x | "
                     f"{cell('x with room')} | {room} | {r['paired_room']['ratio']:.3f}x | "
                     f"{cell('two kernels')} | {cell('eager')} | "
                     f"{cell('compile')} | {e['fusedk']:.1f} / {e['eager']:.1f} / {e['base linear']:.1f} | "
                     f"{r['max_abs_err_vs_float64']['fusedk']:.2e} / "
                     f"{r['max_abs_err_vs_float64']['x with room']:.2e} / {r['max_abs_err_vs_float64']['eager']:.2e} |")
    lines += ["", "Many adapters (rank 16 each, bias, adapter_ids; goal: many / one <= 1.1):", "",
              "| shape | adapters | ids | base linear µs | one adapter µs | many µs | many / one | paired | "
              "torch loop µs | eager call: many / torch loop µs | max err vs f64: fusedk / torch loop |",
              "|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in arows:
        u = r["us"]
        cell = lambda k: f"{u[k]:.1f}" if k in u else "-"  # noqa: E731
        ratio = f"{u['many'] / u['one']:.3f}x" if "many" in u and "one" in u else "-"
        lines.append(f"| {r['name']} M{r['M']} K{r['K']} N{r['N']} {r['dtype']} | {r['A']} | {r['ids']} | "
                     f"{cell('base linear')} | {cell('one')} | {cell('many')} | {ratio} | {r['paired']['ratio']:.3f}x | "
                     f"{cell('torch loop')} | "
                     f"{r['eager_call_us']['many']:.1f} / {r['eager_call_us']['torch loop']:.1f} | "
                     f"{r['max_abs_err_vs_float64']['fusedk']:.2e} / {r['max_abs_err_vs_float64']['torch loop']:.2e} |")
    md = "\n".join(lines) + "\n"
    bench.save(o.out, "bench_linear_lowrank", {"meta": meta, "rows": rows, "adapters": arows}, md)


if __name__ == "__main__":
    main()
