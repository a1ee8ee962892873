"""fusedk.diffusers on real diffusers models (small random configs; the real dims on the GPU):
patched outputs against a float32 run of the unpatched model, eager, under
torch.compile(fullgraph=True) and in a CUDA graph; revert bit-identical; what is left alone is
reported. CPU tensors run fusedk's C references; CUDA tensors (when present) the kernels.
Each model's table entry lives in its own dit_<model>.py next to this file."""
import importlib
import importlib.util
import warnings

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("diffusers")
if not hasattr(torch.Tensor, "__dlpack_c_exchange_api__"):
    pytest.skip("this torch has no DLPack C exchange API (torch >= 2.11)", allow_module_level=True)
import fusedk  # noqa: E402
import fusedk.diffusers as fd  # noqa: E402

MODELS = {}
for _name in ("flux", "ltx", "mochi", "wan"):
    try:
        _mod = importlib.import_module(f"dit_{_name}")
    except ImportError:  # that model's entry is not written yet, or this diffusers lacks the model
        continue
    MODELS[_name] = _mod

_CUDA = torch.cuda.is_available() and bool(fusedk.kernel_info()["cuda"].get("devices"))
DEVICES = ["cpu"] + (["cuda"] if _CUDA else [])


def rel(a, ref):
    """(relative L2, max abs) of a against the float64 of ref."""
    d = a.double() - ref
    return (d.norm() / ref.norm()).item(), d.abs().max().item()


def run(model, inputs):
    with torch.no_grad():
        return model(**inputs)


def in_dtype(model, dtype):
    """model in dtype, as from_pretrained(torch_dtype=dtype) loads it (Wan's norms stay float32)."""
    model = model.to(dtype)
    keep = getattr(model, "_keep_in_fp32_modules", None) or ()
    for n, p in model.named_parameters():
        if any(k in n for k in keep):
            p.data = p.data.float()
    return model


def pair(name, device, dtype=torch.bfloat16, big=False):
    """(float32 model, model in dtype with the same weights, float32 inputs, dtype inputs)."""
    m = MODELS[name]
    torch.manual_seed(0)
    ref = m.build(big).to(device).eval()
    low = m.build(big).to(device).eval()
    low.load_state_dict(ref.state_dict())
    low = in_dtype(low, dtype)
    x32 = m.inputs(ref, device, big)
    xl = {k: (v.to(dtype) if torch.is_tensor(v) and v.is_floating_point() and k not in m.KEEP_F32 else v)
          for k, v in x32.items()}
    return m, ref, low, x32, xl


def check_close(got, stock, ref, what):
    g, s = rel(got, ref), rel(stock, ref)
    assert g[0] <= 1.5 * s[0] and g[1] <= 1.5 * s[1], f"{what}: patched error {g} vs stock {s}"


def counting(monkeypatch, op="attention"):
    """fusedk.<op> wrapped to count its eager calls (the block operator's included): [count]."""
    calls, real = [0], getattr(fusedk, op)

    def counted(*a, **kw):
        calls[0] += 1
        return real(*a, **kw)
    monkeypatch.setattr(fusedk, op, counted)
    return calls


@pytest.mark.parametrize("attention", [False, True])
@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_patched_matches_float32_as_well_as_stock(name, device, attention, monkeypatch):
    m, ref, low, x32, xl = pair(name, device)
    want = m.output(run(ref, x32)).double()
    stock = m.output(run(low, xl))
    calls = counting(monkeypatch)
    report = fd.apply(low, attention=attention)
    assert len(report.patched) == len(m.blocks(low)) and not report.skipped, report
    got = m.output(run(low, xl))
    assert (calls[0] >= len(m.blocks(low))) == attention, calls  # fusedk's kernel in every block, or none
    check_close(got, stock, want, f"{name} eager attention={attention}")
    assert fd.apply(low).patched == []  # applying twice patches nothing new
    assert fd.revert(low) == len(m.blocks(low))
    assert torch.equal(m.output(run(low, xl)), stock)  # the stock forwards, bit for bit


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_int8_attention_within_its_contract(name, device, monkeypatch):
    """apply(attention="int8"): the int8 kernel in every block (q and k straight from
    qk_norm_rope_int8 where the block's q and k come from qk_norm_rope: all but Mochi, whose text
    rows are reordered after), and the output's error against float32 at most 3x the stock bf16
    model's: the 8-bit path's per-model contract. On a GPU the models have their real widths
    (head sizes 64 and 128: what the kernel takes)"""
    if device == "cuda" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("attention_int8's kernel needs sm_90a")
    m, ref, low, x32, xl = pair(name, device, big=device == "cuda")
    want = m.output(run(ref, x32)).double()
    stock = m.output(run(low, xl))
    sage = None
    if device == "cuda" and importlib.util.find_spec("sageattention"):  # diffusers' own 8-bit backend, the peer
        try:
            low.set_attention_backend("sage")
            out = m.output(run(low, xl))
            sage = None if torch.equal(out, stock) else rel(out, want)  # equal: the processors do not dispatch
        except RuntimeError as e:  # diffusers 0.42 takes sageattention >= 2.1.1 only (PyPI has 1.0.6)
            print(f"diffusers' sage backend: {str(e)[:120]}")
        low.reset_attention_backend()
    precisions, real = [], fusedk.attention

    def recorded(*a, **kw):
        precisions.append("scaled" if isinstance(a[0], fusedk.ScaledTensor) else kw.get("precision"))
        return real(*a, **kw)
    monkeypatch.setattr(fusedk, "attention", recorded)
    report = fd.apply(low, attention="int8")
    assert "int8" in repr(report) and not report.skipped, report
    got = m.output(run(low, xl))
    assert len(precisions) >= len(m.blocks(low)), precisions
    assert set(precisions) <= {"int8", "scaled"}, precisions  # (Wan's cross-attention: attention_int8)
    assert precisions.count("scaled") >= (0 if name == "mochi" else len(m.blocks(low))), precisions
    g, s = rel(got, want), rel(stock, want)
    print(f"{name} {device}: int8 {g}, stock {s}, sage backend {sage}")
    assert g[0] <= 3 * s[0], f"{name}: int8 error {g} vs stock {s}"
    assert sage is None or g[0] <= sage[0], f"{name}: int8 error {g} vs diffusers' sage backend {sage}"
    fd.revert(low)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_int8_error_on_the_models_inputs(name, device, monkeypatch):
    """attention_int8's error on the inputs each model's attention gets (the 8-bit contract's
    family (d)): q, k, v captured from the bf16 model (on a GPU its real widths, one or two
    blocks; on the CPU the small test model), random weights, against float64 attention of them:
    within the outliers' bound 0.06 (cosine >= 0.999); on a GPU, where sageattention is
    installed, at most twice its error on the same inputs"""
    import oracle
    if device == "cuda" and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("attention_int8's kernel needs sm_90a")
    m, _, model, _, x = pair(name, device, big=device == "cuda")
    calls, real = [], fusedk.attention

    def recorded(q, k, v, *a, **kw):
        calls.append((q, k, v, kw.get("kv_len")))
        return real(q, k, v, *a, **kw)
    monkeypatch.setattr(fusedk, "attention", recorded)
    fd.apply(model, attention=True)
    run(model, x)
    fd.revert(model)
    assert calls
    for i, (q, k, v, kv_len) in enumerate(calls):
        n = None if kv_len is None else kv_len.cpu().numpy()
        want = torch.from_numpy(oracle.attention(*(t.float().cpu().numpy() for t in (q, k, v)), kv_len=n)[0])
        got = fusedk.attention_int8(q, k, v, kv_len=kv_len).double().cpu()
        # q and k quantized a row without k's mean (what qk_norm_rope_int8 emits), the scaled op
        scaled = real(*(fusedk.ScaledTensor(*_rows_int8(t)) for t in (q, k)), v, kv_len=kv_len)
        e, es8 = rel(got, want)[0], rel(scaled.double().cpu(), want)[0]
        cos = torch.nn.functional.cosine_similarity(got.flatten(), want.flatten(), 0).item()
        line = (f"{name} {device} call {i} q{tuple(q.shape)} k{tuple(k.shape)}: rel. L2 {e:.4f} cosine {cos:.6f}, "
                f"scaled (no k mean) {es8:.4f}")
        assert e <= 0.06 and es8 <= 0.06 and cos >= 0.999, line
        if device == "cuda" and importlib.util.find_spec("sageattention") and kv_len is None:
            from sageattention import sageattn
            sage = sageattn(*(t.transpose(1, 2) for t in (q, k, v)), tensor_layout="HND").transpose(1, 2)
            es = rel(sage.cpu(), want)[0]
            line += f"; sageattention {es:.4f}"
            assert e <= 2 * es and es8 <= 2 * es, line
        print(line)


