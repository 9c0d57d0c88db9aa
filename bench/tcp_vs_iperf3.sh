#!/usr/bin/env bash
# tcp.so loopback throughput next to iperf3 on the same machine, in the same run.
#   bench/tcp_vs_iperf3.sh [build-dir]
# Environment: DURATION (seconds per measurement, default 5), REPEAT (rounds, default 3),
# CPUS (a taskset CPU list every process is pinned to, e.g. 0,1; default: not pinned), OPTIONS
# (space-separated key=value engine/transport options for every tcp.so row, e.g. tcp.zerocopy=0).
#
# Each round measures iperf3 (-l 1M, 1 and 2 streams) and then every transfer_engine_bench
# --loopback row, so iperf3 and tcp.so see the same conditions; the table gives each row's median
# over the rounds, the range, and the median of the per-round ratios to iperf3's one stream.
# tcp.so runs twice per block size and lane count:
#   - "1 GiB": the bench's default 1 GiB buffer per side, blocks cycling through it, so the
#     bytes come from and land in main memory;
#   - "reused": one buffer of max(block, 1 MiB) per side that every op reads or writes, as
#     iperf3 -l 1M sends and receives one 1 MiB buffer that stays in cache. This is the
#     like-for-like row for the iperf3 comparison.
# The bench's buffers ask for transparent huge pages (its default); the 1 MiB rows over 1 GiB
# also run with 4 KiB pages (--huge_pages=false), next to the like-for-like baseline for large
# buffers: bench/loopback_limits --only=tcp, one sender and one receiver thread send()ing and
# recv()ing 1 MiB blocks that walk 1 GiB buffers, with huge pages and with 4 KiB pages.
# Everything binds 127.0.0.1.
set -euo pipefail
build=${1:-build}
duration=${DURATION:-5}
repeat=${REPEAT:-3}
port=${IPERF_PORT:-5299}
bench="$build/bench/transfer_engine_bench"
export FERRY_PLUGIN_PATH="$build/plugins/tcp"
py=/usr/bin/python3
pin=()
[ -n "${CPUS:-}" ] && pin=(taskset -c "$CPUS")
extra=()
for kv in ${OPTIONS:-}; do extra+=(--option "$kv"); done
command -v iperf3 >/dev/null || { echo "iperf3 is missing: apt-get install iperf3" >&2; exit 1; }
[ -x "$bench" ] || { echo "$bench is missing: build first (.ci/build.sh)" >&2; exit 1; }

iperf() { # streams -> GB/s received
  "${pin[@]}" iperf3 -s -B 127.0.0.1 -p "$port" -1 >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  "${pin[@]}" iperf3 -c 127.0.0.1 -p "$port" -l 1M -P "$1" -t "$duration" -J |
    $py -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9))'
  wait "$server" 2>/dev/null || true
}

ferry() { # op block lanes buffer-bytes huge-pages -> GB/s
  "${pin[@]}" "$bench" --loopback --protocol=tcp --operation="$1" --block_size="$2" \
    --option "tcp.lanes=$3" ${extra[@]+"${extra[@]}"} --buffer_size="$4" --huge_pages="$5" --duration="$duration" \
    --json | $py -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["throughput"])'
}
sockets() { # huge-pages -> GB/s of plain send/recv over 1 GiB buffers (bench/loopback_limits)
  "${pin[@]}" "$build/bench/loopback_limits" --only=tcp --huge_pages="$1" --duration="$duration" --json |
    $py -c 'import json,sys; print("%.2f" % json.loads(sys.stdin.readline())["gbps"])'
}

# Rows: label|op|block|lanes|buffer|huge pages. iperf3 rows have op "iperf3" and the stream count
# in lanes; the send/recv baseline op "sockets".
rows=("iperf3 -l 1M|iperf3|1048576|1|0|true" "iperf3 -l 1M|iperf3|1048576|2|0|true"
  "send/recv over 1 GiB, huge pages|sockets|1048576|1|1073741824|true"
  "send/recv over 1 GiB, 4 KiB pages|sockets|1048576|1|1073741824|false")
for op in write read; do
  for block in 65536 1048576 4194304; do
    [ "$op" = read ] && [ "$block" != 1048576 ] && continue
    reused=$((block > 1048576 ? block : 1048576))
    for lanes in 1 2; do
      rows+=("tcp.so $op, 1 GiB, huge pages|$op|$block|$lanes|1073741824|true")
      [ "$block" = 1048576 ] && rows+=("tcp.so $op, 1 GiB, 4 KiB pages|$op|$block|$lanes|1073741824|false")
      rows+=("tcp.so $op, reused|$op|$block|$lanes|$reused|true")
    done
  done
done

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), ${duration}s per measurement, $repeat rounds${CPUS:+, pinned to CPUs $CPUS}${OPTIONS:+, options $OPTIONS}"
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for ((round = 1; round <= repeat; ++round)); do
  for i in "${!rows[@]}"; do
    IFS='|' read -r _ op block lanes buffer huge <<<"${rows[$i]}"
    case $op in
      iperf3) v=$(iperf "$lanes") ;;
      sockets) v=$(sockets "$huge") ;;
      *) v=$(ferry "$op" "$block" "$lanes" "$buffer" "$huge") ;;
    esac
    echo "$round $i $v" >>"$results"
    echo "round $round/$repeat: ${rows[$i]%%|*} block $block lanes $lanes: $v GB/s" >&2
  done
done

printf '%s\n' "${rows[@]}" | $py -c '
import statistics, sys
rows = [line.rstrip("\n").split("|") for line in sys.stdin]
vals = {}
for line in open(sys.argv[1]):
    r, i, v = line.split()
    vals.setdefault(int(r), {})[int(i)] = float(v)
print()
# The like-for-like baseline of a 1 GiB row: send/recv over 1 GiB with the same pages.
same_pages = {huge: i for i, (label, op, block, lanes, buffer, huge) in enumerate(rows) if op == "sockets"}
print("| what | block | lanes/streams | GB/s median | range | vs iperf3 1 stream (median of rounds) | vs send/recv, same buffers and pages |")
print("|---|---|---|---|---|---|---|")
for i, (label, op, block, lanes, buffer, huge) in enumerate(rows):
    xs = [vals[r][i] for r in sorted(vals)]
    ratios = [vals[r][i] / vals[r][0] for r in sorted(vals) if vals[r][0] > 0]
    like = "-"
    if buffer == "1073741824" and op != "sockets":
        b = same_pages[huge]
        like = "%.2f" % statistics.median([vals[r][i] / vals[r][b] for r in sorted(vals) if vals[r][b] > 0])
    print("| %s | %d KiB | %s | %.2f | %.2f-%.2f | %.2f | %s |" % (label, int(block) // 1024, lanes,
          statistics.median(xs), min(xs), max(xs), statistics.median(ratios), like))
' "$results"
