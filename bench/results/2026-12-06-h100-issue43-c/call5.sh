#!/usr/bin/env bash
# issue 43, fourth session, call 5: attention_int8_scaled on the GPU (C units), the int8 regression units, its timing and error
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
export FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:$PWD/bench:$PYTHONPATH XLA_PYTHON_CLIENT_PREALLOCATE=false
E=$PWD/.gpulib/h; export FUSEDK_LIBRARY=$E/libfusedk.so
t0=$(date +%s)
(LD_LIBRARY_PATH=$E FUSEDK_TEST_ONLY="attention int8 scaled f16,attention int8 scaled bf16,attention int8 bf16,attention edges bf16" timeout 240 $E/test_gpu > $OUT/c-attn.txt 2>&1; echo "rc=$?" >> $OUT/c-attn.txt) &
(timeout 200 python3 -m pytest -q -rs tests/python/test_attention_int8.py -k "gpu and not contract" > $OUT/py.txt 2>&1; echo "rc=$?" >> $OUT/py.txt) &
wait
echo "tests $(( $(date +%s) - t0 ))s"; tail -2 $OUT/c-attn.txt; grep -E "^FAIL|^  " $OUT/c-attn.txt | head -12; grep -E "passed|failed|^E |^FAILED" $OUT/py.txt | tail -6
timeout 150 python3 bench/attn_i8_scaled.py > $OUT/scaled.txt 2>&1; echo "rc=$?" >> $OUT/scaled.txt; grep -vi warn $OUT/scaled.txt | tail -16
echo "all $(( $(date +%s) - t0 ))s"
