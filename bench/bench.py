#!/usr/bin/env python3
"""fusedk benchmark: fusedk vs torch eager, torch.compile, Liger and JAX on the normalization and
elementwise ops.

    python3 bench/bench.py [--out DIR] [--quick] [--rounds N]
                           [--ops rmsnorm,rmsnorm_res,layernorm,adaln,rtg_rmsnorm,act,silu_fma,gated_residual,
                                  geglu,swiglu]
                           [--no-jax] [--no-compile] [--no-liger]

Needs a CUDA GPU and PyTorch (JAX and Liger optional). From the repository after `meson compile -C
build`: PYTHONPATH=bindings/python finds build/libfusedk.so and fusedk.h (or set FUSEDK_LIBRARY and
FUSEDK_HEADER). Exits if fusedk cannot be imported, unless --peers-only.
Writes DIR/bench.json, DIR/bench.md and DIR/bench.png (DIR defaults to bench/results) and prints
the Markdown table last on stdout; progress goes to stderr.

Method: every torch-side implementation (fusedk with out=, eager, torch.compile, Liger) is timed
the same way: K calls captured in one CUDA graph, cycling through R input/output sets so that a
set is reused only after more than 2x the L2 of other data has been touched; each replay is timed
with CUDA events and per-call time = median replay / K. Every implementation is timed --rounds times
(default 3), the order rotated each round, and the median is reported: fusedk's first timing in
a row can run slow on the large norm and position rows, and a single pass, fusedk first, would
report that round as fusedk's time. JAX is
timed by wall clock over back-to-back jitted calls. Bandwidth = (bytes read once + bytes written
once) / time, compared with a 1 GiB device-to-device copy measured in the same run.
"""
import argparse
import datetime
import json
import math
import os
import platform
import statistics
import subprocess
import sys
import time
import zlib

# Must precede any jax import, or XLA grabs 75% of the GPU that torch also needs.
os.environ["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"

torch = F = fusedk = None  # imported in main(), so the report code below runs without them
jax = jnp = None

OPS = ("rmsnorm", "rmsnorm_res", "layernorm", "adaln", "rtg_rmsnorm", "act", "silu_fma", "gated_residual", "geglu",
       "swiglu", "rope", "qk_norm_rope", "diffusion_step")
ALIASES = {"residual_tanh_gated_rmsnorm": "rtg_rmsnorm", "rtg": "rtg_rmsnorm", "rmsnorm+res": "rmsnorm_res"}
PEERS = ("eager", "F.rms_norm", "compile", "liger", "jax")  # column order in the reports
DTYPE_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}
REL_TOL = {"bf16": 2e-2, "fp16": 1e-2, "fp32": 1e-4}  # x max|ref|: warning threshold only
EPS_RMS, EPS_LN, EPS_ADALN = 1e-6, 1e-5, 1e-6

NORM_SHAPES = [(1, 1024, 2048), (2, 4096, 3072), (4, 4096, 3072), (1, 2048, 3072), (2, 4096, 1152),
               (8192, 4096), (8192, 8192), (4096, 3584)]


def plan(quick):
    """[(op, shape, dtype)] in report order."""
    big = (4, 4096, 3072)
    # [elementwise]: a DiT MLP hidden (2x4096x4608), a 64 Mi-element tensor, the gated residual
    elementwise = [("act", (2, 4096, 4608), "bf16"), ("act", (4, 4096, 4096), "bf16"),
                   ("silu_fma", (4, 4096, 4096), "bf16"), ("gated_residual", (4, 4096, 3072), "bf16"),
                   ("gated_residual", (2, 4096, 1152), "bf16"), ("geglu", (2, 4096, 2 * 8192), "bf16"),
                   ("swiglu", (2, 4096, 2 * 4608), "bf16"),
                   # [position] q and k of Flux's attention (B2 S4096 H24 Dh128); [sampler] a video latent
                   ("rope", (2, 4096, 24, 128), "bf16"), ("qk_norm_rope", (2, 4096, 24, 128), "bf16"),
                   ("diffusion_step", (4, 16, 16, 128, 128), "bf16")]
    if quick:
        return [("rmsnorm", (1, 1024, 2048), "bf16"), ("rmsnorm", (2, 4096, 3072), "fp16"),
                ("rmsnorm", big, "fp32"), ("rmsnorm_res", big, "bf16"), ("layernorm", big, "bf16"),
                ("adaln", (2, 4096, 1152), "bf16"), ("rtg_rmsnorm", (1, 1024, 2048), "bf16")] + elementwise
    p = []
    for s in NORM_SHAPES:
        p += [("rmsnorm", s, "bf16"), ("rmsnorm", s, "fp16")] + ([("rmsnorm", s, "fp32")] if s == big else [])
    p += [("rmsnorm_res", s, "bf16") for s in (big, (8192, 4096))]
    for s in NORM_SHAPES:
        p += [("layernorm", s, "bf16")] + ([("layernorm", s, "fp16")] if s == big else [])
    p += [("adaln", s, "bf16") for s in ((2, 4096, 1152), (2, 4096, 3072), big, (1, 1024, 2048))]
    p += [("rtg_rmsnorm", s, "bf16") for s in (big, (2, 4096, 3072), (1, 1024, 2048))]
    return p + elementwise


def log(*a):
    print(*a, file=sys.stderr, flush=True)


def err_str(e):
    return f"{type(e).__name__}: {e}".strip()[:400]


# ----------------------------------------------------------------------------------------------
# [norm] Reference formulas (torch) and their JAX twins. eps is a default argument so torch.compile
# sees it as a constant and one compiled function serves every shape and dtype.

def t_rms(x, w, eps=EPS_RMS):
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype) * w


def t_rms_res(x, r, w, eps=EPS_RMS):
    s = x + r
    return t_rms(s, w, eps), s


def t_ln(x, w, b, eps=EPS_LN):
    return F.layer_norm(x, (x.shape[-1],), w, b, eps)


