#!/usr/bin/env python3
"""fusedk.diffusers on real diffusers DiTs (random bf16 weights built on the GPU, no download):
one block of each kind and a whole denoising step (the transformer's forward), stock eager,
stock torch.compile, patched eager, patched + torch.compile, patched in a CUDA graph, and the
patched block with fusedk.torch's operators in place of the plain calls, and the patched block
with fusedk's attention (apply(attention=True): eager, compiled, in a CUDA graph; the step eager
and in a graph) and with its int8 attention (apply(attention="int8"): the blocks compiled and in a
CUDA graph); every variant timed in
the same rounds, the order rotated; the patched eager forward's kernel split (GEMM, attention,
the rest) from torch.profiler.

    PYTHONPATH=bindings/python python3 bench/bench_dit.py [--out DIR] [--models flux,ltx,wan,mochi]
        [--steps flux,ltx,wan] [--no-step] [--rounds 3]

Shapes (MODELS): Flux-dev at 1024x1024 (4096 image + 512 text tokens), LTX-Video 2B at 704x480 x
161 frames, Wan 2.1 1.3B at 832x480 x 81 frames, Mochi 1 at 848x480 x 163 frames (its blocks
only: no regional compile for its step), B1; a block's inputs are what the model's forward gives
it. Compile: blocks through torch.compile(block, fullgraph=True); the step through diffusers'
regional compile (compile_repeated_blocks(fullgraph=True): as fast as compiling the whole model,
5x faster to compile), switched off and on between rounds by the blocks' compiled call. Time: CUDA
events around --iters calls after warm-up, per call; median of --rounds rounds.
Writes DIR/bench_dit.json and DIR/bench_dit.md after each model and prints the table."""
import argparse
import datetime
import json
import os
import statistics
import sys
import time

import torch

import fusedk
import fusedk.diffusers as fd
import fusedk.torch as fkt

BF16 = torch.bfloat16
DEV = "cuda"  # the bench runs on the GPU (tests/python/test_bench_dit_smoke builds its inputs on the CPU)


# --- models: build (real dims, random weights), step inputs, the blocks benched --------------------
def on_gpu(cls, cfg):
    """cls(**cfg) in bf16 on the GPU, every weight random, the modules the class keeps in float32
    (Wan's norms and time embedding) float32, as from_pretrained(torch_dtype=bfloat16) loads them."""
    torch.manual_seed(0)
    with torch.device(DEV):
        m = cls(**cfg).to(BF16).eval()
        keep = getattr(m, "_keep_in_fp32_modules", None) or ()
        for n, p in m.named_parameters():
            torch.nn.init.normal_(p, 0, 0.02)
            if any(k in n for k in keep):
                p.data = p.data.float()
    return m


def rand(seed):
    g = torch.Generator(device=DEV).manual_seed(seed)
    return lambda *s, dtype=BF16: torch.randn(*s, device=DEV, dtype=dtype, generator=g)


def flux_model(layers):
    from diffusers import FluxTransformer2DModel
    return on_gpu(FluxTransformer2DModel, dict(
        patch_size=1, in_channels=64, num_layers=layers or 19, num_single_layers=layers or 38, attention_head_dim=128,
        num_attention_heads=24, joint_attention_dim=4096, pooled_projection_dim=768, guidance_embeds=True,
        axes_dims_rope=(16, 56, 56)))


def flux_inputs(m, Si=4096, St=512):
    h = w = int(Si ** 0.5)
    r = rand(1)
    ids = torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(float(h)), torch.arange(float(w)), indexing="ij"), -1)
    return dict(hidden_states=r(1, Si, 64), encoder_hidden_states=r(1, St, 4096), pooled_projections=r(1, 768),
                timestep=torch.full((1,), 0.5, device=DEV, dtype=BF16), img_ids=ids.reshape(-1, 3).to(DEV),
                txt_ids=torch.zeros(St, 3, device=DEV), guidance=torch.full((1,), 3.5, device=DEV, dtype=BF16),
                return_dict=False)


