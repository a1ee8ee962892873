#!/usr/bin/env python3
"""[linear] FP8 (e4m3) GEMMs at the DiT shapes: fusedk's FP8 linear (fast accumulation, as torchao
runs it, and "precise": without) against torch._scaled_mm per row (what torchao's
Float8DynamicActivationFloat8WeightConfig(PerRow()) runs, fast accumulation by default), per tensor,
and the bf16 GEMM (F.linear); the cost of making x's FP8 copy where nothing fuses it (torch eager
and compiled per-row quantization, fusedk.quantize_fp8); the norms writing FP8 against a copy
of the same bytes; and the modulation GEMMs (one row of temb a sample: Flux's double and single
blocks at B 1 and 2) as linear_w8 runs them (int8 weights, x in bf16) against bf16 F.linear,
quantize_fp8 + linear_fp8, torchao's _scaled_mm and torchao's Int8WeightOnlyConfig under torch.compile
(the same int8 weights), with a copy of the weight's bytes.

    PYTHONPATH=bindings/python:bench python3 bench/bench_linear_fp8.py [--out DIR] [--quick] [--no-gemm]
        [--no-torchao]

Shapes M x K x N: Flux at 1024² (4608 tokens, width 3072): qkv 9216, ff up 12288, ff down;
Wan 14B at 480p x 81 frames (32760 tokens, width 5120): a projection, ffn up 13824, ffn down.
Method (bench.py's): calls captured in a CUDA graph, replays timed by events, median; every
implementation in rotated rounds. Inputs: x N(0,1), w N(0,1)/sqrt(K), both quantized per row.
Writes DIR/bench_linear_fp8.json and .md."""
import argparse
import datetime
import json
import statistics

import bench

SHAPES = [("flux qkv", 4608, 3072, 9216), ("flux ff up", 4608, 3072, 12288), ("flux ff down", 4608, 12288, 3072),
          ("wan proj", 32760, 5120, 5120), ("wan ffn up", 32760, 5120, 13824), ("wan ffn down", 32760, 13824, 5120)]


def side_table(title, what, dims, rows, extra, fmt):
    """A Markdown table of rows' µs (columns: the first row's calls; "refused" where one raised), each
    with rows[extra][call] in brackets where there is one"""
    cols = list(rows[0]["us"])
    L = ["", title, "", f"| {what} | {dims} | " + " | ".join(cols) + " |", "|---|---|" + "---:|" * len(cols)]
    for r in rows:
        L.append(f"| {r['name']} | {'x'.join(map(str, r['shape']))} | " + " | ".join(
            (f"{r['us'][c]:.1f}" if c in r["us"] else "refused") +
            (f" ({r[extra][c]:{fmt}})" if c in r[extra] else "") for c in cols) + " |")
    return L