def _rows_int8(x):
    """x's (token, head) rows as int8 data and a float32 scale a row, fusedk.h's rule (amax / 127,
    round half to even), in torch on x's device"""
    xf = x.float()
    amax = xf.abs().amax(-1)
    inv = torch.where(amax > 0, 127 / amax, torch.zeros_like(amax))
    return torch.round(xf * inv[..., None]).clamp(-127, 127).to(torch.int8), amax / 127


@pytest.mark.parametrize("device,attention", [(d, False) for d in DEVICES] + [(DEVICES[-1], True),
                                                                           (DEVICES[-1], "int8")])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_compiled_fullgraph(name, device, attention):
    m, ref, low, x32, xl = pair(name, device)
    want = m.output(run(ref, x32)).double()
    stock = m.output(run(torch.compile(low, fullgraph=True), xl))
    torch._dynamo.reset()
    fd.apply(low, attention=attention)
    got = m.output(run(torch.compile(low, fullgraph=True), xl))  # fullgraph: any graph break raises
    check_close(got, stock, want, f"{name} compiled attention={attention}")
    torch._dynamo.reset()
    fd.revert(low)


@pytest.mark.skipif(not _CUDA, reason="no CUDA device")
@pytest.mark.parametrize("attention", [False, True, "int8"])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_cuda_graph(name, attention):
    m, ref, low, x32, xl = pair(name, "cuda")
    fd.apply(low, attention=attention)
    eager = m.output(run(low, xl))
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        run(low, xl)  # warm-up on the capture stream: plans, allocator blocks
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.no_grad(), torch.cuda.graph(g):
        out = m.output(low(**xl))
    g.replay()
    torch.cuda.synchronize()
    assert torch.equal(out, eager)
    fd.revert(low)


