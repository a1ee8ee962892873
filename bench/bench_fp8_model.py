#!/usr/bin/env python3
"""[linear] fusedk.diffusers.apply(precision="fp8") on a real-width model of a few blocks, random
bf16 weights (--model flux: 2 double + 4 single blocks at 1024x1024, 4096 image + 512 text tokens,
B1; ltx, wan, mochi: 2 blocks at bench_dit's video shapes): the transformer's
forward against stock torch.compile (regional: compile_repeated_blocks(fullgraph=True)) and
torchao's Float8DynamicActivationFloat8WeightConfig(PerRow()) + the same compile, beside fusedk
in bf16; fusedk's variants eager in a CUDA graph (its blocks need no compile to fuse), FP8 with
fusedk's bf16 attention and with its int8 attention (attention="int8") among them. Each
variant's output against the float32 model's (same weights and inputs): rel. L2. Memory: the
transformer's parameters and buffers on the GPU before and after apply.

    PYTHONPATH=bindings/python:bench python3 bench/bench_fp8_model.py [--model flux] [--out DIR] [--rounds 5] [--full]
        [--no-torchao]

--full: the whole Flux-dev transformer (19 double + 38 single blocks, the step's forward), stock
compiled against fusedk FP8 in a CUDA graph, one after the other on one model's weights (the stock
model is freed before the FP8 one is made: both do not fit beside a float32 copy), the FP8 output
against the stock bf16 one. Writes DIR/bench_fp8_model_MODEL.json and .md (DIR/bench_fp8_model_full.* for --full)."""
import argparse
import copy
import datetime
import json
import time

import torch

import bench_dit as bd
import fusedk
import fusedk.diffusers as fd


def flux_2_4():
    from diffusers import FluxTransformer2DModel
    return bd.on_gpu(FluxTransformer2DModel, dict(
        patch_size=1, in_channels=64, num_layers=2, num_single_layers=4, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
        axes_dims_rope=(16, 56, 56)))


# --model: (the model, its inputs, the table's title)
MODELS = {"flux": (flux_2_4, bd.flux_inputs, "Flux 2 double + 4 single blocks (real width), 1024x1024, B1"),
          **{k: ((lambda build: lambda: build(2))(v[0]), v[1], f"{v[3]}; 2 blocks (real width)")
             for k, v in bd.MODELS.items() if k != "flux"}}


def gpu_bytes(m):
    seen, n = set(), 0

    def add(t):
        nonlocal n
        inner = getattr(t, "__tensor_flatten__", None)
        if inner is not None and type(t) not in (torch.Tensor, torch.nn.Parameter):  # torchao's subclasses
            for name in inner()[0]:
                add(getattr(t, name))
            return
        s = t.untyped_storage()
        if t.is_cuda and s.data_ptr() not in seen:
            seen.add(s.data_ptr())
            n += s.nbytes()
    for t in list(m.parameters()) + list(m.buffers()):
        add(t)
    for mod in m.modules():  # fusedk's FP8 weights (a State's Projs)
        st = mod.__dict__.get("_fusedk")
        for P in getattr(st, "p", {}).values():
            w8 = getattr(P, "w8", None)
            if w8 is not None:
                n += w8.data.untyped_storage().nbytes() + w8.scale.untyped_storage().nbytes()
    return n


