#!/usr/bin/env bash
# Runs every test suite: cpu, gpu (SKIP without a device), python, examples.
#   bash tools/test.sh [meson test arguments, e.g. --suite cpu]
# Set-up on first use: the project venv .venv/ with meson, ninja, numpy, ml_dtypes, cffi, pytest,
# hypothesis (tests/python/test_properties.py), jax (CPU wheels: the Python suite runs fusedk's ops
# under jax.jit on the CPU too) and torch + diffusers + peft (fusedk.torch, torch.compile and
# fusedk.diffusers on real models, LoRA'd ones too, run on CPU tensors;
# PyPI's torch wheel brings ~2.5 GB of CUDA libraries: about 3 minutes once; FUSEDK_TEST_TORCH=0
# leaves them out and those tests skip), see tools/venv.sh. .venv/bin goes first on PATH, so meson
# finds the venv's python for the Python suite.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
fusedk_venv "${FUSEDK_BASE_PACKAGES[@]}" jax hypothesis
if [ "${FUSEDK_TEST_TORCH:-1}" != 0 ]; then  # optional: without them those tests skip
  fusedk_venv torch==2.11.0 diffusers==0.42.1 peft==0.21.2 ||
    echo "fusedk: torch/diffusers/peft not installed; their tests skip" >&2
fi
cd "$FUSEDK_ROOT"
meson setup --reconfigure build
meson test -C build --print-errorlogs "$@"
