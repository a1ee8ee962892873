#!/usr/bin/env python3
"""[conv] Whole VAE decodes, bf16, random weights at the real configs, as users run them (eager
calls, events around each decode, median):
- Flux's AutoencoderKL at 1024^2 (latent 16 x 128 x 128);
- Wan 2.1's AutoencoderKLWan at 480p x 81 frames (latent 16 x 21 x 60 x 104, decoded frame by
  frame through its cache);
- LTX-Video 0.9.5+'s AutoencoderKLLTXVideo (timestep-conditioned, residual upsamplers) at 704 x
  480 x 33 frames (latent 128 x 5 x 15 x 22: its decoder takes all frames at once, and the float32
  reference of 161 frames does not fit beside it);
- Mochi's AutoencoderKLMochi at 848 x 480 x 13 frames (latent 12 x 3 x 60 x 106; its decoder too
  takes all frames at once unless framewise decoding is switched on).
Each as stock eager, stock torch.compile of the decoder (its compile time said) and
fusedk.diffusers.apply(vae) eager; per row the peak memory over the decode's own inputs
(torch.cuda.max_memory_allocated) and the output's rel. L2 against the float32 decoder (the same
weights; the norms' affine and LTX's timestep tables random, as the tests make them).

    PYTHONPATH=bindings/python:bench python3 bench/bench_vae.py [--out DIR] [--quick] [--no-compile]
        [--only flux|wan|ltx|mochi]

--quick: Wan at 5 latent frames, LTX at 3, and fewer repeats. Writes DIR/bench_vae.json and
.md (bench_vae_flux.* with --only flux, and so on)."""
import argparse
import datetime
import json
import statistics
import time

import bench

FLUX = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
            latent_channels=16, norm_num_groups=32, sample_size=1024, use_quant_conv=False, use_post_quant_conv=False)
WAN = dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
           temperal_downsample=[False, True, True])
LTX = dict(in_channels=3, out_channels=3, latent_channels=128, block_out_channels=(128, 256, 512, 1024, 2048),
           down_block_types=("LTXVideo095DownBlock3D",) * 4, decoder_block_out_channels=(256, 512, 1024),
           layers_per_block=(4, 6, 6, 2, 2), decoder_layers_per_block=(5, 5, 5, 5),
           spatio_temporal_scaling=(True,) * 4, decoder_spatio_temporal_scaling=(True,) * 3,
           decoder_inject_noise=(False,) * 4,
           downsample_type=("spatial", "temporal", "spatiotemporal", "spatiotemporal"),
           upsample_residual=(True,) * 3, upsample_factor=(2,) * 3, timestep_conditioning=True, patch_size=4,
           patch_size_t=1, encoder_causal=True, decoder_causal=False)


