#!/usr/bin/env bash
# Everything the lent GPU machine is for, in one call: build for its GPU with its nvcc, run every
# test suite (gpu, python interop, cpu, examples), then the bench. Logs and results land in
# $OUT (default ./out); the last lines printed are the summary.
#   bash tools/gpu_run.sh [--no-bench] [--quick-bench] [--bench-only] [--percall] [--no-percall] [--tune] [--ncu]
#                         [--sanitize] [--dit] [--diffusers-suite]
# (--no-bench --percall: the suites and the per-call table, without the kernel bench;
#  --no-percall: the kernel bench without the per-call table; BENCH_OPS=act,silu_fma limits it;
#  --dit: the Python suite ($DIT_TESTS, default tests/python; fusedk.diffusers on real models
#  included) and bench/bench_dit.py with $DIT_ARGS, nothing else (DIT_NO_TESTS=1, DIT_NO_BENCH=1
#  leave one out);
#  --diffusers-suite: diffusers' own model tests on stock and on patched models, nothing else
#  (tools/diffusers_suite.sh over $DIFFUSERS_TESTS, default .diffusers-tests/tests: a diffusers
#  checkout's tests/ folder copied there; $SUITE_MODELS, default all four; SUITE_PARALLEL=1
#  SUITE_SHARDS=3 runs Flux, LTX and Wan stock and patched at once in about 380 s on one H200);
#  --sanitize: compute-sanitizer memcheck, racecheck, initcheck and synccheck over the GPU suite's
#  small cases of every op (FUSEDK_TEST_SMALL=1), reports in $OUT/sanitize-<tool>.txt)
set -uo pipefail
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
cd "$(dirname "$0")/.."
if ls .whl/*.whl >/dev/null 2>&1; then  # wheels the machine lacks (cffi, meson-python, liger)
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv,noheader
bench=1 quick="" percall=0 no_percall=0
tests=1 tune=0 ncu=0 sanitize=0 dit=0 suite=0
for a in "$@"; do
  case $a in --no-bench) bench=0 ;; --quick-bench) quick=--quick ;; --bench-only) tests=0 ;; --percall) percall=1 ;; --no-percall) no_percall=1 ;;
    --tune) tune=1 tests=0 bench=0 ;; --ncu) ncu=1 tests=0 bench=0 ;; --sanitize) sanitize=1 tests=0 bench=0 ;;
    --dit) dit=1 tests=0 bench=0 ;; --diffusers-suite) suite=1 tests=0 bench=0 ;; esac
done
summary=()
t0=$(date +%s)
if ! [ -d build-gpu ]; then
  meson setup build-gpu >"$OUT/setup.log" 2>&1 || { tail -30 "$OUT/setup.log"; exit 1; }
fi
ninja -C build-gpu >"$OUT/build.log" 2>&1 || { tail -40 "$OUT/build.log"; exit 1; }
summary+=("build: $(( $(date +%s) - t0 ))s")
rm -f "$OUT/setup.log" "$OUT/build.log"  # at most 8 files come back: keep the results
if [ $tests = 1 ]; then
  meson test -C build-gpu --print-errorlogs --num-processes 2 >"$OUT/meson-test.txt" 2>&1
  rc=$?
  cp build-gpu/meson-logs/testlog.txt "$OUT/testlog.txt"
  grep -E "^ *[0-9]+/[0-9]+ " "$OUT/meson-test.txt" | tail -12
  summary+=("meson test rc=$rc: $(grep -E '^(Ok|Fail|Skipped|Expected Fail|Unexpected Pass|Timeout):' "$OUT/meson-test.txt" | tr -s ' ' | tr '\n' ' ')")
  summary+=("gpu suite: $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/testlog.txt" | tr '\n' ' ')")
  summary+=("pytest: $(grep -E '[0-9]+ passed' "$OUT/testlog.txt" | grep -v failed, | tail -1)")
  grep -E "^FAIL|mochi exact vs PyTorch|^ok   huge|SKIPPED \[" "$OUT/testlog.txt" | head -20
fi
if { [ $bench = 1 ] && [ $no_percall = 0 ]; } || [ $percall = 1 ]; then  # the user's call: eager loops vs the frameworks' own ops
  mkdir -p "$OUT/bench"
  FUSEDK_LIBRARY=$PWD/build-gpu/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:${PYTHONPATH:-} \
    python3 bench/percall.py --out "$OUT/bench" >"$OUT/percall.log" 2>&1
  summary+=("percall rc=$?")
  tail -42 "$OUT/percall.log"
  FUSEDK_LIBRARY=$PWD/build-gpu/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:${PYTHONPATH:-} \
    python3 bench/profile_call.py >"$OUT/bench/profile_call.txt" 2>&1
  summary+=("profile_call rc=$?")
  head -30 "$OUT/bench/profile_call.txt"
fi
if [ $bench = 1 ] && [ -f bench/bench.py ]; then
  FUSEDK_LIBRARY=$PWD/build-gpu/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:${PYTHONPATH:-} \
    python3 bench/bench.py --out "$OUT/bench" $quick ${BENCH_OPS:+--ops $BENCH_OPS} >"$OUT/bench.log" 2>&1
  summary+=("bench rc=$?")
  tail -60 "$OUT/bench.log"
  for tune in 1 2; do  # fusedk's default algorithm search, and the wider one (fusedk.h, [linear])
    FUSEDK_LINEAR_TUNE=$tune FUSEDK_LIBRARY=$PWD/build-gpu/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h \
      PYTHONPATH=$PWD/bindings/python:${PYTHONPATH:-} \
      python3 bench/bench_linear.py --out "$OUT/bench" $quick >"$OUT/bench-linear-tune$tune.log" 2>&1
    summary+=("bench_linear FUSEDK_LINEAR_TUNE=$tune rc=$?")
    tail -40 "$OUT/bench-linear-tune$tune.log"
  done
  FUSEDK_LIBRARY=$PWD/build-gpu/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:${PYTHONPATH:-} \
    python3 bench/bench_attention.py --out "$OUT/bench" $quick >"$OUT/bench-attention.log" 2>&1
  summary+=("bench_attention rc=$?")
  tail -30 "$OUT/bench-attention.log"
fi
if [ $dit = 1 ] && [ -z "${DIT_NO_TESTS:-}" ]; then  # fusedk.diffusers: the Python suite on the GPU
  FUSEDK_LIBRARY=$PWD/build-gpu/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h FUSEDK_SOURCE_ROOT=$PWD \
    PYTHONPATH=$PWD/bindings/python:${PYTHONPATH:-} python3 -m pytest -q -rs -p no:cacheprovider \
    ${DIT_TESTS:-tests/python} >"$OUT/pytest-log.txt" 2>&1
  summary+=("pytest rc=$?: $(tail -1 "$OUT/pytest-log.txt")")
  grep -E "^FAILED|^ERROR" "$OUT/pytest-log.txt" | head -20
fi
if [ $dit = 1 ] && [ -z "${DIT_NO_BENCH:-}" ]; then  # then the DiT bench
  mkdir -p "$OUT/bench"
  FUSEDK_LIBRARY=$PWD/build-gpu/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:${PYTHONPATH:-} \
    python3 bench/bench_dit.py --out "$OUT/bench" ${DIT_ARGS:-} >"$OUT/bench-dit.log" 2>&1
  summary+=("bench_dit rc=$?")
  tail -30 "$OUT/bench-dit.log"
fi
if [ $suite = 1 ]; then  # diffusers' own model tests: a patched model passes every test its stock model passes
  FUSEDK_LIBRARY=$PWD/build-gpu/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:${PYTHONPATH:-} \
    OUT=$OUT bash tools/diffusers_suite.sh "${DIFFUSERS_TESTS:-.diffusers-tests/tests}" ${SUITE_MODELS:-} \
    | tee "$OUT/diffusers-suite.txt"
  summary+=("diffusers suite rc=${PIPESTATUS[0]}: $(grep -c ': patched passes every test' "$OUT/diffusers-suite.txt") models with patched >= stock")
fi
if [ $tune = 1 ]; then  # launch-shape sweep of the norm kernel (its hook is built with -Dtuning=true only)
  meson configure build-gpu -Dtuning=true >/dev/null && ninja -C build-gpu >/dev/null || exit 1
  FUSEDK_LIBRARY=$PWD/build-gpu/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:${PYTHONPATH:-} \
    python3 bench/tune_norm.py --out "$OUT/tune.json" 2>&1 | tee "$OUT/tune.log"
fi
if [ $ncu = 1 ]; then  # hardware counters of the norm kernels next to Liger's (Firecracker machines only)
  FUSEDK_LIBRARY=$PWD/build-gpu/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:$PWD/bench:${PYTHONPATH:-} \
    ncu --clock-control none --kernel-name regex:"norm_rows|_norm_forward|triton_" --section SpeedOfLight --section MemoryWorkloadAnalysis \
    --section Occupancy --section LaunchStats --section WarpStateStats --section SchedulerStats \
    python3 bench/ncu_norm.py >"$OUT/ncu.txt" 2>&1
  summary+=("ncu rc=$?")
  grep -E "norm|DRAM Throughput|Duration|Registers Per|Achieved Occupancy|Theoretical Occupancy|Memory Throughput|Block Size|Grid Size" "$OUT/ncu.txt" | head -150
fi
if [ $sanitize = 1 ]; then  # every GPU op's small cases under each compute-sanitizer tool
  for tool in memcheck racecheck initcheck synccheck; do
    extra=""
    [ $tool = memcheck ] && extra="--leak-check full"
    FUSEDK_TEST_SMALL=1 FUSEDK_TEST_JOBS=1 timeout ${SANITIZE_TIMEOUT:-900} compute-sanitizer --tool $tool $extra --error-exitcode 9 \
      build-gpu/tests/test_gpu >"$OUT/sanitize-$tool.txt" 2>&1
    rc=$?
    summary+=("sanitize $tool rc=$rc: $(grep -E '^[0-9]+ passed, [0-9]+ failed' "$OUT/sanitize-$tool.txt") $(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$OUT/sanitize-$tool.txt" | tr '\n' ' ')")
    grep -E "^FAIL|Invalid|Uninitialized|hazard|ERROR SUMMARY|RACECHECK SUMMARY" "$OUT/sanitize-$tool.txt" | head -8
  done
fi
echo "=== summary ==="
printf '%s\n' "${summary[@]}"
