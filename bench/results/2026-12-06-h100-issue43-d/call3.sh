#!/usr/bin/env bash
# issue 43, fifth session, call 3: qk_norm_rope_int8 on the Hopper (TMA) path: C units, Python GPU tests; the prologue bench; the models' blocks
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
export FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:$PYTHONPATH XLA_PYTHON_CLIENT_PREALLOCATE=false
E=$PWD/.gpulib/m; export FUSEDK_LIBRARY=$E/libfusedk.so
t0=$(date +%s)
(LD_LIBRARY_PATH=$E FUSEDK_TEST_ONLY="qk_norm_rope,attention int8 scaled bf16" timeout 150 $E/test_gpu > $OUT/c-qknr.txt 2>&1; echo "rc=$?" >> $OUT/c-qknr.txt) &
(timeout 150 python3 -m pytest -q -rs -s tests/python/test_qk_norm_rope_int8.py tests/python/test_qk_norm_rope.py tests/python/test_diffusers.py -k "gpu or (int8 and cuda)" > $OUT/py.txt 2>&1; echo "rc=$?" >> $OUT/py.txt) &
wait
echo "tests $(( $(date +%s) - t0 ))s"; tail -3 $OUT/c-qknr.txt; grep -E "^FAIL|^  " $OUT/c-qknr.txt | head -8; grep -E "passed|failed|^E |^FAILED" $OUT/py.txt | tail -8
timeout 130 python3 bench/attn_i8_fused.py --out $OUT > $OUT/fused.txt 2>&1; echo "rc=$?" >> $OUT/fused.txt
echo "fused $(( $(date +%s) - t0 ))s"; grep -E "us;|GB/s" $OUT/fused.txt
timeout $(( 560 - ($(date +%s) - t0) )) python3 bench/bench_dit.py --out $OUT --models wan,flux,ltx --no-step --variants "stock compile,attention=True compile,attention=int8 compile" > $OUT/dit.txt 2>&1; echo "rc=$?" >> $OUT/dit.txt
echo "all $(( $(date +%s) - t0 ))s"; tail -25 $OUT/dit.txt