def decode(vae, z, temb):
    """the decoded sample; temb: LTX-Video's decode timestep (the other VAEs take none)"""
    return (vae.decode(z) if temb is None else vae.decode(z, temb)).sample


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--only", choices=["flux", "wan", "ltx", "mochi"])
    args = ap.parse_args()
    import diffusers
    import torch

    import fusedk.diffusers as fd
    bench.torch = torch
    torch.backends.cudnn.benchmark = True
    rows = []

    def make(kind, dtype):
        torch.manual_seed(0)
        cls = {"flux": (diffusers.AutoencoderKL, FLUX), "wan": (diffusers.AutoencoderKLWan, WAN),
               "ltx": (diffusers.AutoencoderKLLTXVideo, LTX),
               "mochi": (diffusers.AutoencoderKLMochi, dict(in_channels=15, out_channels=3, latent_channels=12))}[kind]
        vae = cls[0](**cls[1]).eval()
        with torch.no_grad():
            for m in vae.modules():
                if isinstance(m, torch.nn.GroupNorm):
                    m.weight.normal_(1.0, 0.2), m.bias.normal_(0.0, 0.2)
                elif type(m).__name__ == "WanRMS_norm":
                    m.gamma.normal_(1.0, 0.2)
            for n, p in vae.named_parameters():  # LTX's timestep tables
                if "scale_shift" in n:
                    p.normal_(0.0, 0.2)
        return vae.to(device="cuda", dtype=dtype)

    def measure(name, fn, iters, exact):
        """one warm-up call (compiles, cuDNN autotuning), then iters timed decodes and the peak"""
        with torch.no_grad():
            t0 = time.perf_counter()
            out = fn()
            torch.cuda.synchronize()
            first = time.perf_counter() - t0
            del out
            torch.cuda.empty_cache()
            base = torch.cuda.memory_allocated()
            torch.cuda.reset_peak_memory_stats()
            ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
            for a, b in ev:
                out = None  # the last output freed first: the peak is one decode's
                a.record()
                out = fn()
                b.record()
            torch.cuda.synchronize()
            peak = torch.cuda.max_memory_allocated() - base
            err = float((out.double() - exact).norm() / exact.norm())
        r = {"name": name, "ms": statistics.median(a.elapsed_time(b) for a, b in ev), "first_call_s": first,
             "peak_gib": peak / 2 ** 30, "rel_l2_vs_f32": err}
        rows.append(r)
        bench.log(f"{name}: {r['ms']:.1f} ms, first call {first:.1f} s, peak {r['peak_gib']:.2f} GiB, "
                  f"rel. L2 vs float32 {err:.3e}")
        del out
        torch.cuda.empty_cache()

    for kind in ("flux", "wan", "ltx", "mochi"):
        if args.only and args.only != kind:
            continue
        frames = 5 if args.quick else 21
        z = {"flux": lambda: torch.randn(1, 16, 128, 128, device="cuda"),
             "wan": lambda: torch.randn(1, 16, frames, 60, 104, device="cuda"),
             "ltx": lambda: torch.randn(1, 128, 3 if args.quick else 5, 15, 22, device="cuda"),
             "mochi": lambda: torch.randn(1, 12, 3, 60, 106, device="cuda")}[kind]()
        temb = torch.tensor([0.05], device="cuda") if kind == "ltx" else None  # LTX: the decode timestep
        iters = (3 if args.quick else 10) if kind == "flux" else (1 if args.quick else 3)
        ref = make(kind, torch.float32)
        with torch.no_grad():
            exact = decode(ref, z, temb).double()
        del ref
        torch.cuda.empty_cache()
        vae = make(kind, torch.bfloat16)
        zb, tb = z.bfloat16(), None if temb is None else temb.bfloat16()
        measure(f"{kind} stock eager", lambda: decode(vae, zb, tb), iters, exact)
        if not args.no_compile:
            dec = vae.decoder
            vae.decoder = torch.compile(dec)
            try:
                measure(f"{kind} stock torch.compile(decoder)", lambda: decode(vae, zb, tb), iters, exact)
            except Exception as e:  # say so: Wan's cached decode may not compile
                bench.log(f"{kind} stock torch.compile(decoder) failed: {bench.err_str(e)[:300]}")
                rows.append({"name": f"{kind} stock torch.compile(decoder)", "error": bench.err_str(e)})
            vae.decoder = dec
            torch._dynamo.reset()
        report = fd.apply(vae)
        bench.log(f"{kind}: {len(report.patched)} modules patched, {len(report.skipped)} skipped")
        measure(f"{kind} fusedk.diffusers.apply eager", lambda: decode(vae, zb, tb), iters, exact)
        fd.revert(vae)
        del vae, exact
        torch.cuda.empty_cache()
    meta = {"gpu": torch.cuda.get_device_name(), "date": datetime.date.today().isoformat(), "torch": torch.__version__,
            "diffusers": diffusers.__version__, "quick": args.quick}
    stem = f"{args.out}/bench_vae" + (f"_{args.only}" if args.only else "")
    with open(stem + ".json", "w") as f:
        json.dump({"meta": meta, "rows": rows}, f, indent=1)
    L = [f"# VAE decode, bf16, random weights at real configs ({meta['gpu']}, {meta['date']}, torch {meta['torch']}, "
         f"diffusers {meta['diffusers']}{', quick' if args.quick else ''})", "",
         "| decode | ms | vs stock eager | vs stock compile | peak GiB | rel. L2 vs float32 | first call s |",
         "| --- | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        if "error" in r:
            L.append(f"| {r['name']} | failed: {r['error'][:80]} | | | | | |")
            continue
        kind = r["name"].split()[0]
        base = {k: next((q["ms"] for q in rows if q["name"] == f"{kind} {k}" and "ms" in q), None)
                for k in ("stock eager", "stock torch.compile(decoder)")}
        ratio = [f"{b / r['ms']:.2f}x" if b else "" for b in base.values()]
        L.append(f"| {r['name']} | {r['ms']:.1f} | {ratio[0]} | {ratio[1]} | {r['peak_gib']:.2f} | "
                 f"{r['rel_l2_vs_f32']:.3e} | {r['first_call_s']:.1f} |")
    with open(stem + ".md", "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
