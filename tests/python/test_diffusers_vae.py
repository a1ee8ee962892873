"""[conv] fusedk.diffusers on a VAE decoder (AutoencoderKL, AutoencoderKLWan, AutoencoderKLLTXVideo,
AutoencoderKLMochi): the patched decode
against the stock one (CPU: fusedk's references; GPU: 16-bit against the float32 decoder, no worse
than stock 16-bit's), the report, revert bit for bit, tiled decoding, Wan's frame-by-frame cache,
torch.compile."""
import types

import pytest

torch = pytest.importorskip("torch")
diffusers = pytest.importorskip("diffusers")

import fusedk  # noqa: E402
import fusedk.diffusers as fd  # noqa: E402
import oracle  # noqa: E402

TINY = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(32, 64), layers_per_block=1,
            latent_channels=4, norm_num_groups=16, sample_size=32)
# Flux's AutoencoderKL (16 latent channels, 128..512), at a size a test can afford
FLUX = dict(in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 4,
            up_block_types=("UpDecoderBlock2D",) * 4, block_out_channels=(128, 256, 512, 512), layers_per_block=2,
            latent_channels=16, norm_num_groups=32, sample_size=1024, use_quant_conv=False, use_post_quant_conv=False)


# Wan 2.1's AutoencoderKLWan (z 16, 96..384 channels, a mid attention) and a tiny one of its shape
WAN = dict(base_dim=96, z_dim=16, dim_mult=[1, 2, 4, 4], num_res_blocks=2, attn_scales=[],
           temperal_downsample=[False, True, True])
WAN_TINY = dict(base_dim=8, z_dim=4, dim_mult=[1, 2, 2, 2], num_res_blocks=1, attn_scales=[],
                temperal_downsample=[False, True, True], latents_mean=[0.0] * 4, latents_std=[1.0] * 4)

# LTX-Video's AutoencoderKLLTXVideo, tiny: 0.9.0's form (no timestep conditioning, centred time
# padding, shortcut LayerNorm + conv where channels change) and 0.9.5's (timestep-conditioned
# blocks, residual upsamplers)
LTX_090 = dict(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 8, 16, 16),
               decoder_block_out_channels=(8, 8, 16, 16), layers_per_block=(1,) * 5, decoder_layers_per_block=(1,) * 5,
               patch_size=4)
LTX_095 = dict(in_channels=3, out_channels=3, latent_channels=8, block_out_channels=(8, 16, 32, 32),
               decoder_block_out_channels=(8, 16, 32), layers_per_block=(1,) * 5, decoder_layers_per_block=(1,) * 4,
               spatio_temporal_scaling=(True, True, True, False), decoder_spatio_temporal_scaling=(True,) * 3,
               decoder_inject_noise=(False,) * 4, upsample_residual=(True,) * 3, upsample_factor=(2,) * 3,
               timestep_conditioning=True, patch_size=4)

# Mochi's AutoencoderKLMochi, tiny (its convs pad H, W and time by repetition, GroupNorm a frame)
MOCHI_TINY = dict(in_channels=15, out_channels=3, latent_channels=4, encoder_block_out_channels=(32, 32, 64, 64),
                  decoder_block_out_channels=(32, 32, 64, 64), layers_per_block=(1, 1, 1, 1, 1), act_fn="silu")


def rel(a, b):
    a, b = a.double(), b.double()
    return float((a - b).norm() / b.norm())


