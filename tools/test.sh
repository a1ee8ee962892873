#!/usr/bin/env bash
# Runs every test suite: cpu, gpu (SKIP without a device), python, examples.
#   bash tools/test.sh [meson test arguments, e.g. --suite cpu]
# Set-up on first use: the project venv .venv/ with meson, ninja, numpy, ml_dtypes, cffi, pytest,
# hypothesis (tests/python/test_properties.py), jax (CPU wheels: the Python suite runs fusedk's ops
# under jax.jit on the CPU too) and torch + diffusers + peft (fusedk.torch, torch.compile and
# fusedk.diffusers on real models, LoRA'd ones too, run on CPU tensors;
# PyPI's torch wheel brings ~2.5 GB of CUDA libraries: about 3 minutes once; FUSEDK_TEST_TORCH=0
# leaves them out and those tests skip: the venv is then ~0.6 GB instead of ~5.5 GB), see
# tools/venv.sh. .venv/bin goes first on PATH, so meson finds the venv's python for the Python
# suite. FUSEDK_CUDA=disabled builds without the GPU half (no nvcc run: minutes less on a machine
# without a GPU, whose GPU suites skip anyway).
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
fusedk_venv "${FUSEDK_BASE_PACKAGES[@]}" jax hypothesis
if [ "${FUSEDK_TEST_TORCH:-1}" != 0 ]; then  # optional: without them those tests skip
  fusedk_venv torch==2.11.0 diffusers==0.42.1 peft==0.21.2 ||
    echo "fusedk: torch/diffusers/peft not installed; their tests skip" >&2
fi
cd "$FUSEDK_ROOT"
meson setup --reconfigure build ${FUSEDK_CUDA:+-Dcuda=$FUSEDK_CUDA}
rc=0
meson test -C build --print-errorlogs "$@" || rc=$?
# the Python suite's own counts (meson counts it as one test)
if [ -f build/meson-logs/testlog.txt ]; then
  grep -hE "^=* ?[0-9]+ (passed|failed).* in [0-9.]+s" build/meson-logs/testlog.txt | sed 's/^=* */pytest: /; s/ =*$//' || true
fi
exit $rc
