#!/usr/bin/env bash
# issue 43, fifth session, call 4: the int8 kernel on Wan's own q, k, v against N(0,1): kernel times, the online softmax's rescales, Nsight Compute
set -uo pipefail
OUT=${OUT:-$PWD/out}; mkdir -p "$OUT"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null; export PYTHONPATH=/tmp/site
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee $OUT/gpu.txt
export FUSEDK_HEADER=$PWD/fusedk.h PYTHONPATH=$PWD/bindings/python:$PWD/bench:$PYTHONPATH
E=$PWD/.gpulib/m; export FUSEDK_LIBRARY=$E/libfusedk.so
t0=$(date +%s)
timeout 200 python3 bench/attn_i8_data.py > $OUT/data.txt 2>&1; echo "rc=$?" >> $OUT/data.txt
echo "probe $(( $(date +%s) - t0 ))s"; grep -v Warning $OUT/data.txt | tail -12
NCU=$(command -v ncu || ls /usr/local/cuda*/bin/ncu 2>/dev/null | head -1)
timeout 300 $NCU --nvtx --nvtx-include "probe/" --section SpeedOfLight --section WarpStateStats --section ComputeWorkloadAnalysis --section SchedulerStats --section Occupancy python3 bench/attn_i8_data.py --ncu > $OUT/ncu.txt 2>&1; echo "rc=$?" >> $OUT/ncu.txt
echo "all $(( $(date +%s) - t0 ))s"; grep -E "attn_|Duration|Throughput|Issue Slots Busy|Stall|Warp Cycles Per Issued|Eligible|Active Warps|No Eligible|Pipe" $OUT/ncu.txt | head -120
