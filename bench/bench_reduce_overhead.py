#!/usr/bin/env python3
"""What torch.compile(mode="reduce-overhead") gives a patched Flux against the stock one: the
patched blocks' operator is tagged cudagraph_unsafe, so Inductor's CUDA graphs hold only what lies
between blocks and the blocks launch eagerly. Whole-model torch.compile (as diffusers' hotswap tests
and most scripts use it) of Flux-dev's dims with --layers double and single blocks each, random bf16
weights, at 1024x1024 (4096 image tokens) and 512x512 (1024), 512 text tokens, B1; variants: stock
and patched, compile default and reduce-overhead, patched eager and patched in a hand-captured CUDA
graph, stock eager, timed in the same rounds (bench_dit's timing: CUDA events around --iters calls, median of
--rounds rounds, the order rotated).

    PYTHONPATH=bindings/python python3 bench/bench_reduce_overhead.py [--layers 4] [--out DIR]"""
import argparse
import datetime
import os
import sys
import time

import torch

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import bench  # noqa: E402
import bench_dit as bd  # noqa: E402
import fusedk.diffusers as fd  # noqa: E402


def step(m, x, mode=None):
    """m's forward on x, compiled whole (mode=None: not compiled), and the seconds the first call took."""
    f = m if mode is None else torch.compile(m, mode=mode)

    def call():
        torch.compiler.cudagraph_mark_step_begin()
        return f(**x)[0]
    t0 = time.time()
    for _ in range(3):  # reduce-overhead records its graph on the third call
        call()
    torch.cuda.synchronize()
    return call, time.time() - t0


def bench_shape(layers, si, iters, n_rounds):
    torch._dynamo.reset()
    stock = bd.flux_model(layers)
    pat = bd.flux_model(layers)
    pat.load_state_dict(stock.state_dict())
    fd.apply(pat)
    x = bd.flux_inputs(stock, Si=si, St=512)
    variants, first_s = {}, {}
    with torch.no_grad():
        for who, m in (("stock", stock), ("patched", pat)):
            for mode in ("default", "reduce-overhead"):
                variants[f"{who} compile {mode}"], first_s[f"{who} compile {mode}"] = step(m, x, mode)
        variants["stock eager"], _ = step(stock, x)
        variants["patched eager"], _ = step(pat, x)
        variants["patched CUDA graph"] = bd.graph_of(lambda: pat(**x))
        out = {k: v().clone() for k, v in variants.items() if k != "patched CUDA graph"}
        diff = {ref: {k: bd.rel_err(o, out[ref]) for k, o in out.items() if k != ref}
                for ref in ("stock eager", "stock compile default")}
        med, all_rounds = bd.rounds(variants, iters, n_rounds)
    row = dict(layers=layers, image_tokens=si, text_tokens=512, ms=med, rounds=all_rounds, first_call_s=first_s,
               out_rel_diff=diff)  # {reference: {variant: relative L2 difference}}
    bd.log(row)
    return row


def table(rows):
    keys = list(rows[0]["ms"])
    out = ["| image tokens | " + " | ".join(keys) + " | patched RO / stock RO | patched RO / patched default |",
           "|" + "---|" * (len(keys) + 3)]
    for r in rows:
        ms = r["ms"]
        out.append(f"| {r['image_tokens']} | " + " | ".join(f"{ms[k]:.3f}" for k in keys) +
                   f" | {ms['patched compile reduce-overhead'] / ms['stock compile reduce-overhead']:.3f}x"
                   f" | {ms['patched compile reduce-overhead'] / ms['patched compile default']:.3f}x |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--layers", type=int, default=4, help="double blocks, and as many single blocks")
    ap.add_argument("--tokens", default="4096,1024", help="image tokens, comma list")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    a = ap.parse_args()
    rows = [bench_shape(a.layers, int(s), a.iters, a.rounds) for s in a.tokens.split(",")]
    meta = dict(gpu=torch.cuda.get_device_name(), date=datetime.date.today().isoformat(), torch=torch.__version__,
                layers=a.layers, iters=a.iters, rounds=a.rounds, unit="ms per step (the transformer's forward)")
    md = (f"# Flux, {a.layers}+{a.layers} blocks, whole-model torch.compile modes\n\n{meta['gpu']}, {meta['date']}, "
          f"torch {meta['torch']}; ms per step, median of {a.rounds} rounds of {a.iters} calls.\n\n{table(rows)}\n")
    bench.save(a.out, "bench_reduce_overhead", dict(meta=meta, rows=rows), md)


if __name__ == "__main__":
    main()