def t_adaln(x, scale, shift, eps=EPS_ADALN):
    return F.layer_norm(x, (x.shape[-1],), eps=eps) * (1 + scale[:, None]) + shift[:, None]


def t_rtg(x, x_res, gate, eps=EPS_RMS):
    xf = x_res.float()
    n = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
    return x + (n * torch.tanh(gate)[:, None]).type_as(x)


# [elementwise] (act: tanh GELU, the DiT MLP's)
def t_act(x):
    return F.gelu(x, approximate="tanh")


def t_silu_fma(a, b, c):
    return F.silu(a + b * c)


def t_gated_residual(x, y, g):
    return x + g[:, None] * y


def t_geglu(x):  # diffusers' GEGLU: h, g = x.chunk(2, -1); h * gelu(g)
    h, g = x.chunk(2, -1)
    return h * F.gelu(g)


def t_swiglu(x):  # SwiGLU: silu(a) * b
    a, b = x.chunk(2, -1)
    return F.silu(a) * b


def j_geglu(x):
    h, g = jnp.split(x, 2, -1)
    return h * jax.nn.gelu(g, approximate=False)


def j_swiglu(x):
    a, b = jnp.split(x, 2, -1)
    return jax.nn.silu(a) * b


def j_act(x):
    return jax.nn.gelu(x, approximate=True)


def j_silu_fma(a, b, c):
    return jax.nn.silu(a + b * c)


def j_gated_residual(x, y, g):
    return x + g[:, None] * y


# [sampler] CFG + flow-matching Euler + temporal blend, the constants of one step
STEP = dict(guidance=4.5, sigma=0.8, sigma_next=0.75, blend=0.9)


def t_step(x, c, u, p, g=STEP["guidance"], dt=STEP["sigma_next"] - STEP["sigma"], w=STEP["blend"]):
    m = u + g * (c - u)  # the same formula on torch and JAX arrays (ELEMENTWISE uses it for both)
    return w * (x + dt * m) + (1 - w) * p


# [position] the angles of the [S, Dh/2] float32 tables (theta 10000) both rope rows use
def rope_angles(S, Dh):
    return torch.arange(S, device="cuda")[:, None] * 10000.0 ** (-torch.arange(0, Dh, 2, device="cuda") / Dh)


# [position] interleaved RoPE (Flux, diffusers' apply_rotary_emb) from [S, Dh/2] half tables
def t_rope_one(x, c, s):
    xf = x.float().unflatten(-1, (-1, 2))
    a, b, c, s = xf[..., 0], xf[..., 1], c[:, None], s[:, None]
    return torch.stack((a * c - b * s, b * c + a * s), -1).flatten(-2).to(x.dtype)


def t_rope(q, k, c, s):
    return t_rope_one(q, c, s), t_rope_one(k, c, s)


def j_rope_one(x, c, s):
    xf = x.astype(jnp.float32).reshape(x.shape[:-1] + (-1, 2))
    a, b, c, s = xf[..., 0], xf[..., 1], c[:, None], s[:, None]
    return jnp.stack((a * c - b * s, b * c + a * s), -1).reshape(x.shape).astype(x.dtype)


def j_rope(q, k, c, s):
    return j_rope_one(q, c, s), j_rope_one(k, c, s)


# [position] qk_norm_rope's unfused chain, diffusers' way (Flux): q, k, v = unbind; RMSNorm of each
# head (t_rms: float32 statistics, rounded, times the weight); RoPE; [B, H, S, Dh] for attention
def t_qknr(qkv, qw, kw, c, s):
    q, k, v = qkv.unbind(2)
    q, k = t_rope_one(t_rms(q, qw), c, s), t_rope_one(t_rms(k, kw), c, s)
    return tuple(t.transpose(1, 2).contiguous() for t in (q, k, v))


def j_qknr(qkv, qw, kw, c, s):
    q, k, v = qkv[:, :, 0], qkv[:, :, 1], qkv[:, :, 2]
    q, k = j_rope_one(j_rms(q, qw), c, s), j_rope_one(j_rms(k, kw), c, s)
    return tuple(jnp.swapaxes(t, 1, 2) for t in (q, k, v))


# fusedk's call (out= last), the torch formula, its JAX twin, and the input names, per op
ELEMENTWISE = {
    "act": (lambda x, out: fusedk.act(x, "gelu_tanh", out=out), t_act, j_act, ("x",)),
    "silu_fma": (lambda a, b, c, out: fusedk.silu_fma(a, b, c, out=out), t_silu_fma, j_silu_fma, ("a", "b", "c")),
    "gated_residual": (lambda x, y, g, out: fusedk.gated_residual(x, y, g, out=out), t_gated_residual,
                       j_gated_residual, ("x", "y", "g")),
    "geglu": (lambda x, out: fusedk.glu(x, "gelu", "second", out=out), t_geglu, j_geglu, ("x",)),
    "swiglu": (lambda x, out: fusedk.glu(x, "silu", "first", out=out), t_swiglu, j_swiglu, ("x",)),
    "diffusion_step": (lambda x, c, u, p, out: fusedk.diffusion_step(x, c, uncond=u, prev=p, out=out, **STEP),
                       t_step, t_step, ("x", "c", "u", "p")),
}


def j_rms(x, w, eps=EPS_RMS):
    xf = x.astype(jnp.float32)
    return (xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps)).astype(x.dtype) * w


def j_ln(x, w, b, eps=EPS_LN):
    xf = x.astype(jnp.float32)
    m = xf.mean(-1, keepdims=True)
    v = jnp.square(xf - m).mean(-1, keepdims=True)
    return ((xf - m) * jax.lax.rsqrt(v + eps) * w.astype(jnp.float32) + b.astype(jnp.float32)).astype(x.dtype)


