"""Independent float64 NumPy oracles of every op (the semantics of fusedk.h), and the
tolerance shared by the tests."""
import ml_dtypes
import numpy as np

BF16 = np.dtype(ml_dtypes.bfloat16)
DTYPES = [np.dtype(np.float32), np.dtype(np.float16), BF16]
# eps_T: one unit in the last place relative to the value (2^-(p-1)); float32 outputs of the
# double-accumulating references differ from float64 only by their final rounding
EPS = {np.dtype(np.float32): 2.0 ** -23, np.dtype(np.float16): 2.0 ** -10, BF16: 2.0 ** -7}


def f64(a):
    return None if a is None else np.asarray(a).astype(np.float64)


def bits(a):
    """a's raw bits (unsigned integers of its item size), for bitwise comparisons."""
    a = np.asarray(a)
    return a.view(f"u{a.dtype.itemsize}")


def wide(t):
    """t twice along its last dim: twice the size, and [..., ::2] of it t's values at stride 2."""
    return np.concatenate([t, t], -1)


def rmsnorm(x, weight=None, eps=1e-6, residual=None):
    r = f64(x) + (0 if residual is None else f64(residual))
    y = r / np.sqrt((r * r).mean(-1, keepdims=True) + np.float64(np.float32(eps)))
    return (y if weight is None else y * f64(weight)), r


def layernorm(x, weight=None, bias=None, eps=1e-5):
    x = f64(x)
    mu = x.mean(-1, keepdims=True)
    y = (x - mu) / np.sqrt(((x - mu) ** 2).mean(-1, keepdims=True) + np.float64(np.float32(eps)))
    if weight is not None:
        y = y * f64(weight)
    return y if bias is None else y + f64(bias)


def adaln(x, scale, shift, norm="layer", eps=1e-6, weight=None, bias=None):
    n = layernorm(x, weight, bias, eps) if norm == "layer" else rmsnorm(x, weight, eps)[0]
    return n * (1 + f64(scale)[:, None, :]) + f64(shift)[:, None, :]


def mochi(x, x_res, gate, eps=1e-6):
    """exact=False semantics: everything in float64, one rounding."""
    xr = f64(x_res)
    n = xr / np.sqrt((xr * xr).mean(-1, keepdims=True) + np.float64(np.float32(eps)))
    return f64(x) + n * np.tanh(f64(gate))[:, None, :]


def mochi_exact(x, x_res, gate, eps=1e-6):
    """exact=True: the PyTorch formula's rounding points, written in NumPy float32."""
    dt = np.asarray(x).dtype
    xr = np.asarray(x_res).astype(np.float32)
    ms = (xr.astype(np.float64) ** 2).mean(-1, keepdims=True).astype(np.float32)
    rstd = (1.0 / np.sqrt((ms + np.float32(eps)).astype(np.float64))).astype(np.float32)
    tg = np.tanh(f64(gate)).astype(dt).astype(np.float32)[:, None, :]
    n = ((xr * rstd).astype(np.float32) * tg).astype(np.float32).astype(dt)
    return (np.asarray(x).astype(np.float32) + n.astype(np.float32)).astype(dt)


def act(x, kind="gelu"):
    from math import erf
    x = f64(x)
    if kind == "gelu":
        return 0.5 * x * (1 + np.vectorize(erf, otypes=[np.float64])(x / np.sqrt(2.0)))
    if kind == "gelu_tanh":
        return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x ** 3)))
    if kind == "silu":
        return x / (1 + np.exp(-x))
    return np.where(np.isnan(x), x, np.maximum(x, 0))


def silu_fma(a, b, c):
    return act(f64(a) + f64(b) * f64(c), "silu")


def gated_residual(x, y, gate):
    return f64(x) + f64(gate)[:, None, :] * f64(y)


def glu(x, kind="silu", act_half="first"):
    a, b = np.split(f64(x), 2, axis=-1)
    return act(a, kind) * b if act_half == "first" else a * act(b, kind)


def glu_pair(value, gate, kind="silu"):
    return f64(value) * act(gate, kind)


