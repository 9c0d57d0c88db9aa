#!/usr/bin/env bash
# Configure-time checks of -Drocm_roots, each a real `meson setup` of this source tree:
#  1. a root whose headers are one ROCm major and whose libamdhip64 is another fails, naming both;
#  2. a root with headers but no libamdhip64 builds no hip_ipc.so for it (no system fallback).
#   configure_check.sh SOURCE_DIR HEADERS_ROOT_A LIBRARY_ROOT_B   (two roots of different majors)
set -euo pipefail
src=$1 a=$2 b=$3
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
lib_b=$(/usr/bin/python3 "$src/plugins/gpu_ipc/hip/rocm_root.py" root "$b" "$(gcc -print-multiarch)" | sed -n 's/^library=//p')
inc_a=$(/usr/bin/python3 "$src/plugins/gpu_ipc/hip/rocm_root.py" root "$a" "$(gcc -print-multiarch)" | sed -n 's/^include=//p')
major() { sed -n 's/^#define HIP_VERSION_MAJOR \([0-9]*\).*/\1/p' "$1/hip/hip_version.h"; }
ma=$(major "$inc_a")
mkdir -p "$tmp/mixed/lib" "$tmp/headers"
ln -s "$inc_a" "$tmp/mixed/include"
ln -s "$inc_a" "$tmp/headers/include"
cp -a "$(dirname "$lib_b")"/libamdhip64.so* "$tmp/mixed/lib/"
soname=$(/usr/bin/python3 "$src/plugins/gpu_ipc/hip/rocm_root.py" root "$tmp/mixed" x | sed -n 's/^soname=//p')
opts=(-Dtests=disabled -Dbenchmarks=disabled -Dpython=disabled -Dplugin_efa=disabled -Dnixl=disabled
  -Dplugin_cuda_ipc=disabled --buildtype=release)
passed=0 failed=0
out=$(meson setup "$tmp/b1" "$src" "${opts[@]}" -Drocm_roots="$tmp/mixed" 2>&1) && rc=0 || rc=$?
if [ $rc != 0 ] && grep -q "the HIP headers are ROCm $ma (HIP_VERSION_MAJOR $ma in .*) but .* has soname \"$soname\", not libamdhip64.so.$ma" <<<"$out"; then
  passed=$((passed + 1)); echo "ok: ROCm $ma headers with $soname: configure fails naming both"
else
  failed=$((failed + 1)); echo "FAILED: ROCm $ma headers with $soname: configure exit $rc"; tail -5 <<<"$out"
fi
out=$(meson setup "$tmp/b2" "$src" "${opts[@]}" -Drocm_roots="$tmp/headers" 2>&1) && rc=0 || rc=$?
# The target list is read whole first: `ninja ... | grep -q` under pipefail fails when grep stops
# at its first match and ninja dies of SIGPIPE (it did, once the list outgrew a pipe's buffer).
targets=$([ $rc = 0 ] && ninja -C "$tmp/b2" -t targets all || true)
if [ $rc = 0 ] && grep -q "hip_ipc.so for rocm$ma skipped: $tmp/headers has HIP headers but no libamdhip64" <<<"$out" &&
   ! grep -q "rocm$ma/hip_ipc.so" <<<"$targets" &&
   grep -q "plugins/rocm/rocm$ma/rdma.so" <<<"$targets"; then
  passed=$((passed + 1)); echo "ok: ROCm $ma headers without a library: no hip_ipc.so, rocm$ma/rdma.so still built"
else
  failed=$((failed + 1)); echo "FAILED: ROCm $ma headers without a library (exit $rc)"; tail -5 <<<"$out"
fi
echo "$passed passed, $failed failed"
[ $failed = 0 ]
