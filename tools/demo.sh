#!/usr/bin/env bash
# Builds fusedk and runs its demo: the GPU kernel against the CPU reference when the build has
# the GPU half (nvcc found) and a GPU is present, the CPU references otherwise.
#   bash tools/demo.sh
# Set-up on first use: the project venv .venv/ with meson, ninja, numpy, ml_dtypes, cffi, pytest
# (tools/venv.sh); needs a C compiler and Python 3 with its venv module.
set -euo pipefail
. "$(dirname "${BASH_SOURCE[0]}")/venv.sh"
fusedk_venv "${FUSEDK_BASE_PACKAGES[@]}"
cd "$FUSEDK_ROOT"
meson setup --reconfigure build
meson compile -C build
build/fusedk_demo
