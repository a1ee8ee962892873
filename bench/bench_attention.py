#!/usr/bin/env python3
"""[attention] fusedk.attention against torch SDPA's flash (FlashAttention-2), cuDNN and
memory-efficient backends and JAX's dot_product_attention (cudnn, xla), bf16 forward, one run;
fusedk's int8 attention (precision="int8", its quantization passes counted) and sageattention
(pip's, where installed) beside them: int8 at Dh 64, 128 and 256, sageattention (1.0.6 takes 64,
96 and 128) at 64 and 128.

    PYTHONPATH=bindings/python python3 bench/bench_attention.py [--out DIR] [--rounds 3] [--quick]

Shapes: the issue's (Flux's joint attention B1 H24 S4608 Dh128 first). Layouts as users hold
them: fusedk takes [B, S, H, Dh] tensors; SDPA their [B, H, S, Dh] transposed views (what a
diffusers processor passes); JAX [B, S, H, Dh] arrays. Kernel time (bench.py's method): K calls
in one CUDA graph, replays timed by events, median of --rounds rotated rounds; JAX: a loop of
jitted calls to block_until_ready (async dispatch: throughput). TFLOP/s = 4 B H Sq Sk Dh / time,
halved when causal. Error: max |out - float64| over the first 512 query rows of heads 0 and 1.
The eager call (no out=, no graph: bench/percall.py's loop to a sync) at the first shape, against
the kernel's graph time. Writes DIR/bench_attention.json and .md and prints the table."""
import argparse
import datetime
import json
import os
import statistics
import time

import numpy as np

import bench
import percall

# (B, H, S, Dh, causal)
SHAPES = [(1, 24, 4608, 128, False), (2, 24, 4096, 128, False), (1, 24, 16384, 128, False),
          (1, 24, 32760, 128, False), (2, 16, 4096, 64, False), (1, 16, 8192, 256, False),
          (2, 24, 4096, 128, True)]


