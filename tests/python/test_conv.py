"""[conv] conv, fold_batchnorm, group_norm and channel_rmsnorm: the C references against float64 NumPy oracles (every dtype,
2D and 3D, strides, zero and replicated causal time padding, bias, act, residual, strided views,
odd channels), bad input; on a GPU, the tensor-core kernel against the reference (both load
paths, channel and pixel tails, 1x1 images, batch 1), against torch's cuDNN conv, in a CUDA
graph and under torch.compile."""
import numpy as np
import pytest

import fusedk
import oracle
from oracle import BF16, DTYPES

rng = np.random.default_rng()
ACTS = ["none", "silu", "relu", "gelu", "gelu_tanh"]


def rand(shape, dtype, scale=1.0):
    return (rng.standard_normal(shape) * scale).astype(dtype)


def case(x_shape, w_shape, dtype, bias=True, residual=False, **kw):
    """x, w (N(0, 1/fan-in)), bias and a residual of out's shape, and the oracle's output"""
    x = rand(x_shape, dtype)
    w = rand(w_shape, dtype, 1 / np.sqrt(np.prod(w_shape[1:])))
    b = rand(w_shape[:1], dtype) if bias else None
    want = oracle.conv(x, w, b, **kw)
    r = rand(want.shape, dtype) if residual else None
    if r is not None:
        want = oracle.conv(x, w, b, r, **kw)
    return x, w, b, r, want


def conv_args(kw):
    """the oracle's keywords as fusedk.conv's"""
    m = dict(kw)
    out = {"stride": m.pop("stride", 1), "padding": m.pop("pad", 0), "act": m.pop("act_kind", "none")}
    out["time_pad"] = "replicate" if m.pop("replicate", False) else "zeros"
    out["pad"] = "replicate" if m.pop("pad_replicate", False) else "zeros"
    out.update(m)
    return out


IMAGE_CASES = [  # x [N, H, W, Ci], w [Co, kh, kw, Ci], keywords
    ((2, 9, 7, 5), (6, 3, 3, 5), dict(pad=1)),
    ((1, 8, 8, 16), (24, 3, 3, 16), dict(pad=1, stride=2)),
    ((3, 5, 6, 3), (4, 1, 1, 3), {}),
    ((1, 1, 1, 8), (3, 3, 3, 8), dict(pad=1)),
    ((2, 10, 11, 12), (7, 3, 3, 12), dict(stride=2)),
    ((1, 4, 4, 4), (2, 2, 3, 4), dict(pad=2, stride=3)),
    ((2, 5, 6, 8), (3, 3, 3, 8), dict(pad=1, pad_replicate=True)),
    ((1, 3, 2, 4), (2, 5, 5, 4), dict(pad=3, stride=2, pad_replicate=True)),  # padding past the image
    ((2, 4, 3, 8), (5, 3, 3, 8), dict(pad=1, upsample=2)),  # Upsample2D + conv
    ((1, 3, 5, 4), (3, 3, 3, 4), dict(pad=2, stride=2, upsample=3, pad_replicate=True)),
]
VIDEO_CASES = [  # x [N, T, H, W, Ci], w [Co, kt, kh, kw, Ci]
    ((1, 5, 6, 7, 4), (3, 3, 3, 3, 4), dict(pad=1, pad_t=2)),
    ((2, 4, 5, 5, 6), (5, 3, 3, 3, 6), dict(pad=1, pad_t=2, replicate=True)),
    ((1, 6, 4, 4, 8), (8, 3, 1, 1, 8), dict(pad_t=2)),
    ((1, 7, 5, 6, 3), (2, 3, 3, 3, 3), dict(stride_t=2, pad_t=1, pad_t_back=1, stride=2, pad=1)),
    ((1, 3, 4, 4, 5), (4, 3, 3, 3, 5), dict(pad=1, pad_t=1, pad_t_back=2, replicate=True)),
    ((2, 4, 5, 6, 8), (4, 3, 3, 3, 8), dict(pad=1, pad_t=2, replicate=True, pad_replicate=True)),  # Mochi's
    ((1, 3, 4, 5, 4), (3, 3, 3, 3, 4), dict(pad=1, pad_t=2, pad_replicate=True)),
    ((1, 2, 3, 4, 8), (4, 1, 3, 3, 8), dict(pad=1, upsample=2)),  # Wan's upsamplers, frame by frame
]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("xs,ws,kw", IMAGE_CASES + VIDEO_CASES, ids=str)
def test_conv_reference_against_the_oracle(xs, ws, kw, dtype):
    x, w, b, _, want = case(xs, ws, dtype, **kw)
    got = fusedk.conv(x, w, b, **conv_args(kw))
    assert got.shape == want.shape and got.dtype == dtype
    oracle.assert_close(got, want, dtype, what=f"conv {xs} {ws} {kw}")


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("act", ACTS)
def test_conv_epilogue(act, dtype):
    """act on z = conv + bias in full precision, then the residual, one rounding"""
    x, w, b, r, want = case((2, 6, 5, 8), (9, 3, 3, 8), dtype, residual=True, pad=1, act_kind=act)
    got = fusedk.conv(x, w, b, r, padding=1, act=act)
    oracle.assert_close(got, want, dtype, what=f"conv act {act}")