def j_adaln(x, mod, eps=EPS_ADALN):
    d = x.shape[-1]  # JAX has no views: slice shift/scale out of the [B, 6D] modulation inside jit
    shift, scale = mod[:, :d], mod[:, d:2 * d]
    xf = x.astype(jnp.float32)
    m = xf.mean(-1, keepdims=True)
    n = ((xf - m) * jax.lax.rsqrt(jnp.square(xf - m).mean(-1, keepdims=True) + eps)).astype(x.dtype)
    return n * (1 + scale[:, None]) + shift[:, None]


def j_rtg(x, x_res, gate, eps=EPS_RMS):
    xf = x_res.astype(jnp.float32)
    n = xf * jax.lax.rsqrt(jnp.mean(xf * xf, -1, keepdims=True) + eps)
    return x + (n * jnp.tanh(gate)[:, None].astype(jnp.float32)).astype(x.dtype)


_compiled, _jitted = {}, {}


def compiled(fn):
    if fn not in _compiled:
        _compiled[fn] = torch.compile(fn, dynamic=False)
    return _compiled[fn]


def jitted(fn):
    if fn not in _jitted:
        _jitted[fn] = jax.jit(fn)
    return _jitted[fn]


def liger_fn(kind):
    """Liger's autograd Function with positional args built from its forward() signature."""
    import inspect
    if kind == "rms":
        from liger_kernel.ops.rms_norm import LigerRMSNormFunction as Fn
        lead, want = 2, {"eps": EPS_RMS, "offset": 0.0, "casting_mode": "llama", "in_place": False}
    else:
        from liger_kernel.ops.layer_norm import LigerLayerNormFunction as Fn
        lead, want = 3, {"eps": EPS_LN}
    params = list(inspect.signature(Fn.forward).parameters.values())[1 + lead:]  # skip ctx, tensors
    last = max((i for i, p in enumerate(params) if p.name in want), default=-1)
    extra = []
    for p in params[:last + 1]:
        if p.name in want:
            extra.append(want[p.name])
        elif p.default is not inspect.Parameter.empty:
            extra.append(p.default)
        else:
            raise TypeError(f"unexpected Liger signature {inspect.signature(Fn.forward)}")
    if "eps" not in [p.name for p in params]:
        raise TypeError(f"unexpected Liger signature {inspect.signature(Fn.forward)}")
    return lambda *tensors: Fn.apply(*tensors, *extra)


# ----------------------------------------------------------------------------------------------
# Cases: how to build one input set, call fusedk into preallocated outputs, and call each peer.

