"""A diffusers Flux block, stock and patched by fusedk.diffusers (with diffusers' attention
dispatch, and with fusedk's attention: apply(..., attention=True)), timed side by side (what
tools/demo.sh runs on a machine with a GPU, torch and diffusers).

    PYTHONPATH=bindings/python FUSEDK_LIBRARY=build/libfusedk.so python3 examples/diffusers_block.py [--compile]

Flux-dev's width (24 heads of 128) with random bf16 weights, a 1024x1024 image's 4096 tokens
and 512 text tokens, B1; ms a call from CUDA events over 20 calls, the better of 3 tries each.
--compile also times the stock block and the patched one under torch.compile."""
import sys

import torch

import fusedk.diffusers


def main():
    if not torch.cuda.is_available():
        print("diffusers_block: no CUDA device; skipped")
        return 0
    from diffusers.models.transformers.transformer_flux import FluxPosEmbed, FluxTransformerBlock
    torch.manual_seed(0)
    with torch.device("cuda"):
        stock = FluxTransformerBlock(3072, 24, 128).to(torch.bfloat16).eval()
        for p in stock.parameters():
            torch.nn.init.normal_(p, 0, 0.02)
        patched, attn = (FluxTransformerBlock(3072, 24, 128).to(torch.bfloat16).eval() for _ in range(2))
        patched.load_state_dict(stock.state_dict())
        attn.load_state_dict(stock.state_dict())
        Si, St = 4096, 512
        x, c, t = torch.randn(1, Si, 3072), torch.randn(1, St, 3072), torch.randn(1, 3072)
        x, c, t = x.bfloat16(), c.bfloat16(), t.bfloat16()
        ids = torch.cat([torch.zeros(St, 3), torch.stack(torch.meshgrid(torch.zeros(1), torch.arange(64.0),
                                                                           torch.arange(64.0), indexing="ij"),
                                                            -1).reshape(-1, 3)])
        rope = FluxPosEmbed(10000, [16, 56, 56])(ids)
    print(fusedk.diffusers.apply(patched))
    fusedk.diffusers.apply(attn, attention=True)
    kw = dict(hidden_states=x, encoder_hidden_states=c, temb=t, image_rotary_emb=rope)

    def ms(block):
        best = float("inf")
        for _ in range(3):
            block(**kw)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            for _ in range(20):
                block(**kw)
            e.record()
            e.synchronize()
            best = min(best, s.elapsed_time(e) / 20)
        return best

    def diff(block, ref):
        return max(((p.float() - q.float()).norm() / q.float().norm()).item() for p, q in zip(block(**kw), ref))
    rows = [("stock eager (torch SDPA)", stock), ("fusedk eager (torch SDPA)", patched),
            ("fusedk eager, attention=True", attn)]
    if "--compile" in sys.argv[1:]:
        rows += [("stock torch.compile", torch.compile(stock)), ("fusedk torch.compile, attention=True",
                                                                  torch.compile(attn, fullgraph=True))]
    with torch.inference_mode():
        ref = stock(**kw)
        t_stock = ms(stock)
        print(f"FluxTransformerBlock, 4096 + 512 tokens, bf16, torch {torch.__version__}, {torch.cuda.get_device_name()}:")
        for name, block in rows:
            t_block = ms(block)
            print(f"  {name:38s} {t_block:7.3f} ms  ({t_stock / t_block:.2f}x stock eager; outputs differ from "
                  f"stock's by {diff(block, ref):.1e} relative L2)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