@pytest.mark.skipif(not _CUDA, reason="no CUDA device")
@pytest.mark.parametrize("attention", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_real_dims_one_block(name, attention):
    """One block at the model's real width (heads, head dim) and a short sequence."""
    m, ref, low, x32, xl = pair(name, "cuda", big=True)
    want = m.output(run(ref, x32)).double()
    stock = m.output(run(low, xl))
    fd.apply(low, attention=attention)
    check_close(m.output(run(low, xl)), stock, want, f"{name} real dims attention={attention}")


@pytest.mark.skipif("mochi" not in MODELS, reason="this diffusers lacks Mochi")
@pytest.mark.parametrize("attention", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_mochi_padded_text(device, attention):
    """Padded text tokens (a padded tail, and holes): the stock processor attends per sample over
    the valid ones and zeros the rest; fusedk's kernel masks them through kv_len."""
    m, ref, low, x32, xl = pair("mochi", device)
    mask = torch.ones_like(xl["encoder_attention_mask"])
    mask[0, 5:] = False
    mask[1, ::3] = False
    x32["encoder_attention_mask"] = xl["encoder_attention_mask"] = mask
    want = m.output(run(ref, x32)).double()
    stock = m.output(run(low, xl))
    fd.apply(low, attention=attention)
    check_close(m.output(run(low, xl)), stock, want, f"mochi padded text attention={attention}")
    got = m.output(run(torch.compile(low, fullgraph=True), xl))
    torch._dynamo.reset()
    check_close(got, stock, want, f"mochi padded text compiled attention={attention}")
    fd.revert(low)


@pytest.mark.skipif("mochi" not in MODELS, reason="this diffusers lacks Mochi")
@pytest.mark.parametrize("kernel", ["fusedk", "sdpa"])
@pytest.mark.parametrize("device", DEVICES)
def test_mochi_masked_attention_packs_rows_as_stock(device, kernel):
    """Mochi's attention in one batched call with no host sync (fusedk's kernel with kv_len, or
    SDPA with a boolean mask, as torch.compile runs it) against the stock processor's per-sample
    path on text masks with a padded tail and with holes: the valid text rows' outputs packed first,
    then zeros (Sq = S), or the video rows only (the last block). float32 on the CPU (rounding
    only), bf16 on the GPU (bf16's rounding)."""
    from fusedk.diffusers import mochi
    dt, bound = (torch.float32, 1e-5) if device == "cpu" else (torch.bfloat16, 1e-2)
    B, Si, St, H, Dh = 2, 24, 8, 2, 64
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(B, Si + St, H, Dh, generator=g).to(device, dt) for _ in range(3))
    mask = torch.ones(B, St, dtype=torch.bool)
    mask[0, 5:] = False
    mask[1, ::3] = False
    mask = mask.to(device)
    pieces = fd.Pieces(fd.OPS | ({"attention"} if kernel == "fusedk" else set()))
    for Sq in (Si + St, Si):
        want = mochi._attend(q, k, v, Sq, mochi._validrows(mask, B, Si)).double()
        got = mochi._attend_masked(pieces, None, q.clone(), k.clone(), v.clone(), Sq, mask).double()
        assert got.shape == want.shape
        for b in range(B):
            assert rel(got[b], want[b])[0] < bound, (Sq, b, rel(got[b], want[b]))
        if Sq > Si:  # the padded rows: zeros on both sides, exactly
            assert torch.equal(got[0, Si + 5:], want[0, Si + 5:]) and not got[0, Si + 5:].any()


@pytest.mark.skipif("mochi" not in MODELS, reason="this diffusers lacks Mochi")
@pytest.mark.parametrize("attention", [False, True])
@pytest.mark.parametrize("device", DEVICES)
def test_mochi_compiled_as_users_compile_it(device, attention):
    """A user's torch.compile(model) (graph breaks allowed, as stock Mochi needs them) and
    torch._dynamo.explain on a patched Mochi: masks full and padded, B = 1 and 2, every run as
    close to float32 as the stock eager model"""
    m, ref, low, x32, xl = pair("mochi", device)
    fd.apply(low, attention=attention)
    for B in (1, 2):
        for padded in (False, True):
            a = {k: (v[:B] if torch.is_tensor(v) else v) for k, v in x32.items()}
            b = {k: (v[:B] if torch.is_tensor(v) else v) for k, v in xl.items()}
            mask = torch.ones_like(b["encoder_attention_mask"])
            if padded:
                mask[0, 5:] = False
                mask[-1, ::3] = False
            a["encoder_attention_mask"] = b["encoder_attention_mask"] = mask
            want = m.output(run(ref, a)).double()
            fd.revert(low)
            stock = m.output(run(low, b))
            fd.apply(low, attention=attention)
            torch._dynamo.reset()
            got = m.output(run(torch.compile(low), b))
            check_close(got, stock, want, f"mochi compiled B={B} padded={padded} attention={attention}")
            torch._dynamo.reset()
            with torch.no_grad():
                explained = torch._dynamo.explain(low)(**b)
            assert explained.graph_count >= 1
    torch._dynamo.reset()
    fd.revert(low)


@pytest.mark.skipif(not _CUDA or "mochi" not in MODELS, reason="no CUDA device, or this diffusers lacks Mochi")
@pytest.mark.parametrize("attention", [False, True])
def test_mochi_real_width_compiled(attention):
    """mochi-1's width, B = 1 and 256 text tokens of which 200 are valid, then diffusers' test
    config's B = 2 with every token valid: the whole model under torch.compile, patched, as close to
    float32 as the stock eager model"""
    m, ref, low, x32, xl = pair("mochi", "cuda", big=True)
    g = torch.Generator().manual_seed(2)
    for B, St, valid in ((1, 256, 200), (2, 256, 256)):
        a = dict(x32, hidden_states=torch.cat([x32["hidden_states"]] * B),
                 encoder_hidden_states=torch.randn(B, St, ref.config.text_embed_dim, generator=g).cuda(),
                 timestep=torch.cat([x32["timestep"]] * B),
                 encoder_attention_mask=(torch.arange(St) < valid).expand(B, St).cuda())
        b = {k: (v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() and k not in m.KEEP_F32 else v)
             for k, v in a.items()}
        want = m.output(run(ref, a)).double()
        stock = m.output(run(low, b))
        fd.apply(low, attention=attention)
        torch._dynamo.reset()
        got = m.output(run(torch.compile(low), b))
        check_close(got, stock, want, f"mochi real width compiled B={B} valid={valid} attention={attention}")
        torch._dynamo.reset()
        fd.revert(low)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_moved_after_apply_then_compiled_and_exported(name):
    """apply() on a freshly built model, then .to() (as diffusers' tests and users do: build,
    patch, move): the fused weights are made again by the move itself, so a torch.compile'd first
    call (fullgraph, no recompile) runs fused, as close to float32 as the stock model; torch.export
    traces the stock forwards (AOTInductor cannot package fusedk's Python operators): stock bits"""
    import copy
    m, ref, model, x32, _ = pair(name, "cpu", torch.float32)
    stock = copy.deepcopy(model).to(torch.bfloat16)
    fd.apply(model)
    model = model.to(torch.bfloat16)
    block = m.blocks(model)[0]
    assert all(v.dtype == torch.bfloat16 for v in block._fusedk.views)  # prepared again at the move
    x = {k: (v.to(torch.bfloat16) if torch.is_tensor(v) and v.is_floating_point() and k not in m.KEEP_F32 else v)
         for k, v in x32.items()}
    want = m.output(run(ref, x32)).double()
    with torch.no_grad():
        base = m.output(stock(**x))
        torch._dynamo.reset()
        with torch._dynamo.config.patch(error_on_recompile=True):
            c = torch.compile(model, fullgraph=True)
            for _ in range(2):
                check_close(m.output(c(**x)), base, want, f"{name} moved after apply, compiled")
        torch._dynamo.reset()
        x.pop("return_dict", None)
        ep = torch.export.export(model, args=(), kwargs=x)  # the stock forwards: AOTInductor packages it
        assert not any(str(n.target).startswith(("fusedk.", "fusedk_diffusers.")) for n in ep.graph.nodes)
        assert torch.equal(m.output(ep.module()(**x)), base)


def test_apply_attention_takes_a_bool():
    m, ref, low, x32, xl = pair(sorted(MODELS)[0], "cpu")
    with pytest.raises(fusedk.Error, match="attention is 'yes', expected True, False or 'int8'"):
        fd.apply(low, attention="yes")
    assert not any(getattr(b, "_fusedk", None) for b in m.blocks(low))  # nothing patched


@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_runs_the_stock_forward_with_a_warning(name):
    m, ref, low, x32, xl = pair(name, "cpu", torch.float32)
    want = m.output(low(**xl))  # grad mode on, parameters require grad
    fd.apply(low)
    fd._warned.clear()
    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        got = m.output(low(**xl))
    assert any("runs its stock forward while autograd records" in str(x.message) for x in w)
    assert torch.equal(got, want)
    got.float().square().mean().backward()  # gradients flow, as stock
    assert all(p.grad is not None for p in m.blocks(low)[0].parameters())


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_hook_inside_a_block_runs_it_stock_while_it_is_there(name):
    """a torch hook on a module inside a block (which the fused forward never calls), before
    apply(): the block is patched, but runs its stock forward while the hook is there (the hook
    runs; one warning), then fused again once it is removed"""
    m, ref, low, x32, xl = pair(name, "cpu")
    stock = m.output(run(low, xl))
    block = m.blocks(low)[0]
    inner = next(s for s in block.modules() if isinstance(s, torch.nn.Linear))
    calls = []
    h = inner.register_forward_hook(lambda *a: calls.append(1))
    report = fd.apply(low)
    assert len(report.patched) == len(m.blocks(low)) and not report.skipped, report
    fd._warned.clear()
    with pytest.warns(RuntimeWarning, match="runs its stock forward while .* has hooks"):
        got = m.output(run(low, xl))
    assert calls and block._fusedk is not None
    others = m.output(run(low, xl))  # the other blocks fused, this one stock: close to stock
    assert torch.allclose(got.float(), others.float()) and torch.allclose(got.float(), stock.float(), atol=0.1)
    h.remove()
    calls.clear()
    fused = m.output(run(low, xl))
    assert not calls
    fd.revert(low)
    assert torch.equal(m.output(run(low, xl)), stock)
    del fused


def test_ops_subset_and_bad_names():
    name = sorted(MODELS)[0]
    m, ref, low, x32, xl = pair(name, "cpu")
    want = m.output(run(ref, x32)).double()
    stock = m.output(run(low, xl))
    fd.apply(low, ops=[])  # every piece as the stock torch expression, through the fused forward's structure
    check_close(m.output(run(low, xl)), stock, want, f"{name} ops=[]")
    fd.revert(low)
    with pytest.raises(fusedk.Error, match="ops has"):
        fd.apply(low, ops=["bogus"])


def test_changes_after_apply_are_seen():
    """.to(), a new state dict, a hook or a LoRA layer added after apply(): the fused weights are
    made again, or the block runs its stock forward (with a warning), never the stale weights."""
    import copy
    name = "flux" if "flux" in MODELS else sorted(MODELS)[0]
    m, ref, low, x32, xl = pair(name, "cpu")
    stock = copy.deepcopy(low).float()
    fd.apply(low)
    low.float()  # new storage for every parameter: fused again at the next call
    assert torch.allclose(m.output(run(low, x32)), m.output(run(stock, x32)), rtol=1e-4, atol=1e-5)
    other = m.build()
    low.load_state_dict(other.state_dict(), assign=True)  # new Parameter objects
    other.eval()
    assert torch.allclose(m.output(run(low, x32)), m.output(run(other, x32)), rtol=1e-4, atol=1e-5)
    block = m.blocks(low)[0]
    lin = next(s for s in block.modules() if type(s) is torch.nn.Linear and s.weight.data_ptr() in
               {p.data_ptr() for p in block._fusedk.views})
    before = m.output(run(low, x32))
    h = lin.register_forward_hook(lambda mod, i, o: o * 0)  # a hook the fused forward would skip
    fd._warned.clear()
    with pytest.warns(RuntimeWarning, match="runs its stock forward while"):
        got = m.output(run(low, x32))
    assert block._fusedk is not None  # stock while the hook is there
    assert not torch.allclose(got, before, rtol=1e-3, atol=1e-3)  # the hook ran
    h.remove()
    assert torch.allclose(m.output(run(low, x32)), before)


def test_out_with_grad_raises_and_patched_models_copy():
    import copy
    x = torch.randn(4, 64, requires_grad=True)
    with pytest.raises(fusedk.Error, match="out= is given and an input requires grad"):
        fusedk.rmsnorm(x, out=torch.empty(4, 64))
    name = sorted(MODELS)[0]
    m, ref, low, x32, xl = pair(name, "cpu")
    fd.apply(low)
    twin = copy.deepcopy(low)
    assert torch.equal(m.output(run(twin, xl)), m.output(run(low, xl)))


@pytest.mark.parametrize("name", sorted(MODELS))
def test_another_attention_processor_is_reported(name):
    from diffusers.models.attention_processor import AttnProcessor2_0
    m, ref, low, x32, xl = pair(name, "cpu")
    block = m.blocks(low)[0]
    (getattr(block, "attn", None) or block.attn1).processor = AttnProcessor2_0()
    report = fd.apply(low)
    assert [why for _, _, why in report.skipped] == [f"attention processor AttnProcessor2_0, expected "
                                                     f"{type((getattr(m.blocks(ref)[0], 'attn', None) or m.blocks(ref)[0].attn1).processor).__name__}"]
    assert len(report.patched) == len(m.blocks(low)) - 1
    fd.revert(low)


def add_lora(models, targets, ranks=(4, 8), weights=(1.0, 0.5)):
    """peft LoRA adapters "one", "two", ... of these ranks on targets (random B: not a no-op), added
    to each model, the first model's LoRA weights copied into the others (in their dtypes), all
    active with these set_adapters weights."""
    peft = pytest.importorskip("peft")
    names = ["one", "two", "three"][:len(ranks)]
    for model in models:
        for name, r, seed in zip(names, ranks, (5, 6, 7)):
            torch.manual_seed(seed)
            model.add_adapter(peft.LoraConfig(r=r, lora_alpha=2 * r, target_modules=targets, init_lora_weights=False),
                              adapter_name=name)
        model.set_adapters(names, list(weights))
    first = dict(models[0].named_parameters())
    with torch.no_grad():
        for model in models[1:]:
            for n, p in model.named_parameters():
                if ".lora_" in n:
                    p.copy_(first[n])


def lora_pair(name, device, ranks=(4, 8), dtype=torch.bfloat16):
    """The model with peft LoRA adapters on every projection of its blocks (dit_<model>.LORA),
    "one" and "two" active with weights 1.0 and 0.5: (module, float32 model, the same in dtype,
    float32 inputs, dtype inputs)"""
    import copy
    m, ref, low, x32, xl = pair(name, device)
    add_lora([ref], m.LORA, ranks)
    return m, ref, in_dtype(copy.deepcopy(ref), dtype), x32, xl


def folded(m, model):
    """Whether every block of model is patched with LoRA adapters folded into its q/k/v GEMM."""
    return all(b.__dict__.get("_fusedk") is not None and b._fusedk.p["qkv"].a is not None for b in m.blocks(model))


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_lora_folds_into_the_gemms(name, device, monkeypatch):
    """peft LoRA layers on every projection of a model's blocks (two adapters of ranks 4 and 8 with
    set_adapters weights): every block patched and run fused with the adapters in its GEMMs
    (linear_lowrank), as close to float32 as the stock LoRA'd model; changing the adapters
    (weights, one disabled, all disabled) after apply is seen; revert gives the stock forwards back
    bit for bit; compiled (fullgraph: each block one fusedk_diffusers::block operator) too"""
    m, ref, low, x32, xl = lora_pair(name, device)
    want = m.output(run(ref, x32)).double()
    stock = m.output(run(low, xl))
    base = m.output(run(pair(name, device)[2], xl))
    assert not torch.allclose(stock.float(), base.float(), atol=1e-2)  # the adapters change the output
    report = fd.apply(low)
    assert len(report.patched) == len(m.blocks(low)) and not report.skipped, report
    assert folded(m, low)
    calls = counting(monkeypatch, "linear_lowrank")
    check_close(m.output(run(low, xl)), stock, want, f"{name} LoRA eager")
    assert calls[0] >= len(m.blocks(low)) and folded(m, low), calls  # run fused, not stock
    from torch.profiler import ProfilerActivity, profile
    calls[0] = 0
    torch._dynamo.reset()
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        check_close(m.output(run(torch.compile(low, fullgraph=True), xl)), stock, want, f"{name} LoRA compiled")
    assert "fusedk_diffusers::block" in {e.key for e in prof.key_averages()}
    assert calls[0] >= len(m.blocks(low)) and folded(m, low), calls
    torch._dynamo.reset()
    for change in (lambda t: t.set_adapters(["one"], [0.7]), lambda t: t.disable_adapters()):
        change(ref), change(low)
        want = m.output(run(ref, x32)).double()
        fd.revert(low)
        stock = m.output(run(low, xl))
        fd.apply(low)
        check_close(m.output(run(low, xl)), stock, want, f"{name} LoRA after a change (applied again)")
        change(low)  # and the same change seen by an already patched model
        check_close(m.output(run(low, xl)), stock, want, f"{name} LoRA after a change")
    assert fd.revert(low) == len(m.blocks(low))
    assert torch.equal(m.output(run(low, xl)), stock)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("compiled", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_lora_added_after_apply(name, compiled, device):
    """peft LoRA adapters (ranks 3 and 16: padded to 8 and not) added to a patched model, then its
    first call, eager or torch.compile'd (fullgraph): the blocks prepared again with the adapters
    folded in, as close to float32 as the stock model with the same adapters"""
    import copy
    m, ref, low, x32, xl = pair(name, device)
    stock = copy.deepcopy(low)
    fd.apply(low)
    add_lora([ref, low, stock], m.LORA, ranks=(3, 16))
    want = m.output(run(ref, x32)).double()
    f = (lambda model: torch.compile(model, fullgraph=True)) if compiled else (lambda model: model)
    torch._dynamo.reset()
    base = m.output(run(f(stock), xl))
    torch._dynamo.reset()
    check_close(m.output(run(f(low), xl)), base, want, f"{name} LoRA added after apply, compiled={compiled}")
    assert folded(m, low)
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_compiled_after_lora_unloaded_runs_fused(name, monkeypatch):
    """a patched LoRA'd model, compiled (fullgraph), then its adapters unloaded (unload_lora):
    the compiled model runs fused without them (the operator prepares the blocks again: their
    GEMMs hold no adapters, linear_lowrank is not called), as close to float32 as the stock model
    without LoRA"""
    m, ref, low, x32, xl = lora_pair(name, "cpu")
    fd.apply(low)
    torch._dynamo.reset()
    c = torch.compile(low, fullgraph=True)
    with torch.no_grad():
        run(c, xl)
        assert folded(m, low)
        ref.unload_lora(), low.unload_lora()
        calls = counting(monkeypatch, "linear_lowrank")
        want = m.output(run(ref, x32)).double()
        stock = m.output(run(pair(name, "cpu")[2], xl))
        check_close(m.output(run(c, xl)), stock, want, f"{name} compiled after unload_lora")
    assert calls[0] == 0, calls
    assert all(b.__dict__.get("_fusedk") is not None and b._fusedk.p["qkv"].a is None for b in m.blocks(low))
    torch._dynamo.reset()


@pytest.mark.parametrize("name", sorted(MODELS))
def test_lora_training_step_keeps_the_block_patched(name):
    """a patched model with LoRA dropout, trained a step (model.train(), autograd recording: the
    blocks run stock, the adapters' weights change), then back in eval under no_grad: the blocks
    run fused again with the stepped adapters folded in, as close to float32 as the stock model"""
    import copy
    peft = pytest.importorskip("peft")
    m, ref, low, x32, xl = pair(name, "cpu")
    for model in (ref, low):
        torch.manual_seed(5)
        model.add_adapter(peft.LoraConfig(r=4, lora_alpha=8, lora_dropout=0.1, target_modules=m.LORA,
                                          init_lora_weights=False))
        model.eval()  # peft's dropout layers start in training mode
    fd.apply(low)
    with torch.no_grad():
        run(low, xl)
    assert folded(m, low)
    low.train()
    fd._warned.clear()
    for n, p in low.named_parameters():
        p.requires_grad_(".lora_" in n)
    loras = [p for p in low.parameters() if p.requires_grad]
    with pytest.warns(RuntimeWarning, match="runs its stock forward while autograd records"):
        m.output(low(**xl)).float().square().mean().backward()
    with torch.no_grad():
        for p in loras:
            p.add_(1e-2 * p.grad)
    low.eval()
    with torch.no_grad():
        first = dict(low.named_parameters())
        for n, p in ref.named_parameters():
            if ".lora_" in n:
                p.copy_(first[n])
        want = m.output(run(ref, x32)).double()
        got = m.output(run(low, xl))
    assert folded(m, low)  # patched again, not unpatched for good
    stock = copy.deepcopy(low)
    fd.revert(stock)
    with torch.no_grad():
        check_close(got, m.output(run(stock, xl)), want, f"{name} LoRA after a training step")


@pytest.mark.parametrize("after_apply", [False, True])
@pytest.mark.parametrize("name", sorted(MODELS))
def test_compiled_sees_adapters_swapped_in_place(name, after_apply):
    """a compiled patched model (each LoRA'd block one fusedk_diffusers::block operator, which runs
    eagerly) after its LoRA weights are swapped in place, as peft's hotswap does: no recompile
    (error_on_recompile), and the next compiled call gives the bits of the model compiled afresh.
    The adapters added before apply(), or after it and run under inference_mode, as diffusers' own
    hotswap test does (else under no_grad)"""
    peft = pytest.importorskip("peft")
    if after_apply:
        m, ref, low, x32, xl = pair(name, "cpu")
        fd.apply(low)
        torch.manual_seed(5)
        low.add_adapter(peft.LoraConfig(r=8, lora_alpha=8, target_modules=m.LORA, init_lora_weights=False))
        adapter, mode = "default", torch.inference_mode
    else:
        m, ref, low, x32, xl = lora_pair(name, "cpu")
        fd.apply(low)
        adapter, mode = "one", torch.no_grad
    torch._dynamo.reset()
    c = torch.compile(low, fullgraph=True)
    with torch._dynamo.config.patch(error_on_recompile=True), mode():
        first = m.output(run(c, xl))
        for mod in low.modules():
            if hasattr(mod, "lora_B") and adapter in mod.lora_B:
                mod.lora_B[adapter].weight.mul_(-3)  # in place: same tensors, new values
        got = m.output(run(c, xl))
    assert not torch.equal(first, got)
    torch._dynamo.reset()
    with mode():
        assert torch.equal(got, m.output(run(torch.compile(low, fullgraph=True), xl)))  # compiled afresh
    assert folded(m, low)  # the adapters folded in, not stock
    torch._dynamo.reset()


def test_flux_lora_changed_after_apply_and_too_wide():
    """set_adapters after apply (no re-apply): the next eager call folds the new weights in; adapters
    wider than one GEMM takes (3 x 48 columns for q, k, v) leave the block unpatched, reported"""
    m, ref, low, x32, xl = lora_pair("flux", "cpu")
    fd.apply(low)
    ref.set_adapters(["one", "two"], [0.25, 1.5])
    low.set_adapters(["one", "two"], [0.25, 1.5])
    want = m.output(run(ref, x32)).double()
    got = m.output(run(low, xl))
    fd.revert(low)
    check_close(got, m.output(run(low, xl)), want, "flux LoRA weights changed after apply")
    m, ref, low, x32, xl = lora_pair("flux", "cpu", ranks=(48, 4))
    report = fd.apply(low)
    assert not report.patched and all("expected at most 128" in why for _, _, why in report.skipped), report


def test_flux_replaced_parameters_and_merged_disabled_lora():
    """a single projection's parameter replaced after apply (as load_state_dict(assign=True) does)
    is seen; a merged LoRA then disabled (peft unmerges it at its next forward) is left alone"""
    m, ref, low, x32, xl = pair("flux", "cpu")
    fd.apply(low)
    blk = m.blocks(low)[0]
    with torch.no_grad():
        blk.ff.net[2].weight = torch.nn.Parameter(blk.ff.net[2].weight * 3)
    got = m.output(run(low, xl))
    fd.revert(low)
    fd.apply(low)  # prepared afresh from the new parameter: the same bits
    assert torch.equal(got, m.output(run(low, xl)))
    fd.revert(low)
    m, ref, low, x32, xl = lora_pair("flux", "cpu")
    for mod in low.modules():
        if hasattr(mod, "merge") and hasattr(mod, "lora_A"):
            mod.merge()
    low.disable_adapters()
    report = fd.apply(low)
    assert not report.patched and all("merged LoRA is disabled" in why for _, _, why in report.skipped), report


def regional_compile(m, low, xl, recompile_limit=8):
    """diffusers' compile_repeated_blocks on model low, stock and then patched: (the graphs each
    compiled, each one's output of a second call, the profile of the patched one's)."""
    import torch._dynamo.utils as du
    from torch.profiler import ProfilerActivity, profile
    graphs, outs = [], []
    for patched in (False, True):
        if patched:
            fd.apply(low)
            for b in m.blocks(low):
                b._compiled_call_impl = None  # (compile_repeated_blocks again, on the patched blocks)
        torch._dynamo.reset()
        du.counters.clear()
        low.compile_repeated_blocks(fullgraph=True)
        with torch._dynamo.config.patch(recompile_limit=recompile_limit):
            run(low, xl)
            with profile(activities=[ProfilerActivity.CPU]) as p:
                outs.append(m.output(run(low, xl)))
        graphs.append(du.counters["stats"]["unique_graphs"])
    torch._dynamo.reset()
    return graphs, outs, p


def test_flux_regional_compile_one_operator_a_block():
    """under diffusers' compile_repeated_blocks each patched Flux block is one fusedk_diffusers::block
    operator: no more graphs than the stock model compiles (one a block class, and the single
    blocks' strided-input variant), each block class's forward a code object of its own (torch
    counts recompiles a code object), and the compiled model gives the eager patched model's bits"""
    m, ref, low, x32, xl = pair("flux", "cpu")
    eager = pair("flux", "cpu")[2]
    fd.apply(eager)
    eager = m.output(run(eager, xl))
    graphs, outs, p = regional_compile(m, low, xl)
    assert torch.equal(outs[1], eager)
    names = {e.key for e in p.key_averages()}
    assert "fusedk_diffusers::block" in names and not any(n.startswith("fusedk::") for n in names), names
    assert graphs[1] <= graphs[0], graphs
    codes = {type(b): b.forward.__func__.__code__ for b in m.blocks(low)}
    assert len(set(map(id, codes.values()))) == len(codes) == 2, codes  # (equal, not the same)


@pytest.mark.parametrize("name", [n for n in ("ltx", "wan") if n in MODELS])
def test_regional_compile_no_more_graphs_than_stock(name):
    """compile_repeated_blocks on a patched model with several blocks (recompile_limit=1): the
    trace's checks (hooks, the fused Linears still in place) specialise on no block, so no more
    graphs than stock, as close to float32 as the stock compiled model"""
    m, ref, low, x32, xl = pair(name, "cpu")
    assert len(m.blocks(low)) > 1
    graphs, outs, _ = regional_compile(m, low, xl, recompile_limit=1)
    assert graphs[1] <= graphs[0], graphs
    check_close(outs[1], outs[0], m.output(run(ref, x32)).double(), f"{name} regionally compiled")


def test_flux_copy_compiled_runs_its_own_blocks():
    """a deep copy of a patched Flux with its own weights, compiled before any eager call and after
    the original is gone: each fusedk_diffusers::block runs the copy's block; the operator is
    tagged cudagraph_unsafe (Inductor's CUDA graphs run around it)"""
    import copy
    import gc
    m, ref, low, x32, xl = pair("flux", "cpu")
    fd.apply(low)
    assert torch.Tag.cudagraph_unsafe in torch.ops.fusedk_diffusers.block.default.tags
    before = m.output(run(low, xl))
    twin = copy.deepcopy(low)
    with torch.no_grad():
        for b in m.blocks(twin):
            b.attn.to_v.weight.mul_(4)  # a view into the copy's fused q/k/v weight
    fresh = pair("flux", "cpu")[2]
    fresh.load_state_dict(twin.state_dict())
    fd.apply(fresh)
    del low
    gc.collect()
    torch._dynamo.reset()
    got = m.output(run(torch.compile(twin, fullgraph=True), xl))
    torch._dynamo.reset()
    assert torch.equal(got, m.output(run(torch.compile(fresh, fullgraph=True), xl)))  # the same weights, patched afresh
    torch._dynamo.reset()
    assert (got.float() - before.float()).abs().max() > 0.08  # not the original's weights (0.16 here)


def test_lora_factor_on_another_device_is_refused():
    """a LoRA factor (A or B) on another device than its base layer: the projection is refused
    with a reason naming the adapter, not copied across devices at every call"""
    peft = pytest.importorskip("peft")
    from fusedk.diffusers._lora import lora_of
    for factor in ("lora_A", "lora_B"):
        model = torch.nn.Sequential(torch.nn.Linear(16, 16))
        model = peft.get_peft_model(model, peft.LoraConfig(r=4, target_modules=["0"]))
        lin = model.base_model.model[0]
        assert isinstance(lora_of(lin), tuple)
        f = getattr(lin, factor)["default"]
        f.weight = torch.nn.Parameter(torch.empty(f.weight.shape, device="meta"))
        why = lora_of(lin)
        assert isinstance(why, str) and "'default'" in why and "meta" in why, why


def test_apply_again_registers_no_new_kinds():
    """apply and revert over and over: the block operator's kinds (one a block class) stay as the
    first apply made them"""
    from fusedk.diffusers import _block_op
    m, ref, low, x32, xl = pair("ltx", "cpu")
    fd.apply(low)
    kinds = list(_block_op._KINDS)
    for _ in range(3):
        fd.revert(low)
        fd.apply(low)
    assert _block_op._KINDS == kinds
    fd.revert(low)


# --- precision="fp8" ------------------------------------------------------------------------------
def _fp8_rowwise_linear(x, w, b):
    """torchao's Float8 PerRow linear in torch: x a scale a row, w one an output channel, e4m3
    each (amax / 448), the product of the dequantized values in float32, then the bias"""
    def q(t):
        s = t.float().abs().amax(-1, keepdim=True).clamp(min=1e-12) / 448
        return (t.float() / s).clamp(-448, 448).to(torch.float8_e4m3fn).float() * s
    y = q(x) @ q(w).t()
    return (y if b is None else y + b.float()).to(x.dtype)


def _torchao_like(model, blocks):
    """Every nn.Linear inside the blocks, the modulation ones too, through _fp8_rowwise_linear (what
    apply(precision="fp8") quantizes): the peer's error on the same weights and inputs"""
    for blk in blocks:
        for n, lin in blk.named_modules():
            if type(lin) is torch.nn.Linear:
                lin.forward = (lambda L: lambda x: _fp8_rowwise_linear(x, L.weight, L.bias))(lin)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_fp8_projections_within_the_peers_error(name, device, monkeypatch):
    m, ref, low, x32, xl = pair(name, device)
    want = m.output(run(ref, x32)).double()
    stock = m.output(run(low, xl))
    calls, glu8 = counting(monkeypatch, "linear_fp8"), counting(monkeypatch, "glu_fp8")
    w8 = counting(monkeypatch, "linear_w8")
    report = fd.apply(low, precision="fp8")
    assert len(report.patched) == len(m.blocks(low)) and "FP8" in repr(report), report
    got = m.output(run(low, xl))
    assert calls[0] >= 2 * len(m.blocks(low)), calls  # the blocks' projections on FP8 GEMMs
    assert glu8[0] >= (len(m.blocks(low)) if name == "mochi" else 0), glu8  # SwiGLU's hidden state
    assert w8[0] == (len(m.blocks(low)) if name in ("flux", "mochi") else 0), w8  # the modulation, weight-only
    fd.revert(low)
    assert torch.equal(m.output(run(low, xl)), stock)  # revert: the stock forwards, bit for bit
    _torchao_like(low, m.blocks(low))
    peer = m.output(run(low, xl))
    e, ep, es = rel(got, want)[0], rel(peer, want)[0], rel(stock, want)[0]
    assert e <= 1.1 * ep + 1e-3, f"{name}: fp8 {e:.4f}, torchao-like per-row {ep:.4f}, stock bf16 {es:.4f}"


def test_fp8_precision_argument():
    with pytest.raises(fusedk.InvalidArgumentError, match="precision is 'int4', expected None"):
        fd.apply(torch.nn.Linear(2, 2), precision="int4")


def test_fp8_error_helper(capsys):
    m, ref, low, x32, xl = pair("flux", "cpu")
    stock = m.output(run(low, xl))
    e = fd.fp8_error(low, **xl)
    assert 0 < e < 0.2 and "relative L2 of the FP8 output" in capsys.readouterr().out
    assert torch.equal(m.output(run(low, xl)), stock)  # reverted
    fd.apply(low)
    with pytest.raises(fusedk.InvalidArgumentError, match="patched already"):
        fd.fp8_error(low, **xl)


@pytest.mark.parametrize("device", DEVICES)
def test_fp8_with_lora_on_the_mlp_output_only(device):
    """A LoRA on ff.net.2 alone: that projection stays bf16 (linear_lowrank), its input still made
    by the FP8 fc1 (the buffer with room for h taken from the FP8 norm's rows)"""
    import copy
    m, ref, low, x32, xl = pair("flux", device)
    add_lora([ref], ["ff.net.2"], ranks=(4,), weights=(1.0,))
    low = in_dtype(copy.deepcopy(ref), torch.bfloat16)
    want = m.output(run(ref, x32)).double()
    stock = m.output(run(low, xl))
    report = fd.apply(low, precision="fp8")
    assert not report.skipped, report
    blk = m.blocks(low)[0]
    assert blk._fusedk.p["ff2"].w8 is None and blk._fusedk.p["ff2"].a is not None and blk._fusedk.p["ff1"].w8 is not None
    got = m.output(run(low, xl))
    assert rel(got, want)[0] < 2 * rel(stock, want)[0] + 0.05


def test_fp8_weights_follow_in_place_writes():
    """w8 is a copy: an in-place change of a projection's weight (load_state_dict, .mul_) makes
    the block quantize it again at its next call"""
    m, ref, low, x32, xl = pair("flux", "cpu")
    fd.apply(low, precision="fp8", bf16_weights="keep")
    before = m.output(run(low, xl))
    blk = m.blocks(low)[0]
    old = blk._fusedk.p["qkv"].w8
    with torch.no_grad():
        blk.attn.to_q.weight.mul_(0.5)
    after = m.output(run(low, xl))
    assert blk._fusedk.p["qkv"].w8 is not old and not torch.equal(before, after)
    fresh = copy_apply(low, xl, m)
    assert torch.equal(after, fresh)


def copy_apply(model, xl, m):
    """the output of a copy of model (reverted, then applied again in FP8): what a fresh apply gives"""
    import copy
    c = copy.deepcopy(model)
    fd.revert(c)
    fd.apply(c, precision="fp8", bf16_weights="keep")
    return m.output(run(c, xl))


def test_fp8_bf16_weights_on_the_host():
    """apply(precision="fp8", bf16_weights="host"): the FP8 projections' parameters empty on their
    device, the output that of the weights kept, revert bit for bit; the stock forward's paths, a
    move and a bad value refused by name"""
    import copy
    m, ref, low, x32, xl = pair("flux", "cpu")
    stock = m.output(run(low, xl))
    keep = copy.deepcopy(low)
    fd.apply(keep, precision="fp8", bf16_weights="keep")
    want = m.output(run(keep, xl))
    before = sum(p.numel() for p in low.parameters())
    report = fd.apply(low, precision="fp8")  # bf16_weights="host" by default
    assert "host memory" in repr(report)
    blk = m.blocks(low)[0]
    assert blk.attn.to_q.weight.numel() == 0 and blk.norm1.linear.weight.numel() == 0  # the modulation's too
    assert sum(p.numel() for p in low.parameters()) < 0.5 * before
    assert torch.equal(m.output(run(low, xl)), want)
    with pytest.raises(fusedk.Error, match="autograd records it"):
        blk.attn.to_k.weight.requires_grad_(True)
        with torch.enable_grad():
            run_grad = {k: v for k, v in xl.items()}
            low(**run_grad)
    blk.attn.to_k.weight.requires_grad_(False)
    assert fd.revert(low) == len(m.blocks(low))
    assert blk.attn.to_q.weight.numel() > 0 and torch.equal(m.output(run(low, xl)), stock)
    # a move or cast while the weights are on the host: refused before any module changes
    fd.apply(low, precision="fp8", bf16_weights="host")
    with pytest.raises(fusedk.Error, match="the model is being moved or cast"):
        low.to(torch.float16)
    assert torch.equal(m.output(run(low, xl)), want)  # nothing was cast
    fd.revert(low)
    assert "_apply" not in vars(low) and torch.equal(m.output(run(low, xl)), stock)
    with pytest.raises(fusedk.InvalidArgumentError, match="bf16_weights is 'disk', expected 'keep' or 'host'"):
        fd.apply(low, precision="fp8", bf16_weights="disk")
