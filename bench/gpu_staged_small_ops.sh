#!/usr/bin/env bash
# Small GPU blocks staged through pinned host slices over tcp.so and shm.so: a GPU initiator
# (--use_vram) against a host-memory target, with small ops sharing slices (the default) and with
# a slice per op (gpu_staging_gather_max_op_bytes=0), against host -> host, all in one run.
#   bench/gpu_staged_small_ops.sh [build-dir] [seconds per point]
# Needs a CUDA GPU and a build with cuda_ipc.so (its copy kernel gathers the slices). Prints one
# line per point: transport, block x batch, op, and GB/s for host, shared slices, a slice per op.
set -euo pipefail
build=${1:-build}
secs=${2:-3}
bench=$build/bench/transfer_engine_bench
[ -x "$bench" ] || { echo "$bench is missing: build it first" >&2; exit 1; }
export FERRY_PLUGIN_PATH=${FERRY_PLUGIN_PATH:-$build/plugins/gpu_ipc/cuda:$build/plugins/tcp:$build/plugins/shm}
export FERRY_PLUGINS=
buffer=268435456
work=$(mktemp -d)
target_pid=
cleanup() {
  [ -n "$target_pid" ] && kill "$target_pid" 2>/dev/null && wait "$target_pid" 2>/dev/null
  rm -rf "$work"
}
trap cleanup EXIT

gbps() { /usr/bin/python3 -c 'import json,sys; print("%.2f" % (json.loads(sys.stdin.read().strip().splitlines()[-1])["throughput"]))'; }

port=7311
for proto in tcp shm; do
  port=$((port + 1))
  "$bench" --mode=target --protocol="$proto" --local_server_name="127.0.0.1:$port" --buffer_size=$buffer \
    >"$work/target.log" 2>&1 &
  target_pid=$!
  for shape in "65536 256" "16384 1024"; do
    read -r block batch <<<"$shape"
    for op in write read; do
      run() {
        "$bench" --mode=initiator --protocol="$proto" --segment_id="127.0.0.1:$port" --operation=$op \
          --block_size="$block" --batch_size="$batch" --threads=1 --buffer_size=$buffer --duration="$secs" \
          --wait_for_target=10 --json "$@" | gbps
      }
      host=$(run)
      shared=$(run --use_vram --gpu_id=0)
      per_op=$(run --use_vram --gpu_id=0 --option gpu_staging_gather_max_op_bytes=0)
      echo "$proto $((block / 1024)) KiB x $batch $op: host->host $host GB/s, GPU shared slices $shared GB/s, GPU a slice per op $per_op GB/s"
    done
  done
  kill "$target_pid" && wait "$target_pid" 2>/dev/null || true
  target_pid=
done
