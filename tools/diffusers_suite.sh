#!/usr/bin/env bash
# diffusers' own model tests for Flux, LTX-Video, Mochi and Wan, run twice on this machine: on stock
# models, then with fusedk.diffusers.apply() on every model right after its construction
# (tools/diffusers_apply.py). A patched model passes every test its stock model passes: the script
# prints both counts per model and the tests that pass stock and fail patched, and exits 1 if any.
#   bash tools/diffusers_suite.sh TESTS [MODEL...]     (MODEL: flux ltx mochi wan; default: all four)
# TESTS: the tests/ folder of a diffusers checkout whose models/testing_utils match the installed
# diffusers (tests/models/transformers/test_models_transformer_<model>.py, tests/testing_utils.py).
# fusedk must be importable (PYTHONPATH, FUSEDK_LIBRARY). Logs: $OUT (default ./out)/diffusers-*.txt.
# SUITE_TIMEOUT (s, default 900) bounds each run; pytest's own PYTEST_ADDOPTS adds arguments to both
# runs (PYTEST_ADDOPTS='-k "not compile"').
set -uo pipefail
tests=${1:?usage: tools/diffusers_suite.sh DIFFUSERS_TESTS [MODEL...]}
shift
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(flux ltx mochi wan)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
tools=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$tests/.." && pwd)  # diffusers' tests import as the package `tests`
worse=0
for m in "${models[@]}"; do
  f=tests/models/transformers/test_models_transformer_$m.py
  for kind in stock patched; do
    plugin=()
    [ $kind = patched ] && plugin=(-p diffusers_apply)
    (cd "$root" && PYTHONPATH=$tools:${PYTHONPATH:-} timeout "${SUITE_TIMEOUT:-900}" python3 -m pytest -q -rA \
      -p no:cacheprovider ${plugin[@]+"${plugin[@]}"} "$f") >"$OUT/diffusers-$m-$kind.txt" 2>&1
    echo "$m $kind: $(grep -E '^(=+ )?[0-9]+ (passed|failed)|(passed|failed|error).* in [0-9.]+s' "$OUT/diffusers-$m-$kind.txt" | tail -1) $(grep -h "^fusedk.diffusers.apply:" "$OUT/diffusers-$m-$kind.txt")"
  done
  grep -E '^PASSED ' "$OUT/diffusers-$m-stock.txt" | sed 's/^PASSED //' | sort >"$OUT/.stock"
  grep -E '^PASSED ' "$OUT/diffusers-$m-patched.txt" | sed 's/^PASSED //' | sort >"$OUT/.patched"
  lost=$(comm -23 "$OUT/.stock" "$OUT/.patched")
  if ! [ -s "$OUT/.stock" ]; then
    worse=1
    echo "$m: no test passed on the stock model: see $OUT/diffusers-$m-stock.txt"
  elif [ -n "$lost" ]; then
    worse=1
    echo "$m: passes stock, not patched:"
    echo "$lost" | sed 's/^/  /'
  else
    echo "$m: patched passes every test stock passes ($(wc -l <"$OUT/.stock") of them)"
  fi
done
rm -f "$OUT/.stock" "$OUT/.patched"
exit $worse