def make(config, dtype=torch.float32, device="cpu", seed=0, kind="AutoencoderKL"):
    """diffusers' `kind` at config, eval, its norms' affine (GroupNorm, Wan's gamma, LTX's RMSNorms)
    and LTX's timestep tables random: the stock init (1, 0) would hide a swapped pair"""
    torch.manual_seed(seed)
    vae = getattr(diffusers, kind)(**config).eval()
    with torch.no_grad():
        for m in vae.modules():
            if isinstance(m, (torch.nn.GroupNorm, torch.nn.LayerNorm)) or type(m).__name__ == "RMSNorm":
                for p, mean in ((m.weight, 1.0), (m.bias, 0.0)):
                    if isinstance(p, torch.Tensor):
                        p.normal_(mean, 0.2)
            elif type(m).__name__ == "WanRMS_norm":
                m.gamma.normal_(1.0, 0.2)
        for n, p in vae.named_parameters():
            if "scale_shift" in n:
                p.normal_(0.0, 0.2)
    return vae.to(device=device) if dtype == torch.float32 else vae.to(device=device, dtype=dtype)


class Calls:
    """counts fusedk's conv and norm calls and torch's stock conv3d, interpolate and silu calls
    while it is on"""

    def __init__(self, monkeypatch):
        self.n = {"fusedk": 0, "conv3d": 0, "interpolate": 0, "silu": 0}
        for mod, name, key in ((fusedk, "conv", "fusedk"), (fusedk, "channel_rmsnorm", "fusedk"),
                               (torch.nn.functional, "conv3d", "conv3d"), (torch.nn.functional, "silu", "silu"),
                               (torch.nn.functional, "interpolate", "interpolate")):
            monkeypatch.setattr(mod, name, self.counted(getattr(mod, name), key))

    def counted(self, f, key):
        def g(*a, **k):
            self.n[key] += 1
            return f(*a, **k)
        return g


def decode(vae, z):
    with torch.no_grad():
        return vae.decode(z).sample


@pytest.fixture(autouse=True)
def cpu_reference(monkeypatch):
    monkeypatch.setattr(fd.vae, "CPU_REFERENCE", True)  # the patched math on CPU tensors (slow: tiny models)


def test_cpu_patched_decode_report_and_revert(monkeypatch):
    vae = make(TINY)
    z = torch.randn(2, 4, 8, 8)
    want = decode(vae, z)
    before = {n: p.detach().clone() for n, p in vae.named_parameters()}
    report = fd.apply(types.SimpleNamespace(transformer=torch.nn.Linear(2, 2), vae=vae))
    names = dict(report.patched)
    assert sum(c == "ResnetBlock2D" for c in names.values()) == 6  # the mid block 2, the up blocks 2 x (1 + 1)
    assert names.get("vae.decoder.conv_in") == "Conv2d" and names.get("vae.decoder.conv_out") == "Conv2d"
    assert names.get("vae.decoder.up_blocks.0.upsamplers.0") == "Upsample2D"
    assert names.get("vae.decoder.conv_norm_out + conv_act") == "GroupNorm + SiLU"
    calls = Calls(monkeypatch)
    got = decode(vae, z)
    assert calls.n["interpolate"] == 0 and calls.n["fusedk"] > 0, calls.n  # the upsampling inside the conv
    assert calls.n["silu"] == 0, calls.n  # every SiLU inside a norm
    monkeypatch.undo()
    assert got.shape == want.shape and rel(got, want) < 1e-5, rel(got, want)
    assert fd.revert(types.SimpleNamespace(transformer=torch.nn.Linear(2, 2), vae=vae)) == len(report.patched)
    assert torch.equal(decode(vae, z), want)  # the stock forward again
    for n, p in vae.named_parameters():
        assert torch.equal(p, before[n]) and p.is_contiguous(), n


def test_cpu_tiled_decode_and_fallbacks():
    vae = make(TINY)
    vae.enable_tiling()
    z = torch.randn(1, 4, 24, 24)  # past the tile size (16 latents): tiles and their blending
    want = decode(vae, z)
    fd.apply(vae)
    assert rel(decode(vae, z), want) < 1e-5
    # autograd recording runs the stock forwards
    zg = z.clone().requires_grad_()
    out = vae.decode(zg).sample
    out.sum().backward()
    assert zg.grad is not None
    fd.revert(vae)


