#!/usr/bin/env python3
"""[lowrank] a LoRA'd Flux block: peft LoRA adapters on every projection of Flux-dev's blocks (what
load_lora_weights makes of a Flux LoRA), fusedk.diffusers.apply folding each projection's adapters
into its GEMM (linear_lowrank over w_cat = [w | s b]), against the unpatched block (peft's LoRA
layers: base linear + lora_B(lora_A(x)) * s), eager and torch.compile(fullgraph=True); and the same
block without a LoRA (stock, compiled) for what the adapter costs. Flux-dev's widths at 1024x1024
(4096 image + 512 text tokens, B1), random bf16 weights, the block inputs the model's forward
makes. --step: the whole transformer's forward (19 double + 38 single blocks, a denoising step)
with rank-16 adapters, through diffusers' regional compile (compile_repeated_blocks(fullgraph=
True), switched off and on between rounds as bench_dit.py does). Time: CUDA events around --iters
calls, median of --rounds rounds, the order rotated (bench_dit.py's). Goal (issue 26): patched >=
1.15x unpatched under torch.compile.

    PYTHONPATH=bindings/python:bench python3 bench/bench_flux_lora.py [--ranks 16,32] [--step] [--out DIR]"""
import argparse
import copy
import datetime

import torch

import bench
import fusedk.diffusers as fd
from bench_dit import BF16, block_inputs, compiled_switch, flux_inputs, flux_model, rounds

TARGETS = ["to_q", "to_k", "to_v", "to_out.0", "add_q_proj", "add_k_proj", "add_v_proj", "to_add_out", "ff.net.0.proj",
           "ff.net.2", "ff_context.net.0.proj", "ff_context.net.2", "norm1.linear", "norm1_context.linear", "proj_mlp",
           "proj_out", "norm.linear"]


def blocks(m):
    return [("double", m.transformer_blocks[0]), ("single", m.single_transformer_blocks[0])]


def with_lora(base, rank):
    import peft
    m = copy.deepcopy(base)
    torch.manual_seed(rank)
    m.add_adapter(peft.LoraConfig(r=rank, lora_alpha=rank, target_modules=TARGETS, init_lora_weights=False))
    return m.to(BF16)


def step_row(rank, iters, n_rounds):
    """the whole LoRA'd transformer's forward: unpatched and patched, eager and regionally compiled"""
    stock = with_lora(flux_model(None), rank)
    pat = copy.deepcopy(stock)
    report = fd.apply(pat)
    x = flux_inputs(stock)
    with torch.inference_mode():
        want, got = stock(**x)[0], pat(**x)[0]
        for m in (stock, pat):
            m.compile_repeated_blocks(fullgraph=True)
            m(**x)
        blocks = lambda m: [b for b in m.modules() if getattr(b, "_compiled_call_impl", None) is not None]  # noqa
        (s_off, s_on), (p_off, p_on) = compiled_switch(blocks(stock)), compiled_switch(blocks(pat))
        run = lambda m, before: lambda: (before(), m(**x))  # noqa: E731
        variants = {"unpatched eager": run(stock, s_off), "unpatched compile": run(stock, s_on),
                    "patched eager": run(pat, p_off), "patched compile": run(pat, p_on)}
        for v in variants.values():
            v()
        med, all_rounds = rounds(variants, iters, n_rounds)
    row = dict(block="step", rank=rank, ms=med, rounds=all_rounds,
               rel_diff=[((got.float() - want.float()).norm() / want.float().norm()).item()])
    print(row, flush=True)
    return [row], repr(report)


def rank_rows(rank, iters, n_rounds):
    base = flux_model(1)
    stock = with_lora(base, rank)
    pat = copy.deepcopy(stock)
    report = fd.apply(pat)
    rows = []
    x = flux_inputs(stock)
    for (kind, sb), (_, pb), (_, bb), (a, kw) in zip(blocks(stock), blocks(pat), blocks(base),
                                                     block_inputs(stock, x, [b for _, b in blocks(stock)])):
        with torch.inference_mode():
            want, got = sb(*a, **kw), pb(*a, **kw)
            cs, cp, cb = (torch.compile(b, fullgraph=True) for b in (sb, pb, bb))
            variants = {"unpatched eager": lambda: sb(*a, **kw), "unpatched compile": lambda: cs(*a, **kw),
                        "patched eager": lambda: pb(*a, **kw), "patched compile": lambda: cp(*a, **kw),
                        "no LoRA, compile": lambda: cb(*a, **kw)}
            for v in variants.values():
                v()
            med, all_rounds = rounds(variants, iters, n_rounds)
        want, got = ((t,) if torch.is_tensor(t) else t for t in (want, got))
        rows.append(dict(block=kind, rank=rank, ms=med, rounds=all_rounds,
                         rel_diff=[((g.float() - w.float()).norm() / w.float().norm()).item() for w, g in zip(want, got)]))
        print(rows[-1], flush=True)
    return rows, repr(report)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--ranks", default="16,32")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--step", action="store_true")
    o = ap.parse_args()
    bench.torch = torch
    rows, reports = [], []
    for r in (int(v) for v in o.ranks.split(",")):
        rr, rep = step_row(r, max(2, o.iters // 4), o.rounds) if o.step else rank_rows(r, o.iters, o.rounds)
        rows += rr
        reports.append(rep)
    meta = {"gpu": torch.cuda.get_device_name(), "versions": bench.versions(),
            "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M UTC"), "rounds": o.rounds}
    lines = [f"# fusedk.diffusers on a LoRA'd Flux block — {meta['gpu']} — {meta['date']}", "",
             "Flux-dev dims, 4096 image + 512 text tokens, B1, bf16; peft LoRA on every projection (rank r, "
             "alpha r); CUDA events around calls, median of rounds (bench/bench_flux_lora.py). Goal: patched / "
             "unpatched under compile >= 1.15x. ms:", "",
             "| block | rank | unpatched eager | unpatched compile | patched eager | patched compile | "
             "compile: unpatched / patched | no LoRA, compile | rel. diff patched vs unpatched |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        m = r["ms"]
        lines.append(f"| {r['block']} | {r['rank']} | {m['unpatched eager']:.3f} | {m['unpatched compile']:.3f} | "
                     f"{m['patched eager']:.3f} | {m['patched compile']:.3f} | "
                     f"{m['unpatched compile'] / m['patched compile']:.2f}x | {m.get('no LoRA, compile', float('nan')):.3f} | "
                     f"{', '.join(f'{v:.1e}' for v in r['rel_diff'])} |")
    md = "\n".join(lines + ["", "```"] + reports + ["```"]) + "\n"
    bench.save(o.out, "bench_flux_lora" + ("_step" if o.step else ""), {"meta": meta, "rows": rows, "reports": reports}, md)


if __name__ == "__main__":
    main()
