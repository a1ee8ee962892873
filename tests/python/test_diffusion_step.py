"""[sampling] diffusion_step (classifier-free guidance, then an Euler or DDIM step, then an optional
blend with prev): the CPU reference (through the bindings, on NumPy arrays) against a float64
NumPy oracle, over every dtype, awkward shapes, broadcast views, out= and in place, and a bad value
for every argument; then the GPU kernel through torch and CuPy against the CPU reference."""
import numpy as np
import pytest

import fusedk
import oracle
from oracle import DTYPES, assert_close
from oracle import step_aux as aux

rng = np.random.default_rng()
SHAPES = [(1, 1), (3, 7), (2, 4, 16, 16)]
EULER = dict(sampler="euler", sigma=0.7, sigma_next=0.45)  # 0.7, 0.45: not float32 values
DDIM = dict(sampler="ddim", alpha_bar=0.3, alpha_bar_prev=0.55)


def rand(shape, dtype, scale=1.0):
    return (scale * rng.standard_normal(shape)).astype(dtype)


def check(dtype, what, **kw):
    got = fusedk.diffusion_step(**kw)
    want = oracle.diffusion_step(**kw)
    assert got.shape == want.shape and got.dtype == dtype, (got.shape, got.dtype)
    assert_close(got, want, dtype, aux(**kw), what=what)
    return got