def reference_err(torch, out, q, k, v, causal, bhsd=False, rows=512):
    """max |out - float64 attention| over query rows [0, rows) of heads 0 and 1 (batch 0)"""
    o = out.transpose(1, 2) if bhsd else out
    S = q.shape[1]
    err = 0.0
    for h in range(2):
        qd, kd, vd = (t[0, :, h].double() for t in (q, k, v))
        s = (qd[:rows] @ kd.T) / q.shape[-1] ** 0.5
        if causal:
            s = s.masked_fill(torch.arange(S, device=s.device)[None, :] > torch.arange(rows, device=s.device)[:, None],
                              float("-inf"))
        ref = torch.softmax(s, -1) @ vd
        err = max(err, (o[0, :rows, h].double() - ref).abs().max().item())
    return err


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="bench/results")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--calls", type=int, default=300)
    ap.add_argument("--quick", action="store_true")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--shapes", help="indexes into SHAPES, comma-separated (default: all)")
    ap.add_argument("--no-call", action="store_true", help="skip the eager call's timing")
    ap.add_argument("--only", help="column names to time, comma-separated (default: all)")
    args = ap.parse_args()
    import torch
    import torch.nn.functional as F
    from torch.nn.attention import SDPBackend, sdpa_kernel

    import fusedk
    try:
        from sageattention import sageattn
    except Exception:  # noqa: BLE001 - an optional peer
        sageattn = None
    bench.torch = torch
    jax = jnp = None
    if not args.no_jax:
        try:
            import jax
            import jax.numpy as jnp
            if jax.default_backend() not in ("gpu", "cuda"):
                raise RuntimeError(f"jax backend {jax.default_backend()}")
        except Exception as e:  # noqa: BLE001
            bench.log(f"jax unavailable: {bench.err_str(e)[:200]}")
            jax = None
    dt = torch.bfloat16
    K_CALLS, ITERS = (2, 5) if args.quick else (3, 10)
    rows = []
    shapes = SHAPES[:2] + SHAPES[-1:] if args.quick else SHAPES
    if args.shapes:
        shapes = [SHAPES[int(i)] for i in args.shapes.split(",")]
    for B, H, S, Dh, causal in shapes:
        g = torch.Generator(device="cuda").manual_seed(0)
        q, k, v = (torch.randn(B, S, H, Dh, device="cuda", dtype=dt, generator=g) for _ in range(3))
        qt, kt, vt = (t.transpose(1, 2) for t in (q, k, v))
        flop = 4.0 * B * H * S * S * Dh / (2 if causal else 1)

        def sdpa(backend):
            def call(i):
                with sdpa_kernel(backend):
                    return F.scaled_dot_product_attention(qt, kt, vt, is_causal=causal)
            return call
        calls = {"fusedk": lambda i: fusedk.attention(q, k, v, causal=causal),
                 "sdpa flash": sdpa(SDPBackend.FLASH_ATTENTION), "sdpa cudnn": sdpa(SDPBackend.CUDNN_ATTENTION),
                 "sdpa efficient": sdpa(SDPBackend.EFFICIENT_ATTENTION)}
        if Dh in (64, 128, 256):
            calls["fusedk int8"] = lambda i: fusedk.attention(q, k, v, causal=causal, precision="int8")
            if sageattn is not None and Dh != 256:  # sageattention 1.0.6 takes 64, 96 and 128
                calls["sageattention"] = lambda i: sageattn(qt, kt, vt, tensor_layout="HND", is_causal=causal)
        if args.only:
            calls = {n: c for n, c in calls.items() if n in args.only.split(",")}
        err = {}
        for name, c in calls.items():
            try:
                out = c(0)
                err[name] = reference_err(torch, out, q, k, v, causal, bhsd=not name.startswith("fusedk"))
            except Exception as e:  # noqa: BLE001
                err[name] = f"error: {bench.err_str(e)[:160]}"
        us, meth, errs = bench.time_rounds({n: c for n, c in calls.items() if not isinstance(err[n], str)},
                                           K_CALLS, ITERS, args.rounds)
        t = {n: statistics.median(v) for n, v in us.items() if v}
        if jax is not None:
            jq, jk, jv = (jnp.asarray(x.float().cpu().numpy(), dtype=jnp.bfloat16) for x in (q, k, v))
            for impl in ("cudnn", "xla"):
                name = f"jax {impl}"
                try:
                    f = jax.jit(lambda a, b, c, impl=impl: jax.nn.dot_product_attention(a, b, c, is_causal=causal,
                                                                                        implementation=impl))
                    o = f(jq, jk, jv).block_until_ready()
                    got = torch.from_numpy(np.array(o.astype(jnp.float32))).cuda()
                    err[name] = reference_err(torch, got, q, k, v, causal)
                    n = max(3, int(2e5 / max(1.0, t.get("fusedk", 1000.0))))  # about 0.2 s a trial
                    per = []
                    for _ in range(args.rounds):
                        t0 = time.perf_counter()
                        for _ in range(n):
                            o = f(jq, jk, jv)
                        o.block_until_ready()
                        per.append((time.perf_counter() - t0) / n * 1e6)
                    t[name] = statistics.median(per)
                except Exception as e:  # noqa: BLE001
                    err[name] = f"error: {bench.err_str(e)[:160]}"
            del jq, jk, jv
        peers = {n: u for n, u in t.items() if n not in ("fusedk", "fusedk int8", "sageattention")}  # bf16 peers
        best = min(peers, key=peers.get) if peers else None
        row = dict(B=B, H=H, S=S, Dh=Dh, causal=causal, us=t, rounds_us=us, errors=errs, max_err=err,
                   tflops={n: flop / u / 1e6 for n, u in t.items()}, fastest_peer=best,
                   vs_fastest=peers[best] / t["fusedk"] if best and "fusedk" in t else None,
                   vs_flash=t["sdpa flash"] / t["fusedk"] if "sdpa flash" in t and "fusedk" in t else None)
        rows.append(row)
        bench.log(f"B{B} H{H} S{S} Dh{Dh}{' causal' if causal else ''}: "
                  + ", ".join(f"{n} {row['tflops'][n]:.0f}" for n in t) + " TFLOP/s")
        q = k = v = qt = kt = vt = calls = None
        torch.cuda.empty_cache()
    # the user's eager call at the first shape against its kernel's graph time
    call = None
    if not args.no_call:
        B, H, S, Dh, causal = SHAPES[0]
        q, k, v = (torch.randn(B, S, H, Dh, device="cuda", dtype=dt) for _ in range(3))
        eager = percall.loop_times([lambda: fusedk.attention(q, k, v)], torch.cuda.synchronize, args.calls, 5)[0]
        kernel = statistics.median(bench.time_rounds({"k": lambda i: fusedk.attention(q, k, v)}, K_CALLS, ITERS,
                                                     args.rounds)[0]["k"])
        call = dict(shape=[B, H, S, Dh], eager_us=eager, kernel_us=kernel, ratio=eager / kernel)
        bench.log(f"eager call {call}")
    meta = dict(gpu=torch.cuda.get_device_name(), date=datetime.datetime.now(datetime.timezone.utc).isoformat(),
                fusedk=fusedk.__version__, info=fusedk.kernel_info()["cuda"], rounds=args.rounds, calls=K_CALLS,
                iters=ITERS, **bench.versions())
    res = dict(meta=meta, rows=rows, call=call)
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "bench_attention.json"), "w") as f:
        json.dump(res, f, indent=1)
    md = markdown(res)
    with open(os.path.join(args.out, "bench_attention.md"), "w") as f:
        f.write(md)
    print(md)


