# issue 43, first call: the attention units of the C suite (bf16 after the ring's change, int8), the int8 pytest, a bench
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
L=$PWD/.gpulib
export FUSEDK_HEADER=$PWD/fusedk.h FUSEDK_SOURCE_ROOT=$PWD PYTHONPATH=$PWD/bindings/python:$PWD/bench:$PYTHONPATH PYTHONUNBUFFERED=1
t0=$(date +%s)
FUSEDK_TEST_ONLY="attention int8 f16,attention int8 bf16" LD_LIBRARY_PATH=$L/new timeout 150 $L/new/test_gpu > $OUT/gpu-int8.txt 2>&1; echo "int8 suite rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^FAIL|^  " $OUT/gpu-int8.txt | head -30; tail -n 2 $OUT/gpu-int8.txt
FUSEDK_LIBRARY=$L/new/libfusedk.so timeout 150 python3 -m pytest -q -rs -s -p no:cacheprovider tests/python/test_attention_int8.py -k gpu > $OUT/pytest-int8.txt 2>&1; echo "pytest rc=$? $(( $(date +%s) - t0 ))s"; grep -E "rel. L2|passed|failed|^FAILED|^E " $OUT/pytest-int8.txt | head -30
FUSEDK_LIBRARY=$L/new/libfusedk.so timeout 150 python3 bench/bench_attention.py --no-jax --no-call --rounds 2 --shapes 0,2,3,6 --out $OUT > $OUT/bench.txt 2>&1; echo "bench rc=$? $(( $(date +%s) - t0 ))s"; cat $OUT/bench_attention.md 2>/dev/null || tail -20 $OUT/bench.txt
FUSEDK_TEST_ONLY=attention LD_LIBRARY_PATH=$L/new timeout 100 $L/new/test_gpu > $OUT/gpu-attention.txt 2>&1; echo "attention suite rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^FAIL" $OUT/gpu-attention.txt | head; tail -n 2 $OUT/gpu-attention.txt
