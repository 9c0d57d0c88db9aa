#!/bin/bash
# shm.so small ops, wall time per op: submit_poll_bench's shm cases (64-byte READs and WRITEs,
# batches of 1 and 128, adjacent or 4 KiB apart) with this build's shm.so and, when given,
# another build's (a baseline), alternating, in one run. Prints the median of REPEAT rounds.
#   bench/shm_small_ops.sh <build dir> [<dir holding the baseline's shm.so>]
set -euo pipefail
build=${1:?usage: $0 <build dir> [<baseline shm.so dir>]}
base=${2:-}
REPEAT=${REPEAT:-3}  # at least 2 (Google Benchmark prints medians only then)
bench="$build/bench/submit_poll_bench"
run() {  # label, then FERRY_BENCH_SHM_PLUGIN_DIR
    FERRY_BENCH_SHM_PLUGIN_DIR="$2" "$bench" --benchmark_filter='^shm_ops' \
        --benchmark_repetitions="$REPEAT" --benchmark_report_aggregates_only=true 2>/dev/null |
        awk -v l="$1" '/_median/ { sub(/\/min_time.*/, "", $1); split($1, f, "/");
            printf "%-9s %-5s batch %3d stride %4d: %9.0f ns per batch, %7.0f ns per op\n", l, f[2], f[3], f[4], $2, $2 / f[3] }'
}
[ -n "$base" ] && run baseline "$base"
run this ""
