# issue 42: the diffusers LoRA tests on the GPU, three shards side by side (CPU variants ran in CI)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site || exit
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
L=$PWD/.gpulib
export FUSEDK_LIBRARY=$L/new/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h FUSEDK_SOURCE_ROOT=$PWD PYTHONPATH=$PWD/bindings/python:$PYTHONPATH PYTHONUNBUFFERED=1
t0=$(date +%s)
i=0
for K in "(lora_folds or lora_added or lora_factor or flux_lora or flux_replaced) and not cpu" "compiled_after_lora_unloaded or training_step" "swapped and not cpu"; do
  i=$((i+1))
  ( timeout ${PT:-450} python3 -m pytest -q -rfEs --durations=8 -p no:cacheprovider tests/python/test_diffusers.py -k "$K" > $OUT/pytest-lora-$i.txt 2>&1; echo "shard $i rc=$? $(( $(date +%s) - t0 ))s" >> $OUT/pytest-lora-$i.txt ) &
done
wait
for f in $OUT/pytest-lora-*.txt; do echo "== $f"; grep -E "passed|failed|^FAILED|^ERROR|rc=" $f | tail -n 6; done