def test_cpu_hooks_float64_and_bad_input(monkeypatch):
    vae = make(TINY)
    z = torch.randn(1, 4, 8, 8)
    vae.enable_layerwise_casting(storage_dtype=torch.bfloat16, compute_dtype=torch.float32)
    want = decode(vae, z)
    report = fd.apply(vae)  # every module the casting hooks wrap is left alone, and says why
    assert any("hooks" in why for _, _, why in report.skipped)
    # blocks with hooked modules inside run stock; the casting leaves norms alone, so the closing
    # GroupNorm + SiLU runs fused (float32: the same values to rounding)
    assert rel(decode(vae, z), want) < 1e-5
    fd.revert(vae)
    assert torch.equal(decode(vae, z), want)  # the hooks still there
    v64 = make(TINY).double()
    want = decode(v64, z.double())
    fd.apply(v64)
    assert rel(decode(v64, z.double()), want) < 1e-13  # float64: the stock forwards (weights stored NHWC)
    fd.revert(v64)
    monkeypatch.setattr(fd.vae, "CPU_REFERENCE", False)
    v = make(TINY)
    want = decode(v, z)
    fd.apply(v)
    assert rel(decode(v, z), want) < 1e-5  # CPU tensors: the stock forwards unless CPU_REFERENCE
    fd.revert(v)
    with pytest.raises(fusedk.Error, match="vae is"):
        fd.apply(torch.nn.Linear(2, 2), vae="yes")


def test_cpu_wan_decode_cache_report_and_revert(monkeypatch):
    """Wan: three latent frames (the chunk cache: none, then one and two frames cached, the
    upsamplers' time convs), every conv through fusedk, the stock decode to float32 rounding"""
    vae = make(WAN_TINY, kind="AutoencoderKLWan")
    z = torch.randn(1, 4, 3, 6, 5)
    want = decode(vae, z)
    before = {n: p.detach().clone() for n, p in vae.named_parameters()}
    report = fd.apply(types.SimpleNamespace(transformer=torch.nn.Linear(2, 2), vae=vae))
    kinds = [c for _, c in report.patched]
    assert kinds.count("WanResidualBlock") == 10 and not report.skipped, report  # mid 2, up 4 x 2
    names = dict(report.patched)
    for n in ("post_quant_conv", "decoder.conv_in", "decoder.conv_out", "decoder.up_blocks.0.upsamplers.0.time_conv"):
        assert names.get("vae." + n) == "WanCausalConv3d", n
    assert names.get("vae.decoder.norm_out + nonlinearity") == "WanRMS_norm + SiLU"
    assert kinds.count("WanUpsample + Conv2d") == 3
    calls = Calls(monkeypatch)
    got = decode(vae, z)
    assert calls.n["conv3d"] == calls.n["interpolate"] == calls.n["silu"] == 0 and calls.n["fusedk"] > 50, calls.n
    assert got.shape == want.shape == (1, 3, 9, 48, 40) and rel(got, want) < 1e-5, rel(got, want)
    monkeypatch.undo()
    assert fd.revert(vae) == len(report.patched)
    assert torch.equal(decode(vae, z), want)
    for n, p in vae.named_parameters():
        assert torch.equal(p, before[n]) and p.is_contiguous(), n


def test_cpu_wan_tiled_batch_and_fallbacks(monkeypatch):
    vae = make(WAN_TINY, kind="AutoencoderKLWan")
    vae.enable_tiling(tile_sample_min_height=32, tile_sample_min_width=32, tile_sample_stride_height=16,
                      tile_sample_stride_width=16)
    z = torch.randn(2, 4, 2, 6, 7)  # two samples, tiles of 4 x 4 latents and their blending
    want = decode(vae, z)
    fd.apply(vae)
    calls = Calls(monkeypatch)
    assert rel(decode(vae, z), want) < 1e-5
    assert calls.n["conv3d"] == 0 and calls.n["fusedk"] > 0
    monkeypatch.setattr(fd.vae, "CPU_REFERENCE", False)
    calls.n.update(fusedk=0, conv3d=0)
    assert rel(decode(vae, z), want) < 1e-6  # CPU tensors: the stock forwards
    assert calls.n["fusedk"] == 0 and calls.n["conv3d"] > 0
    fd.revert(vae)


