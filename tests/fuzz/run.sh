#!/usr/bin/env bash
# Builds tests/fuzz/fuzz_ops.c with clang's libFuzzer, ASan and UBSan and runs it for a bounded
# time from the committed seeds (tests/fuzz/seeds.txt: one base64 input a line); exit 77 (skip)
# where no clang with libFuzzer is installed (apt-get install clang).
#   tests/fuzz/run.sh [SOURCE_ROOT] [WORK_DIR]     FUZZ_SECONDS=60 (or FUZZ_RUNS=N: that many inputs)
# A failing input is left in WORK_DIR/crash-*; replay it with WORK_DIR/fuzz_ops FILE.
set -euo pipefail
root=${1:-$(cd "$(dirname "$0")/../.." && pwd)}
work=${2:-$root/build/fuzz}
cc=""
for c in clang clang-18 clang-17 clang-16 clang-15 clang-14; do
  if command -v "$c" >/dev/null && echo 'int LLVMFuzzerTestOneInput(const char *d, long n) { return 0; }' |
      "$c" -x c -fsanitize=fuzzer - -o /dev/null 2>/dev/null; then cc=$c; break; fi
done
if [ -z "$cc" ]; then echo "fuzz: no clang with libFuzzer (apt-get install clang): skipped"; exit 77; fi
mkdir -p "$work/corpus"
"$cc" -g -O1 -fsanitize=fuzzer,address,undefined -fno-sanitize-recover=undefined -I"$root" \
  "$root/tests/fuzz/fuzz_ops.c" -lm -o "$work/fuzz_ops"
n=0
while read -r line; do  # the seeds, one file each (libFuzzer reads a directory)
  [ -n "$line" ] && printf '%s' "$line" | base64 -d > "$work/corpus/seed-$n" && n=$((n + 1))
done < "$root/tests/fuzz/seeds.txt"
cd "$work"
limit=(-max_total_time="${FUZZ_SECONDS:-60}") what="${FUZZ_SECONDS:-60} s"
if [ -n "${FUZZ_RUNS:-}" ]; then limit=(-runs="$FUZZ_RUNS") what="$FUZZ_RUNS inputs"; fi
echo "fuzz: $cc, $n seeds, $what"
set +eo pipefail  # the fuzzer's status, whatever the filter's
# -error_exitcode=1: libFuzzer's own default (77) is what meson reads as a skip
UBSAN_OPTIONS=print_stacktrace=1 ./fuzz_ops "${limit[@]}" -error_exitcode=1 -timeout_exitcode=1 -print_final_stats=1 corpus 2>&1 |
  grep -vE '^#[0-9]+\s+(NEW|REDUCE|pulse)' | tail -25
exit "${PIPESTATUS[0]}"