def assert_close(got, want, dtype, aux=None, what="", eps=None, atol=1e-6, nan_ok=True):
    """|got - want| <= eps_T * (|want| + aux) + atol (atol: a number or an array like want):
    within one unit in the last place of the output dtype (aux adds terms whose own rounding can
    show, e.g. |x| for Mochi). nan_ok: a NaN where the reference has one passes."""
    got, want = f64(got), f64(want)
    tol = (eps or EPS)[np.dtype(dtype)] * (np.abs(want) + (0 if aux is None else np.abs(f64(aux)))) + atol
    bad = ~((np.abs(got - want) <= tol) | (got == want) | (nan_ok & np.isnan(got) & np.isnan(want)))
    if bad.any():
        idx = np.argwhere(bad)[:5]
        rows = [f"{tuple(i)}: got {got[tuple(i)]!r} want {want[tuple(i)]!r} tol {tol[tuple(i)]!r}" for i in idx]
        raise AssertionError(f"{what}: {int(bad.sum())} of {bad.size} elements off\n  " + "\n  ".join(rows))


# GPU kernels against the CPU reference (float32 math, another summation order): the tolerance of
# the C GPU suite and the README, eps_T = 2^-7 bf16, 2^-10 f16, 1e-5 f32, plus 1e-5 absolute
GPU_EPS = {np.dtype(np.float32): 1e-5, np.dtype(np.float16): 2.0 ** -10, BF16: 2.0 ** -7}


def assert_close_gpu(got, want, dtype, aux=None, what=""):
    assert_close(got, want, dtype, aux, what, eps=GPU_EPS, atol=1e-5)


# --- [rope] and [sampling] -----------------------------------------------------------------
def _rope_table(t):
    """A half table [S, R/2] | [S, H, R/2] | [B, S, H, R/2] as [B|1, S, H|1, R/2] float64."""
    t = f64(t)
    if t.ndim == 2:
        return t[None, :, None, :]
    if t.ndim == 3:
        return t[None]
    return t


