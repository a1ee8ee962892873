#!/usr/bin/env python3
"""[conv] fusedk.conv against torch's channels-last conv (cuDNN) and torch.compile, bf16, layer by
layer: the seed's Conv + BN + SiLU (N2 C320 64x64 -> 320, 3x3; N8 C128 128x128; a 1x1) as
fusedk's one conv (BN folded, SiLU in the epilogue) against cuDNN's conv alone and against the
compiled chain conv -> BN (eval) -> SiLU; then the VAE decoders' own layers (Flux's AutoencoderKL
at 1024^2: 512/256/128 channels at 128^2..1024^2; Wan 2.1's causal 3x3x3 convs at 480p, 4
latent frames' worth) as fusedk.conv against cuDNN (Conv3d with the causal padding done by F.pad
for Wan, as diffusers runs it, and on a pre-padded input: the conv alone); and GroupNorm + SiLU
at the Flux decoder's shapes (32 groups) as fusedk.group_norm(act="silu") against torch eager on
channels-last, torch.compile, and a copy of the same bytes (read + write); the Flux decoder's
upsamplers (nearest 2x + 3x3 conv, as diffusers' Upsample2D runs them) against conv(upsample=2).

    PYTHONPATH=bindings/python:bench python3 bench/bench_conv.py [--out DIR] [--quick | --seed | --gn] [--no-compile] [--rounds 5]

Method (bench.py's): each call captured K times in a CUDA graph, replays timed by events, median;
implementations in rotated rounds; TFLOP/s from 2 M Co K. Writes DIR/bench_conv.json and .md."""
import argparse
import datetime
import json
import statistics

import bench

SEED = [("seed 3x3 N2 C320 64^2", 2, 320, 64, 64, 320, 3), ("seed 3x3 N8 C128 128^2", 8, 128, 128, 128, 128, 3),
        ("seed 1x1 N8 C128 128^2", 8, 128, 128, 128, 128, 1)]
# Flux AutoencoderKL decoder at 1024^2 (block_out_channels 128, 256, 512, 512): (name, N, Ci, H, W, Co, k)
FLUX = [("flux conv_in 16->512 128^2", 1, 16, 128, 128, 512, 3), ("flux 512 128^2", 1, 512, 128, 128, 512, 3),
        ("flux 512 256^2", 1, 512, 256, 256, 512, 3), ("flux 512 512^2", 1, 512, 512, 512, 512, 3),
        ("flux 512->256 512^2", 1, 512, 512, 512, 256, 3), ("flux 256 512^2", 1, 256, 512, 512, 256, 3),
        ("flux 256 1024^2", 1, 256, 1024, 1024, 256, 3), ("flux 256->128 1024^2", 1, 256, 1024, 1024, 128, 3),
        ("flux 128 1024^2", 1, 128, 1024, 1024, 128, 3), ("flux shortcut 1x1 512->256 512^2", 1, 512, 512, 512, 256, 1),
        ("flux conv_out 128->3 1024^2", 1, 128, 1024, 1024, 3, 3)]
# the Flux decoder's upsamplers: nearest 2x then a 3x3 conv, (name, Ci, H before, Co)
FLUX_UP = [("flux up 512 128^2->256^2", 512, 128, 512), ("flux up 512 256^2->512^2", 512, 256, 512),
           ("flux up 256 512^2->1024^2", 256, 512, 256)]
