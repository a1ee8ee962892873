# issue 42, last call: C GPU suite (all, then no-TMA) with the diffusers LoRA pytest beside it, then the A/B alone
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
L=$PWD/.gpulib
export FUSEDK_HEADER=$PWD/fusedk.h FUSEDK_SOURCE_ROOT=$PWD PYTHONPATH=$PWD/bindings/python:$PYTHONPATH PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s)
( FUSEDK_LIBRARY=$L/new/libfusedk.so timeout ${PT:-300} python3 -m pytest -q -rs -p no:cacheprovider tests/python/test_diffusers.py -k "${PK:-lora or swapped or unloaded or training_step}" > $OUT/pytest-diffusers-lora.txt 2>&1; echo "pytest rc=$? $(( $(date +%s) - t0 ))s" >> $OUT/pytest-diffusers-lora.txt ) &
LD_LIBRARY_PATH=$L/new timeout ${ST:-200} $L/new/test_gpu > $OUT/gpu-suite.txt 2>&1; echo "gpu suite rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^FAIL" $OUT/gpu-suite.txt | head; tail -n 2 $OUT/gpu-suite.txt
FUSEDK_NO_TMA=1 FUSEDK_TEST_SMALL=1 FUSEDK_TEST_ONLY=position,attention LD_LIBRARY_PATH=$L/new timeout 120 $L/new/test_gpu > $OUT/gpu-suite-no-tma.txt 2>&1; echo "gpu suite no-tma rc=$? $(( $(date +%s) - t0 ))s"; grep -E "^FAIL" $OUT/gpu-suite-no-tma.txt | head; tail -n 2 $OUT/gpu-suite-no-tma.txt
wait; tail -n 4 $OUT/pytest-diffusers-lora.txt; grep -E "^FAILED|^ERROR" $OUT/pytest-diffusers-lora.txt | head
FUSEDK_NO_TMA=1 timeout ${NT:-100} python3 bench/ab.py --lib base=$L/libfusedk.so --lib new=$L/new/libfusedk.so --rows attention:1x24x4608x128:bf16,attention:2x16x4096x64:bf16,attention:1x16x4096x128c:bf16,attention:1x8x2048x256:f16 --out $OUT/ab-no-tma.json > $OUT/ab-no-tma.md 2>$OUT/ab.err; echo "ab no-tma rc=$? $(( $(date +%s) - t0 ))s"; cat $OUT/ab-no-tma.md
ROWS=${ROWS:-lrgrad:4608x3072x16x3072:bf16,lrgrad:4608x3072x64x3072c:bf16,lrgrad:32768x3072x128x3072:bf16,attention:1x24x4608x128:bf16,attention:2x16x4096x64:bf16,attention:1x16x4096x128c:bf16,attention:1x8x2048x256:f16,lowrank:4608x3072x16x3072:bf16,lowrank:4608x3072x16x3072y:bf16,lowrank:8192x4096x64x4096:bf16,lowrank:32768x3072x128x3072y:f16,lora:4608x3072x16x3072:bf16,lora:4608x3072x32x12288:bf16,lora:1024x3072x16x3072x4:bf16,rmsnorm:1x1024x2048:bf16,rmsnorm:4x4096x3072:bf16,adaln:1x1024x2048:bf16,adaln:4x4096x3072:bf16}
timeout ${AT:-230} python3 bench/ab.py --lib base=$L/libfusedk.so --lib new=$L/new/libfusedk.so --rows $ROWS --out $OUT/ab.json > $OUT/ab.md 2>>$OUT/ab.err; echo "ab rc=$? $(( $(date +%s) - t0 ))s"; cat $OUT/ab.md; tail -n 3 $OUT/ab.err
