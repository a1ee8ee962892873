# issue 43, second call: the attention units of the C suite after the store fix, the int8 GPU pytest
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
L=$PWD/.gpulib
export FUSEDK_HEADER=$PWD/fusedk.h FUSEDK_SOURCE_ROOT=$PWD PYTHONPATH=$PWD/bindings/python:$PWD/bench:$PYTHONPATH PYTHONUNBUFFERED=1
t0=$(date +%s)
( FUSEDK_LIBRARY=$L/new/libfusedk.so timeout 200 python3 -m pytest -q -rs -s -p no:cacheprovider tests/python/test_attention_int8.py tests/python/test_attention.py -k gpu > $OUT/pytest-int8.txt 2>&1; echo "pytest rc=$? $(( $(date +%s) - t0 ))s" >> $OUT/pytest-int8.txt ) &
FUSEDK_TEST_ONLY=attention LD_LIBRARY_PATH=$L/new timeout 200 $L/new/test_gpu > $OUT/gpu-attention.txt 2>&1; echo "attention suite rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^FAIL|^  " $OUT/gpu-attention.txt | head -20; tail -n 2 $OUT/gpu-attention.txt
FUSEDK_NO_TMA=1 FUSEDK_TEST_SMALL=1 FUSEDK_TEST_ONLY=attention LD_LIBRARY_PATH=$L/new timeout 60 $L/new/test_gpu > $OUT/gpu-attention-no-tma.txt 2>&1; echo "no-tma rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^FAIL" $OUT/gpu-attention-no-tma.txt | head -5; tail -n 2 $OUT/gpu-attention-no-tma.txt
wait; grep -E "rel. L2|passed|failed|^FAILED|^E |rc=" $OUT/pytest-int8.txt | head -30
