#!/usr/bin/env bash
# diffusers' own model tests for Flux, LTX-Video, Mochi and Wan, run twice on this machine: on stock
# models, then with fusedk.diffusers.apply() on every model right after its construction
# (tools/diffusers_apply.py). A patched model passes every test its stock model passes: the script
# prints both counts per model and the tests that pass stock and fail patched, and exits 1 if any.
#   bash tools/diffusers_suite.sh TESTS [MODEL...]     (MODEL: flux ltx mochi wan; default: all four)
# TESTS: the tests/ folder of a diffusers checkout whose models/testing_utils match the installed
# diffusers (tests/models/transformers/test_models_transformer_<model>.py, tests/testing_utils.py).
# fusedk must be importable (PYTHONPATH, FUSEDK_LIBRARY). Logs: $OUT (default ./out)/diffusers-*.txt.
# SUITE_TIMEOUT (s, default 900) bounds each pytest process (a run resumed after a crash starts another); pytest's own PYTEST_ADDOPTS adds arguments to both
# runs (PYTEST_ADDOPTS='-k "not compile"'). SUITE_PARALLEL=1 starts every run at
# once, each split over SUITE_SHARDS processes (default 1).
set -uo pipefail
tests=${1:?usage: tools/diffusers_suite.sh DIFFUSERS_TESTS [MODEL...]}
shift
models=("$@")
[ ${#models[@]} -gt 0 ] || models=(flux ltx mochi wan)
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
tools=$(cd "$(dirname "$0")" && pwd)
root=$(cd "$tests/.." && pwd)  # diffusers' tests import as the package `tests`
run() {  # run MODEL KIND [SHARD]: the model's tests (SHARD of $SUITE_SHARDS), logged in
         # $OUT/diffusers-MODEL-KIND[.SHARD].txt. A test that kills the process (torch's AOT loader
         # can segfault) is logged CRASHED; pytest then goes on over the tests not yet run.
  local plugin=() log=$OUT/diffusers-$1-$2${3:+.$3}.txt shard=0/1 id rc
  [ -n "${3:-}" ] && shard=$3/${SUITE_SHARDS:-1}
  [ "$2" = patched ] && plugin=(-p diffusers_apply)
  : >"$log"
  : >"$log.done"
  for _ in 1 2 3 4 5 6; do
    (cd "$root" && PYTHONPATH=$tools:${PYTHONPATH:-} SUITE_DONE=$log.done SUITE_SHARD=$shard \
      timeout "${SUITE_TIMEOUT:-900}" python3 -m pytest -v -rA --rootdir "$root" --durations=8 -p no:cacheprovider \
      -p suite_resume ${plugin[@]+"${plugin[@]}"} "tests/models/transformers/test_models_transformer_$1.py") >>"$log" 2>&1
    rc=$?
    [ $rc = 124 ] && printf '\nTIMEOUT after %s s\n' "${SUITE_TIMEOUT:-900}" >>"$log"  # (after -v's unfinished line)
    case $rc in 134 | 135 | 136 | 139) ;; *) break ;; esac  # SIGABRT, SIGBUS, SIGFPE, SIGSEGV: a crash
    id=$(grep -oE '^tests/[^ ]+::[^ ]+' "$log" | tail -1)  # -v names a test before it runs
    [ -n "$id" ] && ! grep -qxF "$id" "$log.done" || break  # (no test named, or the same one again)
    printf '\nCRASHED %s (signal %d)\n' "$id" $((rc - 128)) >>"$log"
    grep -oE '^tests/[^ ]+::[^ ]+' "$log" | sort -u >"$log.done"
  done
  rm -f "$log.done"
}
passed() { grep -E '^tests/[^ ]+::[^ ]+ PASSED' "$1" | cut -d' ' -f1 | sort -u; }  # pytest -v's lines
n() { grep -cE "^tests/[^ ]+::[^ ]+ $2" "$1"; }
if [ -n "${SUITE_PARALLEL:-}" ]; then  # every run at once (one GPU holds them all, compile is CPU-bound),
  # each model's tests split over $SUITE_SHARDS processes a kind
  n=${SUITE_SHARDS:-1}
  for m in "${models[@]}"; do for kind in stock patched; do for ((i = 0; i < n; i++)); do
    run "$m" "$kind" "$i" &
  done; done; done
  wait
  for m in "${models[@]}"; do for kind in stock patched; do
    for ((i = 0; i < n; i++)); do cat "$OUT/diffusers-$m-$kind.$i.txt"; rm -f "$OUT/diffusers-$m-$kind.$i.txt"; done \
      >"$OUT/diffusers-$m-$kind.txt"
  done; done
fi
worse=0
for m in "${models[@]}"; do
  for kind in stock patched; do
    [ -n "${SUITE_PARALLEL:-}" ] || run "$m" "$kind"
    f=$OUT/diffusers-$m-$kind.txt
    echo "$m $kind: $(n "$f" PASSED) passed, $(n "$f" FAILED) failed, $(n "$f" ERROR) errors, $(n "$f" SKIPPED) skipped, $(grep -c '^CRASHED ' "$f") crashed$(grep -q '^TIMEOUT ' "$f" && echo ', timed out') $(grep -h "^fusedk.diffusers.apply:" "$f" | tail -1)"
  done
  passed "$OUT/diffusers-$m-stock.txt" >"$OUT/.stock"
  passed "$OUT/diffusers-$m-patched.txt" >"$OUT/.patched"
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