@pytest.mark.parametrize("cfg", [False, True], ids=["cond", "cfg"])
@pytest.mark.parametrize("sampler", ["euler", "ddim"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_diffusion_step(shape, dtype, sampler, cfg):
    x, c, u = rand(shape, dtype, 2.0), rand(shape, dtype), rand(shape, dtype)
    kw = dict(EULER if sampler == "euler" else DDIM)
    if cfg:
        kw.update(uncond=u, guidance=7.5)
    check(dtype, f"diffusion_step {sampler} {'cfg' if cfg else 'cond'}", x=x, cond=c, **kw)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_guidance_and_step_values(dtype):
    x, c, u = rand((4, 33), dtype, 3.0), rand((4, 33), dtype), rand((4, 33), dtype)
    for g in (0.0, 1.0, 3.3, 12.0):
        check(dtype, f"euler guidance {g}", x=x, cond=c, uncond=u, guidance=g, sampler="euler", sigma=14.6,
              sigma_next=0.029)
    for ab, abp in ((0.0047, 0.01), (0.5, 0.9), (0.9991, 1.0), (1.0, 1.0), (0.7, 0.02)):
        check(dtype, f"ddim {ab} -> {abp}", x=x, cond=c, uncond=u, guidance=4.0, sampler="ddim", alpha_bar=ab,
              alpha_bar_prev=abp)
    # guidance 1 with uncond is the conditional output alone; euler with sigma == sigma_next is x
    y = fusedk.diffusion_step(x, c, u, guidance=1.0, sampler="euler", sigma=0.5, sigma_next=0.5)
    assert np.array_equal(y.view(np.uint8), x.view(np.uint8))
    y = fusedk.diffusion_step(x, c, u, guidance=1.0, **EULER)
    assert_close(y, oracle.diffusion_step(x, c, **EULER), dtype, aux(x, c, u, 1.0, **EULER), what="guidance 1")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_ddim_clamp_x0(dtype):
    x, c, u = rand((3, 64), dtype, 4.0), rand((3, 64), dtype), rand((3, 64), dtype)
    kw = dict(x=x, cond=c, uncond=u, guidance=2.5, sampler="ddim", alpha_bar=0.2, alpha_bar_prev=0.45)
    m = oracle.f64(u) + 2.5 * (oracle.f64(c) - oracle.f64(u))
    x0 = (oracle.f64(x) - np.sqrt(1 - oracle._attr(0.2)) * m) / np.sqrt(oracle._attr(0.2))
    assert (np.abs(x0) > 1.0).mean() > 0.3 and (np.abs(x0) < 1.0).any()  # the clamp bites, not everywhere
    clamped = check(dtype, "ddim clamp_x0 1", clamp_x0=1.0, **kw)
    unclamped = check(dtype, "ddim no clamp", **kw)
    assert not np.array_equal(clamped, unclamped)
    check(dtype, "ddim clamp_x0 1.7", clamp_x0=1.7, **kw)
    # euler ignores clamp_x0
    assert np.array_equal(fusedk.diffusion_step(x, c, u, 2.5, clamp_x0=1.0, **EULER).view(np.uint8),
                          fusedk.diffusion_step(x, c, u, 2.5, **EULER).view(np.uint8))


@pytest.mark.parametrize("sampler", ["euler", "ddim"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_prev_blend(dtype, sampler):
    shape = (2, 4, 8, 8)
    x, c, u, p = (rand(shape, dtype) for _ in range(4))
    kw = dict(EULER if sampler == "euler" else DDIM)
    for blend in (0.0, 0.25, 0.8):
        check(dtype, f"prev blend {blend}", x=x, cond=c, uncond=u, guidance=5.0, prev=p, blend=blend, **kw)
    # prev without blend (1.0) is the step alone
    y = fusedk.diffusion_step(x, c, u, guidance=5.0, prev=p, **kw)
    assert_close(y, oracle.diffusion_step(x, c, u, 5.0, **kw), dtype, aux(x, c, u, 5.0, **kw), what="prev, blend 1")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_broadcast_views(dtype):
    shape = (2, 4, 16, 16)
    x, c = rand(shape, dtype), rand(shape, dtype)
    p = np.broadcast_to(rand((16,), dtype), shape)  # stride 0 in every dim but the last
    u = np.broadcast_to(rand((1,) + shape[1:], dtype), shape)  # one uncond for the batch
    check(dtype, "broadcast prev", x=x, cond=c, prev=p, blend=0.3, **DDIM)
    check(dtype, "broadcast uncond", x=x, cond=c, uncond=u, guidance=6.0, **EULER)
    check(dtype, "broadcast both", x=x, cond=c, uncond=u, guidance=6.0, prev=p, blend=0.6, clamp_x0=1.5, **DDIM)
    # strided (non-broadcast) views: cond and uncond as the two halves of one batched model output
    both = rand((2,) + shape, dtype)
    check(dtype, "cond/uncond halves", x=x, cond=both[0], uncond=both[1], guidance=4.5, **EULER)
    rows = rand((2, 4, 16, 2, 16), dtype)[..., 1, :]
    check(dtype, "strided rows", x=x, cond=rows, **DDIM)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_out_and_in_place(dtype):
    shape = (3, 7)
    x, c, u, p = (rand(shape, dtype) for _ in range(4))
    kw = dict(cond=c, uncond=u, guidance=3.0, prev=p, blend=0.5, **DDIM)
    want, a = oracle.diffusion_step(x, **kw), aux(x, **kw)
    out = np.empty_like(x)
    assert fusedk.diffusion_step(x, out=out, **kw) is out
    assert_close(out, want, dtype, a, what="out=")
    assert fusedk.diffusion_step(x, out=x, **kw) is x
    assert_close(x, want, dtype, a, what="out=x")
    # in place into prev, the previous latent of a blended (e.g. inpainting) step
    x = rand(shape, dtype)
    want, a = oracle.diffusion_step(x, **kw), aux(x, **kw)
    assert fusedk.diffusion_step(x, out=p, **kw) is p
    assert_close(p, want, dtype, a, what="out=prev")


def test_zero_size():
    x = np.empty((0, 8), np.float32)
    y = fusedk.diffusion_step(x, x, x, guidance=2.0, **DDIM)
    assert y.shape == (0, 8) and y.dtype == np.float32


@pytest.mark.parametrize("case, status, name", [
    (lambda x, c: fusedk.diffusion_step(x, c, sampler="heun"), "INVALID_ARGUMENT", "sampler"),
    (lambda x, c: fusedk.diffusion_step(x, c, sampler="ddim", alpha_bar=0.0), "INVALID_ARGUMENT", "alpha_bar"),
    (lambda x, c: fusedk.diffusion_step(x, c, sampler="ddim", alpha_bar=1.5), "INVALID_ARGUMENT", "alpha_bar"),
    (lambda x, c: fusedk.diffusion_step(x, c, sampler="ddim", alpha_bar=-0.5), "INVALID_ARGUMENT", "alpha_bar"),
    (lambda x, c: fusedk.diffusion_step(x, c, sampler="ddim", alpha_bar=0.5, clamp_x0=-1.0), "INVALID_ARGUMENT",
     "clamp_x0"),
    (lambda x, c: fusedk.diffusion_step(x, c, sampler="ddim", alpha_bar=0.5, clamp_x0=0.0), "INVALID_ARGUMENT",
     "clamp_x0"),
    (lambda x, c: fusedk.diffusion_step(x, c, blend=0.5), "INVALID_ARGUMENT", "prev"),
    (lambda x, c: fusedk.diffusion_step(x, c, guidance=7.5), "INVALID_ARGUMENT", "uncond"),
    (lambda x, c: fusedk.diffusion_step(x, c[..., :8]), "SHAPE", "cond"),
    (lambda x, c: fusedk.diffusion_step(x, c[:1]), "SHAPE", "cond"),
    (lambda x, c: fusedk.diffusion_step(x, c, c[0]), "SHAPE", "uncond"),
    (lambda x, c: fusedk.diffusion_step(x, c, prev=c[:, :, :8], blend=0.5), "SHAPE", "prev"),
    (lambda x, c: fusedk.diffusion_step(x, c.astype(np.float16)), "DTYPE", "cond"),
    (lambda x, c: fusedk.diffusion_step(x, c, c.astype(oracle.BF16), guidance=2.0), "DTYPE", "uncond"),
    (lambda x, c: fusedk.diffusion_step(x, c, prev=c.astype(np.float16), blend=0.5), "DTYPE", "prev"),
    (lambda x, c: fusedk.diffusion_step(x.astype(np.float64), c.astype(np.float64)), "DTYPE", "x"),
    (lambda x, c: fusedk.diffusion_step(np.concatenate([x, x], -1)[..., ::2], c), "LAYOUT", "x"),
])
def test_bad_arguments(case, status, name):
    x, c = rand((2, 3, 16), np.float32), rand((2, 3, 16), np.float32)
    with pytest.raises(fusedk.Error) as e:
        case(x, c)
    r = e.value.reason
    assert e.value.status == "FUSEDK_ERR_" + status and r.startswith("diffusion_step: ") and name in r, e.value


# --- the GPU kernel through torch and CuPy, against the CPU reference ----------------------------
@pytest.mark.skipif(not oracle.gpu_frameworks(), reason="no CUDA device with torch or CuPy")
@pytest.mark.parametrize("sampler", ["euler", "ddim"])
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (3, 7), (2, 16, 64, 64), (1, 4096, 320)], ids=str)
def test_gpu_matches_the_reference(shape, dtype, sampler):
    from oracle import assert_close_gpu
    x, c, u, p = (rand(shape, dtype) for _ in range(4))
    pb = rand(shape[-1:], dtype)
    base = dict(EULER if sampler == "euler" else DDIM)
    variants = {
        "cond": dict(),
        "cfg": dict(uncond=u, guidance=7.5),
        "cfg+clamp+prev": dict(uncond=u, guidance=3.0, clamp_x0=1.0, prev=p, blend=0.3),
        "broadcast prev": dict(prev=np.broadcast_to(pb, shape), blend=0.7),
    }
    for name, extra in variants.items():
        kw = dict(base, **extra)
        want = fusedk.diffusion_step(x, c, **kw)
        a = aux(x, c, **kw)
        for fw, to_dev, to_host, bcast in oracle.gpu_frameworks():
            xd = to_dev(x)
            if xd is None:
                continue  # CuPy has no bfloat16 arrays
            dkw = dict(kw)
            for key in ("uncond", "prev"):
                if key in dkw:
                    dkw[key] = bcast(to_dev(pb), shape) if name == "broadcast prev" and key == "prev" \
                        else to_dev(dkw[key])
            got = fusedk.diffusion_step(xd, to_dev(c), **dkw)
            assert_close_gpu(to_host(got), want, dtype, a, what=f"{fw} diffusion_step {sampler} {name}")
            assert fusedk.diffusion_step(xd, to_dev(c), out=xd, **dkw) is xd  # in place
            assert_close_gpu(to_host(xd), want, dtype, a, what=f"{fw} diffusion_step {sampler} {name} in place")