def test_conv_views_and_out():
    """strided NHWC views (a crop of a larger buffer, every other pixel), out= a view too"""
    big = rand((2, 12, 14, 24), np.float32)
    x = big[:, 1:10, ::2, 3:11]  # [2, 9, 7, 8], channels contiguous
    w = rand((12, 5, 3, 3, 8), np.float32).transpose(1, 0, 2, 3, 4)[0]  # [12, 3, 3, 8] with a w stride
    r_big = rand((2, 9, 7, 20), np.float32)
    r = r_big[..., 4:16]
    out_big = np.full((2, 9, 8, 16), np.nan, np.float32)
    got = fusedk.conv(x, w, None, r, padding=1, act="silu", out=out_big[:, :, :7, 2:14])
    want = oracle.conv(x, w, None, r, pad=1, act_kind="silu")
    oracle.assert_close(got, want, np.float32, what="views")
    oracle.assert_close(out_big[:, :, :7, 2:14], want, np.float32, what="out view")
    assert np.isnan(out_big[:, :, 7]).all() and np.isnan(out_big[..., :2]).all() and np.isnan(out_big[..., 14:]).all()


def test_conv_empty_and_strided_weight():
    x = rand((0, 4, 4, 3), np.float32)
    assert fusedk.conv(x, rand((2, 3, 3, 3), np.float32), padding=1).shape == (0, 4, 4, 2)
    # w by any strides of its leading dims (a slice of a wider weight), channels contiguous
    w = rand((6, 3, 3, 10), np.float32)[:, :, :, 2:7]
    x = rand((1, 7, 7, 5), np.float32)
    oracle.assert_close(fusedk.conv(x, w, padding=1), oracle.conv(x, w, pad=1), np.float32)


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("affine,bias", [(True, True), (False, False), (True, False)])
def test_fold_batchnorm_against_the_oracle(affine, bias, dtype):
    w = rand((6, 3, 3, 5), dtype)
    b = rand((6,), dtype) if bias else None
    g, be = (rand((6,), dtype), rand((6,), dtype)) if affine else (None, None)
    mean, var = rand((6,), dtype), (rng.uniform(0.1, 2.0, 6)).astype(dtype)
    wf, bf = fusedk.fold_batchnorm(w, b, g, be, mean, var, 1e-3)
    ww, bw = oracle.fold_batchnorm(w, b, g, be, mean, var, 1e-3)
    oracle.assert_close(wf, ww, dtype, what="w'")
    oracle.assert_close(bf, bw, dtype, what="b'")
    # in place, and conv + BN (eval) + SiLU as one conv
    x = rand((2, 5, 5, 5), dtype)
    want = oracle.act(oracle.conv(x, ww.astype(dtype), bw.astype(dtype), pad=1), "silu")
    oracle.assert_close(fusedk.fused_conv_bn_silu(x, w, b, g, be, mean, var, 1e-3), want, dtype, what="fused")
    fusedk.fold_batchnorm(w, b, g, be, mean, var, 1e-3, out=(w, np.empty(6, dtype)))
    assert oracle.bits(w).tobytes() == oracle.bits(wf).tobytes()


