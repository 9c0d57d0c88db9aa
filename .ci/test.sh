#!/usr/bin/env bash
# Builds Ferry and runs every test; ends with "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/deps.sh
# ROCm 5.7, 6.4 and 7.2 from Debian's archive (trixie, sid, experimental; cached): one build
# makes rocm5/, rocm6/ and rocm7/. Without them (no network, not Debian) only the system's ROCm.
if rocm_roots=$(tests/rocm/fetch_rocm.sh | paste -sd, -); then
  if [ -f build/build.ninja ]; then meson configure build -Drocm_roots="$rocm_roots"
  else meson setup build --buildtype=release -Drocm_roots="$rocm_roots"; fi >/dev/null
else
  echo "ROCm packages not fetched: building the system's ROCm only (the rocm_root suite will say SKIPPED)"
fi
.ci/build.sh
status=0
meson test -C build --print-errorlogs --num-processes 1 || status=$?
# GoogleTest cases and script suites' checks over all suites, failed tests by name, and which
# suites skipped and why (.ci/count_tests.py).
/usr/bin/python3 .ci/count_tests.py build/meson-logs/testlog.json
exit $status
