"""Launch-shape sweep for the elementwise kernel: times bench.py's elementwise rows over (vectors a
thread U, most threads a row g_max) through the internal hook fusedk__tune_ew_plan (built with
meson -Dtuning=true), next to the library's own choice and torch.compile on the same inputs.
Timed by bench.py's time_graph (CUDA events over CUDA-graph replays) cycling input sets larger
than L2. Prints a table; writes JSON if --out.
    python3 bench/tune_ew.py [--ops act,geglu] [--out FILE]"""
import argparse
import ctypes
import json
import types

import torch

import bench  # bench/bench.py: the cases and the timing method
import fusedk

lib = ctypes.CDLL(fusedk.kernel_info()["library"])
if not hasattr(lib, "fusedk__tune_ew_plan"):
    raise SystemExit("tune_ew.py: this libfusedk has no tuning hook; build it with meson -Dtuning=true")
tune = lib.fusedk__tune_ew_plan
tune.argtypes = [ctypes.c_int, ctypes.c_int]
CONFIGS = [(0, 0)] + [(u, g) for u in (1, 2) for g in (64, 128, 256)]  # (U, g_max); (0, 0): the library's


def main():
    bench.torch, bench.F, bench.fusedk = torch, torch.nn.functional, fusedk
    ap = argparse.ArgumentParser()
    ap.add_argument("--ops", default="")
    ap.add_argument("--out")
    args = ap.parse_args()
    ops = set(filter(None, args.ops.split(",")))
    l2 = torch.cuda.get_device_properties(0).L2_cache_size
    cargs = types.SimpleNamespace(no_compile=False, no_liger=True, no_jax=True)
    rows = []
    for op, shape, dtype in bench.plan(True):
        if op not in bench.ELEMENTWISE or (ops and op not in ops):
            continue
        c = bench.Case(op, shape, dtype, cargs)
        R, K = bench.sizing(c.nbytes, l2)  # the bench's own set count and graph length
        sets = [c.make() for _ in range(R)]
        outs = [c.outs(s) for s in sets]
        ref = [t.clone() for t in bench.as_list(c.ref(sets[0]))]
        res = []
        for u, g in CONFIGS:
            tune(u, g)
            c.fk(sets[0], outs[0])
            err = bench.max_err(c.got(outs[0]), ref)
            us = bench.time_graph(lambda i: c.fk(sets[i % R], outs[i % R]), K, 100)
            res.append({"u": u, "g_max": g, "us": us, "err": err})
        tune(0, 0)
        peer = bench.time_graph(lambda i: c.peers["compile"](sets[i % R]), K, 100)
        name = f"{op} {'x'.join(map(str, shape))} {dtype}"
        print(f"{name}: compile {peer:.1f} us; " + "; ".join(
            f"{'lib' if r['u'] == 0 else 'u%d g%d' % (r['u'], r['g_max'])} {r['us']:.1f}" for r in res), flush=True)
        rows.append({"op": op, "shape": list(shape), "dtype": dtype, "bytes": c.nbytes, "compile_us": peer,
                     "results": res})
        del sets, outs, ref
        torch.cuda.empty_cache()
    if args.out:
        with open(args.out, "w") as fh:
            json.dump({"gpu": torch.cuda.get_device_name(), "rows": rows}, fh, indent=1)


if __name__ == "__main__":
    main()
