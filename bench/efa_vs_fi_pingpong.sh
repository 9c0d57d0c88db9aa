#!/usr/bin/env bash
# efa.so over libfabric's tcp provider next to tcp.so and fi_pingpong, in the same run.
#   bench/efa_vs_fi_pingpong.sh [[LABEL=]build-dir ...]
#       DURATION=5 seconds per run, REPEAT=1 runs per row and round (the best is kept),
#       ROUNDS=1, BLOCKS="65536 1048576 4194304", PROTOS="efa tcp",
#       OPTIONS="efa.spin_us=200 ..." (engine options for both processes of every build),
#       BUFFER=268435456 bytes per process (ops walk through it, so at 256 MiB every op's bytes
#       come from memory; fi_pingpong reuses one buffer of the block's size, in cache: BUFFER
#       equal to the block compares like with like for one op in flight),
#       PROFILE=1: every run under a system-wide `perf record` (root, or perf_event_paranoid
#       -1), and a column with the kernel's socket copies in CPU ms per GB moved: sending
#       (_copy_from_iter) / receiving (_copy_to_iter), median over rounds; REPEAT must be 1
# Prints a Markdown table at 64 KiB, 1 MiB and 4 MiB:
#   - fi_pingpong -p tcp -e rdm (libfabric-bin): one message in flight, its MB/sec (1e6 B/s);
#   - transfer_engine_bench --protocol=efa (efa.provider=tcp) with target and initiator in two
#     processes, WRITE and READ, one op in flight (--batch_size=1, like fi_pingpong) and 128;
#   - transfer_engine_bench --protocol=tcp (tcp.so), same shape;
# each with its ratio to fi_pingpong at the same size. fi_pingpong swings between levels from
# run to run, so with several builds (e.g. `main=/work/main/build this=build`) and ROUNDS=n every
# round runs fi_pingpong and then each row of every build, interleaved (the builds' order
# alternates between rounds); a row prints the median over rounds of its GB/s and of its ratio
# to the same round's fi_pingpong, and every round's GB/s. fi_pingpong's server listens on every
# interface, so both fi_pingpong processes run in a private network namespace that has only
# loopback (unshare -n); Ferry's processes bind 127.0.0.1 (FI_TCP_IFACE=lo as well).
set -euo pipefail
[ $# -gt 0 ] || set -- build
labels=() builds=()
for arg in "$@"; do
  if [[ "$arg" == *=* ]]; then labels+=("${arg%%=*}"); builds+=("${arg#*=}"); else labels+=("$arg"); builds+=("$arg"); fi
  [ -x "${builds[-1]}/bench/transfer_engine_bench" ] || { echo "build first: ${builds[-1]}/bench/transfer_engine_bench is missing" >&2; exit 1; }
done
duration=${DURATION:-5}
rounds=${ROUNDS:-1}
py=/usr/bin/python3
export FI_TCP_IFACE=lo
buffer=${BUFFER:-268435456}
command -v fi_pingpong >/dev/null || { echo "fi_pingpong is missing: apt-get install libfabric-bin" >&2; exit 1; }
tmp=$(mktemp -d)
target_pid=""
cleanup() { [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

throughput() { $py -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["throughput"])'; }

# PROFILE=1: perf samples every CPU while a run goes; copy_cost then splits the kernel's socket
# copies out of them, per GB the run moved (fi_pingpong: both directions), into $tmp/copy.
if [ -n "${PROFILE:-}" ]; then
  [ "${REPEAT:-1}" = 1 ] || { echo "PROFILE=1 needs REPEAT=1 (one run per row and round)" >&2; exit 1; }
  perf record -a -q -o /dev/null -- true 2>/dev/null ||
    { echo "PROFILE=1: perf record -a does not work here (perf missing, or not root and perf_event_paranoid > -1)" >&2; exit 1; }
fi
prof_pid=""
prof_start() {
  [ -n "${PROFILE:-}" ] || return 0
  perf record -a -q -F 999 -o "$tmp/prof.data" -- sleep 100000 >/dev/null 2>&1 &
  prof_pid=$!
  sleep 0.3
}
copy_cost() { # bytes moved -> "$tmp/copy": sending / receiving CPU ms per GB
  [ -n "${PROFILE:-}" ] || return 0
  kill -INT "$prof_pid" && wait "$prof_pid" 2>/dev/null
  perf report -i "$tmp/prof.data" --stdio --no-children --sort sym -g none 2>/dev/null | awk -v bytes="$1" '
    /^# Event count/ {total = $NF}
    $NF == "_copy_from_iter" {sub("%", "", $1); from += $1}
    $NF == "_copy_to_iter" {sub("%", "", $1); to += $1}
    END {if (bytes > 0 && total > 0) printf "%.0f / %.0f\n", from / 100 * total / 1e6 / (bytes / 1e9), to / 100 * total / 1e6 / (bytes / 1e9); else print "n/a"}' >"$tmp/copy"
}
ratio() { $py -c "print('%.2f' % ($1 / $2))"; }

# Loopback up in the new namespace: with iproute2's ip, or where it is missing (the lent GPU
# machine has none) with the same SIOCGIFFLAGS/SIOCSIFFLAGS ioctls from Python.
lo_up='ip link set lo up 2>/dev/null || /usr/bin/python3 -c "
import fcntl, socket, struct
s = socket.socket()
flags = struct.unpack(\"16sh\", fcntl.ioctl(s, 0x8913, struct.pack(\"16sh22x\", b\"lo\", 0))[:18])[1]
fcntl.ioctl(s, 0x8914, struct.pack(\"16sh22x\", b\"lo\", flags | 1))"'
in_loopback_netns() {
  if unshare -n true 2>/dev/null; then
    unshare -n sh -c "$lo_up"' && exec "$@"' sh "$@"
  else
    unshare -rn sh -c "$lo_up"' && exec "$@"' sh "$@"
  fi
}

pingpong_once() { # size -> GB/s (fi_pingpong prints MB/sec = 1e6 B/s)
  local iters=$(( $1 >= 1048576 ? duration * 800 : duration * 8000 ))
  prof_start
  in_loopback_netns sh -c '
    fi_pingpong -p tcp -e rdm -S "$1" -I "$2" -B 47593 >/dev/null 2>&1 &
    server=$!
    sleep 0.5
    fi_pingpong -p tcp -e rdm -S "$1" -I "$2" -P 47593 127.0.0.1
    wait $server' sh "$1" "$iters" |
    awk '$1 ~ /^[0-9]+[kmg]?$/ && NF >= 8 {mb = $6} END {if (mb == "") print "n/a"; else printf "%.2f\n", mb / 1000}'
  copy_cost $((2 * iters * $1))
}

# build protocol block operation batch -> GB/s; target and initiator are two processes.
ferry_rate_once() {
  local build=$1 proto=$2 block=$3 op=$4 batch=$5
  local bench="$build/bench/transfer_engine_bench"
  export FERRY_PLUGIN_PATH="$build/plugins/efa:$build/plugins/tcp"
  local opts=(--option "plugins=$proto")
  [ "$proto" = efa ] && opts+=(--option efa.provider=tcp)
  for kv in ${OPTIONS:-}; do opts+=(--option "$kv"); done
  "$bench" --mode=target --local_server_name=127.0.0.1:0 --buffer_size=$buffer "${opts[@]}" >"$tmp/target.out" 2>&1 &
  target_pid=$!
  local segment=""
  for _ in $(seq 1 200); do
    segment=$(awk '/ ready:/ {print $2}' "$tmp/target.out")
    [ -n "$segment" ] && break
    kill -0 "$target_pid" 2>/dev/null || { cat "$tmp/target.out" >&2; exit 1; }
    sleep 0.05
  done
  [ -n "$segment" ] || { echo "target did not start" >&2; exit 1; }
  prof_start
  "$bench" --mode=initiator --segment_id="$segment" --protocol="$proto" --operation="$op" --buffer_size=$buffer \
    --block_size="$block" --batch_size="$batch" --duration="$duration" "${opts[@]}" --json >"$tmp/run.json"
  copy_cost "$($py -c 'import json,sys; print(json.load(open(sys.argv[1]))["bytes"])' "$tmp/run.json")"
  throughput <"$tmp/run.json"
  kill -INT "$target_pid"
  wait "$target_pid" 2>/dev/null || true
  target_pid=""
}

# REPEAT=n runs every row n times and keeps the best (interference from other work on a shared
# machine only ever lowers a figure). Every row, baselines included, is treated the same.
best_of() {
  local best="" v
  for _ in $(seq 1 "${REPEAT:-1}"); do
    v=$("$@")
    if [ "$v" != "n/a" ] && { [ -z "$best" ] || $py -c "import sys; sys.exit(0 if $v > $best else 1)"; }; then best=$v; fi
  done
  echo "${best:-n/a}"
}
pingpong() { best_of pingpong_once "$@"; }
ferry_rate() { best_of ferry_rate_once "$@"; }

median() { $py -c 'import statistics,sys; v=[float(x) for x in sys.argv[1:] if x != "n/a"]; print("%.2f" % statistics.median(v) if v else "n/a")' "$@"; }

# Every round: per block, fi_pingpong once, then every row of every build.
declare -A got
rows=()
for block in ${BLOCKS:-65536 1048576 4194304}; do
  for proto in ${PROTOS:-efa tcp}; do
    for op in write read; do
      for batch in 1 128; do
        [ "$op" = read ] && [ "$batch" = 1 ] && continue
        rows+=("$block $proto $op $batch")
      done
    done
  done
done
echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r), libfabric $(fi_info --version 2>/dev/null | awk '/libfabric:/ {print $2}')"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), ${duration}s per run, best of ${REPEAT:-1} per row, $rounds round(s), builds: $*, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
for round in $(seq 1 "$rounds"); do
  order=("${!builds[@]}")
  if [ $((round % 2)) -eq 0 ]; then order=(); for ((i = ${#builds[@]} - 1; i >= 0; i--)); do order+=("$i"); done; fi
  for block in ${BLOCKS:-65536 1048576 4194304}; do
    got["ping $block $round"]=$(pingpong "$block")
    [ -n "${PROFILE:-}" ] && got["copy ping $block $round"]=$(cat "$tmp/copy")
    for row in "${rows[@]}"; do
      read -r b proto op batch <<<"$row"
      [ "$b" = "$block" ] || continue
      for i in "${order[@]}"; do
        got["$i $row $round"]=$(ferry_rate "${builds[$i]}" "$proto" "$block" "$op" "$batch")
        [ -n "${PROFILE:-}" ] && got["copy $i $row $round"]=$(cat "$tmp/copy")
      done
    done
  done
  echo "round $round done, load $(cut -d' ' -f1-3 /proc/loadavg)" >&2
done
# "from / to" per round -> the median of each side
copy_median() { $py -c '
import statistics, sys
v = [x.split(" / ") for x in sys.argv[1:] if " / " in x]
print("%.0f / %.0f" % tuple(statistics.median(float(p[i]) for p in v) for i in (0, 1)) if v else "n/a")' "$@"; }
copies() { # key prefix -> " copies |" cell when PROFILE=1
  [ -n "${PROFILE:-}" ] || return 0
  local cs=() round
  for round in $(seq 1 "$rounds"); do cs+=("${got["copy $1 $round"]}"); done
  echo " $(copy_median "${cs[@]}") |"
}
copies_head="" copies_rule=""
[ -n "${PROFILE:-}" ] && copies_head=" socket copies, CPU ms per GB: sending / receiving |" copies_rule="---|"
echo
echo "| what | block | in flight | GB/s (median) | vs fi_pingpong (median of rounds) | GB/s per round |$copies_head"
echo "|---|---|---|---|---|---|$copies_rule"
for block in ${BLOCKS:-65536 1048576 4194304}; do
  label=$([ "$block" -ge 1048576 ] && echo "$((block / 1048576)) MiB" || echo "$((block / 1024)) KiB")
  ps=() p_all=""
  for round in $(seq 1 "$rounds"); do ps+=("${got["ping $block $round"]}"); done
  echo "| fi_pingpong -p tcp -e rdm | $label | 1 | $(median "${ps[@]}") | 1.00 | ${ps[*]} |$(copies "ping $block")"
  for row in "${rows[@]}"; do
    read -r b proto op batch <<<"$row"
    [ "$b" = "$block" ] || continue
    for i in "${!builds[@]}"; do
      vs=() rs=()
      for round in $(seq 1 "$rounds"); do
        v=${got["$i $row $round"]} p=${ps[$((round - 1))]}
        vs+=("$v")
        rs+=("$([ "$p" = n/a ] || [ "$v" = n/a ] && echo n/a || ratio "$v" "$p")")
      done
      name=$([ "$proto" = efa ] && echo "efa.so (tcp;ofi_rxm)" || echo "tcp.so")
      [ ${#builds[@]} -gt 1 ] && name="$name, ${labels[$i]}"
      echo "| $name $op | $label | $batch | $(median "${vs[@]}") | $(median "${rs[@]}") | ${vs[*]} |$(copies "$i $row")"
    done
  done
done
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