def test_bad_input():
    x, w = rand((1, 6, 6, 4), np.float32), rand((3, 3, 3, 4), np.float32)
    bad = [
        (lambda: fusedk.conv(x, rand((3, 3, 3, 5), np.float32)), fusedk.ShapeError, "w has shape"),
        (lambda: fusedk.conv(x.transpose(0, 3, 1, 2), w), fusedk.ShapeError, "w has shape"),
        (lambda: fusedk.conv(np.ascontiguousarray(x.transpose(0, 3, 1, 2)).transpose(0, 2, 3, 1), w),
         fusedk.LayoutError, "stride"),
        (lambda: fusedk.conv(x[..., 0], w[..., 0]), fusedk.ShapeError, "expected [N, H, W, Ci]"),
        (lambda: fusedk.conv(x, w, pad_t=1), fusedk.InvalidArgumentError, "pad_t"),
        (lambda: fusedk.conv(x, w, stride=0), fusedk.InvalidArgumentError, "stride"),
        (lambda: fusedk.conv(x, w, padding=-1), fusedk.InvalidArgumentError, "pad"),
        (lambda: fusedk.conv(x, rand((3, 7, 7, 4), np.float32)), fusedk.ShapeError, "larger than the padded"),
        (lambda: fusedk.conv(x, w, rand((4,), np.float32)), fusedk.ShapeError, "bias"),
        (lambda: fusedk.conv(x, w, residual=rand((1, 6, 6, 3), np.float32)), fusedk.ShapeError, "residual"),
        (lambda: fusedk.conv(x, w, act="tanh"), fusedk.InvalidArgumentError, "act"),
        (lambda: fusedk.conv(x, w, time_pad="reflect"), fusedk.InvalidArgumentError, "time_pad"),
        (lambda: fusedk.conv(x, w, pad="reflect"), fusedk.InvalidArgumentError, "pad"),
        (lambda: fusedk.conv(x, w, upsample=0), fusedk.InvalidArgumentError, "upsample"),
        (lambda: fusedk.conv(x, w, time_pad="replicate"), fusedk.InvalidArgumentError, "replicate is 1 for an image"),
        (lambda: fusedk.conv(x, w.astype(np.float16)), fusedk.DTypeError, "dtype"),
        (lambda: fusedk.conv(x, w, out=np.empty((1, 6, 6, 3), np.float32)), fusedk.ShapeError, "out"),
        (lambda: fusedk.fold_batchnorm(w, None, None, None, rand((4,), np.float32), rand((3,), np.float32)),
         fusedk.ShapeError, "mean"),
        (lambda: fusedk.fold_batchnorm(w, None, None, None, rand((3,), np.float32), rand((3,), np.float32), eps=-1),
         fusedk.InvalidArgumentError, "eps"),
        (lambda: fusedk.fold_batchnorm(rand((3, 3, 6, 4), np.float32)[:, :, :3], None, None, None,
                                       rand((3,), np.float32), rand((3,), np.float32)), fusedk.LayoutError, "compact"),
    ]
    for f, err, text in bad:
        with pytest.raises(err) as e:
            f()
        assert text in str(e.value) and isinstance(e.value, (ValueError, TypeError)), str(e.value)
    y = np.full((1, 6, 6, 3), 7.0, np.float32)  # a failed call writes nothing
    with pytest.raises(fusedk.Error):
        fusedk.conv(x, w, rand((4,), np.float32), padding=1, out=y)
    assert (y == 7.0).all()
    with pytest.raises(fusedk.LayoutError, match="overlaps"):
        fusedk.conv(x, rand((4, 1, 1, 4), np.float32), out=x)


GN_CASES = [((2, 5, 4, 64), 32), ((1, 3, 3, 4, 48), 16), ((3, 7, 10), 5), ((1, 1, 1, 12), 12), ((2, 9, 6, 128), 1)]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape,groups", GN_CASES, ids=str)
@pytest.mark.parametrize("act", ["none", "silu"])
def test_group_norm_reference_against_the_oracle(shape, groups, act, dtype):
    C, N = shape[-1], shape[0]
    x = (rand(shape, np.float32) * 2 + 3).astype(dtype)  # off-center groups: the variance's cancellation
    w, b, sc, sh = rand((C,), dtype), rand((C,), dtype), rand((N, C), dtype, 0.2), rand((N, C), dtype)
    got = fusedk.group_norm(x, groups, w, b, 1e-5, sc, sh, act=act)
    oracle.assert_close(got, oracle.group_norm(x, groups, w, b, 1e-5, sc, sh, act), dtype, what=f"gn {shape}")
    got = fusedk.group_norm(x, groups, act=act)
    oracle.assert_close(got, oracle.group_norm(x, groups, act_kind=act), dtype, what=f"gn plain {shape}")