class Case:
    def __init__(self, op, shape, dtype, args):
        self.op, self.shape, self.dtype = op, tuple(shape), dtype
        self.tdt = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
        D = shape[-1]
        n = math.prod(shape)
        es = DTYPE_BYTES[dtype]
        rnd = lambda *s: torch.randn(*s, device="cuda", dtype=self.tdt)
        self.peers = {}
        if op == "rmsnorm":
            self.make = lambda: dict(x=rnd(shape), w=1 + 0.1 * rnd(D))
            self.outs = lambda s: dict(y=torch.empty_like(s["x"]))
            self.fk = lambda s, o: fusedk.rmsnorm(s["x"], weight=s["w"], eps=EPS_RMS, out=o["y"])
            self.got = lambda o: [o["y"]]
            self.ref = lambda s: t_rms(s["x"], s["w"])
            self.peers["F.rms_norm"] = lambda s: F.rms_norm(s["x"], (D,), s["w"], EPS_RMS)
            cfn, targs, self.jax = t_rms, ("x", "w"), (j_rms, ("x", "w"))
            self.liger = "rms"
            self.nbytes = (2 * n + D) * es
        elif op == "rmsnorm_res":
            self.make = lambda: dict(x=rnd(shape), r=rnd(shape), w=1 + 0.1 * rnd(D))
            self.outs = lambda s: dict(y=torch.empty_like(s["x"]), ro=torch.empty_like(s["x"]))
            self.fk = lambda s, o: fusedk.rmsnorm(s["x"], weight=s["w"], eps=EPS_RMS, residual=s["r"],
                                                  out=o["y"], residual_out=o["ro"])
            self.got = lambda o: [o["y"], o["ro"]]
            self.ref = lambda s: t_rms_res(s["x"], s["r"], s["w"])
            cfn, targs, self.jax, self.liger = t_rms_res, ("x", "r", "w"), None, None
            self.nbytes = (4 * n + D) * es
        elif op == "layernorm":
            self.make = lambda: dict(x=rnd(shape), w=1 + 0.1 * rnd(D), b=0.1 * rnd(D))
            self.outs = lambda s: dict(y=torch.empty_like(s["x"]))
            self.fk = lambda s, o: fusedk.layernorm(s["x"], weight=s["w"], bias=s["b"], eps=EPS_LN, out=o["y"])
            self.got = lambda o: [o["y"]]
            self.ref = lambda s: t_ln(s["x"], s["w"], s["b"])
            cfn, targs, self.jax, self.liger = t_ln, ("x", "w", "b"), (j_ln, ("x", "w", "b")), "ln"
            self.nbytes = (2 * n + 2 * D) * es
        elif op == "adaln":
            B = shape[0]

            def make():  # DiT AdaLN-Zero: shift, scale = first two D-chunks of a [B, 6D] tensor
                mod = 0.5 * rnd(B, 6 * D)
                return dict(x=rnd(shape), mod=mod, shift=mod[:, :D], scale=mod[:, D:2 * D])
            self.make = make
            self.outs = lambda s: dict(y=torch.empty_like(s["x"]))
            self.fk = lambda s, o: fusedk.adaln(s["x"], s["scale"], s["shift"], norm="layer", eps=EPS_ADALN,
                                                out=o["y"])
            self.got = lambda o: [o["y"]]
            self.ref = lambda s: t_adaln(s["x"], s["scale"], s["shift"])
            cfn, targs, self.jax, self.liger = t_adaln, ("x", "scale", "shift"), (j_adaln, ("x", "mod")), None
            self.nbytes = (2 * n + 2 * B * D) * es
        elif op == "rtg_rmsnorm":
            B = shape[0]
            self.make = lambda: dict(x=rnd(shape), xr=rnd(shape), g=rnd(B, D))
            self.outs = lambda s: dict(y=torch.empty_like(s["x"]))
            self.fk = lambda s, o: fusedk.residual_tanh_gated_rmsnorm(s["x"], s["xr"], s["g"], eps=EPS_RMS,
                                                                      exact=True, out=o["y"])
            self.got = lambda o: [o["y"]]
            self.ref = lambda s: t_rtg(s["x"], s["xr"], s["g"])
            cfn, targs, self.jax, self.liger = t_rtg, ("x", "xr", "g"), (j_rtg, ("x", "xr", "g")), None
            self.nbytes = (3 * n + B * D) * es
        elif op == "rope":  # q and k [B, S, H, Dh], float32 tables [S, Dh/2]
            S, Dh = shape[1], shape[-1]
            ang = rope_angles(S, Dh)
            self.make = lambda: dict(q=rnd(shape), k=rnd(shape), c=ang.cos().float(), s=ang.sin().float())
            self.outs = lambda s: dict(q=torch.empty_like(s["q"]), k=torch.empty_like(s["k"]))
            self.fk = lambda s, o: fusedk.rope(s["q"], s["k"], s["c"], s["s"], "interleaved", q_out=o["q"],
                                               k_out=o["k"])
            self.got = lambda o: [o["q"], o["k"]]
            self.ref = lambda s: t_rope(s["q"], s["k"], s["c"], s["s"])
            cfn, targs, self.jax, self.liger = t_rope, ("q", "k", "c", "s"), (j_rope, ("q", "k", "c", "s")), None
            self.nbytes = 4 * n * es + ang.numel() * 2 * 4
        elif op == "qk_norm_rope":  # packed qkv [B, S, 3, H, Dh] -> q, k, v [B, H, S, Dh], weights [Dh]
            B, S, H, Dh = shape
            ang = rope_angles(S, Dh)
            self.make = lambda: dict(qkv=rnd(B, S, 3, H, Dh), qw=1 + 0.1 * rnd(Dh), kw=1 + 0.1 * rnd(Dh),
                                     c=ang.cos().float(), s=ang.sin().float())
            self.outs = lambda s: {k: torch.empty(B, H, S, Dh, device="cuda", dtype=self.tdt) for k in "qkv"}
            self.fk = lambda s, o: fusedk.qk_norm_rope(s["qkv"], s["c"], s["s"], q_weight=s["qw"], k_weight=s["kw"],
                                                       eps=EPS_RMS, out=(o["q"], o["k"], o["v"]))
            self.got = lambda o: [o["q"], o["k"], o["v"]]
            self.ref = lambda s: t_qknr(s["qkv"], s["qw"], s["kw"], s["c"], s["s"])
            targs = ("qkv", "qw", "kw", "c", "s")
            cfn, self.jax, self.liger = t_qknr, (j_qknr, targs), None
            self.nbytes = 6 * n * es + ang.numel() * 2 * 4 + 2 * Dh * es
        elif op in ELEMENTWISE:  # [elementwise]: one output, fusedk's call and the peers' on the same inputs
            fk, cfn, jfn, targs = ELEMENTWISE[op]
            B = shape[0]
            out_shape = tuple(shape[:-1]) + ((shape[-1] // 2,) if op in ("geglu", "swiglu") else (D,))
            if op == "gated_residual":  # the gate: the third D-chunk of a [B, 6D] AdaLN-Zero modulation
                self.make = lambda: dict(x=rnd(shape), y=rnd(shape), g=rnd(B, 6 * D)[:, 2 * D:3 * D])
            else:
                self.make = lambda: {k: rnd(shape) for k in targs}
            self.outs = lambda s: dict(y=torch.empty(out_shape, device="cuda", dtype=self.tdt))
            self.fk = lambda s, o: fk(*(s[k] for k in targs), out=o["y"])
            self.got = lambda o: [o["y"]]
            self.ref = lambda s: cfn(*(s[k] for k in targs))
            self.jax, self.liger = (jfn, targs), None
            # bytes: each row input read once, the output written once, the gate's B x D
            self.nbytes = (n * len(targs) + math.prod(out_shape)) * es if op != "gated_residual" else \
                (3 * n + B * D) * es
        else:
            raise ValueError(op)
        self.peers = {"eager": self.ref, **self.peers}
        if not args.no_compile:
            self.peers["compile"] = lambda s: compiled(cfn)(*(s[k] for k in targs))
        if self.liger and not args.no_liger:
            try:
                lf = liger_fn(self.liger)
                lk = ("x", "w") if self.liger == "rms" else ("x", "w", "b")
                self.peers["liger"] = lambda s: lf(*(s[k] for k in lk))
            except Exception as e:  # not installed or API changed: a missing peer, not a crash
                self.peers["liger"] = e


def as_list(r):
    return list(r) if isinstance(r, (tuple, list)) else [r]


def max_err(got, ref):
    return max((a.float() - b.float()).abs().max().item() for a, b in zip(got, ref))


# ----------------------------------------------------------------------------------------------
# Timing

def capture(call, K):
    """call(0..K-1) captured in one CUDA graph, after an eager warm-up: (graph, the outputs kept)."""
    for i in range(K):  # eager warm-up: compiles, autotunes and lazily-initialized state stay out of capture
        call(i)
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    keep = []  # holding every output gives each call its own output memory, as with fusedk's out sets
    # What torch.cuda.graph() does, minus its gc.collect()/empty_cache() that cost ~0.1 s per capture.
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        g.capture_begin()
        try:
            for i in range(K):
                keep.append(call(i))
        finally:
            g.capture_end()
    torch.cuda.current_stream().wait_stream(side)
    return g, keep


def time_graph(call, K, iters, warm=3):
    """Per-call µs of call(0..K-1) captured in one CUDA graph: median over replays of events / K."""
    g, keep = capture(call, K)
    for _ in range(warm):
        g.replay()
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        g.replay()
        b.record()
    torch.cuda.synchronize()
    ms = statistics.median(a.elapsed_time(b) for a, b in ev)
    del g, keep
    return ms * 1e3 / K


def time_loop(call, K, iters):
    """Fallback when capture fails: events around K eager calls (includes launch overhead)."""
    for i in range(K):
        call(i)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        for i in range(K):
            call(i)
        b.record()
    torch.cuda.synchronize()
    return statistics.median(a.elapsed_time(b) for a, b in ev) * 1e3 / K


def time_torch(call, K, iters):
    try:
        return time_graph(call, K, iters), "cuda-graph"
    except Exception as e:
        log(f"    graph capture failed ({err_str(e)[:120]}); timing an eager loop")
        try:
            torch.cuda.synchronize()
        except Exception:
            pass
        return time_loop(call, K, max(20, iters // 4)), "events-loop"


def time_rounds(calls, K, iters, rounds, timer=None):
    """Times every call(i) of calls {name: call} `rounds` times, round after round, the order
    rotated each round (each leads one round in turn: a first timing in a row can run slow).
    timer(call, K, iters) -> (µs, method),
    time_torch by default. Returns {name: [µs a round]}, {name: method}, {name: error}: a call that
    raises is recorded and not timed again."""
    timer = timer or time_torch
    us, meth, err = {k: [] for k in calls}, {}, {}
    names = list(calls)
    for r in range(rounds if names else 0):
        for k in names[r % len(names):] + names[:r % len(names)]:
            if k in err:
                continue
            try:
                t, meth[k] = timer(calls[k], K, iters)
                us[k].append(t)
            except Exception as ex:
                err[k] = err_str(ex)
                log(f"  {k} failed: {err[k][:200]}")
    return us, meth, err


def copy_ceiling(iters):
    """GB/s of a 1 GiB device-to-device copy, counting read + write."""
    src = torch.randn(2 ** 28, device="cuda")  # 1 GiB of float32
    dst = torch.empty_like(src)
    for _ in range(3):
        dst.copy_(src)
    ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(iters)]
    for a, b in ev:
        a.record()
        dst.copy_(src)
        b.record()
    torch.cuda.synchronize()
    ms = statistics.median(a.elapsed_time(b) for a, b in ev)
    del src, dst
    torch.cuda.empty_cache()
    return 2 * 2 ** 30 / (ms * 1e-3) / 1e9


def jax_probe_start():
    """Import jax next to torch in a child first: a crash there must not take the bench down."""
    code = ("import torch; torch.ones(1, device='cuda'); import jax, jax.numpy as jnp; "
            "assert jax.default_backend() in ('gpu', 'cuda'), jax.default_backend(); "
            "jnp.ones(8).sum().block_until_ready(); print(jax.__version__)")
    return subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def jax_probe_finish(proc):
    try:
        out, errout = proc.communicate(timeout=180)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.communicate()
        return "jax probe timed out"
    if proc.returncode != 0:
        tail = [l for l in errout.strip().splitlines() if l.strip()][-1:] or [f"rc={proc.returncode}"]
        return f"jax probe failed: {tail[0][:300]}"
    return None


def jax_import():
    global jax, jnp
    import jax as _jax
    import jax.numpy as _jnp
    if _jax.default_backend() not in ("gpu", "cuda"):  # never time a CPU fallback as a GPU peer
        raise RuntimeError(f"jax backend is {_jax.default_backend()}, not gpu")
    jax, jnp = _jax, _jnp


def time_jax(case, sets, ref, n, trials=3):
    import numpy as np
    fn, names = case.jax
    f = jitted(fn)
    jdt = {"bf16": jnp.bfloat16, "fp16": jnp.float16, "fp32": jnp.float32}[case.dtype]
    # Same values as the torch sets, moved through the host (bf16 -> fp32 -> bf16 is exact).
    jsets = [[jnp.asarray(s[k].float().cpu().numpy(), dtype=jdt if s[k].dtype == case.tdt else jnp.float32)
              for k in names] for s in sets]  # float32 operands (rope's tables) stay float32
    out = jax.block_until_ready(f(*jsets[0]))
    outs = out if isinstance(out, tuple) else (out,)
    err = max_err([torch.from_numpy(np.array(o.astype(jnp.float32))).cuda() for o in outs], ref[:len(outs)])
    for i in range(2 * len(jsets)):
        out = f(*jsets[i % len(jsets)])
    jax.block_until_ready(out)
    per = []
    for _ in range(trials):  # async dispatch: block once after n calls, so this is throughput
        t0 = time.perf_counter()
        for i in range(n):
            out = f(*jsets[i % len(jsets)])
        jax.block_until_ready(out)
        per.append((time.perf_counter() - t0) / n * 1e6)
    del jsets, out
    return statistics.median(per), err


# ----------------------------------------------------------------------------------------------
# One row

def sizing(nbytes, l2):
    """(R, K): R input sets so a set is reused only after > 2x L2 of other traffic; K calls per
    graph, a multiple of R, enough for ~150 µs per replay so the graph launch gap is amortized."""
    R = min(64, max(1, math.ceil(2 * l2 / nbytes)))
    est_us = nbytes / 3e6  # at ~3 TB/s
    return R, min(256, R * math.ceil(max(4, 150 / max(est_us, 1.0)) / R))


def run_case(op, shape, dtype, args, env):
    c = Case(op, shape, dtype, args)
    row = dict(op=op, shape=list(shape), shape_str="x".join(map(str, shape)), dtype=dtype, bytes=c.nbytes,
               fusedk={}, peers={})
    R, K = sizing(c.nbytes, env["l2"])
    row.update(R=R, K=K)
    torch.manual_seed(zlib.crc32(f"{op}{shape}{dtype}".encode()))  # fresh per row, reproducible
    sets = [c.make() for _ in range(R)]
    outs = [c.outs(s) for s in sets]
    ref = [t.clone() for t in as_list(c.ref(sets[0]))]
    row["ref_max_abs"] = max(t.float().abs().max().item() for t in ref)
    tol = REL_TOL[dtype] * row["ref_max_abs"]

    # Check each implementation once (its first call also compiles), then time them all in
    # rotated rounds (time_rounds); per implementation the median of its rounds. --rounds 1 is
    # the sequential order: fusedk, then each peer.
    calls = {}
    if env.get("fusedk_error"):
        row["fusedk"] = {"error": env["fusedk_error"]}
    else:
        try:
            c.fk(sets[0], outs[0])
            e = max_err(c.got(outs[0]), ref)
            row["fusedk"] = dict(err=e, ok=e <= tol)  # NaN counts as not ok
            if not e <= tol:
                log(f"WARNING {op} {row['shape_str']} {dtype}: fusedk max_abs_err {e:.3g} > tol {tol:.3g}")
            calls["fusedk"] = lambda i: c.fk(sets[i % R], outs[i % R])
        except Exception as ex:
            row["fusedk"] = {"error": err_str(ex)}
            log(f"  fusedk failed: {err_str(ex)[:200]}")
    for name, fn in c.peers.items():
        if isinstance(fn, Exception):
            row["peers"][name] = {"error": err_str(fn), "missing": True}
            continue
        try:
            row["peers"][name] = dict(err=max_err(as_list(fn(sets[0])), ref))
            calls[name] = lambda i, fn=fn: fn(sets[i % R])
        except Exception as ex:
            row["peers"][name] = {"error": err_str(ex)}
            log(f"  {name} failed: {err_str(ex)[:200]}")
    rounds, meth, errs = time_rounds(calls, K, args.iters, args.rounds)
    for k, v in rounds.items():
        d = row["fusedk"] if k == "fusedk" else row["peers"][k]
        if k in errs:
            d.clear()
            d["error"] = errs[k]
        elif v:
            d.update(us=statistics.median(v), method=meth[k])
            if len(v) > 1:
                d["rounds_us"] = v

    if c.jax and not args.no_jax:
        if env.get("jax_error"):
            row["peers"]["jax"] = {"error": env["jax_error"], "missing": True}
        else:
            try:
                if jax is None:
                    jax_import()
                us, e = time_jax(c, sets, ref, args.jax_calls)
                row["peers"]["jax"] = dict(us=us, method="jax-wallclock", err=e)
            except Exception as ex:
                row["peers"]["jax"] = {"error": err_str(ex)}
                log(f"  jax failed: {err_str(ex)[:200]}")
                if jax is None:  # import failed: don't retry on every row
                    env["jax_error"] = err_str(ex)
    for lst in (sets, outs, ref):  # free the buffers now (the timing lambdas close over these lists)
        lst.clear()
    torch.cuda.empty_cache()
    finish_row(row, env["ceiling"])
    return row


def finish_row(row, ceiling):
    """Derived columns: best peer, speedup, bandwidth. Pure Python."""
    timed = {k: v["us"] for k, v in row["peers"].items() if v.get("us")}
    best = min(timed, key=timed.get) if timed else None
    fk = row["fusedk"].get("us")
    row["best_peer"] = best
    row["best_peer_us"] = timed[best] if best else None
    row["speedup"] = timed[best] / fk if best and fk else None
    row["fusedk_gbps"] = row["bytes"] / (fk * 1e-6) / 1e9 if fk else None
    row["pct_ceiling"] = 100 * row["fusedk_gbps"] / ceiling if fk and ceiling else None


# ----------------------------------------------------------------------------------------------
# Reports (pure Python + matplotlib; testable without a GPU)

def num(us):
    return f"{us:.2f}" if us < 10 else f"{us:.1f}" if us < 1000 else f"{us:.0f}"


def fmt_us(d):
    if not d:
        return "—"
    if "us" not in d:
        return "n/a" if d.get("missing") else "err"
    return num(d["us"]) + ("*" if d.get("method") == "events-loop" else "") + ("!" if d.get("ok") is False else "")


def peer_columns(rows):
    """Peers that produced a number somewhere (a column of only n/a is noise)."""
    return [p for p in PEERS if any("us" in r["peers"].get(p, {}) for r in rows)]


def markdown(res):
    m, rows = res["meta"], res["rows"]
    cols = peer_columns(rows)
    missing = {}
    for r in rows:
        for p, d in r["peers"].items():
            if p not in cols and "error" in d:
                missing.setdefault(p, d["error"])
    lines = [
        f"# fusedk benchmark — {m.get('gpu', '?')} — {m.get('date', '?')}",
        "",
        f"Copy ceiling {m.get('copy_ceiling_gbps', 0):.0f} GB/s (1 GiB D2D copy, read+write). "
        f"torch {m.get('torch') or '?'}, triton {m.get('triton') or '?'}, jax {m.get('jax') or '—'}, "
        f"liger {m.get('liger') or '—'}, fusedk {m.get('fusedk_version') or '?'}.",
        f"Peers: {', '.join(cols) or 'none'}"
        + (" (missing: " + "; ".join(f"{p}: {e[:80]}" for p, e in missing.items()) + ")" if missing else "") + ".",
        "Method: CUDA events over CUDA-graph replays of K calls cycling R input/output sets "
        "(reuse distance > 2x L2), per-call µs = median replay / K"
        f" ({m.get('iters', '?')} replays)"
        + (f", median of {m['rounds']} rounds timing every implementation in turn, the order rotated each round"
           if (m.get("rounds") or 1) > 1 else ", each implementation timed once, fusedk first")
        + f"; jax = wall clock over {m.get('jax_calls', '?')} back-to-back "
        "jitted calls; * = eager events loop (capture failed); ! = fusedk beyond tolerance. "
        "GB/s = (bytes read once + written once) / fusedk time. rtg_rmsnorm = "
        "residual_tanh_gated_rmsnorm(exact=True).",
    ]
    if m.get("fusedk_error"):
        lines.append(f"**fusedk not importable, peers only:** {m['fusedk_error']}")
    lines += [
        "",
        "| op | shape | dtype | fusedk µs | " + " | ".join(cols) + " | best peer | speedup | GB/s | % ceil |",
        "|" + "---|" * 3 + "---:|" * (1 + len(cols)) + "---|---:|---:|---:|",
    ]
    for r in rows:
        best = f"{r['best_peer']} {num(r['best_peer_us'])}" if r.get("best_peer") else "—"
        cells = [r["op"], r["shape_str"], r["dtype"], fmt_us(r["fusedk"])]
        cells += [fmt_us(r["peers"].get(p)) for p in cols]
        cells += [best, f"{r['speedup']:.2f}x" if r.get("speedup") else "—",
                  f"{r['fusedk_gbps']:.0f}" if r.get("fusedk_gbps") else "—",
                  f"{r['pct_ceiling']:.0f}%" if r.get("pct_ceiling") else "—"]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


COLORS = {"fusedk": "#d62728", "eager": "#7f7f7f", "F.rms_norm": "#bcbd22", "compile": "#1f77b4",
          "liger": "#2ca02c", "jax": "#9467bd"}


def plot(res, path):
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    rows, ceil = res["rows"], res["meta"].get("copy_ceiling_gbps")
    ops = list(dict.fromkeys(r["op"] for r in rows))
    if not ops:
        return
    nmax = max(sum(r["op"] == op for r in rows) for op in ops)
    fig, axes = plt.subplots(len(ops), 1, figsize=(max(9, 1.3 * nmax + 2.5), 3.6 * len(ops)), squeeze=False)
    for ax, op in zip(axes[:, 0], ops):
        rs = [r for r in rows if r["op"] == op]
        impls = ["fusedk"] + peer_columns(rs)
        w = 0.84 / len(impls)
        group_top = [0.0] * len(rs)
        for j, name in enumerate(impls):
            us = [(r["fusedk"] if name == "fusedk" else r["peers"].get(name, {})).get("us") for r in rs]
            gbps = [r["bytes"] / (u * 1e-6) / 1e9 if u else 0 for r, u in zip(rs, us)]
            group_top = [max(a, b) for a, b in zip(group_top, gbps)]
            ax.bar([i + (j - (len(impls) - 1) / 2) * w for i in range(len(rs))], gbps, w, label=name,
                   color=COLORS.get(name))
        for i, r in enumerate(rs):  # speedup vs best peer above each group
            if r.get("speedup"):
                ax.annotate(f"{r['speedup']:.2f}x", (i, group_top[i]), ha="center", va="bottom", fontsize=8,
                            xytext=(0, 2), textcoords="offset points", fontweight="bold")
        if ceil:
            ax.axhline(ceil, ls="--", lw=1, color="black", label="copy ceiling")
        ax.set_ylim(0, max(group_top + [ceil or 0]) * 1.18 or 1)
        ax.set_xticks(range(len(rs)), [f"{r['shape_str']}\n{r['dtype']}" for r in rs], fontsize=8)
        ax.set_xlim(-0.6, nmax - 0.4)  # same bar width in every subplot
        ax.set_ylabel("GB/s")
        ax.set_title(op, fontsize=10, loc="left")
        ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.0, 1.0))
        ax.grid(axis="y", alpha=0.3)
    m = res["meta"]
    fig.suptitle(f"fusedk vs peers, effective GB/s (higher is better; label = speedup vs best peer)\n"
                 f"{m.get('gpu', '?')}, {m.get('date', '?')}", fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110, bbox_inches="tight")
    plt.close(fig)


def save(out_dir, name, report, md):
    """out_dir/name.json (the report) and out_dir/name.md, and the Markdown printed: what a
    bench script leaves behind."""
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, name + ".json"), "w") as fh:
        json.dump(report, fh, indent=1)
    with open(os.path.join(out_dir, name + ".md"), "w") as fh:
        fh.write(md)
    print(md)