def ltx_model(layers):  # LTX-Video 2B (0.9.x): 28 layers, 32 heads of 64, T5 4096
    from diffusers import LTXVideoTransformer3DModel
    return on_gpu(LTXVideoTransformer3DModel, dict(num_layers=layers or 28))


def ltx_inputs(m, F=21, H=15, W=22, St=128):  # 704x480, 161 frames: VAE 32x32 spatial, 8x temporal
    r = rand(1)
    return dict(hidden_states=r(1, F * H * W, 128), encoder_hidden_states=r(1, St, 4096),
                timestep=torch.full((1,), 500.0, device=DEV), encoder_attention_mask=torch.ones(1, St, device=DEV),
                num_frames=F, height=H, width=W, rope_interpolation_scale=(8 / 25, 32.0, 32.0), return_dict=False)


def wan_model(layers):  # Wan 2.1 T2V 1.3B: 30 layers, 12 heads of 128, FFN 8960, umT5 4096
    from diffusers import WanTransformer3DModel
    return on_gpu(WanTransformer3DModel, dict(
        patch_size=(1, 2, 2), num_attention_heads=12, attention_head_dim=128, in_channels=16, out_channels=16,
        text_dim=4096, freq_dim=256, ffn_dim=8960, num_layers=layers or 30))


def wan_inputs(m, F=21, H=60, W=104, St=512):  # 832x480, 81 frames: VAE 8x8 spatial, 4x temporal
    r = rand(1)
    return dict(hidden_states=r(1, 16, F, H, W), timestep=torch.full((1,), 500.0, device=DEV),
                encoder_hidden_states=r(1, St, 4096), return_dict=False)


def mochi_model(layers):  # mochi-1-preview: 48 layers, 24 heads of 128 (the last block context_pre_only)
    from diffusers import MochiTransformer3DModel
    return on_gpu(MochiTransformer3DModel, dict(num_layers=(layers + 1) if layers else 48))


def mochi_inputs(m, F=28, H=60, W=106, St=256):  # 848x480, 163 frames: VAE 8x8 spatial, 6x temporal
    r = rand(1)
    return dict(hidden_states=r(1, 12, F, H, W), encoder_hidden_states=r(1, St, 4096),
                timestep=torch.full((1,), 500.0, device=DEV),
                encoder_attention_mask=torch.ones(1, St, dtype=torch.bool, device=DEV), return_dict=False)


# name: (model of n layers (None: all), step inputs, [(block kind, its getter)], shapes)
MODELS = {
    "flux": (flux_model, flux_inputs, [("double block", lambda m: m.transformer_blocks[0]),
                                       ("single block", lambda m: m.single_transformer_blocks[0])],
             "Flux-dev, 1024x1024: 4096 image + 512 text tokens, B1"),
    "ltx": (ltx_model, ltx_inputs, [("block", lambda m: m.transformer_blocks[0])],
            "LTX-Video 2B, 704x480, 161 frames: 21x15x22 = 6930 video + 128 text tokens, B1"),
    "wan": (wan_model, wan_inputs, [("block", lambda m: m.blocks[0])],
            "Wan 2.1 T2V 1.3B, 832x480, 81 frames: 21x30x52 = 32760 video + 512 text tokens, B1"),
    "mochi": (mochi_model, mochi_inputs, [("block", lambda m: m.transformer_blocks[0])],
              "Mochi 1 (10B), 848x480, 163 frames: 28x30x53 = 44520 video + 256 text tokens, B1"),
}


def block_inputs(m, x, blocks):
    """(args, kwargs) each block gets in m's forward on the step inputs x, as the model makes them."""
    got = {}

    def keep(i):
        def hook(mod, args, kwargs):
            got.setdefault(i, (args, kwargs))
        return hook
    hooks = [b.register_forward_pre_hook(keep(i), with_kwargs=True) for i, b in enumerate(blocks)]
    with torch.inference_mode():
        m(**x)
    for h in hooks:
        h.remove()
    return [got[i] for i in range(len(blocks))]


