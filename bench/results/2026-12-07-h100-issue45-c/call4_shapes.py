# one conv a shape, for ncu: Wan's 384-channel causal 3x3x3 at 60x104 and 120x208 (4 frames), Flux's 512 at 128^2
import sys, torch, fusedk
bf = torch.bfloat16
for s in sys.argv[1:]:
    if s.startswith("wan"):
        H, W = (60, 104) if s == "wan60" else (120, 208)
        x = torch.randn(1, 4, H, W, 384, device="cuda", dtype=bf)
        w = torch.randn(384, 3, 3, 3, 384, device="cuda", dtype=bf) * 0.01
        y = fusedk.conv(x, w, None, padding=1, pad_t=2)
    else:
        x = torch.randn(1, 128, 128, 512, device="cuda", dtype=bf)
        w = torch.randn(512, 3, 3, 512, device="cuda", dtype=bf) * 0.02
        y = fusedk.conv(x, w, None, padding=1)
    torch.cuda.synchronize()
    print(s, tuple(y.shape))
