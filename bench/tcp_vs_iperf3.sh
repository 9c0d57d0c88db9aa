#!/usr/bin/env bash
# tcp.so loopback throughput next to iperf3 on the same machine, in the same run.
#   bench/tcp_vs_iperf3.sh [build-dir]      (DURATION=5 by default)
# Prints a Markdown table: iperf3 with 1 and 2 streams (-l 1M), then transfer_engine_bench
# --loopback over tcp.so at 64 KiB, 1 MiB and 4 MiB blocks with 1 and 2 lanes, each with its
# ratio to iperf3's one-stream figure. Everything binds 127.0.0.1.
set -euo pipefail
build=${1:-build}
duration=${DURATION:-5}
port=${IPERF_PORT:-5299}
bench="$build/bench/transfer_engine_bench"
export FERRY_PLUGIN_PATH="$build/plugins/tcp"
py=/usr/bin/python3
command -v iperf3 >/dev/null || { echo "iperf3 is missing: apt-get install iperf3" >&2; exit 1; }
[ -x "$bench" ] || { echo "$bench is missing: build first (.ci/build.sh)" >&2; exit 1; }

iperf() { # streams -> GB/s received
  iperf3 -s -B 127.0.0.1 -p "$port" -1 >/dev/null 2>&1 &
  local server=$!
  sleep 0.5
  iperf3 -c 127.0.0.1 -p "$port" -l 1M -P "$1" -t "$duration" -J |
    $py -c 'import json,sys; print("%.2f" % (json.load(sys.stdin)["end"]["sum_received"]["bits_per_second"]/8e9))'
  wait "$server" 2>/dev/null || true
}

ferry() { # op block lanes -> GB/s
  "$bench" --loopback --protocol=tcp --operation="$1" --block_size="$2" --option "tcp.lanes=$3" \
    --duration="$duration" --json | $py -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["throughput"])'
}

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), duration ${duration}s per row"
base=$(iperf 1)
two=$(iperf 2)
ratio() { $py -c "print('%.2f' % ($1/$base))"; }
echo
echo "| what | block | lanes/streams | GB/s | vs iperf3 1 stream |"
echo "|---|---|---|---|---|"
echo "| iperf3 -l 1M | 1 MiB | 1 | $base | 1.00 |"
echo "| iperf3 -l 1M | 1 MiB | 2 | $two | $(ratio "$two") |"
for op in write read; do
  for block in 65536 1048576 4194304; do
    [ "$op" = read ] && [ "$block" != 1048576 ] && continue
    for lanes in 1 2; do
      v=$(ferry "$op" "$block" "$lanes")
      echo "| tcp.so $op | $((block / 1024)) KiB | $lanes | $v | $(ratio "$v") |"
    done
  done
done