@pytest.mark.parametrize("config,causal,blocks", [(LTX_090, False, 6), (LTX_095, True, 4)],
                         ids=["0.9.0", "0.9.5-causal"])
def test_cpu_ltx_decode_report_and_revert(monkeypatch, config, causal, blocks):
    """LTX-Video: two samples, three latent frames (the time padding repeating the first and last
    frame), the timestep modulation in the norms, every conv through fusedk"""
    vae = make(dict(config, decoder_causal=causal), kind="AutoencoderKLLTXVideo")
    z = torch.randn(2, 8, 3, 4, 5)
    temb = torch.tensor([0.05, 0.3]) if config.get("timestep_conditioning") else None
    with torch.no_grad():
        want = vae.decode(z, temb).sample
    report = fd.apply(vae)
    assert [c for _, c in report.patched].count("LTXVideoResnetBlock3d") == blocks and not report.skipped, report
    calls = Calls(monkeypatch)
    with torch.no_grad():
        got = vae.decode(z, temb).sample
    assert calls.n["conv3d"] == 0 and calls.n["fusedk"] > 10, calls.n
    assert got.shape == want.shape == (2, 3, 17, 128, 160) and rel(got, want) < 1e-5, rel(got, want)
    monkeypatch.undo()
    assert fd.revert(vae) == len(report.patched)
    with torch.no_grad():
        assert torch.equal(vae.decode(z, temb).sample, want)


def test_cpu_mochi_decode_report_and_revert(monkeypatch):
    """Mochi: two samples, three latent frames (13 frames out), the edge-replicated convs and the
    per-frame GroupNorm through fusedk; framewise decoding too"""
    vae = make(MOCHI_TINY, kind="AutoencoderKLMochi")
    z = torch.randn(2, 4, 3, 4, 5)
    want = decode(vae, z)
    report = fd.apply(vae)
    names = dict(report.patched)
    assert list(names.values()).count("MochiResnetBlock3D") == 5 and not report.skipped, report
    assert names.get("decoder.conv_in") == "Conv3d"
    calls = Calls(monkeypatch)
    got = decode(vae, z)
    assert calls.n["conv3d"] == 0 and calls.n["fusedk"] > 10, calls.n
    assert got.shape == want.shape == (2, 3, 13, 32, 40) and rel(got, want) < 1e-5, rel(got, want)
    block = vae.decoder.block_in.resnets[0]
    assert block.conv1.conv.weight.is_contiguous(memory_format=torch.channels_last_3d)  # stored NDHWC: no copy
    fired = []  # a hook inside a fused block: the block runs its stock forward, and the hook fires
    handle = block.conv1.register_forward_hook(lambda *a: fired.append(1))
    assert rel(decode(vae, z), want) < 1e-5 and fired
    handle.remove()
    vae.use_framewise_decoding, vae.num_latent_frames_batch_size = True, 2
    monkeypatch.undo()
    fd.revert(vae)
    assert not [n for n, m in vae.named_modules() if "_fusedk_w" in vars(m)]  # no weight copy left behind
    want = decode(vae, z)  # framewise: each batch of latent frames padded on its own
    fd.apply(vae)
    assert rel(decode(vae, z), want) < 1e-5
    assert fd.revert(vae) == len(report.patched)
    assert torch.equal(decode(vae, z), want)


VIDEO_GPU = {  # kind, config, latent shape, decode timestep: the real configs at small sizes
    "wan": ("AutoencoderKLWan", WAN, (1, 16, 3, 16, 24), None),  # 9 frames of 128 x 192
    "ltx": ("AutoencoderKLLTXVideo", dict(LTX_095, latent_channels=128, block_out_channels=(128, 256, 512, 512),
                                          decoder_block_out_channels=(128, 256, 512), decoder_layers_per_block=(2,) * 4),
            (1, 128, 3, 8, 12), 0.05),  # 0.9.5's decoder form at 128..512 channels
    "mochi": ("AutoencoderKLMochi", dict(in_channels=15, out_channels=3, latent_channels=12), (1, 12, 3, 8, 12), None),
}