def test_group_norm_views_in_place_and_bad_input():
    big = rand((2, 6, 9, 40), np.float32)
    x = big[:, :, 1:8, 4:36]  # pixels by a stride, channels contiguous: [2, 6, 7, 32]
    with pytest.raises(fusedk.LayoutError, match="flatten to one pixel stride"):
        fusedk.group_norm(x, 8)
    x = big[:, 1:5, :, 4:36]  # [2, 4, 9, 32]: rows of whole images (their pixels flatten)
    mod = rand((2, 64), np.float32)
    want = oracle.group_norm(x, 8, scale=mod[:, :32], shift=mod[:, 32:], act_kind="silu")
    oracle.assert_close(fusedk.group_norm(x, 8, scale=mod[:, :32], shift=mod[:, 32:], act="silu"), want, np.float32)
    y = x.copy()
    fusedk.group_norm(y, 8, act="silu", scale=mod[:, :32], shift=mod[:, 32:], out=y)
    oracle.assert_close(y, want, np.float32, what="in place")
    bad = [(lambda: fusedk.group_norm(x, 5), fusedk.InvalidArgumentError, "groups is 5"),
           (lambda: fusedk.group_norm(x, 0), fusedk.InvalidArgumentError, "groups is 0"),
           (lambda: fusedk.group_norm(x, 8, rand((31,), np.float32)), fusedk.ShapeError, "weight"),
           (lambda: fusedk.group_norm(x, 8, scale=rand((3, 32), np.float32)), fusedk.ShapeError, "scale"),
           (lambda: fusedk.group_norm(x[..., 0], 1), fusedk.LayoutError, "stride"),
           (lambda: fusedk.group_norm(x, 8, eps=-1.0), fusedk.InvalidArgumentError, "eps"),
           (lambda: fusedk.group_norm(x, 8, act="tanh"), fusedk.InvalidArgumentError, "act"),
           (lambda: fusedk.group_norm(x, "8"), fusedk.InvalidArgumentError, "groups")]
    for f, err, text in bad:
        with pytest.raises(err, match=text):
            f()



@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(2, 3, 5, 4, 96), (1, 7, 384), (3, 5), (2, 1, 1, 13)], ids=str)
@pytest.mark.parametrize("clamp,act,mod", [(False, "silu", False), (True, "silu", False), (True, "none", False),
                                           (False, "silu", True)])
def test_channel_rmsnorm_reference_against_the_oracle(shape, clamp, act, mod, dtype):
    C, N = shape[-1], shape[0]
    x, w, b = rand(shape, dtype), rand((C,), dtype), rand((C,), dtype)
    # LTX-Video's timestep modulation: scale and shift per sample (rows of a wider [N, 4C] projection)
    sc, sh = (rand((N, 4 * C), dtype)[:, C:2 * C], rand((N, C), dtype)) if mod else (None, None)
    eps = 1e-12 / np.sqrt(C) if clamp else 1e-8
    got = fusedk.channel_rmsnorm(x, w, b, eps, sc, sh, clamp=clamp, act=act)
    want = oracle.channel_rmsnorm(x, w, b, eps, clamp, act, sc, sh)
    oracle.assert_close(got, want, dtype, what=f"crms {shape}")
    z = np.zeros(shape, dtype)  # Wan's all-zero pixels: 0, not NaN
    assert not np.isnan(np.asarray(fusedk.channel_rmsnorm(z, w, None, eps, clamp=True), np.float32)).any()
    y = x.copy()
    fusedk.channel_rmsnorm(y, w, b, eps, sc, sh, clamp=clamp, act=act, out=y)
    assert oracle.bits(y).tobytes() == oracle.bits(got).tobytes()
    with pytest.raises(fusedk.ShapeError, match="weight"):
        fusedk.channel_rmsnorm(x, rand((C + 1,), dtype))
    before = x.copy()
    for bad, what in (({"scale": rand((N + 1, C), dtype)}, "scale has shape"), ({"shift": rand((N, C + 1), dtype)},
                      "shift has shape"), ({"shift": rand((C,), dtype)}, "shift has shape")):
        with pytest.raises(fusedk.ShapeError, match=what):
            fusedk.channel_rmsnorm(x, out=x, **bad)
        assert oracle.bits(x).tobytes() == oracle.bits(before).tobytes()  # nothing written


