#!/usr/bin/env bash
# The GPU checks of a build made on the development machine and carried to the lent GPU machine,
# where a whole build-gpu/ is past the carry limit: libfusedk.so, tests/test_gpu and
# fusedk_dit_block copied into $FUSEDK_CARRIED (default .gpulib/b, ignored by git), with the
# wheels of ../shared/device/wheels.sh in .whl/. On this machine:
#   ninja -C build-gpu && mkdir -p .gpulib/b && cp build-gpu/{libfusedk.so,tests/test_gpu,fusedk_dit_block} .gpulib/b/
# then the device tool's run with carry [".whl", ".gpulib"] and the command
#   bash tools/gpu_carried.sh [conv-units] [conv] [fp8] [bench-conv-fast] [bench-conv] [bench-conv-full]
#     [bench-conv-list] [bench-conv-seed] [bench-gn] [bench-vae-flux] [bench-vae-wan] [bench-vae-ltx] [bench-vae-mochi]
#     [bench-norms] [vae] [profile] [ncu] [ncu-gn] [epilogue] [profile-wan] [demo]
# conv: the C units of the conv family (conv, group_norm, channel_rmsnorm; conv on wgmma, with
# FUSEDK_NO_TMA=1 on mma.sync, at the small shapes with the halo steps off, the clusters on and
# group_norm's held form streaming all but 3 pixels a block, group_norm in three launches) and
# tests/python/test_conv.py; conv-units: those C units at the small shapes only; fp8: the C
# units of the FP8 ops and the norms, test_fp8.py's GPU norm and int8 tests; vae:
# test_diffusers_vae.py; bench-conv: bench/bench_conv.py --quick (bench-conv-fast: without the
# torch.compile columns; bench-conv-full: every row, with them; bench-conv-list: every row, without
# them; bench-conv-seed: the seed's three shapes, with them; bench-gn: the GroupNorm rows alone); bench-vae-KIND: bench/bench_vae.py
# --only KIND (Wan without torch.compile); bench-norms: bench_linear_fp8.py --no-gemm --no-torchao
# --quick (the norms' FP8 forms against a copy); profile: bench/profile_conv.py under ncu (ncu:
# that alone), and its decode table; ncu-gn: ncu --set full of the held group_norm (profile_conv.py --gn),
# its details in $OUT/ncu-gn-details.txt; epilogue: profile_conv.py --epilogue; profile-wan: torch.profiler's table of a patched and a stock Wan
# decode; demo: the C DiT block. Logs and results in $OUT; a line a step in $OUT/summary.txt,
# printed last. Where libfusedk.so and .whl pass the carry limit together, carry
# libfusedk.so.xz (xz -T2) and run `xz -d .gpulib/b/libfusedk.so.xz` first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
B=$(cd "${FUSEDK_CARRIED:-.gpulib/b}" && pwd) || exit 1
if ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl &&
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export XLA_PYTHON_CLIENT_PREALLOCATE=false PYTHONUNBUFFERED=1
export LD_LIBRARY_PATH=$B${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH} FUSEDK_LIBRARY=$B/libfusedk.so FUSEDK_HEADER=$PWD/fusedk.h
export PYTHONPATH=$PWD/bindings/python:$PWD/tests/python:$PWD/bench${PYTHONPATH:+:$PYTHONPATH}
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$OUT/gpu.txt"
say() { echo "== $1" | tee -a "$OUT/summary.txt"; }
step() { # step NAME SECONDS CMD...: runs CMD under a timeout into $OUT/NAME.txt, says how it went
  local name=$1 secs=$2 t0 rc
  shift 2
  t0=$(date +%s)
  timeout "$secs" "$@" >"$OUT/$name.txt" 2>&1
  rc=$?
  say "$name rc=$rc $(($(date +%s) - t0))s: $(grep -E '^[0-9]+ passed|passed|failed' "$OUT/$name.txt" | tail -1)"
  grep -E "^FAIL|^FAILED|^E  " "$OUT/$name.txt" | head -8
}
for what in "${@:-conv}"; do
  case $what in
    conv-units)
      step units-conv 40 env FUSEDK_TEST_ONLY=conv FUSEDK_TEST_SMALL=1 "$B/test_gpu"
      step units-conv-mma 30 env FUSEDK_TEST_ONLY=conv FUSEDK_NO_TMA=1 FUSEDK_TEST_SMALL=1 "$B/test_gpu" ;;
    conv)
      step units-conv 120 env FUSEDK_TEST_ONLY=conv "$B/test_gpu"
      step units-conv-mma 90 env FUSEDK_TEST_ONLY=conv FUSEDK_NO_TMA=1 "$B/test_gpu"
      step units-conv-alt 40 env FUSEDK_TEST_ONLY=conv FUSEDK_CONV_HALO=0 FUSEDK_CONV_CLUSTER=2 FUSEDK_TEST_SMALL=1 "$B/test_gpu"
      step units-gn-hold 40 env FUSEDK_TEST_ONLY=group_norm FUSEDK_GN_HOLD=3 FUSEDK_TEST_SMALL=1 "$B/test_gpu"
      step units-gn3 60 env FUSEDK_TEST_ONLY=group_norm FUSEDK_GN_HELD=0 "$B/test_gpu"
      step py-conv 150 python3 -m pytest -q -W ignore -p no:cacheprovider tests/python/test_conv.py -k gpu ;;
    fp8)
      step units-fp8 150 env FUSEDK_TEST_ONLY=quantize_fp8,glu_fp8,linear_fp8,linear_w8,norm "$B/test_gpu"
      step py-fp8 120 python3 -m pytest -q -W ignore -p no:cacheprovider tests/python/test_fp8.py -k "gpu and (norm or int8 or w8)" ;;
    vae) step py-vae 150 python3 -m pytest -q -W ignore -p no:cacheprovider tests/python/test_diffusers_vae.py ;;
    bench-conv) step bench-conv 200 python3 bench/bench_conv.py --quick --rounds 3 --out "$OUT"
      cat "$OUT/bench_conv.md" 2>/dev/null ;;
    bench-conv-full) step bench-conv 420 python3 bench/bench_conv.py --rounds 3 --out "$OUT"
      cat "$OUT/bench_conv.md" 2>/dev/null ;;
    bench-conv-seed) step bench-conv 150 python3 bench/bench_conv.py --seed --rounds 3 --out "$OUT"
      cat "$OUT/bench_conv.md" 2>/dev/null ;;
    bench-gn) step bench-conv 120 python3 bench/bench_conv.py --gn --no-compile --rounds 3 --out "$OUT"
      grep -E "^gn" "$OUT/bench-conv.txt" | cut -c1-200 ;;
    bench-conv-list) step bench-conv 300 python3 bench/bench_conv.py --no-compile --rounds 3 --out "$OUT"
      cat "$OUT/bench_conv.md" 2>/dev/null ;;
    bench-conv-fast) step bench-conv 90 python3 bench/bench_conv.py --quick --no-compile --rounds 3 --out "$OUT"
      grep -E "^(seed|flux|wan|gn)" "$OUT/bench-conv.txt" ;;
    bench-norms) step bench-norms 120 python3 bench/bench_linear_fp8.py --no-gemm --no-torchao --quick --out "$OUT"
      tail -25 "$OUT/bench-norms.txt" ;;
    bench-vae-flux | bench-vae-wan | bench-vae-ltx | bench-vae-mochi) # a VAE's whole decodes: up to 5 min
      step "$what" 300 python3 bench/bench_vae.py --only "${what#bench-vae-}" $([ "$what" = bench-vae-wan ] &&
        echo --no-compile) --out "$OUT"
      grep -hE "ms, first call|failed" "$OUT/$what.txt" ;;
    profile | ncu) # ncu over the conv layers and group_norm (one call each); profile: then torch.profiler's table of a decode
      step ncu 200 ncu --section SpeedOfLight --section MemoryWorkloadAnalysis --section LaunchStats \
        --section Occupancy --section WarpStateStats -k "regex:conv_tma|conv_kernel|gn_" --launch-count 9 \
        python3 bench/profile_conv.py --layers
      grep -E "^  [a-z_]+.*conv|^  gn_|Duration|Compute \(SM\) Throughput|L2 Cache Throughput|DRAM Throughput" "$OUT/ncu.txt" | head -80
      [ "$what" = ncu ] && continue
      step prof-table 150 python3 bench/profile_conv.py --table
      grep -A32 "^== " "$OUT/prof-table.txt" | cut -c1-150 ;;
    ncu-gn) # every section and the SASS-level stall samples of the held group_norm at 512 ch 128^2 and 256^2
      step ncu-gn 120 ncu --set full --import-source no -k regex:gn_ -o "$OUT/gn" python3 bench/profile_conv.py --gn
      [ -f "$OUT/gn.ncu-rep" ] && ncu -i "$OUT/gn.ncu-rep" --page details >"$OUT/ncu-gn-details.txt" 2>&1
      grep -E "gn_held|Duration|Compute \(SM\) Throughput|DRAM Throughput|Issued Warp Per Scheduler" "$OUT/ncu-gn-details.txt" | head -20 ;;
    epilogue) step epilogue 120 python3 bench/profile_conv.py --epilogue
      grep "^epilogue" "$OUT/epilogue.txt" ;;
    profile-wan) # torch.profiler's table of a patched and a stock eager Wan decode
      step prof-wan 200 python3 bench/profile_conv.py --table wan --rows 30
      grep -A36 "^== " "$OUT/prof-wan.txt" | cut -c1-150 ;;
    demo) step demo 60 "$B/fusedk_dit_block"
      tail -14 "$OUT/demo.txt" ;;
    *) say "unknown step $what (conv-units, conv, fp8, vae, bench-conv-fast, bench-conv, bench-vae-KIND, bench-norms, profile, ncu-gn, epilogue, demo)" ;;
  esac
done
cat "$OUT/summary.txt"
