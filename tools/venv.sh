# Sourced by tools/demo.sh and tools/test.sh: the project's Python environment.
#   fusedk_venv PKG...   makes sure .venv/ (in the repository, ignored by git) exists and has
#                        PKG... installed, then puts .venv/bin first on PATH, so meson, ninja and
#                        the python that meson finds for the Python suite are the venv's.
# The venv sidesteps distro Pythons that refuse `pip install` outside one (PEP 668). The first
# run creates it and installs from PyPI; later runs reuse it (a package is installed once, as
# recorded in .venv/.fusedk-installed). Start over with `rm -rf .venv`.
#   FUSEDK_PYTHON   the interpreter that creates the venv (default: python3)
#   FUSEDK_VENV     where the venv lives (default: <repository>/.venv)
FUSEDK_ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
FUSEDK_VENV=${FUSEDK_VENV:-$FUSEDK_ROOT/.venv}

_fusedk_say() { echo "fusedk: $*" >&2; }

_fusedk_make_venv() {
  local py=${FUSEDK_PYTHON:-python3} ver
  if ! command -v "$py" >/dev/null 2>&1; then
    _fusedk_say "$py not found: install Python 3 (>= 3.9), or set FUSEDK_PYTHON to one"
    return 1
  fi
  rm -rf "$FUSEDK_VENV"
  _fusedk_say "creating the project venv $FUSEDK_VENV with $(command -v "$py") (once)"
  "$py" -m venv "$FUSEDK_VENV" && : >"$FUSEDK_VENV/.fusedk-installed" && return 0
  rm -rf "$FUSEDK_VENV"  # a venv without pip (no ensurepip) is of no use
  ver=$("$py" -c 'import sys; print("%d.%d" % sys.version_info[:2])' 2>/dev/null || echo 3)
  # Debian/Ubuntu ship the venv module (and ensurepip) apart: python3-venv, python3.X-venv
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    _fusedk_say "'$py -m venv' failed; installing python3-venv with apt-get"
    { apt-get update -qq && { DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv "python$ver-venv" ||
        DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv; }; } >/dev/null 2>&1 ||
      _fusedk_say "apt-get install python3-venv failed"
    "$py" -m venv "$FUSEDK_VENV" && : >"$FUSEDK_VENV/.fusedk-installed" && return 0
    rm -rf "$FUSEDK_VENV"
  fi
  _fusedk_say "'$py -m venv' cannot create a virtual environment: Python's venv module (with ensurepip)
  is missing. Install it and run this again; on Debian/Ubuntu: sudo apt-get install python3-venv
  (or python$ver-venv), elsewhere the python3-venv/python3-virtualenv package of your distribution,
  or point FUSEDK_PYTHON at a Python that has it."
  return 1
}

fusedk_venv() {
  local stamp=$FUSEDK_VENV/.fusedk-installed missing=() p
  if ! "$FUSEDK_VENV/bin/python" -c 'import pip' >/dev/null 2>&1; then
    if [ -e "$FUSEDK_VENV" ] && ! [ -f "$stamp" ]; then  # not ours: leave it be
      _fusedk_say "$FUSEDK_VENV exists but is not a Python venv with pip; remove it, or set FUSEDK_VENV to another place"
      return 1
    fi
    _fusedk_make_venv || return 1
  fi
  for p in "$@"; do
    grep -qxF "$p" "$stamp" 2>/dev/null || missing+=("$p")
  done
  if [ ${#missing[@]} -gt 0 ]; then
    _fusedk_say "installing into $FUSEDK_VENV: ${missing[*]}"
    if ! "$FUSEDK_VENV/bin/python" -m pip install -q --disable-pip-version-check "${missing[@]}"; then
      _fusedk_say "pip install ${missing[*]} failed (the first run needs PyPI, or a mirror set in PIP_INDEX_URL)"
      return 1
    fi
    printf '%s\n' "${missing[@]}" >>"$stamp"
  fi
  export VIRTUAL_ENV=$FUSEDK_VENV
  export PATH=$FUSEDK_VENV/bin:$PATH
  unset PYTHONHOME
}

# what both commands need: the build (meson, ninja) and the Python suite (numpy, ml_dtypes, cffi, pytest)
FUSEDK_BASE_PACKAGES=(meson ninja numpy ml_dtypes cffi pytest)
