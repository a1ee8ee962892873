"""Launch-shape sweep for the normalization kernel: times rmsnorm (and layernorm) over
(cached vectors per thread NV, threads per row G, rows per block) through the internal hook
fusedk__tune_norm_plan (built with meson -Dtuning=true), next to the library's own choice. Timed by bench.py's time_graph (CUDA
events over CUDA-graph replays) cycling input sets larger than L2. Prints a table; writes JSON
if --out.
    python3 bench/tune_norm.py [--out FILE]"""
import argparse
import ctypes
import json

import torch

import bench  # bench/bench.py: the shared timing method
import fusedk

lib = ctypes.CDLL(fusedk.kernel_info()["library"])
if not hasattr(lib, "fusedk__tune_norm_plan"):
    raise SystemExit("tune_norm.py: this libfusedk has no tuning hook; build it with meson -Dtuning=true "
                     "(tools/gpu_run.sh --tune does)")
tune = lib.fusedk__tune_norm_plan
tune.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int]


def configs(nvec):
    out = [(-1, 0, 0)]  # the library's plan
    for nv in (1, 2, 4, 8, 16):
        g = -(-nvec // nv)
        if g > 1024:
            continue
        g = g if g < 32 and g & (g - 1) == 0 else (1 << (g - 1).bit_length() if g < 32 else -(-g // 32) * 32)
        for rpb in (1, 2, 4, 8):
            if g * rpb <= 1024 and (g >= 32 or g * rpb % 32 == 0):
                out.append((nv, g, rpb))
    return out


def main():
    bench.torch = torch  # bench.py binds torch in its own main()
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--shapes", default="", help="op:RxD,... (op rmsnorm, layernorm or rtg) instead of the default list")
    args = ap.parse_args()
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    rows = []
    shapes = [("rmsnorm", 16384, 3072), ("rmsnorm", 1024, 2048), ("rmsnorm", 2048, 3072), ("rmsnorm", 8192, 1152),
              ("rmsnorm", 8192, 4096), ("rmsnorm", 8192, 8192), ("rmsnorm", 4096, 3584), ("layernorm", 16384, 3072),
              ("rtg", 16384, 3072)]
    if args.shapes:
        shapes = [(o, *map(int, rd.split("x"))) for o, rd in (t.split(":") for t in args.shapes.split(","))]
    for op, R, D in shapes:
        nbytes = R * D * 2 * (3 if op == "rtg" else 2)
        nsets = max(1, min(32, -(-3 * l2 // nbytes)))
        w = torch.randn(D, device="cuda", dtype=torch.bfloat16)
        sets = [(torch.randn(R, D, device="cuda", dtype=torch.bfloat16), torch.randn(R, D, device="cuda", dtype=torch.bfloat16))
                for _ in range(nsets)]
        gate = torch.randn(4, D, device="cuda", dtype=torch.bfloat16)
        f = {"rmsnorm": lambda x, y: fusedk.rmsnorm(x, w, out=y),
             "layernorm": lambda x, y: fusedk.layernorm(x, w, w, out=y),
             # Mochi in place: x += tanh(gate) * rmsnorm(y)
             "rtg": lambda x, y: fusedk.residual_tanh_gated_rmsnorm(x.view(4, -1, D), y.view(4, -1, D), gate,
                                                                  out=x.view(4, -1, D))}[op]
        res = []
        for nv, g, rpb in configs(D // 8):
            tune(nv, g, rpb)
            try:
                us = bench.time_graph(lambda i: f(*sets[i % len(sets)]), max(len(sets), 8), 60)
            except Exception as e:  # a shape the hook rejected still runs the default plan
                us = float("nan")
                print("error", e)
            res.append({"nv": nv, "g": g, "rows_per_block": rpb, "us": us, "TBps": nbytes / us / 1e6})
        tune(-1, 0, 0)
        best = min(res, key=lambda r: r["us"])
        dflt = res[0]
        print(f"{op} {R}x{D} bf16: default {dflt['us']:.1f} us ({dflt['TBps']:.2f} TB/s); best nv={best['nv']} "
              f"g={best['g']} rpb={best['rows_per_block']} {best['us']:.1f} us ({best['TBps']:.2f} TB/s)")
        top = sorted(res, key=lambda r: r["us"])[:6]
        print("   top: " + "; ".join(f"nv{r['nv']} g{r['g']} r{r['rows_per_block']}: {r['us']:.1f}" for r in top))
        rows.append({"op": op, "rows": R, "D": D, "results": res})
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
