# issue 42: the whole GPU pytest suite at HEAD, in N shards side by side
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
L=$PWD/.gpulib
export FUSEDK_LIBRARY=$L/new/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h FUSEDK_SOURCE_ROOT=$PWD PYTHONPATH=$PWD/bindings/python:$L:$PYTHONPATH PYTHONUNBUFFERED=1 XLA_PYTHON_CLIENT_PREALLOCATE=false
t0=$(date +%s); N=${N:-8}
for i in $(seq 0 $((N-1))); do
  ( SHARD=$i/$N timeout ${PT:-470} python3 -m pytest -q -rfE -p shard -p no:cacheprovider tests/python > $OUT/pytest-$i.txt 2>&1; echo "shard $i rc=$? $(( $(date +%s) - t0 ))s" >> $OUT/pytest-$i.txt ) &
done
wait
for f in $OUT/pytest-*.txt; do echo "== $f"; grep -E "passed|failed|^FAILED|^ERROR|rc=" $f | tail -n 5; done
