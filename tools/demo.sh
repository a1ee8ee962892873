#!/usr/bin/env bash
# Builds fusedk and runs its demo: the GPU kernel against the CPU reference when the build has
# the GPU half (nvcc found) and a GPU is present, the CPU references otherwise; examples/dit_block
# (one DiT block in C on fusedk alone) the same way; then, on a GPU
# machine with torch and diffusers, a diffusers Flux block stock and patched (fusedk.diffusers).
#   bash tools/demo.sh
# Set-up on first use: the project venv .venv/ with meson, ninja, numpy, ml_dtypes, cffi, pytest
# (tools/venv.sh); needs a C compiler and Python 3 with its venv module.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
fusedk_venv "${FUSEDK_BASE_PACKAGES[@]}"
cd "$FUSEDK_ROOT"
meson setup --reconfigure build ${FUSEDK_CUDA:+-Dcuda=$FUSEDK_CUDA}  # FUSEDK_CUDA=disabled: CPU-only, no nvcc run
meson compile -C build
build/fusedk_demo
build/fusedk_dit_block  # a Flux-style block in C: checked against the CPU block, and timed on a GPU
# with a GPU, torch and diffusers (in the venv, or the python3 on PATH before it): a Flux block,
# stock and patched by fusedk.diffusers, timed side by side
for py in "$FUSEDK_VENV/bin/python" "$(PATH=${PATH#"$FUSEDK_VENV/bin:"} command -v python3 || true)"; do
  if [ -x "$py" ] && "$py" -c 'import torch, diffusers, cffi, ml_dtypes; assert torch.cuda.is_available()' 2>/dev/null; then
    FUSEDK_LIBRARY=build/libfusedk.so FUSEDK_HEADER=fusedk.h PYTHONPATH=bindings/python${PYTHONPATH:+:$PYTHONPATH} \
      "$py" examples/diffusers_block.py
    exit
  fi
done
echo "fusedk: no python with torch, diffusers and a CUDA device: the diffusers block demo is skipped"