def markdown(res):
    m = res["meta"]
    names = ["fusedk", "sdpa flash", "sdpa cudnn", "sdpa efficient", "jax cudnn", "jax xla", "fusedk int8",
             "sageattention"]
    L = [f"# fusedk attention — {m['gpu']} — {m['date'][:16]} UTC", "",
         f"bf16 forward, TFLOP/s (4 B H Sq Sk Dh / time, halved when causal); torch {m['torch']}, jax {m['jax']}; "
         f"CUDA-graph replays (JAX: jitted loop), median of {m['rounds']} rotated rounds "
         f"(bench/bench_attention.py); commit {m.get('git')}.", "",
         "| shape | " + " | ".join(names) + " | fusedk / fastest peer | fusedk / flash |",
         "|---|" + "---:|" * (len(names) + 2)]
    f = lambda v, d=0: "—" if v is None else f"{v:.{d}f}"  # noqa: E731
    for r in res["rows"]:
        shape = f"B{r['B']} H{r['H']} S{r['S']} Dh{r['Dh']}{' causal' if r['causal'] else ''}"
        L.append(f"| {shape} | " + " | ".join(f(r["tflops"].get(n)) for n in names)
                 + f" | {f(r['vs_fastest'], 2)}x ({r['fastest_peer']}) | {f(r['vs_flash'], 2)}x |")
    L += ["", "Max |error| vs float64 (first 512 rows of heads 0, 1):", "",
          "| shape | " + " | ".join(names) + " |", "|---|" + "---:|" * len(names)]
    for r in res["rows"]:
        shape = f"B{r['B']} H{r['H']} S{r['S']} Dh{r['Dh']}{' causal' if r['causal'] else ''}"
        e = r["max_err"]
        L.append(f"| {shape} | " + " | ".join(
            "—" if n not in e else e[n][:40] if isinstance(e[n], str) else f"{e[n]:.2e}" for n in names) + " |")
    c = res["call"]
    L += [] if c is None else ["", f"Eager call `fusedk.attention(q, k, v)` at B{c['shape'][0]} H{c['shape'][1]} S{c['shape'][2]} "
          f"Dh{c['shape'][3]}: {c['eager_us']:.1f} µs a call (loop to a sync) vs the kernel's {c['kernel_us']:.1f} µs "
          f"(graph replay): {c['ratio']:.3f}x (goal ≤ 1.02x)."]
    return "\n".join(L) + "\n"


if __name__ == "__main__":
    main()
