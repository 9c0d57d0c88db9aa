#!/usr/bin/env bash
# tcp.so next to Mooncake Transfer Engine's TCP transport, same flags, same run.
#   bench/tcp_vs_mooncake.sh MOONCAKE_TRANSFER_ENGINE_BENCH [build-dir]
# The first argument is an existing build of Mooncake's transfer_engine_bench (this script does
# not build Mooncake). Environment: DURATION (seconds per measurement, default 5), REPEAT
# (rounds, default 3), OPS (default "write read"), BLOCKS (default "1048576 65536"), BATCH
# (default 128), MC_LANES (MC_TCP_LANES_PER_PEER values, default "1 4"), FERRY_LANES (tcp.lanes
# values, default "2"), OPTIONS (extra key=value options for every tcp.so row), PORT (default
# 24310; Ferry uses PORT+2, PORT+3; Mooncake's handshake takes a random port in its namespace).
#
# Mooncake runs at its best measured configuration: MC_TCP_ENABLE_CONNECTION_POOL=1,
# --threads=1, --metadata_server=P2PHANDSHAKE, --protocol=tcp, DRAM buffers (a build without USE_CUDA has no --use_vram). Its bench binds
# every interface, so both of its processes run inside a private network namespace
# (`unshare -n`, only loopback up): nothing is reachable from outside. Ferry's bench runs as two
# processes too (target and initiator, the same flags), in a namespace of its own, so both
# sides see the same conditions. Each round measures every row; the table gives each row's
# median over the rounds, the range, and the median of the per-round ratios Ferry / Mooncake's
# best row of the same op and block.
set -euo pipefail
mc=${1:?usage: bench/tcp_vs_mooncake.sh MOONCAKE_TRANSFER_ENGINE_BENCH [build-dir]}
build=${2:-build}
duration=${DURATION:-5}
repeat=${REPEAT:-3}
port=${PORT:-24310}
batch=${BATCH:-128}
ferry="$build/bench/transfer_engine_bench"
py=/usr/bin/python3
[ -x "$mc" ] || { echo "$mc is not an executable (Mooncake's transfer_engine_bench)" >&2; exit 1; }
[ -x "$ferry" ] || { echo "$ferry is missing: build first (ninja -C $build bench/transfer_engine_bench)" >&2; exit 1; }
[ "$(id -u)" = 0 ] || { echo "unshare -n needs root" >&2; exit 1; }
mc=$(readlink -f "$mc")
ferry=$(readlink -f "$ferry")
plugins=$(readlink -f "$build/plugins/tcp")
extra=""
for kv in ${OPTIONS:-}; do extra+=" --option $kv"; done

# Runs "target command" and "initiator command" in one fresh network namespace; prints the
# initiator's output. @PORT@ in the initiator's command becomes the port the target's log names
# ("listening on 127.0.0.1:PORT": Mooncake's P2P handshake picks a random one), if it names one.
# The target is stopped once the initiator has finished.
in_netns() {
  unshare -n bash -c '
    ip link set lo up
    log=$(mktemp)
    bash -c "$1" >"$log" 2>&1 &
    target=$!
    for _ in $(seq 100); do grep -q "listening on" "$log" && break; sleep 0.1; done
    sleep 0.5
    p=$(sed -n "s/.*Transfer Engine RPC using .*listening on 127.0.0.1:\([0-9]*\).*/\1/p" "$log" | head -1)
    out=$(bash -c "${2//@PORT@/$p}" 2>&1) || { echo "$out" >&2; cat "$log" >&2; kill $target; rm -f "$log"; exit 1; }
    kill $target 2>/dev/null; wait $target 2>/dev/null
    rm -f "$log"
    echo "$out"' _ "$1" "$2"
}

mooncake() { # op block lanes -> GB/s
  local common="--metadata_server=P2PHANDSHAKE --protocol=tcp --buffer_size=1073741824"
  local env="MC_TCP_ENABLE_CONNECTION_POOL=1 MC_TCP_LANES_PER_PEER=$3 GLOG_logtostderr=1"
  in_netns "$env $mc --mode=target --local_server_name=127.0.0.1:$port $common" \
    "$env $mc --mode=initiator --local_server_name=127.0.0.1:$((port + 1)) --segment_id=127.0.0.1:@PORT@ \
       $common --operation=$1 --block_size=$2 --batch_size=$batch --threads=1 --duration=$duration" |
    $py -c '
import re, sys
text = sys.stdin.read()
m = re.search(r"throughput ([0-9.]+) GB/s", text)
if not m: sys.exit("no throughput in Mooncake output:\n" + text)
print("%.2f" % float(m.group(1)))'
}

ferry() { # op block lanes -> GB/s
  local common="--metadata_server=P2PHANDSHAKE --protocol=tcp --buffer_size=1073741824 --option tcp.lanes=$3$extra"
  local env="FERRY_PLUGIN_PATH=$plugins"
  in_netns "$env $ferry --mode=target --local_server_name=127.0.0.1:$((port + 2)) $common" \
    "$env $ferry --mode=initiator --local_server_name=127.0.0.1:$((port + 3)) --segment_id=127.0.0.1:$((port + 2)) \
       $common --operation=$1 --block_size=$2 --batch_size=$batch --threads=1 --duration=$duration --json" |
    $py -c 'import json,sys; print("%.2f" % json.loads(sys.stdin.read().strip().splitlines()[-1])["throughput"])'
}

rows=()  # label|who|op|block|lanes
for op in ${OPS:-write read}; do
  for block in ${BLOCKS:-1048576 65536}; do
    for l in ${MC_LANES:-1 4}; do rows+=("Mooncake TE tcp, MC_TCP_LANES_PER_PEER=$l|mc|$op|$block|$l"); done
    for l in ${FERRY_LANES:-2}; do rows+=("tcp.so, tcp.lanes=$l|ferry|$op|$block|$l"); done
  done
done

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r)"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), ${duration}s per measurement, $repeat rounds, batch $batch, 1 thread${OPTIONS:+, options $OPTIONS}"
results=$(mktemp)
trap 'rm -f "$results"' EXIT
for ((round = 1; round <= repeat; ++round)); do
  for i in "${!rows[@]}"; do
    IFS='|' read -r label who op block lanes <<<"${rows[$i]}"
    if [ "$who" = mc ]; then v=$(mooncake "$op" "$block" "$lanes"); else v=$(ferry "$op" "$block" "$lanes"); fi
    echo "$round $i $v" >>"$results"
    echo "round $round/$repeat: $label $op block $block: $v GB/s" >&2
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
print("| what | op | block | GB/s median | range | vs best Mooncake row (median of rounds) |")
print("|---|---|---|---|---|---|")
for i, (label, who, op, block, lanes) in enumerate(rows):
    xs = [vals[r][i] for r in sorted(vals)]
    ratios = []
    for r in sorted(vals):
        best = max(vals[r][j] for j, row in enumerate(rows) if row[1] == "mc" and row[2] == op and row[3] == block)
        if best > 0: ratios.append(vals[r][i] / best)
    print("| %s | %s | %d KiB | %.2f | %.2f-%.2f | %.2f |" % (label, op, int(block) // 1024,
          statistics.median(xs), min(xs), max(xs), statistics.median(ratios)))
' "$results"
