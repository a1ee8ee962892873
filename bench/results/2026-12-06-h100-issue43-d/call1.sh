#!/usr/bin/env bash
# issue 43, fifth session, call 1: the committed build 3f9e5d7 (validate refactor, kpair helper, scaled review fixes): C attention units, Python GPU tests
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
python3 -c "import cupy; print('cupy', cupy.__version__)" >> $OUT/gpu.txt 2>&1; python3 -c "import jax; print('jax', jax.__version__, jax.devices())" >> $OUT/gpu.txt 2>&1
export FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:$PYTHONPATH XLA_PYTHON_CLIENT_PREALLOCATE=false
E=$PWD/.gpulib/k; export FUSEDK_LIBRARY=$E/libfusedk.so
t0=$(date +%s)
(LD_LIBRARY_PATH=$E FUSEDK_TEST_ONLY=attention timeout 300 $E/test_gpu > $OUT/c-attn.txt 2>&1; echo "rc=$?" >> $OUT/c-attn.txt) &
(timeout 300 python3 -m pytest -q -rs tests/python/test_attention_int8.py tests/python/test_attention.py -k "gpu" > $OUT/py.txt 2>&1; echo "rc=$?" >> $OUT/py.txt) &
wait
echo "tests $(( $(date +%s) - t0 ))s"; cat $OUT/gpu.txt; tail -6 $OUT/c-attn.txt; grep -E "^FAIL" $OUT/c-attn.txt | head -8; grep -E "passed|failed|^E |^FAILED|XPASS|SKIP" $OUT/py.txt | tail -12
