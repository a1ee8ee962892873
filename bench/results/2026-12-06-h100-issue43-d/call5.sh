#!/usr/bin/env bash
# issue 43, fifth session, call 5: the final build (review fixes: q8 never skips pass-through channels, the scales' shape message): C units, the new GPU tests
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
export FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:$PYTHONPATH XLA_PYTHON_CLIENT_PREALLOCATE=false
E=$PWD/.gpulib/n; export FUSEDK_LIBRARY=$E/libfusedk.so
t0=$(date +%s)
(LD_LIBRARY_PATH=$E FUSEDK_TEST_ONLY="qk_norm_rope,rope,attention int8 scaled f16,attention int8 scaled bf16,attention int8 bf16" timeout 170 $E/test_gpu > $OUT/c-final.txt 2>&1; echo "rc=$?" >> $OUT/c-final.txt) &
(timeout 170 python3 -m pytest -q -rs tests/python/test_qk_norm_rope_int8.py tests/python/test_diffusers.py -k "gpu or (cuda and (int8 or graph))" > $OUT/py-final.txt 2>&1; echo "rc=$?" >> $OUT/py-final.txt) &
wait
echo "all $(( $(date +%s) - t0 ))s"; tail -4 $OUT/c-final.txt; grep -E "^FAIL|^  " $OUT/c-final.txt | head -8; grep -E "passed|failed|^E |^FAILED" $OUT/py-final.txt | tail -10