# --- GPU ---------------------------------------------------------------------------------------
needs_torch_gpu = pytest.mark.skipif(not oracle.torch_cuda()[1], reason="no CUDA device, torch or fusedk GPU half")


def _gpu_case(torch, xs, ws, dtype, kw, residual=True, view=False):
    """the GPU kernel against the C reference on the same inputs (host copies)"""
    dt = getattr(torch, dtype)
    x = torch.randn(xs, dtype=torch.float32).to(dt)
    if view:  # pixels 2 elements past a 16-byte boundary, channels still contiguous
        x = torch.randn(xs[:-1] + (xs[-1] + 2,), dtype=torch.float32).to(dt)[..., 2:]
    w = (torch.randn(ws) / np.sqrt(np.prod(ws[1:]))).to(dt)
    b = torch.randn(ws[0]).to(dt)
    ref = fusedk.conv(x, w, b, **conv_args(kw))
    r = torch.randn(ref.shape).to(dt) if residual else None
    act = kw.get("act_kind", "none")
    ref = fusedk.conv(x, w, b, r, **conv_args(kw))
    got = fusedk.conv(x.cuda(), w.cuda(), b.cuda(), None if r is None else r.cuda(), **conv_args(kw))
    torch.cuda.synchronize()
    aux = None if r is None else oracle.np_of(r.float())
    oracle.assert_close_gpu(oracle.np_of(got.float()), oracle.np_of(ref.float()), np.dtype(BF16 if dtype == "bfloat16"
                            else np.float16), aux=aux, what=f"gpu conv {xs} {ws} {kw} {act}")
    return got


GPU_CASES = IMAGE_CASES + VIDEO_CASES + [
    ((2, 17, 19, 64), (130, 3, 3, 64), dict(pad=1, act_kind="silu")),      # M and Co tails, 16-byte path
    ((1, 16, 16, 72), (40, 3, 3, 72), dict(pad=1, stride=2)),             # Ci 72: a tile's channel tail
    ((1, 33, 31, 128), (128, 1, 1, 128), dict(act_kind="gelu")),          # 1x1
    ((1, 5, 12, 12, 32), (64, 3, 3, 3, 32), dict(pad=1, pad_t=2, replicate=True)),
    ((1, 1, 1, 256), (17, 3, 3, 256), dict(pad=1)),                       # a 1x1 image
]


@needs_torch_gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("xs,ws,kw", GPU_CASES, ids=str)
def test_gpu_conv_against_the_reference(xs, ws, kw, dtype):
    torch = oracle.torch_cuda()[0]
    _gpu_case(torch, xs, ws, dtype, kw)
    if xs[-1] % 8 == 0:  # the element path on the same shape: pixels off the 16-byte boundary
        _gpu_case(torch, xs, ws, dtype, kw, residual=False, view=True)


