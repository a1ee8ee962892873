#!/usr/bin/env bash
# issue 43, fourth session, call 1: the Dh 256 build's tests; kernel times of the three builds
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
export FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:$PYTHONPATH XLA_PYTHON_CLIENT_PREALLOCATE=false
E=$PWD/.gpulib/e; export FUSEDK_LIBRARY=$E/libfusedk.so
t0=$(date +%s)
(LD_LIBRARY_PATH=$E FUSEDK_TEST_ONLY=attention timeout 330 $E/test_gpu > $OUT/c-attn.txt 2>&1; echo "rc=$?" >> $OUT/c-attn.txt) &
(timeout 330 python3 -m pytest -q -rs tests/python/test_attention_int8.py tests/python/test_attention.py -k gpu -s > $OUT/py.txt 2>&1; echo "rc=$?" >> $OUT/py.txt) &
wait
echo "tests $(( $(date +%s) - t0 ))s"; tail -2 $OUT/c-attn.txt; grep -E "^FAIL" $OUT/c-attn.txt | head -8; grep -E "passed|failed|^E |^FAILED" $OUT/py.txt | tail -12
SH="1,24,4608 1,24,16384 2,24,4096,1 2,16,4096,0,64"
for lib in n e n e; do
  FUSEDK_LIBRARY=$PWD/.gpulib/$lib/libfusedk.so timeout 60 python3 bench/attn_i8_parts.py --shapes $SH > $OUT/parts-$lib.txt 2>&1
  echo "== $lib"; grep -v -i warn $OUT/parts-$lib.txt | grep -o "^B.*: \|kernel .*" | paste - - ; done
FUSEDK_LIBRARY=$E/libfusedk.so timeout 40 python3 bench/attn_i8_parts.py --shapes 1,16,8192,0,256 > $OUT/parts-256.txt 2>&1; grep -v -i warn $OUT/parts-256.txt
echo "all $(( $(date +%s) - t0 ))s"
