#!/usr/bin/env python3
"""[conv] Where a patched Flux VAE decode spends its time, and the conv layers one call each for
ncu. `--table [flux|wan]`: torch.profiler's CUDA time by kernel over one patched decode (Flux's
AutoencoderKL at 1024^2, bf16, random weights; or Wan 2.1's at 480p x 81 frames) and over one
stock torch.compile decode (Wan: stock eager), top rows of each.
`--layers`: one fusedk.conv (and group_norm) call per listed shape, for
`ncu -k regex:conv_tma|gn_` to read. `--gn`: one group_norm + SiLU call each at 512 ch 128^2 (x held
on chip) and 256^2 (part of x streamed), for `ncu --set full -k regex:gn_`. `--epilogue`: the seed's
1x1 and 3x3 N8 C128 128^2 timed
(CUDA-graph replays) with the epilogue's parts added one at a time (bias, SiLU, a residual), and a
copy of the output's bytes: what the epilogue costs against the products. Writes nothing; prints."""
import argparse
import statistics

import bench
import bench_vae


def table(torch, fd, diffusers, rows, kind):
    def make():
        torch.manual_seed(0)
        cls, cfg = (diffusers.AutoencoderKL, bench_vae.FLUX) if kind == "flux" else \
            (diffusers.AutoencoderKLWan, bench_vae.WAN)
        return cls(**cfg).eval().to(device="cuda", dtype=torch.bfloat16)
    z = torch.randn(*((1, 16, 128, 128) if kind == "flux" else (1, 16, 21, 60, 104)), device="cuda",
                    dtype=torch.bfloat16)
    for name in ("patched eager", "stock compile" if kind == "flux" else "stock eager"):
        vae = make()
        if name == "patched eager":
            fd.apply(vae)
            run = lambda: vae.decode(z).sample  # noqa: E731
        elif name == "stock eager":
            run = lambda: vae.decode(z).sample  # noqa: E731
        else:
            dec = torch.compile(vae.decoder)
            run = lambda: dec(z)  # noqa: E731
        with torch.no_grad():
            for _ in range(3 if kind == "flux" else 1):
                run()
            torch.cuda.synchronize()
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
                run()
                torch.cuda.synchronize()
        print(f"== {name}")
        print(prof.key_averages().table(sort_by="cuda_time_total", row_limit=rows, max_name_column_width=70))
        del vae
        torch.cuda.empty_cache()


def layers(torch, fusedk):
    BF = torch.bfloat16
    for N, C, H, Co, k, up in ((8, 128, 128, 128, 3, 1), (8, 128, 128, 128, 1, 1), (1, 512, 256, 512, 3, 1),
                               (1, 512, 128, 512, 3, 2), (1, 128, 1024, 3, 3, 1)):
        x = torch.randn(N, H, H, C, device="cuda", dtype=BF)
        w = torch.randn(Co, k, k, C, device="cuda", dtype=BF) / (k * k * C) ** 0.5
        fusedk.conv(x, w, None, padding=k // 2, upsample=up)
        torch.cuda.synchronize()
        print(f"conv N{N} C{C} {H}^2 -> {Co} k{k} up{up}", flush=True)
    x = torch.randn(1, 4, 60, 104, 384, device="cuda", dtype=BF)  # Wan's 384-channel causal 3x3x3
    w = torch.randn(384, 3, 3, 3, 384, device="cuda", dtype=BF) / (27 * 384) ** 0.5
    fusedk.conv(x, w, None, padding=1, pad_t=2)
    x = torch.randn(1, 256, 256, 512, device="cuda", dtype=BF)
    fusedk.group_norm(x, 32, act="silu")
    torch.cuda.synchronize()


def gn(torch, fusedk):
    for H in (128, 256):
        x = torch.randn(1, H, H, 512, device="cuda", dtype=torch.bfloat16)
        w, b = (torch.randn(512, device="cuda", dtype=torch.bfloat16) for _ in range(2))
        fusedk.group_norm(x, 32, w, b, 1e-6, act="silu")
        torch.cuda.synchronize()
        print(f"group_norm silu 512 {H}^2", flush=True)


def epilogue(torch, fusedk):
    bench.torch = torch
    BF = torch.bfloat16
    for k in (1, 3):
        x = torch.randn(8, 128, 128, 128, device="cuda", dtype=BF)
        w = torch.randn(128, k, k, 128, device="cuda", dtype=BF) / (k * k * 128) ** 0.5
        b, r = torch.randn(128, device="cuda", dtype=BF), torch.randn_like(x)
        y = torch.empty_like(x)
        calls = {"none": lambda i: fusedk.conv(x, w, None, padding=k // 2, out=y),
                 "bias": lambda i: fusedk.conv(x, w, b, padding=k // 2, out=y),
                 "bias silu": lambda i: fusedk.conv(x, w, b, padding=k // 2, act="silu", out=y),
                 "bias silu res": lambda i: fusedk.conv(x, w, b, padding=k // 2, act="silu", residual=r, out=y),
                 "copy of y": lambda i: y.copy_(x)}
        us, _, err = bench.time_rounds(calls, 4, 20, 3)
        print(f"epilogue N8 C128 128^2 k{k}:", {n: round(statistics.median(v), 1) for n, v in us.items() if v},
              err or "", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--table", nargs="?", const="flux", choices=["flux", "wan"],
                    help="the decode to profile (Wan 2.1's: 480p x 81 frames, against stock eager)")
    ap.add_argument("--layers", action="store_true")
    ap.add_argument("--gn", action="store_true")
    ap.add_argument("--epilogue", action="store_true")
    ap.add_argument("--rows", type=int, default=25)
    args = ap.parse_args()
    import diffusers
    import torch

    import fusedk
    import fusedk.diffusers as fd
    torch.backends.cudnn.benchmark = True
    if args.layers:
        layers(torch, fusedk)
    if args.gn:
        gn(torch, fusedk)
    if args.epilogue:
        epilogue(torch, fusedk)
    if args.table:
        table(torch, fd, diffusers, args.rows, args.table)


if __name__ == "__main__":
    main()
