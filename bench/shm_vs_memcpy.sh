#!/usr/bin/env bash
# shm.so between two processes next to a single-thread memcpy and UCX, in the same run.
#   bench/shm_vs_memcpy.sh [build-dir]        (DURATION=5 seconds per row, REPEAT=1 runs per row)
# Prints a Markdown table:
#   - memcpy_baseline (1 thread; glibc defaults, and with the non-temporal threshold lowered to
#     64 KiB, see docs/PERFORMANCE.md) at 1 MiB and 16 MiB blocks over a 1 GiB buffer;
#   - transfer_engine_bench --protocol=shm, target and initiator in two processes, WRITE and
#     READ at the same blocks over the same 1 GiB buffer, with ratios to both memcpy rows; once
#     with shm.so's defaults (cross-memory attach) and once with shm.adopt_memfd=true on the
#     initiator (its buffer moved into a memfd that the serving side maps and copies with memcpy);
#   - ucx_perftest -t ucp_put_bw with UCX_TLS=shm at 4 MiB (UCX allocates one 4 MiB buffer per
#     side in shared memory and reuses it, so it runs from cache) next to shm.so at 4 MiB over a
#     4 MiB buffer (the same reuse) and over 1 GiB. ucx_perftest's server listens on every
#     interface, so both UCX processes run in a private network namespace that has only loopback
#     (unshare -n);
#   - the same 4 MiB rows with managed buffers on both sides (--shared_buffers: the engine's
#     alloc_shared, a sealed memfd that the target's shm.so hands to the initiator, which maps
#     it once and copies with memcpy), over a 4 MiB buffer (reused, like UCX) and over 1 GiB.
# The memcpy table runs once with huge pages asked for on every buffer (the benches' default) and
# once with 4 KiB pages (--huge_pages=false on the benches and memcpy_baseline), each shm.so row
# against memcpy over the same pages; PAGES="true false" (the default) picks them.
# TABLES=memcpy,ucx (default both) picks the tables, so each part fits one quiet-bench call.
# Everything else binds 127.0.0.1.
set -euo pipefail
build=${1:-build}
duration=${DURATION:-5}
bench="$build/bench/transfer_engine_bench"
baseline="$build/bench/memcpy_baseline"
py=/usr/bin/python3
export FERRY_PLUGIN_PATH="$build/plugins/shm"
GiB=1073741824
[ -x "$bench" ] && [ -x "$baseline" ] || { echo "build first: $bench and $baseline are missing" >&2; exit 1; }
[ -e "$build/plugins/shm/shm.so" ] || { echo "$build/plugins/shm/shm.so is missing" >&2; exit 1; }
tmp=$(mktemp -d)
target_pid=""
cleanup() { [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null; rm -rf "$tmp"; }
trap cleanup EXIT

throughput() { $py -c 'import json,sys; print("%.2f" % json.load(sys.stdin)["throughput"])'; }
ratio() { $py -c "print('%.2f' % ($1 / $2))"; }

huge=true # the pages of the buffers the next rows use (--huge_pages)
memcpy_rate_once() { # buffer block -> GB/s
  "$baseline" --buffer_size="$1" --block_size="$2" --duration="$duration" --huge_pages="$huge" --json | throughput
}
memcpy_nt_rate() {
  GLIBC_TUNABLES=glibc.cpu.x86_non_temporal_threshold=0x10000 memcpy_rate "$@"
}

# buffer block operation [initiator --option k=v ...] -> GB/s; target and initiator are two processes.
# --shared_buffers as the first extra argument goes to both sides.
shm_rate_once() {
  local buffer=$1 block=$2 op=$3 target_extra=()
  shift 3
  [ "${1:-}" = --shared_buffers ] && target_extra=(--shared_buffers)
  "$bench" --mode=target --local_server_name=127.0.0.1:0 --buffer_size="$buffer" --option plugins=shm \
    --huge_pages="$huge" ${target_extra[@]+"${target_extra[@]}"} >"$tmp/target.out" 2>&1 &
  target_pid=$!
  local segment=""
  for _ in $(seq 1 200); do
    segment=$(awk '/ ready:/ {print $2}' "$tmp/target.out")
    [ -n "$segment" ] && break
    kill -0 "$target_pid" 2>/dev/null || { cat "$tmp/target.out" >&2; exit 1; }
    sleep 0.05
  done
  [ -n "$segment" ] || { echo "target did not start" >&2; exit 1; }
  "$bench" --mode=initiator --segment_id="$segment" --protocol=shm --operation="$op" --buffer_size="$buffer" \
    --block_size="$block" --duration="$duration" --option plugins=shm --huge_pages="$huge" "$@" --json | throughput
  kill -INT "$target_pid"
  wait "$target_pid" 2>/dev/null || true
  target_pid=""
}

in_loopback_netns() { # cmd... : run in a network namespace that has only lo
  if unshare -n true 2>/dev/null; then
    unshare -n sh -c 'ip link set lo up && exec "$@"' sh "$@"
  else
    unshare -rn sh -c 'ip link set lo up && exec "$@"' sh "$@"
  fi
}

ucx_rate_once() { # size -> GB/s (ucx_perftest reports MiB/s)
  command -v ucx_perftest >/dev/null || { echo "n/a"; return; }
  local iters=$((duration * 2000))
  in_loopback_netns sh -c '
    UCX_TLS=shm ucx_perftest -t ucp_put_bw -s "$1" -n "$2" -w 200 -p 13337 >/dev/null 2>&1 &
    server=$!
    sleep 1
    UCX_TLS=shm ucx_perftest 127.0.0.1 -t ucp_put_bw -s "$1" -n "$2" -w 200 -p 13337 -f 2>/dev/null
    wait $server' sh "$1" "$iters" |
    awk 'NF >= 8 && $1 ~ /^[0-9]+$/ {mb = $6} END {if (mb == "") print "n/a"; else printf "%.2f\n", mb * 1048576 / 1e9}'
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
memcpy_rate() { best_of memcpy_rate_once "$@"; }
shm_rate() { best_of shm_rate_once "$@"; }
ucx_rate() { best_of ucx_rate_once "$@"; }

echo "machine: $(nproc) cores, $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), kernel $(uname -r), $(free -g | awk '/Mem:/ {print $2}') GiB"
echo "date: $(date -u +%Y-%m-%dT%H:%MZ), ${duration}s per run, best of ${REPEAT:-1} per row, load before: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "shm.so defaults: copy_threads=2, chunk_size=1m; transfer_engine_bench batch_size=128, threads=1"
tables=${TABLES:-memcpy,ucx}
if [[ $tables == *memcpy* ]]; then
echo
echo "| what | block | buffer | pages | GB/s | vs memcpy | vs memcpy (NT 64k) |"
echo "|---|---|---|---|---|---|---|"
for huge in ${PAGES:-true false}; do
pages=$([ "$huge" = true ] && echo "huge pages asked" || echo "4 KiB")
for block in 1048576 16777216; do
  label="$((block / 1048576)) MiB"
  m=$(memcpy_rate $GiB "$block")
  nt=$(memcpy_nt_rate $GiB "$block")
  echo "| memcpy, 1 thread | $label | 1 GiB | $pages | $m | 1.00 | $(ratio "$m" "$nt") |"
  echo "| memcpy, 1 thread, non-temporal from 64 KiB | $label | 1 GiB | $pages | $nt | $(ratio "$nt" "$m") | 1.00 |"
  for op in write read; do
    s=$(shm_rate $GiB "$block" "$op")
    echo "| shm.so $op, 2 processes | $label | 1 GiB | $pages | $s | $(ratio "$s" "$m") | $(ratio "$s" "$nt") |"
  done
  for op in write read; do
    s=$(shm_rate $GiB "$block" "$op" --option shm.adopt_memfd=true)
    echo "| shm.so $op, 2 processes, adopt_memfd | $label | 1 GiB | $pages | $s | $(ratio "$s" "$m") | $(ratio "$s" "$nt") |"
  done
done
done
huge=true
fi
if [[ $tables == *ucx* ]]; then
echo
echo "| what | block | buffer | GB/s | vs UCX |"
echo "|---|---|---|---|---|"
u=$(ucx_rate 4194304)
echo "| ucx_perftest ucp_put_bw, UCX_TLS=shm | 4 MiB | 4 MiB (reused) | $u | 1.00 |"
for buffer in 4194304 $GiB; do
  label=$([ "$buffer" = $GiB ] && echo "1 GiB" || echo "4 MiB (reused)")
  for mode in "" adopt_memfd; do
    for op in write read; do
      if [ -n "$mode" ]; then s=$(shm_rate "$buffer" 4194304 "$op" --option shm.adopt_memfd=true); else s=$(shm_rate "$buffer" 4194304 "$op"); fi
      if [ "$u" = "n/a" ]; then r="n/a"; else r=$(ratio "$s" "$u"); fi
      echo "| shm.so $op, 2 processes${mode:+, $mode} | 4 MiB | $label | $s | $r |"
    done
  done
  for op in write read; do
    s=$(shm_rate "$buffer" 4194304 "$op" --shared_buffers)
    if [ "$u" = "n/a" ]; then r="n/a"; else r=$(ratio "$s" "$u"); fi
    echo "| shm.so $op, 2 processes, managed buffers (alloc_shared) | 4 MiB | $label | $s | $r |"
  done
done
fi
echo
echo "load after: $(cut -d' ' -f1-3 /proc/loadavg)"
