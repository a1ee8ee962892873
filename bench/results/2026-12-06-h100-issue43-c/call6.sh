#!/usr/bin/env bash
# issue 43, fourth session, call 6: the committed build (host checks shared by attention and attention_int8_scaled): every attention unit, the GPU pytest
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
export FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:$PYTHONPATH XLA_PYTHON_CLIENT_PREALLOCATE=false
E=$PWD/.gpulib/i; export FUSEDK_LIBRARY=$E/libfusedk.so
t0=$(date +%s)
(LD_LIBRARY_PATH=$E FUSEDK_TEST_ONLY=attention timeout 280 $E/test_gpu > $OUT/c-attn.txt 2>&1; echo "rc=$?" >> $OUT/c-attn.txt) &
(timeout 250 python3 -m pytest -q -rs tests/python/test_attention_int8.py tests/python/test_attention.py -k "gpu and not contract" > $OUT/py.txt 2>&1; echo "rc=$?" >> $OUT/py.txt) &
wait
echo "tests $(( $(date +%s) - t0 ))s"; tail -12 $OUT/c-attn.txt; grep -E "^FAIL" $OUT/c-attn.txt | head -8; grep -E "passed|failed|^E |^FAILED" $OUT/py.txt | tail -6
