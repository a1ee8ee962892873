#!/usr/bin/env bash
# issue 43, fourth session, call 2: the models' blocks with int8 attention against stock compile; the diffusers int8 tests
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
export FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:$PYTHONPATH XLA_PYTHON_CLIENT_PREALLOCATE=false
E=$PWD/.gpulib/f; export FUSEDK_LIBRARY=$E/libfusedk.so
t0=$(date +%s)
V="stock compile,attention=True compile,attention=int8 compile,attention=int8 CUDA graph"
timeout ${DIT_S:-420} python3 bench/bench_dit.py --out $OUT --models ${MODELS:-wan,mochi} --no-step --rounds 3 --iters 10 --variants "$V" > $OUT/dit.txt 2>&1; echo "rc=$?" >> $OUT/dit.txt
grep -E "^\| |rc=" $OUT/dit.txt | tail -8; echo "dit $(( $(date +%s) - t0 ))s"
if [ -n "${DIFF:-1}" ]; then timeout 150 python3 -m pytest -q -s tests/python/test_diffusers.py -k "int8 and cuda" > $OUT/diffusers-int8.txt 2>&1; echo "rc=$?" >> $OUT/diffusers-int8.txt; grep -E "rel|passed|failed|^E " $OUT/diffusers-int8.txt | tail -20; fi
echo "all $(( $(date +%s) - t0 ))s"
