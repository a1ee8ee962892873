#!/usr/bin/env python3
"""[lowrank] the backward for training adapters: fusedk's linear_lowrank_backward (a LoRA'd linear:
dx, da, db through the frozen base) and lowrank_update_backward (BEM's update: dx, dv, du_t,
dcodes) against PyTorch autograd of the unfused chain (peft's F.linear(x, w, bias) + F.linear(
F.linear(x, a), b) * s then act; BEM's s ((x v) codes) u_t), eager and torch.compile: one run.

    PYTHONPATH=bindings/python:bench python3 bench/bench_lowrank_grad.py [--out DIR] [--rounds 3]

Kernel time (bench.py's method: K calls in one CUDA graph over input sets that outgrow L2, replays
timed by events, median of --rounds rotated rounds): fusedk's backward op on the forward's saved
tensors, against the ops PyTorch autograd runs for the chain's backward (its formulas on the
activations autograd saves: h = x a^T, the pre-activation), as torch ops and through
torch.compile (autograd's own engine cannot be captured in a graph, and a compiled backward
refuses retain_graph); and linear_backward's dx alone (the frozen base's own backward, what any
LoRA backward costs at least). The training step
as a user runs it (no graphs, a loop to a sync, per step): forward + backward through
fusedk.torch (linear_lowrank(x, lowrank_prepare(w, b, s), ...), lowrank_update) against the chain
eager and compiled. Goal (issue 26): backward >= 1.3x PyTorch autograd of the unfused chain.
Writes DIR/bench_lowrank_grad.json and .md and prints the table."""
import argparse
import datetime
import statistics

import torch
import torch.nn.functional as F

import bench
import fusedk
from bench_lowrank import eager_us

LORA = [("BEM f16", 16384, 768, 8, 768, torch.float16, "none"),
        ("bf16 4096", 8192, 4096, 16, 4096, torch.bfloat16, "none"),
        ("Flux fc1", 4608, 3072, 32, 12288, torch.bfloat16, "none"),
        ("Flux fc1", 4608, 3072, 32, 12288, torch.bfloat16, "gelu_tanh")]
BEM = [("BEM f16", 16384, 768, 8, 768, torch.float16), ("bf16 4096", 8192, 4096, 16, 4096, torch.bfloat16)]
ACT = {"none": lambda z: z, "gelu_tanh": lambda z: F.gelu(z, approximate="tanh")}


def n_sets_of(M, K, N, dt):
    es = torch.tensor([], dtype=dt).element_size()
    return max(2, -(-150 * 2 ** 20 // ((M * K + M * N) * es)))  # cycled through: more than L2 between reuses


def timed(calls, n_sets, rounds, iters):
    us, meth, errs = bench.time_rounds(calls, max(1, min(20, n_sets * 4)), iters, rounds)
    return {k: statistics.median(t) for k, t in us.items() if t}, us, meth, errs


def lora_chain_bwd(x, w, a, b, h, z, dy, s, act):
    """what autograd runs for act(F.linear(x, w, bias) + F.linear(F.linear(x, a), b) * s) with w
    and bias frozen: act's backward on the saved pre-activation, the mul's, two linears' and the
    sum of x's two gradients"""
    dz = dy if act == "none" else torch.ops.aten.gelu_backward(dy, z, approximate="tanh")
    dlo = dz * s
    dh = dlo @ b
    return dz @ w + dh @ a, dh.t() @ x, dlo.t() @ h


def bem_chain_bwd(x, v, u, c, h, g, dy, s):
    """what autograd runs for ((x @ v) * c) @ u * s, h = x @ v and g = h * c saved"""
    d1 = dy * s
    dg = d1 @ u.t()
    dh = dg * c
    return dh @ v.t(), x.t() @ dh, g.t() @ d1, dg * h


def lora_row(name, M, K, r, N, dt, act, rounds, iters):
    n_sets = n_sets_of(M, K, N, dt)
    g = torch.Generator(device="cuda").manual_seed(0)
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, device="cuda", generator=g)).to(dt)  # noqa: E731
    w, bias, s = mk(N, K, scale=K ** -0.5), mk(N), 0.5
    a, b = mk(r, K, scale=K ** -0.5).requires_grad_(), mk(N, r, scale=r ** -0.5).requires_grad_()
    xs = [mk(M, K).requires_grad_() for _ in range(n_sets)]
    dys = [mk(M, N) for _ in range(n_sets)]
    w_cat = fusedk.lowrank_prepare(w, b.detach(), s)
    zs = [fusedk.linear_lowrank(x.detach(), w_cat, a.detach(), bias, act=act, aux=True)[1] for x in xs]
    chain = lambda x: ACT[act](F.linear(x, w, bias) + F.linear(F.linear(x, a), b) * s)  # noqa: E731
    cc = torch.compile(chain)
    ad, bd = a.detach(), b.detach()
    hs = [F.linear(x.detach(), ad) for x in xs]  # what autograd saves
    zts = [F.linear(x.detach(), w, bias) + F.linear(h, bd) * s for x, h in zip(xs, hs)]
    cb = torch.compile(lora_chain_bwd)
    at = lambda i: i % n_sets  # noqa: E731
    tb = lambda f: lambda i: f(xs[at(i)].detach(), w, ad, bd, hs[at(i)], zts[at(i)], dys[at(i)], s, act)  # noqa: E731
    calls = {"fusedk": lambda i: fusedk.linear_lowrank_backward(dys[at(i)], xs[at(i)].detach(), w_cat, a.detach(),
                                                                aux=zs[at(i)] if act != "none" else None, act=act,
                                                                scaling=s),
             "base dx": lambda i: fusedk.linear_backward(dys[at(i)], xs[at(i)].detach(), w, zs[at(i)], act, dw=False,
                                                         db=False)[0],
             "eager": tb(lora_chain_bwd), "compile": tb(cb)}
    # what is timed, against float64
    x0, dy0 = xs[0].detach().double(), dys[0].double()
    want = grads64(x0, dy0, w, a, b, bias, s, act)
    got = calls["fusedk"](0)
    err = {"fusedk": [(gt.double() - wt).abs().max().item() for gt, wt in zip(got, want)],
           "eager": [(gt.double() - wt).abs().max().item() for gt, wt in zip(calls["eager"](0), want)]}
    med, us, meth, errs = timed(calls, n_sets, rounds, iters)

    def fused_step():
        y = fusedk.linear_lowrank(xs[0], fusedk.lowrank_prepare(w, b, s), a, bias, act=act)
        return torch.autograd.grad(y, (xs[0], a, b), dys[0])

    step = {"fusedk": eager_us(fused_step, calls=20),
            "eager": eager_us(lambda: torch.autograd.grad(chain(xs[0]), (xs[0], a, b), dys[0]), calls=20),
            "compile": eager_us(lambda: torch.autograd.grad(cc(xs[0]), (xs[0], a, b), dys[0]), calls=20)}
    return {"name": name, "M": M, "K": K, "r": r, "N": N, "act": act, "dtype": str(dt).replace("torch.", ""),
            "us": med, "rounds_us": us, "method": meth, "errors": errs, "step_us": step,
            "max_abs_err_vs_float64 (dx, da, db)": err}