def torchao_int8_weight_only(w, b):
    """torchao's Int8WeightOnlyConfig on a Linear of w, b under torch.compile (the peer of linear_w8;
    eager it dequantizes the weight a call); None without torchao"""
    import torch
    try:
        from torchao.quantization import Int8WeightOnlyConfig, quantize_
        lin = torch.nn.Linear(w.shape[1], w.shape[0], device=w.device, dtype=w.dtype)
        with torch.no_grad():
            lin.weight.copy_(w), lin.bias.copy_(b)
        quantize_(lin, Int8WeightOnlyConfig())
        return torch.compile(lin)
    except Exception as e:  # noqa: BLE001 - torchao missing or refusing: the log says so
        bench.log("torchao int8 weight-only:", type(e).__name__, str(e)[:200])
        return None


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-torchao", action="store_true", help="leave torchao's compiled int8 weight-only peer out")
    ap.add_argument("--no-gemm", action="store_true", help="the norms and the modulation GEMMs only")
    args = ap.parse_args()
    import torch

    bench.torch = torch
    try:
        import fusedk
        has_fusedk = hasattr(fusedk, "quantize_fp8")
    except Exception:
        has_fusedk = False
    F8, BF = torch.float8_e4m3fn, torch.bfloat16

    def q_row(t):  # torchao's dynamic per-row activation quantization
        s = t.abs().amax(-1, keepdim=True).float().clamp(min=1e-12) / 448.0
        return (t.float() / s).clamp(-448, 448).to(F8), s

    q_row_c = torch.compile(q_row)
    rows = []
    for name, M, K, N in [] if args.no_gemm else SHAPES[:2] if args.quick else SHAPES:
        x = torch.randn(M, K, device="cuda", dtype=BF)
        w = torch.randn(N, K, device="cuda", dtype=BF) / K ** 0.5
        xq, sx = q_row(x)
        wq, sw = q_row(w)
        st = torch.tensor(1.0, device="cuda")
        ref = (x.double() @ w.double().t())
        impl = {
            "bf16 F.linear": lambda i: torch.nn.functional.linear(x, w),
            "scaled_mm row": lambda i: torch._scaled_mm(xq, wq.t(), sx, sw.t(), out_dtype=BF),
            "scaled_mm row fast": lambda i: torch._scaled_mm(xq, wq.t(), sx, sw.t(), out_dtype=BF, use_fast_accum=True),
            "scaled_mm tensor": lambda i: torch._scaled_mm(xq, wq.t(), st, st, out_dtype=BF),
            "scaled_mm tensor fast": lambda i: torch._scaled_mm(xq, wq.t(), st, st, out_dtype=BF, use_fast_accum=True),
            "quantize x eager": lambda i: q_row(x),
            "quantize x compiled": lambda i: q_row_c(x),
        }
        if has_fusedk:
            fx, fw = fusedk.quantize_fp8(x), fusedk.quantize_fp8(w)
            impl["fusedk quantize_fp8 x"] = lambda i: fusedk.quantize_fp8(x)
            if hasattr(fusedk, "linear_fp8"):
                bias = torch.randn(N, device="cuda", dtype=BF)
                impl["fusedk linear_fp8"] = lambda i: fusedk.linear_fp8(fx, fw)
                impl["fusedk linear_fp8 precise"] = lambda i: fusedk.linear_fp8(fx, fw, fast_accum=False)
                impl["fusedk linear_fp8 bias+gelu_tanh"] = lambda i: fusedk.linear_fp8(fx, fw, bias, act="gelu_tanh")
                impl["scaled_mm row bias"] = lambda i: torch._scaled_mm(xq, wq.t(), sx, sw.t(), bias=bias,
                                                                        out_dtype=BF)
        err = {k: float(((impl[k](0).double() - ref).norm() / ref.norm()).item())
               for k in ("bf16 F.linear", "scaled_mm row", "scaled_mm row fast", "fusedk linear_fp8",
                         "fusedk linear_fp8 precise") if k in impl}
        del ref
        us = {k: statistics.median(v) for k, v in bench.time_rounds(impl, 4, 10, args.rounds)[0].items() if v}
        eager = {}  # the user's call: no graph, no out= (events around a loop of calls)
        for k in ("scaled_mm row", "fusedk linear_fp8"):
            if k in impl:
                eager[k] = bench.time_loop(impl[k], 20, 5)
        row = dict(name=name, shape=[M, K, N], us=us, eager_us=eager, rel_l2=err,
                   tflops={k: 2e-6 * M * K * N / v for k, v in us.items() if "quantize" not in k})
        rows.append(row)
        bench.log(name, {k: round(v, 1) for k, v in us.items()}, {k: round(v, 4) for k, v in err.items()})
        del x, w, xq, wq, impl
        torch.cuda.empty_cache()
    norms = []
    if has_fusedk and hasattr(fusedk, "adaln_fp8"):
        for name, M, D in ([("flux", 4608, 3072)] if args.quick else [("flux", 4608, 3072), ("wan", 32760, 5120)]):
            x = torch.randn(1, M, D, device="cuda", dtype=BF)
            sc, sh = torch.randn(1, D, device="cuda", dtype=BF) * 0.2, torch.randn(1, D, device="cuda", dtype=BF)
            w = torch.ones(D, device="cuda", dtype=BF)
            traffic = 3 * M * D + 4 * M  # bf16 x read, e4m3 y and float32 scales written
            src = torch.empty(traffic // 2, device="cuda", dtype=torch.uint8)
            dst = torch.empty_like(src)
            impl = {"copy (same bytes)": lambda i: dst.copy_(src),
                    "adaln bf16": lambda i: fusedk.adaln(x, sc, sh),
                    "adaln_fp8": lambda i: fusedk.adaln_fp8(x, sc, sh),
                    "adaln + quantize_fp8": lambda i: fusedk.quantize_fp8(fusedk.adaln(x, sc, sh)),
                    "rmsnorm_fp8": lambda i: fusedk.rmsnorm_fp8(x, w),
                    "layernorm_fp8": lambda i: fusedk.layernorm_fp8(x),
                    "quantize_fp8": lambda i: fusedk.quantize_fp8(x)}
            us = {k: statistics.median(v) for k, v in bench.time_rounds(impl, 8, 10, args.rounds)[0].items() if v}
            norms.append(dict(name=name, shape=[M, D], us=us, of_copy={k: us["copy (same bytes)"] / v for k, v in
                                                                       us.items() if "fp8" in k}))
            bench.log(name, {k: round(v, 1) for k, v in us.items()})
            del x, src, dst
    mods = []
    if has_fusedk and hasattr(fusedk, "linear_w8"):
        for name, M, K, N in [("flux double mod", 1, 3072, 18432), ("flux double mod B2", 2, 3072, 18432),
                              ("flux single mod", 1, 3072, 9216)]:
            x, w = torch.randn(M, K, device="cuda", dtype=BF), torch.randn(N, K, device="cuda", dtype=BF) / K ** 0.5
            b = torch.randn(N, device="cuda", dtype=BF)
            w8, w4 = fusedk.quantize_int8(w), fusedk.quantize_fp8(w)
            (wq, sw), src = q_row(w), torch.empty(N * K // 2, device="cuda", dtype=torch.uint8)
            dst, ref = torch.empty_like(src), x.double() @ w.double().t() + b.double()
            impl = {"copy (weight bytes)": lambda i: dst.copy_(src),
                    "bf16 F.linear": lambda i: torch.nn.functional.linear(x, w, b),
                    "fusedk linear_w8": lambda i: fusedk.linear_w8(x, w8, b),
                    "fusedk quantize_fp8 + linear_fp8": lambda i: fusedk.linear_fp8(fusedk.quantize_fp8(x), w4, b),
                    "torchao scaled_mm row (x quantized)": lambda i: torch._scaled_mm(
                        *(lambda q: (q[0], wq.t(), q[1], sw.t()))(q_row(x)), bias=b, out_dtype=BF, use_fast_accum=True)}
            ao = None if args.no_torchao else torchao_int8_weight_only(w, b)
            if ao is not None:
                impl["torchao int8 weight-only compile"] = lambda i: ao(x)
            err = {}
            for k in list(impl)[1:]:
                try:
                    err[k] = float(((impl[k](0).double() - ref).norm() / ref.norm()).item())
                except Exception as ex:  # noqa: BLE001 - _scaled_mm refuses some shapes: time_rounds says so
                    bench.log(f"  {k}: {type(ex).__name__} {str(ex)[:150]}")
            us = {k: statistics.median(v) for k, v in bench.time_rounds(impl, 8, 10, args.rounds)[0].items() if v}
            mods.append(dict(name=name, shape=[M, K, N], us=us, rel_l2=err,
                             eager_us={k: bench.time_loop(impl[k], 20, 5) for k in ("bf16 F.linear", "fusedk linear_w8")}))
            bench.log(name, {k: round(v, 1) for k, v in us.items()}, {k: round(v, 4) for k, v in err.items()})
    meta = dict(date=datetime.date.today().isoformat(), gpu=torch.cuda.get_device_name(), torch=torch.__version__)
    name = "bench_linear_fp8"
    with open(f"{args.out}/{name}.json", "w") as f:
        json.dump(dict(meta=meta, rows=rows, norms=norms, modulation=mods), f, indent=1)
    cols = list(rows[0]["us"]) if rows else []
    L = [f"# FP8 linear, {meta['gpu']}, {meta['date']}, torch {meta['torch']}", "",
         "µs a call (graph replays, median); in brackets the rate against bf16 F.linear", "",
         "| shape | M x K x N | " + " | ".join(cols) + " |", "|---|---|" + "---:|" * len(cols)]
    for r in rows:
        b = r["us"]["bf16 F.linear"]
        L.append(f"| {r['name']} | {'x'.join(map(str, r['shape']))} | " + " | ".join(
            f"{r['us'][c]:.1f}" + ("" if "quantize" in c else f" ({b / r['us'][c]:.2f}x)") for c in cols) + " |")
    L += ["", "The user's eager call (a loop of calls between events, no graph), µs:", ""]
    for r in rows:
        L.append(f"- {r['name']}: " + ", ".join(f"{k} {v:.1f}" for k, v in r["eager_us"].items()))
    L += ["", "rel. L2 against the float64 product of the unquantized x, w:", ""]
    for r in rows:
        L.append(f"- {r['name']}: " + ", ".join(f"{k} {v:.4f}" for k, v in r["rel_l2"].items()))
    if norms:
        L += side_table("Norms writing FP8 (bf16 x [1, M, D] in; e4m3 y and float32 row scales out), µs (graph "
                        "replays); in brackets the rate of a copy of the same bytes (read 3 M D + 4 M, half read, "
                        "half written)", "shape", "M x D", norms, "of_copy", ".2f")
    if mods:
        L += side_table("The modulation GEMMs (M rows of temb), µs (graph replays); rel. L2 against float64 of the "
                        "unquantized x, w in brackets; the user's eager call after the table", "GEMM", "M x K x N",
                        mods, "rel_l2", ".4f")
        L += [""] + [f"- {r['name']} eager: " + ", ".join(f"{k} {v:.1f}" for k, v in r["eager_us"].items()) for r in mods]
    with open(f"{args.out}/{name}.md", "w") as f:
        f.write("\n".join(L) + "\n")
    print("\n".join(L))


if __name__ == "__main__":
    main()
