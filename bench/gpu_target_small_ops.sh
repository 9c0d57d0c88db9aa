#!/usr/bin/env bash
# Small GPU blocks with GPU memory on both ends over tcp.so: the target serves its GPU memory
# through pinned staging slices. Against host -> host, and with the target's packing of small
# READs into shared slices turned off (tcp.staged_pack_max_bytes=0), each in the same run.
#   bench/gpu_target_small_ops.sh [build-dir] [seconds per point]
# Needs a CUDA GPU and a build with cuda_ipc.so. Prints one line per block x batch and op.
set -euo pipefail
build=${1:-build}
secs=${2:-3}
bench=$build/bench/transfer_engine_bench
[ -x "$bench" ] || { echo "$bench is missing: build it first" >&2; exit 1; }
export FERRY_PLUGIN_PATH=${FERRY_PLUGIN_PATH:-$build/plugins/gpu_ipc/cuda:$build/plugins/tcp}
export FERRY_PLUGINS=
buffer=268435456
work=$(mktemp -d)
pids=()
cleanup() {
  for p in "${pids[@]}"; do kill "$p" 2>/dev/null && wait "$p" 2>/dev/null; done
  rm -rf "$work"
}
trap cleanup EXIT

gbps() { /usr/bin/python3 -c 'import json,sys; print("%.2f" % (json.loads(sys.stdin.read().strip().splitlines()[-1])["throughput"]))'; }

# Three targets at once: host memory, GPU memory (packing small READs, the default), GPU memory
# serving a slice per request.
target() {
  "$bench" --mode=target --protocol=tcp --local_server_name="127.0.0.1:$1" --buffer_size=$buffer "${@:2}" \
    >"$work/target-$1.log" 2>&1 &
  pids+=($!)
}
target 7321
target 7322 --use_vram --gpu_id=0
target 7323 --use_vram --gpu_id=0 --option tcp.staged_pack_max_bytes=0
for shape in "65536 256" "16384 1024"; do
  read -r block batch <<<"$shape"
  for op in read write; do
    run() {
      "$bench" --mode=initiator --protocol=tcp --segment_id="127.0.0.1:$1" --operation=$op \
        --block_size="$block" --batch_size="$batch" --threads=1 --buffer_size=$buffer --duration="$secs" \
        --wait_for_target=10 --json "${@:2}" | gbps
    }
    host=$(run 7321)
    packed=$(run 7322 --use_vram --gpu_id=0)
    per_request=$(run 7323 --use_vram --gpu_id=0)
    echo "tcp $((block / 1024)) KiB x $batch $op: host->host $host GB/s, GPU->GPU target packing $packed GB/s, GPU->GPU a slice per request $per_request GB/s"
  done
done
