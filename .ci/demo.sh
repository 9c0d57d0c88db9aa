#!/usr/bin/env bash
# The main job: install what is missing, build, and run the loopback transfer_engine_bench over
# tcp.so (target and initiator in one process, 1 MiB blocks, every byte checked in a first pass).
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/deps.sh
.ci/build.sh
export FERRY_PLUGIN_PATH="$PWD/build/plugins/tcp"
build/core/ferry-info
echo "== verify pass (checks every byte, so slower) =="
build/bench/transfer_engine_bench --loopback --protocol=tcp --operation=write --block_size=1048576 \
  --buffer_size=268435456 --duration=2 --verify
echo "== throughput =="
# Extra arguments go to the bench (any flag but --loopback, --protocol and --duration; DURATION
# sets the seconds).
build/bench/transfer_engine_bench --loopback --protocol=tcp --duration="${DURATION:-5}" \
  $(printf '%s\n' "$@" | grep -q -- '--block_size' || echo --block_size=1048576) "$@"
