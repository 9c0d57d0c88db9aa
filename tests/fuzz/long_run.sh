#!/usr/bin/env bash
# Runs each libFuzzer target until it has executed RUNS inputs in all, spread over JOBS worker
# processes that share one scratch corpus (seeded from tests/fuzz/corpus/<target>), then reports
# the executions, the time and the coverage of the merged corpus. This is the "once, to >= 10 M
# executions" run of docs/RELIABILITY.md; CI runs tests/fuzz/run.sh's short runs instead.
#   tests/fuzz/long_run.sh [build dir] [runs per target] [jobs]   (defaults: build-fuzz, 10000000, nproc)
# Environment: FUZZ_TARGETS="tcp_wire shm_wire" to run a subset; FUZZ_MAX_SECONDS=N stops each
# target after N seconds even short of its runs (the table then shows how far it got). Fails on the first crash, leak,
# sanitizer report or violated invariant and keeps the input in the scratch directory.
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
build="$(cd "${1:-$root/build-fuzz}" && pwd)"
runs="${2:-10000000}"
jobs="${3:-$(nproc)}"
targets="${FUZZ_TARGETS:-$(cd "$build/tests/fuzz" && ls *_fuzz | sed 's/_fuzz$//' | sort)}"
scratch="$(mktemp -d /tmp/ferry-fuzz-long.XXXXXX)"
echo "fuzz: $runs executions per target over $jobs workers; scratch corpus, logs, crash inputs in $scratch"
printf '| target | executions | seconds | exec/s | cov (merged corpus) | corpus | result |\n|---|---|---|---|---|---|---|\n' >"$scratch/table.md"
status=0
for t in $targets; do
  bin="$build/tests/fuzz/${t}_fuzz"
  mkdir -p "$scratch/$t/corpus" "$scratch/$t/logs"
  cp -r "$root/tests/fuzz/corpus/$t/." "$scratch/$t/corpus/" 2>/dev/null || true
  start=$(date +%s.%N)
  # -jobs/-workers: JOBS independent processes, each stopping after its share of the runs;
  # new inputs land in the shared corpus directory, which each worker re-reads as it goes.
  result=ok
  (cd "$scratch/$t/logs" && "$bin" -runs=$(( (runs + jobs - 1) / jobs )) -jobs="$jobs" -workers="$jobs" \
      -timeout=10 -max_total_time="${FUZZ_MAX_SECONDS:-0}" -print_final_stats=1 -artifact_prefix="$scratch/$t/" "$scratch/$t/corpus" >/dev/null 2>&1) || result=FAILED
  end=$(date +%s.%N)
  execs=$(cat "$scratch/$t/logs"/fuzz-*.log | sed -n 's/^stat::number_of_executed_units: *//p' | awk '{s+=$1} END {print s+0}')
  if grep -lE 'ERROR: (libFuzzer|AddressSanitizer|LeakSanitizer|UndefinedBehaviorSanitizer)|runtime error|invariant' \
      "$scratch/$t/logs"/fuzz-*.log >/dev/null 2>&1; then
    result=FAILED
  fi
  # Coverage of everything found, measured in one pass over the merged corpus.
  cov=$(cd "$scratch/$t" && "$bin" -runs=0 -artifact_prefix="$scratch/$t/" "$scratch/$t/corpus" 2>&1 | sed -nE 's/.*INITED cov: ([0-9]+).*/\1/p' | tail -1)
  files=$(ls "$scratch/$t/corpus" | wc -l)
  secs=$(awk -v a="$start" -v b="$end" 'BEGIN {printf "%.0f", b - a}')
  rate=$(awk -v e="$execs" -v s="$secs" 'BEGIN {printf "%.0f", (s > 0 ? e / s : 0)}')
  printf '| `%s` | %s | %s | %s | %s | %s | %s |\n' "$t" "$execs" "$secs" "$rate" "${cov:-?}" "$files" "$result" \
    | tee -a "$scratch/table.md"
  if [ "$result" != ok ]; then
    status=1
    grep -hE 'ERROR|invariant|runtime error|SUMMARY' "$scratch/$t/logs"/fuzz-*.log | head -20 || true
  fi
done
echo "table: $scratch/table.md"
exit $status
