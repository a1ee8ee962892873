#!/usr/bin/env bash
# Runs every test suite: cpu, gpu (SKIP without a device), python, examples.
#   bash tools/test.sh [meson test arguments, e.g. --suite cpu]
# Set-up on first use: the project venv .venv/ with meson, ninja, numpy, ml_dtypes, cffi, pytest
# and jax (CPU wheels: the Python suite runs fusedk's ops under jax.jit on the CPU too), see
# tools/venv.sh. .venv/bin goes first on PATH, so meson finds the venv's python for the Python suite.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
fusedk_venv "${FUSEDK_BASE_PACKAGES[@]}" jax
cd "$FUSEDK_ROOT"
meson setup --reconfigure build
meson test -C build --print-errorlogs "$@"
