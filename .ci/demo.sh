#!/usr/bin/env bash
# The main job: install what is missing, build only what the demo runs (libferry, ferry-info,
# tcp.so, transfer_engine_bench), and run the loopback transfer_engine_bench over tcp.so (target
# and initiator in one process, 1 MiB blocks, every byte checked in a first pass). .ci/build.sh
# (or `ninja -C build <target>`) builds the rest: the other plugins, tests, other benches.
set -euo pipefail
cd "$(dirname "$0")/.."
step() { printf '\n== [%s] %s ==\n' "$(date +%H:%M:%S)" "$*"; }
start=$SECONDS
step "1/5 Debian packages (.ci/deps.sh: installs only what is missing)"
.ci/deps.sh
step "2/5 configure build/ (meson, once)"
if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=release
else
  echo "build/ is configured already"
fi
step "3/5 build libferry, ferry-info, tcp.so and transfer_engine_bench (ninja prints [done/total])"
ninja -C build -j"$(nproc)" core/ferry-info core/ferry/plugins/tcp.so bench/transfer_engine_bench
step "4/5 ferry-info: which plugins load from the build tree (build/core/ferry/plugins)"
build/core/ferry-info
step "5/5 transfer_engine_bench --loopback over tcp.so"
echo "-- verify pass (checks every byte, so slower) --"
build/bench/transfer_engine_bench --loopback --protocol=tcp --operation=write --block_size=1048576 \
  --buffer_size=268435456 --duration=2 --verify
echo "-- throughput --"
# Extra arguments go to the bench (any flag but --loopback, --protocol and --duration; DURATION
# sets the seconds).
build/bench/transfer_engine_bench --loopback --protocol=tcp --duration="${DURATION:-5}" \
  $(printf '%s\n' "$@" | grep -q -- '--block_size' || echo --block_size=1048576) "$@"
echo "demo done in $((SECONDS - start)) s; .ci/build.sh builds everything else (tests, other plugins)"
