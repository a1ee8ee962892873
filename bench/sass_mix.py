#!/usr/bin/env python3
"""Two builds' kernels compared instruction by instruction, without a GPU: each kernel's SASS
opcode counts in object A and object B (cuobjdump -sass), the kernels whose mix differs, and the
opcodes that differ. A change meant to leave a kernel's code alone should show nothing here; a
kernel whose uniform-datapath ops (U*: loop-uniform offsets) turn into per-thread IMAD/SEL/ISETP
has lost the compiler's proof that a value is warp-uniform.

    python3 bench/sass_mix.py A.o B.o [--match attn_kernel] [--all]

cuobjdump and nvdisasm come with the CUDA toolkit, or from PyPI (nvidia-cuda-cuobjdump,
nvidia-cuda-nvdisasm: bin/ under nvidia/cu13) on PATH. Objects: build-gpu's
libfusedk_kernels_<part>.a.p/fusedk_kernels.cu.o, or one part compiled by hand with
-DFUSEDK_ONLY_<PART>."""
import argparse
import collections
import re
import subprocess


def mix(obj):
    """{demangled kernel: Counter(opcode)} of obj's SASS (anonymous namespaces dropped: two builds'
    hashes differ)."""
    sass = subprocess.run(["cuobjdump", "-sass", obj], capture_output=True, text=True, check=True).stdout
    out, cur = {}, None
    for line in sass.splitlines():
        m = re.search(r"Function : (\S+)", line)
        if m:
            cur = out.setdefault(m.group(1), collections.Counter())
            continue
        m = re.match(r"\s+/\*[0-9a-f]{4,}\*/\s+(@!?U?P\w+\s+)?([A-Z][A-Z0-9_]*)", line)
        if m and cur is not None:
            cur[m.group(2)] += 1
    names = subprocess.run(["c++filt"], input="\n".join(out), capture_output=True, text=True).stdout.split("\n")
    return {n.replace("(anonymous namespace)::", ""): c for n, c in zip(names, out.values())}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--match", default="", help="only kernels whose name contains this")
    ap.add_argument("--all", action="store_true", help="list kernels whose mix is the same too")
    o = ap.parse_args()
    a, b = mix(o.a), mix(o.b)
    uniform = lambda c: sum(v for k, v in c.items() if k.startswith("U"))  # noqa: E731
    for k in sorted(set(a) | set(b)):
        if o.match not in k:
            continue
        ca, cb = a.get(k, collections.Counter()), b.get(k, collections.Counter())
        if ca == cb and not o.all:
            continue
        print(f"{k[:120]}\n  total {sum(ca.values())} -> {sum(cb.values())}, uniform ops {uniform(ca)} -> {uniform(cb)}")
        for op in sorted(set(ca) | set(cb), key=lambda x: -abs(ca[x] - cb[x])):
            if ca[op] != cb[op]:
                print(f"    {op:10s} {ca[op]:6d} -> {cb[op]:6d}")


if __name__ == "__main__":
    main()