@needs_torch_gpu
@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
@pytest.mark.parametrize("N,C,H,Co,k,stride", [(2, 320, 64, 320, 3, 1), (1, 128, 96, 256, 3, 2), (8, 64, 32, 64, 1, 1)])
def test_gpu_conv_against_cudnn(N, C, H, Co, k, stride, dtype):
    """torch's channels-last Conv2d (cuDNN) on the same inputs: within bf16/f16 rounding of each"""
    torch = oracle.torch_cuda()[0]
    dt = getattr(torch, dtype)
    conv = torch.nn.Conv2d(C, Co, k, stride, k // 2).cuda().to(dt).to(memory_format=torch.channels_last)
    x = torch.randn(N, C, H, H, device="cuda", dtype=dt).to(memory_format=torch.channels_last)
    with torch.no_grad():
        want = conv(x).float()
        got = fusedk.conv(x.permute(0, 2, 3, 1), conv.weight.permute(0, 2, 3, 1), conv.bias, stride=stride,
                          padding=k // 2)
        exact = torch.nn.functional.conv2d(x.double(), conv.weight.double(), conv.bias.double(), stride, k // 2)
    exact = exact.permute(0, 2, 3, 1)
    err = lambda t: float((t.double() - exact).norm() / exact.norm())  # noqa: E731
    assert err(got) <= 1.05 * err(want.permute(0, 2, 3, 1)) + 1e-4, (err(got), err(want.permute(0, 2, 3, 1)))


@needs_torch_gpu
def test_gpu_conv_graph_compile_bad_input_and_fold():
    torch = oracle.torch_cuda()[0]
    x = torch.randn(2, 16, 16, 64, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(96, 3, 3, 64, device="cuda", dtype=torch.bfloat16) / 24
    eager = fusedk.conv(x, w, padding=1, act="silu")
    g, out = torch.cuda.CUDAGraph(), None
    s = torch.cuda.Stream()
    with torch.cuda.stream(s):
        fusedk.conv(x, w, padding=1, act="silu")
        with torch.cuda.graph(g):
            out = fusedk.conv(x, w, padding=1, act="silu")
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    f = torch.compile(lambda a, b: fusedk.conv(a, b, padding=1, act="silu") * 2, fullgraph=True)
    assert torch.equal(f(x, w), eager * 2)
    with pytest.raises(fusedk.Error, match="float32 on a GPU"):
        fusedk.conv(x.float(), w.float(), padding=1)
    with pytest.raises(fusedk.DeviceError):
        fusedk.conv(x, w.cpu(), padding=1)
    # fold_batchnorm on the GPU: the reference's bits (double math, one rounding)
    mean, var = torch.randn(96, device="cuda"), torch.rand(96, device="cuda") + 0.5
    gm, bt = torch.randn(96, device="cuda"), torch.randn(96, device="cuda")
    wf = w.float()
    gw, gb = fusedk.fold_batchnorm(wf, None, gm, bt, mean, var)
    cw, cb = fusedk.fold_batchnorm(wf.cpu(), None, gm.cpu(), bt.cpu(), mean.cpu(), var.cpu())
    assert torch.equal(gw.cpu(), cw) and torch.equal(gb.cpu(), cb)


@needs_torch_gpu
def test_gpu_conv_past_2_31_elements():
    """x of more than 2^31 elements (64-bit offsets): the last rows against the reference on them"""
    torch = oracle.torch_cuda()[0]
    x = torch.empty(1, 8193, 1024, 256, device="cuda", dtype=torch.bfloat16).normal_()
    assert x.numel() > 2 ** 31
    w = (torch.randn(8, 3, 3, 256, device="cuda") / 48).to(torch.bfloat16)
    got = fusedk.conv(x, w, padding=1)
    tail = x[:, -3:].cpu()  # the last two output rows read input rows -3..-1 (and the zero padding below)
    want = fusedk.conv(torch.nn.functional.pad(tail, (0, 0, 1, 1, 0, 1)), w.cpu())
    oracle.assert_close_gpu(oracle.np_of(got[:, -2:].float()), oracle.np_of(want[:, -2:].float()), BF16, what="huge")


@needs_torch_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape,groups", GN_CASES + [((1, 256, 256, 128), 32), ((1, 4, 60, 104, 384), 32),
                                                     ((2, 33, 17, 24), 6)], ids=str)
def test_gpu_group_norm_against_the_reference(shape, groups, dtype):
    torch = oracle.torch_cuda()[0]
    dt = getattr(torch, dtype)
    C, N = shape[-1], shape[0]
    np_dt = np.dtype({"float32": np.float32, "float16": np.float16, "bfloat16": BF16}[dtype])
    x = (torch.randn(shape) * 2 + 3).to(dt)
    w, b, sc, sh = (torch.randn(C).to(dt), torch.randn(C).to(dt), (torch.randn(N, C) * 0.2).to(dt),
                    torch.randn(N, C).to(dt))
    for args, act in (((w, b, 1e-6, sc, sh), "silu"), ((None, None, 1e-6, None, None), "none")):
        ref = fusedk.group_norm(x, groups, *args, act=act)
        got = fusedk.group_norm(x.cuda(), groups, *(a.cuda() if hasattr(a, "cuda") else a for a in args), act=act)
        oracle.assert_close_gpu(oracle.np_of(got.float()), oracle.np_of(ref.float()), np_dt,
                                what=f"gpu group_norm {shape} {act}")
    if C % 8 == 0:  # the element path: pixels off the 16-byte grid
        xv = torch.randn(shape[:-1] + (C + 1,)).to(dt)[..., 1:]
        ref = fusedk.group_norm(xv, groups, act="silu")
        got = fusedk.group_norm(xv.cuda(), groups, act="silu")
        oracle.assert_close_gpu(oracle.np_of(got.float()), oracle.np_of(ref.float()), np_dt,
                                what=f"gpu group_norm {shape} unaligned")


@needs_torch_gpu
def test_gpu_group_norm_matches_torch_and_runs_in_a_graph():
    torch = oracle.torch_cuda()[0]
    gn = torch.nn.GroupNorm(32, 128, eps=1e-6).cuda().to(torch.bfloat16)
    with torch.no_grad():
        gn.weight.normal_(), gn.bias.normal_()
        x = torch.randn(1, 128, 128, 128, device="cuda", dtype=torch.bfloat16).to(memory_format=torch.channels_last)
        want = torch.nn.functional.silu(gn(x)).permute(0, 2, 3, 1)
        exact = torch.nn.functional.silu(torch.nn.functional.group_norm(x.double(), 32, gn.weight.double(),
                                                                         gn.bias.double(), 1e-6)).permute(0, 2, 3, 1)
        got = fusedk.group_norm(x.permute(0, 2, 3, 1), 32, gn.weight, gn.bias, 1e-6, act="silu")
        err = lambda t: float((t.double() - exact).norm() / exact.norm())  # noqa: E731
        assert err(got) <= err(want) * 1.05 + 1e-4, (err(got), err(want))
        g = torch.cuda.CUDAGraph()
        s = torch.cuda.Stream()
        with torch.cuda.stream(s):
            fusedk.group_norm(x.permute(0, 2, 3, 1), 32, gn.weight, gn.bias, 1e-6, act="silu")
            with torch.cuda.graph(g):
                out = fusedk.group_norm(x.permute(0, 2, 3, 1), 32, gn.weight, gn.bias, 1e-6, act="silu")
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(out, got)


@needs_torch_gpu
@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
@pytest.mark.parametrize("shape", [(1, 4, 60, 104, 384), (2, 3, 5, 4, 96), (7, 3), (1, 2, 5, 2050)], ids=str)
def test_gpu_channel_rmsnorm_against_the_reference(shape, dtype):
    torch = oracle.torch_cuda()[0]
    dt = getattr(torch, dtype)
    np_dt = np.dtype({"float32": np.float32, "float16": np.float16, "bfloat16": BF16}[dtype])
    C = shape[-1]
    for x in (torch.randn(shape).to(dt), torch.randn(shape[:-1] + (C + 1,)).to(dt)[..., 1:]):  # aligned, not
        w, b = torch.randn(C).to(dt), torch.randn(C).to(dt)
        sc, sh = torch.randn(shape[0], 3 * C).to(dt)[:, C:2 * C], torch.randn(shape[0], C).to(dt)  # LTX's
        for clamp, eps, mod in ((False, 1e-8, False), (True, 1e-12 / C ** 0.5, False), (False, 1e-8, True)):
            m = (sc, sh) if mod else (None, None)
            ref = fusedk.channel_rmsnorm(x, w, b, eps, *m, clamp=clamp, act="silu")
            got = fusedk.channel_rmsnorm(x.cuda(), w.cuda(), b.cuda(), eps, *(t if t is None else t.cuda() for t in m),
                                         clamp=clamp, act="silu")
            oracle.assert_close_gpu(oracle.np_of(got.float()), oracle.np_of(ref.float()), np_dt,
                                    what=f"gpu channel_rmsnorm {shape} clamp {clamp} modulated {mod}")