def full_step(args):
    """The whole Flux-dev transformer: stock regional compile, then (freed) fusedk FP8 in a graph"""
    from diffusers import FluxTransformer2DModel
    cfg = dict(patch_size=1, in_channels=64, num_layers=19, num_single_layers=38, attention_head_dim=128,
               num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
               axes_dims_rope=(16, 56, 56))
    res = {}
    for name in ("stock compile", "fusedk fp8 graph"):
        m = bd.on_gpu(FluxTransformer2DModel, cfg)  # the same seed: the same weights
        x = bd.flux_inputs(m)
        with torch.no_grad():
            t0 = time.time()
            if name == "stock compile":
                m.compile_repeated_blocks(fullgraph=True)
                f = lambda: m(**x)  # noqa: E731
                f(), f()
            else:
                fd.apply(m, precision="fp8")
                f = bd.graph_of(lambda: m(**x))
            torch.cuda.synchronize()
            setup = time.time() - t0
            y = m(**x)[0].float().cpu()
            ms = sorted(bd.time_call(f, args.iters) for _ in range(args.rounds))[args.rounds // 2]
        res[name] = dict(ms=ms, setup_s=setup, gpu_bytes=gpu_bytes(m), out=y)
        print(name, f"{ms:.2f} ms", flush=True)
        del m, f, x
        torch.cuda.empty_cache()
    s, q = res["stock compile"], res["fusedk fp8 graph"]
    e = bd.rel_err(q.pop("out"), s.pop("out"))
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    with open(f"{args.out}/bench_fp8_model_full.json", "w") as f:
        json.dump(dict(meta=meta, res=res, fp8_vs_stock_rel_l2=e), f, indent=1)
    L = [f"# Flux-dev transformer (19 + 38 blocks), 1024x1024, B1: one step's forward — {meta['gpu']}, {meta['date']}",
         "", "| variant | ms | vs stock compile | GPU GiB (transformer) |", "|---|---:|---:|---:|"]
    for k, v in res.items():
        L.append(f"| {k} | {v['ms']:.2f} | {s['ms'] / v['ms']:.3f}x | {v['gpu_bytes'] / 2**30:.2f} |")
    L += ["", f"FP8 output against the stock bf16 one: rel. L2 {e:.4f}"]
    with open(f"{args.out}/bench_fp8_model_full.md", "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--full", action="store_true")
    ap.add_argument("--model", choices=sorted(MODELS), default="flux")
    ap.add_argument("--no-torchao", action="store_true", help="leave torchao out (its compile takes minutes)")
    args = ap.parse_args()
    if args.full:
        return full_step(args)
    build, inputs, title = MODELS[args.model]
    base = build()
    x = inputs(base)
    ref = copy.deepcopy(base).float()
    x32 = {k: (v.float() if torch.is_tensor(v) and v.is_floating_point() else v) for k, v in x.items()}
    with torch.no_grad():
        want = ref(**x32)[0].double()
    del ref
    torch.cuda.empty_cache()
    variants, errs, mem, compile_s = {}, {}, {}, {}

    def add(name, m, how):
        with torch.no_grad():
            t0 = time.time()
            if how == "compile":
                if getattr(m, "_repeated_blocks", None):
                    m.compile_repeated_blocks(fullgraph=True)
                else:  # Mochi names no repeated blocks: each block compiled as compile_repeated_blocks does
                    for blk in m.transformer_blocks:
                        blk.compile(fullgraph=True)
                f = lambda: m(**x)  # noqa: E731
                f(), f()
            else:
                g = bd.graph_of(lambda: m(**x))
                f = g
            torch.cuda.synchronize()
            compile_s[name] = time.time() - t0
            y = m(**x)[0]
        errs[name] = bd.rel_err(y, want)
        variants[name] = f

    with torch.no_grad():
        mem["stock"] = gpu_bytes(base)
        kinds = (("fusedk bf16 graph", {}), ("fusedk fp8 graph", dict(precision="fp8")),
                 ("fusedk fp8 + attention graph", dict(precision="fp8", attention=True)),
                 ("fusedk fp8 + int8 attention graph", dict(precision="fp8", attention="int8")),
                 ("fusedk fp8, bf16 weights kept, graph", dict(precision="fp8", bf16_weights="keep")))
        copies = [copy.deepcopy(base) for _ in kinds]  # before the stock one is compiled in place
        add("stock compile", base, "compile")
        for m, (name, kw) in zip(copies, kinds):
            rep = fd.apply(m, **kw)
            mem[name] = gpu_bytes(m)
            print(name, rep, flush=True)
            add(name, m, "graph")
        try:
            if not args.no_torchao:
                from torchao.quantization import Float8DynamicActivationFloat8WeightConfig, PerRow, quantize_
                m = build()
                m.load_state_dict(base.state_dict())
                quantize_(m, Float8DynamicActivationFloat8WeightConfig(granularity=PerRow()),  # its bf16 Linears
                          filter_fn=lambda mod, _: type(mod) is torch.nn.Linear and mod.weight.dtype == torch.bfloat16)
                mem["torchao fp8"] = gpu_bytes(m)
                add("torchao fp8 compile", m, "compile")
        except Exception as e:  # noqa: BLE001 - torchao missing or refusing: the table says so
            print("torchao:", type(e).__name__, str(e)[:300], flush=True)
        ms, all_ms = bd.rounds(variants, args.iters, args.rounds)
    s = ms["stock compile"]
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                model=args.model)
    res = dict(meta=meta, ms=ms, rounds=all_ms, rel_l2=errs, gpu_bytes=mem, setup_s=compile_s)
    with open(f"{args.out}/bench_fp8_model_{args.model}.json", "w") as f:
        json.dump(res, f, indent=1)
    L = [f"# {title} — {meta['gpu']}, {meta['date']}, torch "
         f"{meta['torch']}", "", "| variant | ms | vs stock compile | rel. L2 vs float32 | setup s |",
         "|---|---:|---:|---:|---:|"]
    for k, v in ms.items():
        L.append(f"| {k} | {v:.2f} | {s / v:.3f}x | {errs[k]:.4f} | {compile_s[k]:.0f} |")
    L += ["", "Transformer bytes on the GPU (parameters, buffers, fusedk's e4m3 weights): " +
          ", ".join(f"{k} {v / 2**30:.2f} GiB" for k, v in mem.items())]
    with open(f"{args.out}/bench_fp8_model_{args.model}.md", "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
