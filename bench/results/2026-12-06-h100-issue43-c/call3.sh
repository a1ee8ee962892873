#!/usr/bin/env bash
# issue 43, fourth session, call 3: the four models' blocks (int8 against stock compile, the eager kernels); parts at Wan's shape
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
export FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:$PYTHONPATH XLA_PYTHON_CLIENT_PREALLOCATE=false
E=$PWD/.gpulib/f; export FUSEDK_LIBRARY=$E/libfusedk.so
t0=$(date +%s)
for lib in f g f g; do
  FUSEDK_LIBRARY=$PWD/.gpulib/$lib/libfusedk.so timeout 60 python3 bench/attn_i8_parts.py --shapes 1,24,4608 1,24,16384 2,24,4096,1 2,16,4096,0,64 1,16,8192,0,256 > $OUT/parts-$lib.txt 2>&1
  echo "== $lib"; grep -v -i warn $OUT/parts-$lib.txt | grep -o "^B.*: \|kernel .*" | paste - - ; done
E=$PWD/.gpulib/g; export FUSEDK_LIBRARY=$E/libfusedk.so
timeout 60 python3 bench/attn_i8_parts.py --shapes 1,12,32760 > $OUT/parts-wan.txt 2>&1; grep -v -i warn $OUT/parts-wan.txt
V="stock compile,attention=True compile,attention=int8 compile,attention=int8 CUDA graph"
timeout 450 python3 bench/bench_dit.py --out $OUT --models wan,mochi,ltx,flux --no-step --rounds 3 --iters 10 --variants "$V" > $OUT/dit.txt 2>&1; echo "rc=$?" >> $OUT/dit.txt
grep -E "^\| |rc=" $OUT/dit.txt | tail -8; echo "dit $(( $(date +%s) - t0 ))s"
grep "eager kernels" $OUT/bench_dit.md | cut -c1-1500
LD_LIBRARY_PATH=$PWD/.gpulib/g FUSEDK_TEST_ONLY="attention int8 bf16,attention bf16" timeout 120 $PWD/.gpulib/g/test_gpu > $OUT/c-attn-g.txt 2>&1; echo "rc=$?" >> $OUT/c-attn-g.txt; tail -2 $OUT/c-attn-g.txt
echo "all $(( $(date +%s) - t0 ))s"