@pytest.mark.skipif(not oracle.torch_cuda()[1], reason="no CUDA device, torch or fusedk GPU half")
@pytest.mark.parametrize("which", list(VIDEO_GPU))
def test_gpu_video_decode_error_against_float32(which):
    """the contract for the video VAEs: random weights, 3 latent frames, bf16 patched against the
    float32 decoder no worse than 1.5x stock bf16's; revert gives stock's bits back"""
    kind, cfg, zs, t = VIDEO_GPU[which]
    z = torch.randn(zs, device="cuda")
    temb = None if t is None else torch.tensor([t], device="cuda")

    def run(vae, dtype):
        with torch.no_grad():
            return (vae.decode(z.to(dtype)) if t is None else vae.decode(z.to(dtype), temb.to(dtype))).sample

    exact = run(make(cfg, torch.float32, "cuda", kind=kind), torch.float32)
    vae = make(cfg, torch.bfloat16, "cuda", kind=kind)
    stock = run(vae, torch.bfloat16)
    report = fd.apply(vae)
    assert len(report.patched) > 5 and not report.skipped, report
    got = run(vae, torch.bfloat16)
    assert rel(got, exact) <= 1.5 * rel(stock, exact), (rel(got, exact), rel(stock, exact))
    fd.revert(vae)
    assert torch.equal(run(vae, torch.bfloat16), stock)


@pytest.mark.skipif(not oracle.torch_cuda()[1], reason="no CUDA device, torch or fusedk GPU half")
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_gpu_decode_error_against_float32(dtype):
    """the contract: the patched 16-bit decode's error against the float32 decoder no more than
    1.5x stock 16-bit's (Flux's VAE config, random weights, a 256^2 image)"""
    ref = make(FLUX, torch.float32, "cuda")
    z = torch.randn(1, 16, 32, 32, device="cuda")
    exact = decode(ref, z)
    vae = make(FLUX, dtype, "cuda")
    stock = decode(vae, z.to(dtype))
    report = fd.apply(vae)
    assert len(report.patched) > 10 and not report.skipped, report
    got = decode(vae, z.to(dtype))
    assert rel(got, exact) <= 1.5 * rel(stock, exact), (rel(got, exact), rel(stock, exact))
    compiled = torch.compile(vae.decoder)  # the patched ops traced: the same contract
    with torch.no_grad():
        assert rel(compiled(z.to(dtype)), exact) <= 1.5 * rel(stock, exact)
    fd.revert(vae)
    assert torch.equal(decode(vae, z.to(dtype)), stock)


def test_cpu_tail_with_a_hooked_silu_leaves_the_pair_and_patches_the_norm():
    """the closing norm + SiLU fuse only as a pair: a hooked SiLU leaves both modules' forwards to
    the SiLU's hook and the norm patched on its own (Wan's norm_out as any other WanRMS_norm)"""
    vae = make(WAN_TINY, kind="AutoencoderKLWan")
    z = torch.randn(1, 4, 2, 6, 5)
    want = decode(vae, z)
    vae.decoder.nonlinearity._hf_hook = object()  # accelerate's marker: the module is someone else's
    report = fd.apply(vae)
    names = dict(report.patched)
    assert names.get("decoder.norm_out") == "WanRMS_norm", report
    assert [k for n, k, _ in report.skipped if n == "decoder.norm_out + nonlinearity"] == ["WanRMS_norm + SiLU"]
    assert "forward" not in vars(vae.decoder.nonlinearity)
    assert rel(decode(vae, z), want) < 1e-5
    fd.revert(vae)
    assert "forward" not in vars(vae.decoder.norm_out)
