#!/usr/bin/env bash
# tcp.so's per-op cost for small ops (submit + completion, 64-byte READs in batches of 1, 32 and
# 128: submit_poll_bench's tcp cases, wall time) and a 1 MiB check (transfer_engine_bench
# --loopback, WRITE and READ), for this build and, when given, a baseline build in the same run.
#   bench/tcp_small_ops.sh [build-dir] [baseline-build-dir]
# Environment: ROUNDS (default 3; the builds alternate within each round), MIN_TIME (seconds
# per submit_poll_bench case, default 0.5), DURATION (seconds per 1 MiB run, default 3; 0 skips
# them). Prints each figure's median over the rounds, with the range. "switches" rows: context
# switches of the bench process's threads per batch (submit_poll_bench's switches_per_batch, its
# last CSV column, from /proc), this build's bench binary loading each build's tcp.so (FERRY_BENCH_TCP_PLUGIN_DIR).
set -euo pipefail
build=${1:-build}
base=${2:-}
rounds=${ROUNDS:-3}
min_time=${MIN_TIME:-0.5}
duration=${DURATION:-3}
py=/usr/bin/python3
builds=("$build")
[ -n "$base" ] && builds=("$base" "$build")
for b in "${builds[@]}"; do
  [ -x "$b/bench/submit_poll_bench" ] || { echo "$b/bench/submit_poll_bench is missing: build it first" >&2; exit 1; }
done
out=$(mktemp)
trap 'rm -f "$out"' EXIT

for ((r = 1; r <= rounds; r++)); do
  for b in "${builds[@]}"; do
    "$b/bench/submit_poll_bench" --benchmark_filter='submit_and_wait/tcp' --benchmark_min_time="$min_time" \
      --benchmark_format=csv 2>/dev/null |
      awk -F, -v b="$b" '/^"submit_and_wait\/tcp\//{gsub(/"/, "", $1); split($1, p, "/"); print b, "tcp/" p[3], $3 / 1000}' >>"$out"
    FERRY_BENCH_TCP_PLUGIN_DIR="$b/plugins/tcp" "$build/bench/submit_poll_bench" \
      --benchmark_filter='submit_and_wait/tcp' --benchmark_min_time="$min_time" --benchmark_format=csv 2>/dev/null |
      awk -F, -v b="$b" '/^"submit_and_wait\/tcp\// {gsub(/"/, "", $1); split($1, p, "/"); print b, "switches-tcp/" p[3], $NF}' >>"$out"
    if [ "$duration" != 0 ]; then
      for op in write read; do
        FERRY_PLUGIN_PATH="$b/plugins/tcp" "$b/bench/transfer_engine_bench" --loopback --block_size=1048576 \
          --duration="$duration" --operation="$op" 2>&1 |
          awk -v b="$b" -v op="$op" '/^Test completed/{for (i = 1; i <= NF; ++i) if ($i == "throughput") print b, "1MiB-" op, $(i + 1)}' >>"$out"
      done
    fi
  done
done

$py - "$out" "${builds[@]}" <<'EOF'
import statistics, sys
rows = [l.split() for l in open(sys.argv[1]) if l.strip()]
builds = sys.argv[2:]
cases = []
for _, c, _ in rows:
    if c not in cases:
        cases.append(c)
def fig(b, c):
    v = [float(x) for bb, cc, x in rows if bb == b and cc == c]
    return (statistics.median(v), min(v), max(v)) if v else None
unit = lambda c: "GB/s" if c.startswith("1MiB") else ("/batch" if c.startswith("switches") else "us/batch")
print("| case | " + " | ".join(builds) + (" | ratio |" if len(builds) == 2 else " |"))
print("|---" * (len(builds) + 1 + (len(builds) == 2)) + "|")
for c in cases:
    cells, meds = [], []
    for b in builds:
        f = fig(b, c)
        meds.append(f[0] if f else None)
        if not f:
            cells.append("-")
            continue
        per_op = ""
        if c.startswith("tcp/"):
            n = int(c.split("/")[1])
            per_op = " (%.2f us/op)" % (f[0] / n)
        cells.append("%.2f %s%s [%.2f-%.2f]" % (f[0], unit(c), per_op, f[1], f[2]))
    ratio = ""
    if len(builds) == 2 and None not in meds:
        # > 1: this build is better (less time, or more GB/s)
        r = meds[1] / meds[0] if c.startswith("1MiB") else meds[0] / meds[1]
        ratio = " %.2fx |" % r
    print("| %s | %s |%s" % (c, " | ".join(cells), ratio))
EOF
