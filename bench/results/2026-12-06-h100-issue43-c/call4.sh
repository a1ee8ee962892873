#!/usr/bin/env bash
# issue 43, fourth session, call 4: the final build (f): the C attention suite, the GPU pytest, bench_attention at every shape
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
export FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:$PYTHONPATH XLA_PYTHON_CLIENT_PREALLOCATE=false
E=$PWD/.gpulib/f; export FUSEDK_LIBRARY=$E/libfusedk.so
t0=$(date +%s)
(LD_LIBRARY_PATH=$E FUSEDK_TEST_ONLY=attention timeout 300 $E/test_gpu > $OUT/c-attn.txt 2>&1; echo "rc=$?" >> $OUT/c-attn.txt) &
(timeout 300 python3 -m pytest -q -rs tests/python/test_attention_int8.py tests/python/test_attention.py -k gpu -s > $OUT/py.txt 2>&1; echo "rc=$?" >> $OUT/py.txt) &
wait
echo "tests $(( $(date +%s) - t0 ))s"; tail -2 $OUT/c-attn.txt; grep -E "^FAIL" $OUT/c-attn.txt | head -8; grep -E "passed|failed|^E |^FAILED" $OUT/py.txt | tail -6
timeout 380 python3 bench/bench_attention.py --out $OUT --rounds 3 --no-jax > $OUT/bench.txt 2>&1; echo "rc=$?" >> $OUT/bench.txt
grep -vi "warn" $OUT/bench.txt | tail -24; echo "all $(( $(date +%s) - t0 ))s"