# --- timing ------------------------------------------------------------------------------------
def time_call(fn, iters):
    s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    s.record()
    for _ in range(iters):
        fn()
    e.record()
    e.synchronize()
    return s.elapsed_time(e) / iters


def host_time(fn, iters):
    """The Python thread's time per call, the GPU work queued (not waited for)."""
    torch.cuda.synchronize()
    t = time.perf_counter()
    for _ in range(iters):
        fn()
    dt = (time.perf_counter() - t) / iters * 1e3
    torch.cuda.synchronize()
    return dt


def rounds(variants, iters, n_rounds):
    """{name: median ms} over n_rounds rounds, each timing every variant once, the order rotated."""
    names = list(variants)
    got = {k: [] for k in names}
    for r in range(n_rounds):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            got[k].append(time_call(variants[k], iters))
    return {k: statistics.median(v) for k, v in got.items()}, got


def graph_of(fn):
    """fn captured in a CUDA graph (warmed up on a side stream first), and its replay."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        for _ in range(2):
            fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g.replay


def kernel_split(fn, iters=3):
    """ms per call of the GPU kernels of fn, by kind: GEMM, attention, the rest (the rest's and the
    attention's kernels listed by name)."""
    from torch.profiler import ProfilerActivity, profile
    fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(iters):
            fn()
        torch.cuda.synchronize()
    split, rest, att = {"gemm": 0.0, "attention": 0.0, "other": 0.0}, {}, {}
    for ev in prof.key_averages():
        t = getattr(ev, "device_time_total", None)
        if t is None:
            t = ev.cuda_time_total
        if not t or ev.device_type != torch.autograd.DeviceType.CUDA:
            continue
        n = ev.key.lower()
        kind = ("attention" if any(s in n for s in ("fmha", "flash", "attention", "cudnn", "sdpa", "attn_"))
                else "gemm" if any(s in n for s in ("gemm", "xmma", "cutlass", "nvjet", "sm90_", "cublas"))
                else "other")
        split[kind] += t / 1e3 / iters
        if kind != "gemm":
            by = rest if kind == "other" else att
            by[ev.key[:80]] = by.get(ev.key[:80], 0.0) + t / 1e3 / iters
    split["other_kernels"] = dict(sorted(rest.items(), key=lambda kv: -kv[1])[:12])
    split["attention_kernels"] = dict(sorted(att.items(), key=lambda kv: -kv[1])[:8])
    return split


class FloorPieces(fd.Pieces):
    """A patched block's GEMMs and attention alone: the memory-bound pieces return their input (or
    an empty output) instead of running: the floor the patched block can reach before fusedk's own
    attention and GEMM epilogues."""

    def adaln(self, x, scale, shift, eps, norm="layer", out=None):
        return x if out is None else out

    def gated_residual(self, x, y, gate, out=None):
        return x if out is None else out

    def qk_norm_rope(self, qkv, cos, sin, wq, wk, eps, out=None, norm="head", style="interleaved"):
        if out is not None:
            return out
        q = qkv[0] if isinstance(qkv, (tuple, list)) else qkv[:, :, 0]
        return tuple(torch.empty(q.shape, dtype=q.dtype, device=q.device) for _ in range(3))

    def residual_tanh_gated_rmsnorm(self, x, x_res, gate, eps):
        return x


def swapped(block, pieces):
    """A call of the patched block with other pieces in place of its own."""
    st = block._fusedk

    def f(*a, **kw):
        own = st.k
        st.k = pieces
        try:
            return block(*a, **kw)
        finally:
            st.k = own
    return f


def rel_err(a, ref):
    a, ref = a.double(), ref.double()
    return ((a - ref).norm() / ref.norm()).item()


# --- one model -----------------------------------------------------------------------------------
def bench_blocks(name, iters, n_rounds, only=None):
    """only: the variants to time (names as below; None: all, with the kernel split and host times)"""
    build, inputs, kinds, _ = MODELS[name]
    stock_m = build(1)
    pat_m, att_m, i8_m = build(1), build(1), build(1)
    for m in (pat_m, att_m, i8_m):
        m.load_state_dict(stock_m.state_dict())
    report = fd.apply(pat_m)
    fd.apply(att_m, attention=True)
    fd.apply(i8_m, attention="int8")
    stocks, pats, atts, i8s = ([get(m) for _, get in kinds] for m in (stock_m, pat_m, att_m, i8_m))
    rows = []
    for (kind, _), stock, pat, att, i8, (a, kw) in zip(kinds, stocks, pats, atts, i8s,
                                                      block_inputs(stock_m, inputs(stock_m), stocks)):
        with torch.inference_mode():
            want, got, got_att, got_i8 = stock(*a, **kw), pat(*a, **kw), att(*a, **kw), i8(*a, **kw)
            with_fkt = fd.Pieces(pat._fusedk.k.use)
            with_fkt.fk = fkt
            via_fkt, floor = swapped(pat, with_fkt), swapped(pat, FloorPieces(fd.OPS))
            compiled = lambda f: torch.compile(f, fullgraph=True)  # noqa: E731
            # a variant's timed call, made (compiled, captured) only where it is timed
            makers = {"stock eager": lambda: stock, "stock compile": lambda: compiled(stock),
                      "patched eager": lambda: pat, "patched compile": lambda: compiled(pat),
                      "patched CUDA graph": lambda: graph_of(lambda: pat(*a, **kw)),
                      "patched eager, fusedk.torch ops": lambda: via_fkt,
                      "GEMM + attention alone, CUDA graph": lambda: graph_of(lambda: floor(*a, **kw)),
                      "attention=True eager": lambda: att, "attention=True compile": lambda: compiled(att),
                      "attention=True CUDA graph": lambda: graph_of(lambda: att(*a, **kw)),
                      "attention=int8 eager": lambda: i8, "attention=int8 compile": lambda: compiled(i8),
                      "attention=int8 CUDA graph": lambda: graph_of(lambda: i8(*a, **kw))}
            variants, compile_s = {}, {}
            for n, make in makers.items():
                if only and n not in only:
                    continue
                f, t0 = make(), time.time()
                variants[n] = f if n.endswith("graph") else (lambda f=f: f(*a, **kw))
                variants[n]()  # compiles, warms up
                if n.endswith("compile"):
                    compile_s[n.split(" ")[0]] = time.time() - t0
            med, all_rounds = rounds(variants, iters, n_rounds)
            row = dict(model=name, what=kind, ms=med, rounds=all_rounds, compile_s=compile_s,
                       out_diff=[(x.float() - y.float()).abs().max().item() for x, y in zip(*map(_tuple, (want, got)))],
                       out_rel_diff_att=[rel_err(y, x) for x, y in zip(*map(_tuple, (want, got_att)))],
                       out_rel_diff_i8=[rel_err(y, x) for x, y in zip(*map(_tuple, (want, got_i8)))])
            row.update(split_att=kernel_split(lambda: att(*a, **kw)), split_i8=kernel_split(lambda: i8(*a, **kw)))
            if not only:
                row.update(split=kernel_split(lambda: pat(*a, **kw)),
                           host_ms={"patched eager": host_time(lambda: pat(*a, **kw), iters),
                                    "patched eager, fusedk.torch ops": host_time(lambda: via_fkt(*a, **kw), iters),
                                    "stock eager": host_time(lambda: stock(*a, **kw), iters)})
        rows.append(row)
        log(rows[-1])
    return rows, repr(report)


def _tuple(t):
    return (t,) if torch.is_tensor(t) else t


def compiled_switch(blocks):
    """(off, on): the blocks' compiled call impls switched off (eager) and back on."""
    impls = [b._compiled_call_impl for b in blocks]

    def off():
        for b in blocks:
            b._compiled_call_impl = None

    def on():
        for b, f in zip(blocks, impls):
            b._compiled_call_impl = f
    return off, on


def bench_step(name, iters, n_rounds):
    build, inputs, _, _ = MODELS[name]
    stock = build(None)
    pat = build(None)
    pat.load_state_dict(stock.state_dict())
    report = fd.apply(pat)
    x = inputs(stock)
    with torch.inference_mode():
        want = stock(**x)[0]
        got = pat(**x)[0]
        replay = graph_of(lambda: pat(**x))
        patched = [b for b in pat.modules() if getattr(b, "_fusedk", None) is not None]
        own, floor, att = [b._fusedk.k for b in patched], FloorPieces(fd.OPS), fd.Pieces(fd.OPS | {"attention"})

        def with_pieces(pieces):  # the patched step with other pieces (apply(attention=True)'s, the floor's)
            def f():
                for b in patched:
                    b._fusedk.k = pieces
                try:
                    return pat(**x)
                finally:
                    for b, k in zip(patched, own):
                        b._fusedk.k = k
            return f
        floor_replay, att_step = graph_of(with_pieces(floor)), with_pieces(att)
        got_att = att_step()[0]
        att_replay = graph_of(att_step)
        split = kernel_split(lambda: pat(**x), 1)
        compile_s = {}
        for key, m in (("stock", stock), ("patched", pat)):
            t0 = time.time()
            m.compile_repeated_blocks(fullgraph=True)
            m(**x)
            compile_s[key] = time.time() - t0
        blocks = lambda m: [b for b in m.modules() if getattr(b, "_compiled_call_impl", None) is not None]  # noqa
        s_off, s_on = compiled_switch(blocks(stock))
        p_off, p_on = compiled_switch(blocks(pat))

        def run(m, before):
            def f():
                before()
                m(**x)
            return f
        variants = {"stock eager": run(stock, s_off), "stock compile": run(stock, s_on),
                    "patched eager": run(pat, p_off), "patched compile": run(pat, p_on),
                    "patched CUDA graph": replay, "GEMM + attention alone, CUDA graph": floor_replay,
                    "attention=True eager": lambda: (p_off(), att_step()), "attention=True CUDA graph": att_replay}
        for v in variants.values():
            v()
        med, all_rounds = rounds(variants, iters, n_rounds)
        p_off()
        host = host_time(lambda: pat(**x), iters)
        p_on()
    row = dict(model=name, what="step", ms=med, rounds=all_rounds, split=split, host_ms={"patched eager": host},
               compile_s=compile_s, out_rel_diff=rel_err(got, want), out_rel_diff_att=rel_err(got_att, want))
    log(row)
    return [row], repr(report)


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def table(rows):
    hdr = ("| model | what | stock eager | stock compile | patched eager | patched compile | patched CUDA graph "
           "| eager / compile | graph / compile | GEMM + attention alone | graph / (GEMM + attn) "
           "| attention=True: eager | compile | CUDA graph | graph / stock compile "
           "| attention=int8: compile | CUDA graph | stock compile / int8 compile | stock compile / int8 graph |")
    out = [hdr, "|" + "---|" * (hdr.count("|") - 1)]
    nan = float("nan")
    for r in rows:
        ms, sp = r["ms"], r.get("split")
        g = lambda n: ms.get(n, nan)  # noqa: E731 (variants a run left out: nan)
        floor = ms.get("GEMM + attention alone, CUDA graph", sp["gemm"] + sp["attention"] if sp else nan)
        cells = [g("stock eager"), g("stock compile"), g("patched eager"), g("patched compile"),
                 g("patched CUDA graph"), f"{g('stock compile') / g('patched eager'):.3f}x",
                 f"{g('stock compile') / g('patched CUDA graph'):.3f}x", floor,
                 f"{g('patched CUDA graph') / floor:.3f}x", g("attention=True eager"), g("attention=True compile"),
                 g("attention=True CUDA graph"), f"{g('stock compile') / g('attention=True CUDA graph'):.3f}x",
                 g("attention=int8 compile"), g("attention=int8 CUDA graph"),
                 f"{g('stock compile') / g('attention=int8 compile'):.3f}x",
                 f"{g('stock compile') / g('attention=int8 CUDA graph'):.3f}x"]
        out.append(f"| {r['model']} | {r['what']} | " +
                   " | ".join(c if isinstance(c, str) else f"{c:.3f}" for c in cells) + " |")
    return "\n".join(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--models", default="flux,ltx,wan,mochi")
    ap.add_argument("--steps", default="flux,ltx,wan", help="the models whose whole step is timed too")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--step-iters", type=int, default=3)
    ap.add_argument("--no-step", action="store_true")
    ap.add_argument("--variants", help="comma-separated block variants to time (default: all, with the kernel "
                    "split and host times), e.g. 'stock compile,attention=int8 compile'")
    a = ap.parse_args()
    os.makedirs(a.out, exist_ok=True)
    rows, reports = [], {}
    for name in a.models.split(","):  # the results written after each model: a cut-off run keeps them
        r, reports[name + " blocks"] = bench_blocks(name, a.iters, a.rounds,
                                                    a.variants.split(",") if a.variants else None)
        rows += r
        write(a, rows, reports)
        if not a.no_step and name in a.steps.split(","):
            r, reports[name + " step"] = bench_step(name, a.step_iters, a.rounds)
            rows += r
            write(a, rows, reports)
    print(write(a, rows, reports))


def write(a, rows, reports):
    torch._dynamo.reset()  # the compiled graphs and their memory of the model done go
    torch.cuda.empty_cache()
    import diffusers
    names = sorted({r["model"] for r in rows}, key=a.models.split(",").index)
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__,
                diffusers=diffusers.__version__, fusedk=fusedk.__version__,
                commit=os.popen("git rev-parse --short HEAD 2>/dev/null").read().strip()
                + ("+changes" if os.popen("git status --porcelain --untracked-files=no 2>/dev/null").read() else ""),
                shapes={k: MODELS[k][3] for k in names}, reports=reports)
    with open(os.path.join(a.out, "bench_dit.json"), "w") as f:
        json.dump(dict(meta=meta, rows=rows), f, indent=1)
    md = [f"# fusedk.diffusers, {meta['gpu']}, {meta['date']}", "",
          f"torch {meta['torch']}, diffusers {meta['diffusers']}, fusedk {meta['fusedk']} ({meta['commit']}); "
          f"ms a call, median of {a.rounds} rotated rounds; bf16, random weights.", ""]
    md += [f"- {k}: {v}" for k, v in meta["shapes"].items()] + ["", table(rows), ""]
    for r in (r for r in rows if "split" in r):
        md.append(f"- {r['model']} {r['what']}: host ms a call {r['host_ms']}; compile s {r['compile_s']}; "
                  f"patched eager with fusedk.torch ops {r['ms'].get('patched eager, fusedk.torch ops', float('nan')):.3f}"
                  f" ms; profiler's kernel split of the patched eager call (its kernel times run above the events'): "
                  f"GEMM {r['split']['gemm']:.3f}, attention {r['split']['attention']:.3f}, other "
                  f"{r['split']['other']:.3f} ms: {r['split']['other_kernels']}" +
                  (f"; with attention=True: GEMM {r['split_att']['gemm']:.3f}, attention {r['split_att']['attention']:.3f}, "
                   f"other {r['split_att']['other']:.3f} ms, output vs stock's relative L2 {r['out_rel_diff_att']}"
                   f"; attention=int8 output vs stock's relative L2 {r['out_rel_diff_i8']}"
                   if "split_att" in r else f"; attention=True output vs stock's relative L2 {r['out_rel_diff_att']}"))
    md += [f"- {r['model']} {r['what']}: compile s {r['compile_s']}; output vs stock's relative L2: attention=True "
           f"{r['out_rel_diff_att']}, attention=int8 {r['out_rel_diff_i8']}" for r in rows if "split" not in r]
    md += [f"- {r['model']} {r['what']}, eager kernels (profiler, ms a call): attention=True {r['split_att']}; "
           f"attention=int8 {r['split_i8']}" for r in rows if "split_i8" in r]
    md += ["", "```", *reports.values(), "```"]
    with open(os.path.join(a.out, "bench_dit.md"), "w") as f:
        f.write("\n".join(md) + "\n")
    return "\n".join(md)


if __name__ == "__main__":
    main()