def rope(x, cos, sin, style="interleaved", rotary_dim=None):
    """Rotary embedding of x [B, S, H, Dh] with half tables cos/sin (angle per channel pair):
    "interleaved" rotates the pairs (2i, 2i+1) (diffusers' apply_rotary_emb, Flux, LTX, Mochi),
    "half" the pairs (i, i + R/2) (GPT-NeoX / Llama rotate_half). Channels >= R pass through."""
    x = f64(x)
    r = x.shape[-1] if rotary_dim is None else rotary_dim
    c, s = _rope_table(cos), _rope_table(sin)
    assert c.shape[-1] == r // 2 and s.shape == c.shape, (c.shape, s.shape, r)
    out = x.copy()
    if style == "interleaved":
        a, b = x[..., 0:r:2], x[..., 1:r:2]
        out[..., 0:r:2] = a * c - b * s
        out[..., 1:r:2] = b * c + a * s
    elif style == "half":
        a, b = x[..., :r // 2], x[..., r // 2:r]
        out[..., :r // 2] = a * c - b * s
        out[..., r // 2:r] = b * c + a * s
    else:
        raise ValueError(style)
    return out


def pair_aux(x, style, rotary_dim=None, keep_rest=False):
    """|x| + |partner| per rotated channel (|cos|, |sin| <= 1): the terms of x c -+ x' s whose float32
    rounding can show when they cancel (the aux of assert_close_gpu). Past rotary_dim: 0 (rope
    copies those channels), or with keep_rest |x| (qk_norm_rope's x, the normalized values)."""
    x = np.abs(f64(x))
    r = x.shape[-1] if rotary_dim is None else rotary_dim
    aux = x.copy() if keep_rest else np.zeros_like(x)
    if style == "interleaved":
        aux[..., 0:r:2] = aux[..., 1:r:2] = x[..., 0:r:2] + x[..., 1:r:2]
    else:
        aux[..., :r // 2] = aux[..., r // 2:r] = x[..., :r // 2] + x[..., r // 2:r]
    return aux


def qk_norm(x, weight=None, eps=1e-6, norm="head"):
    """RMSNorm of x [B, S, H, Dh] before the rotation: "head" over each head's Dh channels (weight
    [Dh]), "full" over the token's whole H*Dh row (weight [H*Dh], head h its slice h*Dh..), "none"
    x itself (no weight)."""
    x = f64(x)
    B, S, H, Dh = x.shape
    if norm == "head":
        return rmsnorm(x, weight, eps)[0]
    if norm == "full":
        return rmsnorm(x.reshape(B, S, H * Dh), weight, eps)[0].reshape(x.shape)
    if norm == "none":
        assert weight is None
        return x
    raise ValueError(norm)


def qk_norm_rope(q, k, v, cos, sin, q_weight=None, k_weight=None, eps=1e-6, norm="head", style="interleaved",
                 layout="bhsd", rotary_dim=None):
    """q [B, S, Hq, Dh], k and v [B, S, Hk, Dh] (v may be None) -> (q', k', v') or (q', k'):
    q' = rope(qk_norm(q) * q_weight), k' likewise, v' = v, each in `layout` ("bhsd": transposed to
    [B, H, S, Dh], "bshd": as they are)."""
    outs = [rope(qk_norm(q, q_weight, eps, norm), cos, sin, style, rotary_dim),
            rope(qk_norm(k, k_weight, eps, norm), cos, sin, style, rotary_dim)]
    if v is not None:
        outs.append(f64(v))
    if layout == "bhsd":
        outs = [o.transpose(0, 2, 1, 3) for o in outs]
    elif layout != "bshd":
        raise ValueError(layout)
    return tuple(outs)


def rope_table_1d(positions, dim, theta=10000.0):
    """(cos, sin) [S, dim/2]: angle[s, i] = pos[s] / theta^(2i/dim) (diffusers'
    get_1d_rotary_pos_embed before its repeat_interleave)."""
    pos = f64(positions).reshape(-1)
    inv = 1.0 / np.float64(theta) ** (np.arange(dim // 2, dtype=np.float64) * 2.0 / dim)
    ang = pos[:, None] * inv[None, :]
    return np.cos(ang), np.sin(ang)


def rope_table_axes(ids, axes_dim=(16, 56, 56), theta=10000.0):
    """Flux: one 1-D table per axis of ids [S, n_axes], axis a over axes_dim[a]/2 columns,
    concatenated -> [S, sum(axes_dim)/2]."""
    ids = f64(ids)
    parts = [rope_table_1d(ids[:, a], d, theta) for a, d in enumerate(axes_dim)]
    return np.concatenate([p[0] for p in parts], -1), np.concatenate([p[1] for p in parts], -1)


def rope_table_ltx(coords, dim, theta=10000.0):
    """LTX-Video: n = dim // 6 frequencies f_k = theta^(k/(n-1)) * pi/2 (f_0 = pi/2 when n == 1),
    angle = f_k * (2 * coords[s, a] - 1); half-table columns: (dim % 6) / 2 identity columns
    (cos 1, sin 0), then column 3k + a (the three axes interleaved per frequency) -> [S, dim/2]."""
    coords = f64(coords)
    n, pad = dim // 6, (dim % 6) // 2
    freqs = np.float64(theta) ** np.linspace(0.0, 1.0, n) * (np.pi / 2)  # linspace(0, 1, 1) == [0.]
    ang = freqs[None, :, None] * (2.0 * coords[:, None, :] - 1.0)  # [S, n, 3]
    ang = ang.reshape(coords.shape[0], 3 * n)
    ones, zeros = np.ones((coords.shape[0], pad)), np.zeros((coords.shape[0], pad))
    return np.concatenate([ones, np.cos(ang)], -1), np.concatenate([zeros, np.sin(ang)], -1)


def rope_table_mixed(pos, freqs):
    """Mochi: angle[s, h, f] = sum_a pos[s, a] * freqs[a, h, f] -> (cos, sin) [S, H, F]."""
    ang = np.einsum("sa,ahf->shf", f64(pos), f64(freqs))
    return np.cos(ang), np.sin(ang)


def _attr(v):
    """An attribute as the C op sees it: a float32, widened."""
    return None if v is None else np.float64(np.float32(v))


def diffusion_step(x, cond, uncond=None, guidance=1.0, sampler="euler", sigma=0.0, sigma_next=0.0, alpha_bar=1.0,
                   alpha_bar_prev=1.0, clamp_x0=None, prev=None, blend=1.0):
    """One sampler step on the model output with classifier-free guidance:
    m = uncond + guidance * (cond - uncond) (or cond); euler: x + (sigma_next - sigma) * m;
    ddim (eta 0, epsilon prediction): x0 = (x - sqrt(1 - ab) * m) / sqrt(ab), clipped to
    [-clamp_x0, clamp_x0], x' = sqrt(ab_prev) * x0 + sqrt(1 - ab_prev) * m; then, with prev,
    x' = blend * x' + (1 - blend) * prev."""
    x, c = f64(x), f64(cond)
    m = c if uncond is None else f64(uncond) + _attr(guidance) * (c - f64(uncond))
    if sampler == "euler":
        y = x + (_attr(sigma_next) - _attr(sigma)) * m
    elif sampler == "ddim":
        ab, abp = _attr(alpha_bar), _attr(alpha_bar_prev)
        x0 = (x - np.sqrt(1.0 - ab) * m) / np.sqrt(ab)
        if clamp_x0 is not None:
            x0 = np.clip(x0, -_attr(clamp_x0), _attr(clamp_x0))
        y = np.sqrt(abp) * x0 + np.sqrt(1.0 - abp) * m
    else:
        raise ValueError(sampler)
    if prev is not None:
        b = _attr(blend)
        y = b * y + (1.0 - b) * f64(prev)
    return y


def step_aux(x, cond, uncond=None, guidance=1.0, sampler="euler", sigma=0.0, sigma_next=0.0, alpha_bar=1.0,
             alpha_bar_prev=1.0, clamp_x0=None, prev=None, blend=1.0):
    """The oracle over |terms|: every product and sum with its operands' magnitudes, the bound on
    what cancellation can let another summation order (or float32 on the GPU) show."""
    a, at = (lambda t: np.abs(f64(t))), (lambda v: abs(_attr(v)))
    m = a(cond) if uncond is None else a(uncond) + at(guidance) * (a(cond) + a(uncond))
    if sampler == "euler":
        y = a(x) + (at(sigma_next) + at(sigma)) * m
    else:
        ab, abp = _attr(alpha_bar), _attr(alpha_bar_prev)
        y = np.sqrt(abp) * (a(x) + np.sqrt(1 - ab) * m) / np.sqrt(ab) + np.sqrt(1 - abp) * m
    if prev is not None:
        y = at(blend) * y + abs(1 - _attr(blend)) * a(prev)
    return y


# --- [attention] ---------------------------------------------------------------------------
def attention(q, k, v, scale=None, causal=False, kv_len=None):
    """(out, lse) in float64: q [B, Sq, Hq, D], k, v [B, Sk, Hkv, D]; masked keys get -inf scores;
    a row with none visible: 0 and -inf."""
    q, k, v = f64(q), f64(k), f64(v)
    B, Sq, Hq, D = q.shape
    Sk, Hkv = k.shape[1], k.shape[2]
    scale = np.float64(np.float32(1.0 / np.sqrt(D) if scale is None else scale))
    kk, vv = np.repeat(k, Hq // Hkv, axis=2), np.repeat(v, Hq // Hkv, axis=2)
    s = np.einsum("bihd,bjhd->bhij", q, kk) * scale
    seen = np.ones((B, 1, Sq, Sk), bool)
    if causal:
        seen &= np.arange(Sk)[None, :] <= np.arange(Sq)[:, None] + Sk - Sq
    if kv_len is not None:
        seen &= np.arange(Sk)[None, None, None, :] < np.asarray(kv_len)[:, None, None, None]
    s = np.where(seen, s, -np.inf)
    m = s.max(-1, keepdims=True, initial=-np.inf)  # initial: Sk = 0
    any_seen = seen.any(-1, keepdims=True)
    p = np.where(seen, np.exp(s - np.where(any_seen, m, 0.0)), 0.0)
    l = p.sum(-1, keepdims=True)
    out = np.einsum("bhij,bjhd->bihd", p / np.where(any_seen, l, 1.0), vv)
    lse = np.where(any_seen, m + np.log(np.where(any_seen, l, 1.0)), -np.inf)[..., 0]
    return out, lse


# --- the frameworks the GPU tests run through ------------------------------------------------
def quantize_rows(x):
    """rows of x ([..., D], float32) as int8 and a float32 scale a row ([..., 1]), fusedk.h's rule"""
    amax = np.abs(x).max(-1, keepdims=True)
    amax = np.where(np.isnan(x).any(-1, keepdims=True), np.float32(np.nan), amax)
    with np.errstate(divide="ignore", invalid="ignore", over="ignore"):
        c = np.float32(127)
        inv = np.where((amax > 0) & np.isfinite(c / amax), c / amax, np.float32(0)).astype(np.float32)
        r = np.rint(x * inv)
    return np.clip(np.nan_to_num(r, nan=0.0), -127, 127).astype(np.int8), (amax / c).astype(np.float32)


def torch_cuda():
    """(torch, True) where torch, a CUDA device and fusedk's GPU half are all there, else (torch
    or None, False): what the torch GPU tests skip by"""
    import fusedk
    try:
        import torch
    except ImportError:  # pragma: no cover
        return None, False
    return torch, torch.cuda.is_available() and bool(fusedk.kernel_info()["cuda"].get("devices"))


def gpu_frameworks():
    """(name, to_device, to_host, broadcast_to) per framework with a CUDA device."""
    import fusedk
    out = []
    try:
        import torch
        if torch.cuda.is_available() and fusedk.kernel_info()["cuda"].get("devices"):
            out.append(("torch", lambda a: torch.from_numpy(np.ascontiguousarray(a).view(np.uint16)).cuda().view(
                torch.bfloat16) if a.dtype == BF16 else torch.from_numpy(np.ascontiguousarray(a)).cuda(),
                lambda t: t.float().cpu().numpy() if t.dtype == torch.bfloat16 else t.cpu().numpy(),
                lambda t, shape: t.expand(shape)))
    except ImportError:
        pass
    try:
        import cupy
        if fusedk.kernel_info()["cuda"].get("devices"):
            out.append(("cupy", lambda a: None if a.dtype == BF16 else cupy.asarray(a), cupy.asnumpy,
                        cupy.broadcast_to))
    except Exception:  # noqa: BLE001 - no CuPy, or no device for it
        pass
    return out


def np_of(t):
    """A torch tensor on the host as NumPy (bfloat16 as ml_dtypes' bfloat16, bit for bit)."""
    import torch
    t = t.detach().cpu()
    return t.view(torch.uint16).numpy().view(BF16) if t.dtype == torch.bfloat16 else t.numpy()


def tables(shape):
    """float32 (cos, sin) of random angles, any table shape [..., R/2] (rope's tests)."""
    ang = np.random.default_rng().uniform(-4.0, 4.0, shape)
    return np.cos(ang).astype(np.float32), np.sin(ang).astype(np.float32)


def table_shape(kind, B, S, H, half):
    return {"SR": (S, half), "SHR": (S, H, half), "S1R": (S, 1, half), "BSHR": (B, S, H, half),
            "BS1R": (B, S, 1, half)}[kind]


def table_views(B, S, H, half):
    """{what: view} of an [S, R/2] table as the broadcast and strided shapes rope accepts."""
    return {
        "[S,H,R/2] stride 0 over H": lambda t: np.broadcast_to(t[:, None, :], (S, H, half)),
        "[B,S,H,R/2] stride 0 over B and H": lambda t: np.broadcast_to(t[None, :, None, :], (B, S, H, half)),
        "[B,S,1,R/2] stride 0 over B": lambda t: np.broadcast_to(t[None, :, None, :], (B, S, 1, half)),
        "[S,R/2] strided rows": lambda t: wide(t)[:, :half],
    }


# --- [linear] ------------------------------------------------------------------------------
def linear(x, w, bias=None, act_kind="none", dtype=None):
    """(y, z): z = x w^T + bias, y = act(z) in float64; GELU (erf) and SILU see z rounded to
    dtype first (fusedk.h: they run as the GEMM, then a pass, as the unfused chain does)."""
    z = f64(x) @ f64(w).T + (0 if bias is None else f64(bias))
    if act_kind == "none":
        return z, z
    zin = z.astype(dtype).astype(np.float64) if dtype is not None and act_kind in ("gelu", "silu") else z
    return act(zin, act_kind), z


def linear_lowrank(x, w, a, b, scaling=1.0, bias=None, codes=None, act_kind="none", dtype=None, ids=None):
    """(y, S1, Sh) in float64: y = act(x w^T + bias + sum over adapters q of ((x a_q^T) codes) (scaling
    b_q)^T) (a [r, K] and b [N, r], or [A, r, K] and [A, N, r]; with ids [M], row m takes adapter
    ids[m] alone, none outside 0..A-1); GELU and SILU see z rounded to dtype first, as linear's; S1
    the same over absolute values; Sh = |h| |scaling b|^T, what h's and scaling b's roundings to
    the dtype (one each) can move"""
    s = np.float64(np.float32(scaling))
    a3, b3 = (f64(a)[None], f64(b)[None]) if np.ndim(a) == 2 else (f64(a), f64(b))
    z, _ = linear(x, w, bias)
    s1 = np.abs(f64(x)) @ np.abs(f64(w)).T + (0 if bias is None else np.abs(f64(bias)))
    sh = np.zeros_like(z)
    for q in range(a3.shape[0]):
        h, ha = f64(x) @ a3[q].T, np.abs(f64(x)) @ np.abs(a3[q]).T
        if codes is not None:
            h, ha = h * f64(codes), ha * np.abs(f64(codes))
        if ids is not None:
            on = (np.asarray(ids).reshape(h.shape[:-1]) == q)[..., None]
            h, ha = h * on, ha * on
        z = z + h @ (s * b3[q]).T
        s1 = s1 + ha @ np.abs(s * b3[q]).T
        sh = sh + np.abs(h) @ np.abs(s * b3[q]).T
    if act_kind == "none":
        return z, s1, sh
    zin = z.astype(dtype).astype(np.float64) if dtype is not None and act_kind in ("gelu", "silu") else z
    return act(zin, act_kind), s1, sh


def gemm_close(got, want, dtype, s1, what, extra=0.0, gpu=False):
    """The reference (double accumulation, one rounding) against the oracle: |got - want| <=
    eps_T |want| + 2^-40 S1 + extra + 1e-7 (float16 subnormals); S1 = the sum of |terms|. gpu:
    float32 accumulation against the reference, one GPU ulp (GPU_EPS) + 2^-19 S1 + extra +
    1e-6, as tests/test_gpu.c. No NaN passes."""
    atol = (2.0 ** -19 if gpu else 2.0 ** -40) * s1 + extra + (1e-6 if gpu else 1e-7)
    assert_close(got, want, dtype, what=what, eps=GPU_EPS if gpu else None, atol=atol, nan_ok=False)


def act_grad(z, kind):
    from math import erf
    z = f64(z)
    if kind == "gelu":
        return 0.5 * (1 + np.vectorize(erf, otypes=[np.float64])(z / np.sqrt(2.0))) + z * np.exp(-0.5 * z * z) / np.sqrt(2 * np.pi)
    if kind == "gelu_tanh":
        c = np.sqrt(2 / np.pi)
        t = np.tanh(c * (z + 0.044715 * z ** 3))
        return 0.5 * (1 + t) + 0.5 * z * (1 - t * t) * c * (1 + 3 * 0.044715 * z * z)
    if kind == "silu":
        s = 1 / (1 + np.exp(-z))
        return s * (1 + z * (1 - s))
    if kind == "relu":
        return (z > 0).astype(np.float64)
    return np.ones_like(z)


def linear_backward(dy, x, w, aux=None, act_kind="none", dtype=None):
    """(dx, dw, db) in float64, dz = dy * act'(aux) rounded to dtype (as fusedk.h keeps it)."""
    dz = f64(dy) if act_kind == "none" else f64(dy) * act_grad(aux, act_kind)
    if act_kind != "none" and dtype is not None:
        dz = dz.astype(dtype).astype(np.float64)
    M, K, N = int(np.prod(np.shape(x)[:-1])), x.shape[-1], w.shape[0]  # M explicit: K may be 0
    dz2, x2 = dz.reshape(M, N), f64(x).reshape(M, K)
    return (dz @ f64(w)).reshape(np.shape(x)), dz2.T @ x2, dz2.sum(0)


# --- [lowrank] -----------------------------------------------------------------------------
def lowrank_update(x, v, u_t, codes=None, scaling=1.0, y=None, beta=1.0):
    """(out, S1) in float64: out = beta y + scaling ((x v) codes) u_t (y absent or beta 0: the
    update alone, y not read); S1 the same over absolute values, the bound of a summation's error"""
    s, b = np.float64(np.float32(scaling)), np.float64(np.float32(beta))
    h, ha = (f64(x) @ f64(v)) * s, (np.abs(f64(x)) @ np.abs(f64(v))) * abs(s)
    if codes is not None:
        h, ha = h * f64(codes), ha * np.abs(f64(codes))
    out, s1 = h @ f64(u_t), ha @ np.abs(f64(u_t))
    if y is not None and b != 0:
        out, s1 = out + b * f64(y), s1 + abs(b) * np.abs(f64(y))
    return out, s1


def lowrank_grad(dy, x, ps, qs, codes=None, ids=None, scaling=1.0, w=None, aux=None, act_kind="none", dtype=None):
    """The low-rank backward in float64 (fusedk.h's [lowrank] formulas): per adapter q, h_q = x P_q,
    g_q = h_q codes (0 on rows whose id is not q), dg_q = dz Q_q; returns dx = sum_q (dg_q codes)
    P_q^T (+ dz w), [dP_q = x^T (dg_q codes)], [dQ_q = scaling dz^T g_q] ([N, r] each), dcodes =
    sum_q dg_q h_q, dbias = dz summed over rows. ps: P_q [K, r] (v, or a_q^T); qs: Q_q [N, r]
    (scaling u_t^T, or w_cat's scaling b_q columns); dz = dy act'(aux) rounded to dtype."""
    s = np.float64(np.float32(scaling))
    K, N = np.shape(x)[-1], np.shape(dy)[-1]
    M = int(np.prod(np.shape(x)[:-1]))
    dz = f64(dy).reshape(M, N)
    if act_kind != "none":
        dz = dz * act_grad(f64(aux).reshape(M, N), act_kind)
        if dtype is not None:
            dz = dz.astype(dtype).astype(np.float64)
    x2 = f64(x).reshape(M, K)
    c = np.ones((M, ps[0].shape[1])) if codes is None else f64(codes).reshape(M, -1)
    dx, dps, dqs, dc = np.zeros((M, K)), [], [], np.zeros_like(c)
    for q, (P, Q) in enumerate(zip(ps, qs)):
        on = np.ones((M, 1)) if ids is None else (np.asarray(ids).reshape(M) == q)[:, None].astype(np.float64)
        h = (x2 @ f64(P)) * on
        dg = (dz @ f64(Q)) * on
        dh = dg * c
        dx += dh @ f64(P).T
        dps.append(x2.T @ dh)
        dqs.append(s * dz.T @ (h * c))
        dc += dg * h
    if w is not None:
        dx += dz @ f64(w)
    return dx.reshape(np.shape(x)), dps, dqs, dc.reshape(np.shape(x)[:-1] + (-1,)), dz.sum(0)


# --- [conv] --------------------------------------------------------------------------------
def conv(x, w, bias=None, residual=None, stride=1, pad=0, stride_t=1, pad_t=0, pad_t_back=0, replicate=False,
         act_kind="none", pad_replicate=False, upsample=1):
    """fusedk_conv in float64: the padded input sliced once a tap, [N, To, Ho, Wo, Ci] @ w's tap"""
    x, w = f64(x), f64(w)
    video = x.ndim == 5
    if not video:
        x, w = x[:, None], w[:, None]
    x = x.repeat(upsample, axis=2).repeat(upsample, axis=3)  # nearest-neighbour upsampling of H and W
    T, (Co, kt, kh, kw, _) = x.shape[1], w.shape
    if replicate:
        x = np.concatenate([x[:, :1]] * pad_t + [x] + [x[:, -1:]] * pad_t_back, axis=1)
    else:
        x = np.pad(x, ((0, 0), (pad_t, pad_t_back), (0, 0), (0, 0), (0, 0)))
    x = np.pad(x, ((0, 0), (0, 0), (pad, pad), (pad, pad), (0, 0)), mode="edge" if pad_replicate else "constant")
    To, Ho, Wo = ((x.shape[1] - kt) // stride_t + 1, (x.shape[2] - kh) // stride + 1, (x.shape[3] - kw) // stride + 1)
    out = np.zeros((x.shape[0], To, Ho, Wo, Co))
    for i in range(kt):
        for j in range(kh):
            for k in range(kw):
                p = x[:, i:i + stride_t * (To - 1) + 1:stride_t, j:j + stride * (Ho - 1) + 1:stride,
                      k:k + stride * (Wo - 1) + 1:stride]
                out += p @ w[:, i, j, k].T
    out = out + (0 if bias is None else f64(bias))
    if act_kind != "none":
        out = act(out, act_kind)
    out = out + (0 if residual is None else f64(residual).reshape(out.shape))
    return out if video else out[:, 0]


def fold_batchnorm(w, bias, gamma, beta, mean, var, eps=1e-5):
    s = (1.0 if gamma is None else f64(gamma)) / np.sqrt(f64(var) + np.float64(np.float32(eps)))
    w = f64(w) * s.reshape((-1,) + (1,) * (np.ndim(w) - 1))
    b = ((0 if bias is None else f64(bias)) - f64(mean)) * s + (0 if beta is None else f64(beta))
    return w, b


def group_norm(x, groups, weight=None, bias=None, eps=1e-6, scale=None, shift=None, act_kind="none"):
    x = f64(x)
    N, C = x.shape[0], x.shape[-1]
    g = x.reshape(N, -1, groups, C // groups)
    mean = g.mean(axis=(1, 3), keepdims=True)
    var = ((g - mean) ** 2).mean(axis=(1, 3), keepdims=True)
    y = ((g - mean) / np.sqrt(var + np.float64(np.float32(eps)))).reshape(x.shape)
    bc = (N,) + (1,) * (x.ndim - 2) + (C,)
    y = y * (1 if weight is None else f64(weight)) + (0 if bias is None else f64(bias))
    y = y * (1 if scale is None else 1 + f64(scale).reshape(bc)) + (0 if shift is None else f64(shift).reshape(bc))
    return y if act_kind == "none" else act(y, act_kind)


def channel_rmsnorm(x, weight=None, bias=None, eps=1e-6, clamp=False, act_kind="none", scale=None, shift=None):
    x = f64(x)
    ms = (x * x).mean(-1, keepdims=True)
    e = np.float64(np.float32(eps))
    y = x / np.maximum(np.sqrt(ms), e) if clamp else x / np.sqrt(ms + e)
    y = y * (1 if weight is None else f64(weight)) + (0 if bias is None else f64(bias))
    bc = (x.shape[0],) + (1,) * (x.ndim - 2) + (x.shape[-1],)  # scale, shift [N, C] per sample
    y = y * (1 if scale is None else 1 + f64(scale).reshape(bc)) + (0 if shift is None else f64(shift).reshape(bc))
    return y if act_kind == "none" else act(y, act_kind)