def grads64(x, dy, w, a, b, bias, s, act):
    """dx, da, db of the chain in float64"""
    x, a, b = x.clone().requires_grad_(), a.detach().double().requires_grad_(), b.detach().double().requires_grad_()
    y = ACT[act](F.linear(x, w.double(), bias.double()) + F.linear(F.linear(x, a), b) * s)
    return torch.autograd.grad(y, (x, a, b), dy)


def bem_row(name, M, K1, r, K2, dt, rounds, iters):
    n_sets = n_sets_of(M, K1, K2, dt)
    g = torch.Generator(device="cuda").manual_seed(2)
    mk = lambda *s, scale=1.0: (scale * torch.randn(*s, device="cuda", generator=g)).to(dt)  # noqa: E731
    v, u, s = mk(K1, r, scale=K1 ** -0.5).requires_grad_(), mk(r, K2, scale=r ** -0.5).requires_grad_(), 2.0
    xs = [mk(M, K1).requires_grad_() for _ in range(n_sets)]
    cs = [mk(M, r).requires_grad_() for _ in range(n_sets)]
    dys = [mk(M, K2) for _ in range(n_sets)]
    chain = lambda x, c: ((x @ v) * c) @ u * s  # noqa: E731
    cc = torch.compile(chain)
    vd, ud = v.detach(), u.detach()
    hs = [x.detach() @ vd for x in xs]
    gs = [h * c.detach() for h, c in zip(hs, cs)]
    cb = torch.compile(bem_chain_bwd)
    at = lambda i: i % n_sets  # noqa: E731
    ins = lambda i: (xs[at(i)], v, u, cs[at(i)])  # noqa: E731
    tb = lambda f: lambda i: f(xs[at(i)].detach(), vd, ud, cs[at(i)].detach(), hs[at(i)], gs[at(i)], dys[at(i)], s)  # noqa
    calls = {"fusedk": lambda i: fusedk.lowrank_update_backward(dys[at(i)], xs[at(i)].detach(), v.detach(), u.detach(),
                                                                cs[at(i)].detach(), s),
             "eager": tb(bem_chain_bwd), "compile": tb(cb)}
    x0, c0, v0, u0 = (t.detach().double().requires_grad_() for t in (xs[0], cs[0], v, u))
    want = torch.autograd.grad(((x0 @ v0) * c0) @ u0 * s, (x0, v0, u0, c0), dys[0].double())
    got = calls["fusedk"](0)
    got = (got[0], got[1], got[2], got[3])
    err = {"fusedk": [(gt.double() - wt).abs().max().item() for gt, wt in zip(got, want)],
           "eager": [(gt.double() - wt).abs().max().item() for gt, wt in zip(calls["eager"](0), want)]}
    med, us, meth, errs = timed(calls, n_sets, rounds, iters)
    es = torch.tensor([], dtype=dt).element_size()
    least = (2 * M * K1 + M * K2 + 2 * M * r) * es  # read x, dy, codes; write dx, dcodes
    step = {"fusedk": eager_us(lambda: torch.autograd.grad(fusedk.lowrank_update(xs[0], v, u, cs[0], s), ins(0), dys[0]),
                               calls=20),
            "eager": eager_us(lambda: torch.autograd.grad(chain(xs[0], cs[0]), ins(0), dys[0]), calls=20),
            "compile": eager_us(lambda: torch.autograd.grad(cc(xs[0], cs[0]), ins(0), dys[0]), calls=20)}
    return {"name": name, "M": M, "K1": K1, "r": r, "K2": K2, "dtype": str(dt).replace("torch.", ""), "us": med,
            "rounds_us": us, "method": meth, "errors": errs, "step_us": step, "least_bytes": least,
            "max_abs_err_vs_float64 (dx, dv, du_t, dcodes)": err}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--commit", default="")
    o = ap.parse_args()
    bench.torch = torch  # bench.py binds torch in its own main()
    import fusedk.torch  # noqa: F401 - the autograd of the training step
    rows = [lora_row(*sh, o.rounds, o.iters) for sh in LORA]
    brows = [bem_row(*sh, o.rounds, o.iters) for sh in BEM]
    meta = {"gpu": torch.cuda.get_device_name(), "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M UTC"),
            "versions": bench.versions(), "commit": o.commit, "rounds": o.rounds}
    f = lambda u, k: f"{u[k]:.1f}" if k in u else "-"  # noqa: E731
    x = lambda u, a, b: f"{u[a] / u[b]:.2f}x" if a in u and b in u else "-"  # noqa: E731
    lines = [f"# fusedk low-rank backward — {meta['gpu']} — {meta['date']}", "",
             f"torch {torch.__version__}; backward alone: CUDA-graph replays, median of {o.rounds} rotated rounds "
             f"(bench/bench_lowrank_grad.py); step: forward + backward as a user runs it (no graphs), per step. "
             f"commit {o.commit or '(not given)'}. Goal: PyTorch autograd / fusedk >= 1.3.", "",
             "LoRA'd linear (dx, da, db; w frozen; scaling 0.5):", "",
             "| shape | act | fusedk bwd µs | base dx alone µs | autograd's ops, eager µs | compiled µs | "
             "eager / fusedk | compile / fusedk | step: fusedk / eager / compile µs | max err vs f64 (dx, da, db): "
             "fusedk / eager |", "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        u, st, e = r["us"], r["step_us"], r["max_abs_err_vs_float64 (dx, da, db)"]
        lines.append(f"| {r['name']} M{r['M']} K{r['K']} N{r['N']} r{r['r']} {r['dtype']} | {r['act']} | "
                     f"{f(u, 'fusedk')} | {f(u, 'base dx')} | {f(u, 'eager')} | {f(u, 'compile')} | "
                     f"{x(u, 'eager', 'fusedk')} | {x(u, 'compile', 'fusedk')} | "
                     f"{st['fusedk']:.0f} / {st['eager']:.0f} / {st['compile']:.0f} | "
                     f"{', '.join(f'{v:.1e}' for v in e['fusedk'])} / {', '.join(f'{v:.1e}' for v in e['eager'])} |")
    lines += ["", "BEM's lowrank_update (dx, dv, du_t, dcodes; scaling 2):", "",
              "| shape | fusedk bwd µs | GB/s of the least bytes | autograd's ops, eager µs | compiled µs | "
              "eager / fusedk | compile / fusedk | step: fusedk / eager / compile µs | max err vs f64 (dx, dv, du_t, "
              "dcodes): fusedk / eager |", "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in brows:
        u, st, e = r["us"], r["step_us"], r["max_abs_err_vs_float64 (dx, dv, du_t, dcodes)"]
        gbs = f"{r['least_bytes'] / u['fusedk'] / 1e3:.0f}" if "fusedk" in u else "-"
        lines.append(f"| {r['name']} M{r['M']} K1 {r['K1']} K2 {r['K2']} r{r['r']} {r['dtype']} | {f(u, 'fusedk')} | "
                     f"{gbs} | {f(u, 'eager')} | {f(u, 'compile')} | {x(u, 'eager', 'fusedk')} | "
                     f"{x(u, 'compile', 'fusedk')} | {st['fusedk']:.0f} / {st['eager']:.0f} / {st['compile']:.0f} | "
                     f"{', '.join(f'{v:.1e}' for v in e['fusedk'])} / {', '.join(f'{v:.1e}' for v in e['eager'])} |")
    md = "\n".join(lines) + "\n"
    bench.save(o.out, "bench_lowrank_grad", {"meta": meta, "lora": rows, "bem": brows}, md)


if __name__ == "__main__":
    main()