def write_reports(res, out_dir, png=True):
    os.makedirs(out_dir, exist_ok=True)
    with open(os.path.join(out_dir, "bench.json"), "w") as f:
        json.dump(res, f, indent=1, default=str)
    md = markdown(res)
    with open(os.path.join(out_dir, "bench.md"), "w") as f:
        f.write(md)
    if png:
        try:
            plot(res, os.path.join(out_dir, "bench.png"))
        except Exception as e:
            log(f"plot failed: {err_str(e)}")
    return md


# ----------------------------------------------------------------------------------------------

def versions():
    from importlib import metadata
    v = {"python": platform.python_version(), "torch": torch.__version__, "torch_cuda": torch.version.cuda}
    for key, dist in (("triton", "triton"), ("jax", "jax"), ("jaxlib", "jaxlib"), ("liger", "liger-kernel"),
                      ("numpy", "numpy")):
        try:
            v[key] = metadata.version(dist)
        except Exception:
            v[key] = None
    try:
        q = subprocess.run(["nvidia-smi", "--query-gpu=driver_version,clocks.max.sm,clocks.max.mem",
                            "--format=csv,noheader"], capture_output=True, text=True, timeout=20)
        v["nvidia_smi"] = q.stdout.strip().splitlines()[0] if q.returncode == 0 else None
    except Exception:
        v["nvidia_smi"] = None
    try:
        here = os.path.dirname(os.path.abspath(__file__))
        q = subprocess.run(["git", "-C", here, "rev-parse", "--short", "HEAD"], capture_output=True, text=True)
        d = subprocess.run(["git", "-C", here, "status", "--porcelain", "--untracked-files=no"], capture_output=True,
                           text=True)
        # a tree with changes (the GPU machine's copy of an uncommitted one) is not that commit
        v["git"] = (q.stdout.strip() + ("+changes" if d.stdout.strip() else "")) or None
    except Exception:
        v["git"] = None
    return v


