#!/bin/sh
# Builds examples/c_drop_in the way a C user would (make + cc, and nvcc when present) in a
# scratch directory, and runs what it built.
set -eu
src=$1/examples/c_drop_in
out=$2
mkdir -p "$out"
make -s -C "$src" FUSEDK="$1" OUT="$out" cpu
"$out/demo_cpu"
if command -v nvcc >/dev/null 2>&1; then
  make -s -C "$src" FUSEDK="$1" OUT="$out" GENCODE="-gencode=arch=compute_90a,code=sm_90a" gpu
  "$out/demo_gpu"
else
  echo "nvcc not found: GPU drop-in build not tried"
fi