# Wan 2.1 VAE decoder at 480p (60x104 latent, dims 384/384/192/96 over 4 frames' chunk): (name, N, T, Ci, H, W, Co, kt)
WAN = [("wan 384 60x104 t4", 1, 4, 384, 60, 104, 384, 3), ("wan 384 120x208 t4", 1, 4, 384, 120, 208, 384, 3),
       ("wan 192 240x416 t4", 1, 4, 192, 240, 416, 192, 3), ("wan 96 480x832 t4", 1, 4, 96, 480, 832, 96, 3),
       ("wan time_conv 384 (3,1,1) 60x104 t4", 1, 4, 384, 60, 104, 768, 3)]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--seed", action="store_true", help="the seed's three shapes alone (with the compiled chain)")
    ap.add_argument("--gn", action="store_true", help="the GroupNorm + SiLU rows alone")
    ap.add_argument("--no-compile", action="store_true", help="leave out the torch.compile columns (their compile time)")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F

    import fusedk
    bench.torch = torch
    torch.backends.cudnn.benchmark = True
    BF = torch.bfloat16
    rows = []

    def pick(rows_, n, gn=False):  # a list's rows for this run: --quick its first n, --seed none, --gn its own
        return [] if args.seed or args.gn != gn else rows_[:n] if args.quick else rows_

    def run(name, calls, flop, ref, outs):
        K = 4 if flop < 2e11 else 1  # (memory-bound rows: flop 0)
        us, meth, err = bench.time_rounds(calls, K, 20 if K > 1 else 10, args.rounds)
        r = {"name": name, "gflop": flop / 1e9, "us": {k: statistics.median(v) for k, v in us.items() if v},
             "errors": err, "rel_l2": {}}
        fk = next((k for k in r["us"] if k.startswith("fusedk")), None)
        if "copy" in r["us"] and fk:  # a memory-bound op's time against a copy of its bytes
            r["of_copy"] = r["us"]["copy"] / r["us"][fk]
        for k, f in outs.items():
            if k not in err:
                o = f().double()
                r["rel_l2"][k] = float((o - ref).norm() / ref.norm())
        rows.append(r)
        bench.log(name, {k: round(v, 1) for k, v in r["us"].items()}, {k: f"{v:.2e}" for k, v in r["rel_l2"].items()})

    with torch.no_grad():
        for name, N, C, H, W, Co, k in SEED if args.seed else pick(SEED, 2):
            conv = torch.nn.Conv2d(C, Co, k, 1, k // 2).cuda().to(BF).to(memory_format=torch.channels_last)
            bn = torch.nn.BatchNorm2d(Co).cuda().to(BF).eval()
            bn.running_mean.normal_(), bn.running_var.uniform_(0.5, 2.0), bn.weight.normal_(), bn.bias.normal_()
            x = torch.randn(N, C, H, W, device="cuda", dtype=BF).to(memory_format=torch.channels_last)
            chain = lambda: F.silu(bn(conv(x)))  # noqa: E731
            chain_c = None if args.no_compile else torch.compile(chain)
            wf, bf = fusedk.fold_batchnorm(conv.weight.permute(0, 2, 3, 1), conv.bias, bn.weight, bn.bias,
                                           bn.running_mean, bn.running_var, bn.eps)
            xv = x.permute(0, 2, 3, 1)
            ref = F.silu(F.batch_norm(F.conv2d(x.double(), conv.weight.double(), conv.bias.double(), 1, k // 2),
                                      bn.running_mean.double(), bn.running_var.double(), bn.weight.double(),
                                      bn.bias.double(), False, 0.0, bn.eps)).permute(0, 2, 3, 1)
            calls = {"cudnn conv alone": lambda i: conv(x), "eager conv+bn+silu": lambda i: chain(),
                     "compiled conv+bn+silu": lambda i: chain_c(),
                     "fusedk conv (bn folded, silu)": lambda i: fusedk.conv(xv, wf, bf, padding=k // 2, act="silu")}
            outs = {"eager conv+bn+silu": lambda: chain().permute(0, 2, 3, 1),
                    "compiled conv+bn+silu": lambda: chain_c().permute(0, 2, 3, 1),
                    "fusedk conv (bn folded, silu)": lambda: fusedk.conv(xv, wf, bf, padding=k // 2, act="silu")}
            if chain_c is None:
                del calls["compiled conv+bn+silu"], outs["compiled conv+bn+silu"]
            run(name, calls, 2.0 * N * H * W * Co * C * k * k, ref, outs)
        for name, N, C, H, W, Co, k in pick(FLUX, 3):
            conv = torch.nn.Conv2d(C, Co, k, 1, k // 2).cuda().to(BF).to(memory_format=torch.channels_last)
            x = torch.randn(N, C, H, W, device="cuda", dtype=BF).to(memory_format=torch.channels_last)
            xv, wv = x.permute(0, 2, 3, 1), conv.weight.permute(0, 2, 3, 1)
            flop = 2.0 * N * H * W * Co * C * k * k
            ref = F.conv2d(x.double(), conv.weight.double(), conv.bias.double(), 1, k // 2).permute(0, 2, 3, 1) \
                if flop < 1e12 else None
            calls = {"cudnn": lambda i: conv(x), "fusedk": lambda i: fusedk.conv(xv, wv, conv.bias, padding=k // 2)}
            outs = {} if ref is None else {"cudnn": lambda: conv(x).permute(0, 2, 3, 1),
                                           "fusedk": lambda: fusedk.conv(xv, wv, conv.bias, padding=k // 2)}
            run(name, calls, flop, ref, outs)
            torch.cuda.empty_cache()
        for name, C, H, Co in pick(FLUX_UP, 1):
            conv = torch.nn.Conv2d(C, Co, 3, 1, 1).cuda().to(BF).to(memory_format=torch.channels_last)
            x = torch.randn(1, C, H, H, device="cuda", dtype=BF).to(memory_format=torch.channels_last)
            xv, wv = x.permute(0, 2, 3, 1), conv.weight.permute(0, 2, 3, 1)
            up = lambda: conv(F.interpolate(x, scale_factor=2.0, mode="nearest"))  # noqa: E731  (Upsample2D's)
            fk = lambda: fusedk.conv(xv, wv, conv.bias, padding=1, upsample=2)  # noqa: E731
            calls = {"cudnn (interpolate + conv, diffusers)": lambda i: up(), "fusedk (upsample=2)": lambda i: fk()}
            ref = F.conv2d(F.interpolate(x.double(), scale_factor=2.0, mode="nearest"), conv.weight.double(),
                           conv.bias.double(), 1, 1).permute(0, 2, 3, 1) if H < 512 else None
            run(name, calls, 2.0 * 4 * H * H * Co * C * 9, ref, {"fusedk (upsample=2)": fk} if ref is not None else {})
            torch.cuda.empty_cache()
        for name, N, T, C, H, W, Co, kt in pick(WAN, 1):
            ks = (kt, 1, 1) if "time_conv" in name else (kt, 3, 3)
            conv = torch.nn.Conv3d(C, Co, ks).cuda().to(BF).to(memory_format=torch.channels_last_3d)
            sp = ks[1] // 2
            x = torch.randn(N, C, T, H, W, device="cuda", dtype=BF).to(memory_format=torch.channels_last_3d)
            xp = F.pad(x, (sp, sp, sp, sp, kt - 1, 0)).contiguous(memory_format=torch.channels_last_3d)
            xv, wv = x.permute(0, 2, 3, 4, 1), conv.weight.permute(0, 2, 3, 4, 1)
            flop = 2.0 * N * T * H * W * Co * C * ks[0] * ks[1] * ks[2]
            calls = {"cudnn (F.pad + conv, diffusers)": lambda i: conv(F.pad(x, (sp, sp, sp, sp, kt - 1, 0))),
                     "cudnn on a padded input": lambda i: conv(xp),
                     "fusedk (causal zeros)": lambda i: fusedk.conv(xv, wv, conv.bias, padding=sp, pad_t=kt - 1)}
            run(name, calls, flop, conv(xp).double().permute(0, 2, 3, 4, 1),
                {"fusedk (causal zeros)": lambda: fusedk.conv(xv, wv, conv.bias, padding=sp, pad_t=kt - 1)})
            torch.cuda.empty_cache()
        for name, C, H in pick([("gn+silu 512 128^2", 512, 128), ("gn+silu 512 256^2", 512, 256),
                           ("gn+silu 256 512^2", 256, 512), ("gn+silu 128 1024^2", 128, 1024)], 2, True):
            gn = torch.nn.GroupNorm(32, C, eps=1e-6).cuda().to(BF)
            x = torch.randn(1, C, H, H, device="cuda", dtype=BF).to(memory_format=torch.channels_last)
            xv, y = x.permute(0, 2, 3, 1), torch.empty_like(x)
            chain = lambda: F.silu(gn(x))  # noqa: E731
            chain_c = None if args.no_compile else torch.compile(chain)
            ref = F.silu(F.group_norm(x.double(), 32, gn.weight.double(), gn.bias.double(), 1e-6)).permute(0, 2, 3, 1)
            calls = {"eager gn+silu": lambda i: chain(), "compiled gn+silu": lambda i: chain_c(),
                     "copy": lambda i: y.copy_(x),
                     "fusedk group_norm silu": lambda i: fusedk.group_norm(xv, 32, gn.weight, gn.bias, 1e-6, act="silu")}
            outs = {"eager gn+silu": lambda: chain().permute(0, 2, 3, 1),
                    "compiled gn+silu": lambda: chain_c().permute(0, 2, 3, 1),
                    "fusedk group_norm silu": lambda: fusedk.group_norm(xv, 32, gn.weight, gn.bias, 1e-6, act="silu")}
            if chain_c is None:
                del calls["compiled gn+silu"], outs["compiled gn+silu"]
            run(name, calls, 0.0, ref, outs)
            torch.cuda.empty_cache()
    meta = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "cudnn": torch.backends.cudnn.version()}
    with open(f"{args.out}/bench_conv.json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    L = [f"# fusedk.conv against cuDNN (torch channels-last) and torch.compile, bf16 ({meta['gpu']}, {meta['date']}, "
         f"torch {meta['torch']}, cuDNN {meta['cudnn']})", "",
         "µs a call (CUDA graph replays, median); in brackets TFLOP/s; ratio: the first column's time over fusedk's", ""]
    for r in rows:
        cols = list(r["us"])
        fk = next((c for c in cols if c.startswith("fusedk")), None)
        L.append(f"**{r['name']}** ({r['gflop']:.1f} GFLOP): " + ", ".join(
            f"{c} {r['us'][c]:.1f}" + (f" ({r['gflop'] / r['us'][c] * 1e3:.0f})" if r["gflop"] else "") for c in cols) +
            (f"; {cols[0]} / fusedk = {r['us'][cols[0]] / r['us'][fk]:.3f}" if fk and fk != cols[0] else "") +
            ("; rel. L2 vs float64: " + ", ".join(f"{k} {v:.2e}" for k, v in r["rel_l2"].items()) if r["rel_l2"] else "") +
            (f"; fusedk at {r['of_copy']:.2f} of a copy's rate (the copy's time over fusedk's: x in, y out; "
             f"{1.5 * r['of_copy']:.2f} counting x read twice)" if "of_copy" in r else ""))
        L.append("")
    with open(f"{args.out}/bench_conv.md", "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