def main():
    global torch, F, fusedk
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "results"))
    ap.add_argument("--quick", action="store_true", help="few shapes and replays (smoke test)")
    ap.add_argument("--ops", default=",".join(OPS), help="comma list of " + ", ".join(OPS))
    ap.add_argument("--iters", type=int, default=None, help="graph replays timed per implementation")
    ap.add_argument("--rounds", type=int, default=None,
                    help="timings per implementation and row, in rotating order; the median is reported "
                         "(default 3, --quick 1)")
    ap.add_argument("--jax-calls", type=int, default=None, help="back-to-back calls per JAX timing")
    ap.add_argument("--no-jax", action="store_true")
    ap.add_argument("--no-compile", action="store_true")
    ap.add_argument("--no-liger", action="store_true")
    ap.add_argument("--peers-only", action="store_true", help="run even if fusedk cannot be imported")
    args = ap.parse_args()
    args.iters = args.iters or (30 if args.quick else 200)
    args.rounds = args.rounds or (1 if args.quick else 3)
    if args.rounds < 1:
        ap.error("--rounds wants a count >= 1")
    args.jax_calls = args.jax_calls or (50 if args.quick else 200)
    want = [ALIASES.get(o.strip(), o.strip()) for o in args.ops.split(",") if o.strip()]
    bad = [o for o in want if o not in OPS]
    if bad:
        ap.error(f"unknown ops {bad}; choose from {', '.join(OPS)}")
    t_start = time.time()
    probe = None if args.no_jax else jax_probe_start()

    try:
        import torch as _torch
        import torch.nn.functional as _F
    except ImportError:
        sys.exit("bench.py needs PyTorch with CUDA (the peers and the timing run through torch)")
    torch, F = _torch, _F
    if not torch.cuda.is_available():
        sys.exit("bench.py needs a CUDA GPU and PyTorch with CUDA (the peers and the timing run through torch)")
    torch.set_grad_enabled(False)
    import torch._dynamo
    for name, val in (("cache_size_limit", 256), ("recompile_limit", 256),
                      ("accumulated_cache_size_limit", 4096), ("accumulated_recompile_limit", 4096)):
        if hasattr(torch._dynamo.config, name):  # one compiled fn per op serves every shape/dtype
            setattr(torch._dynamo.config, name, val)

    env = {}
    meta = {"date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
            "argv": sys.argv[1:], "quick": args.quick, "iters": args.iters, "rounds": args.rounds, "jax_calls": args.jax_calls}
    try:
        import fusedk as _fk
        fusedk = _fk
        meta["fusedk_version"] = getattr(fusedk, "__version__", None)
        try:
            meta["kernel_info"] = fusedk.kernel_info()
            meta["fusedk_version"] = meta["fusedk_version"] or meta["kernel_info"].get("version")
        except Exception as e:
            meta["kernel_info"] = {"error": err_str(e)}
    except Exception as e:
        if not args.peers_only:
            sys.exit(f"bench.py: cannot import fusedk ({err_str(e)}). Run from the repository with "
                     "PYTHONPATH=bindings/python after building into build/ (or set FUSEDK_LIBRARY and "
                     "FUSEDK_HEADER), or pass --peers-only to time the peers alone.")
        env["fusedk_error"] = meta["fusedk_error"] = err_str(e)
        log(f"fusedk import failed, timing peers only (--peers-only): {env['fusedk_error']}")

    prop = torch.cuda.get_device_properties(0)
    env["l2"] = getattr(prop, "L2_cache_size", 0) or 50 * 2 ** 20
    meta.update(gpu=prop.name, sm_count=prop.multi_processor_count, l2_bytes=env["l2"],
                gpu_mem_bytes=prop.total_memory, **versions())
    if probe:
        env["jax_error"] = jax_probe_finish(probe)
        if env["jax_error"]:
            log(env["jax_error"])
    meta["jax_error"] = env.get("jax_error")
    if args.no_jax:
        meta["jax"] = None
    env["ceiling"] = meta["copy_ceiling_gbps"] = copy_ceiling(20 if args.quick else 50)
    log(f"{prop.name}: L2 {env['l2'] / 2 ** 20:.0f} MiB, copy ceiling {env['ceiling']:.0f} GB/s "
        f"({time.time() - t_start:.0f} s)")

    res = {"meta": meta, "rows": []}
    for op, shape, dtype in [p for p in plan(args.quick) if p[0] in want]:
        t0 = time.time()
        try:
            row = run_case(op, shape, dtype, args, env)
        except Exception as e:  # e.g. out of memory building inputs: keep the rest of the run
            row = dict(op=op, shape=list(shape), shape_str="x".join(map(str, shape)), dtype=dtype, bytes=0,
                       fusedk={"error": err_str(e)}, peers={})
            finish_row(row, env["ceiling"])
            torch.cuda.empty_cache()
        row["wall_s"] = round(time.time() - t0, 1)
        res["rows"].append(row)
        cells = " ".join(f"{k}={fmt_us(v)}" for k, v in [("fusedk", row["fusedk"])] + list(row["peers"].items()))
        log(f"{op:12s} {row['shape_str']:>14s} {dtype}  {cells}  [{time.time() - t0:.1f} s]")
        meta["elapsed_s"] = round(time.time() - t_start, 1)
        write_reports(res, args.out, png=False)  # partial results survive a crash later on
    meta["elapsed_s"] = round(time.time() - t_start, 1)
    md = write_reports(res, args.out)
    log(f"wrote {args.out}/bench.{{json,md,png}} in {meta['elapsed_s']:.0f} s")
    print(md, flush=True)


if __name__ == "__main__":
    main()
