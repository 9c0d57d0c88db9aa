#!/usr/bin/env bash
# Configures (once) and builds Ferry in ./build. ccache is used when present.
set -euo pipefail
cd "$(dirname "$0")/.."
if [ ! -f build/build.ninja ]; then
  meson setup build --buildtype=release
fi
ninja -C build -j"$(nproc)"
