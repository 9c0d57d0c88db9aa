#!/usr/bin/env bash
# Makes (once) a Debian sid root with ROCm's real user space for the run-time suite:
#   tests/rocm/make_root.sh ROOT_DIR
# sid's HIP 6.4 and hipRTC 6.4 (libamdhip64-6, libhiprtc6), experimental's HIP 7.2, hipRTC 7.2
# and rocm-core 7.2 (libamdhip64-7, libhiprtc7, librocm-core1), and python3-venv, python3-cffi,
# python3-pytest, python3-numpy and libcurl for the wheel check (the Python test suite runs on
# sid's CPython too); the .debs stay in the root's apt cache so the suite switches between
# installs with dpkg, offline. Exit 77 with "SKIPPED: <reason>" when the root cannot be made
# (not root, no debootstrap, no network).
set -euo pipefail
root=${1:?usage: make_root.sh ROOT_DIR}
here=$(cd "$(dirname "$0")" && pwd)
version=6 # bump when the package set changes: the cached root is rebuilt (v4, v5: upgraded in place)
skip() { echo "SKIPPED: $*"; exit 77; }
if [ -f "$root/.ferry-root-v$version" ]; then echo "sid root: cached at $root"; exit 0; fi
py_test_pkgs=(python3-pytest python3-numpy)
# v5 = v4 + the Python test suite's packages; v6 = v5 + hipRTC 6.4 and 7.2. A root keeps the
# markers of the versions it contains, so a checkout with an older make_root.sh still takes it.
if { [ -f "$root/.ferry-root-v4" ] || [ -f "$root/.ferry-root-v5" ]; } && [ "$(id -u)" = 0 ]; then
  add=(libhiprtc6)
  [ -f "$root/.ferry-root-v5" ] || add+=("${py_test_pkgs[@]}")
  echo "sid root: adding ${add[*]} libhiprtc7 to the cached root"
  chroot "$root" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive sh -c \
    "apt-get -q update >/dev/null && apt-get install -y -q --no-install-recommends ${add[*]} >/dev/null &&
     apt-get install -y -q --no-install-recommends -t experimental libhiprtc7 >/dev/null" &&
    { rm -rf "$root/var/lib/apt/lists/"*_Packages; touch "$root/.ferry-root-v5" "$root/.ferry-root-v$version"
      exit 0; }
  echo "sid root: upgrade failed; making it again"
fi
[ "$(id -u)" = 0 ] || skip "making a sid root needs root (debootstrap, chroot)"
command -v debootstrap >/dev/null || skip "debootstrap is not installed (apt-get install debootstrap)"
mirror=$("$here/debian_mirror.sh") || skip "no Debian mirror configured for apt"
curl -sf -m 20 -o /dev/null "$mirror/dists/sid/Release" || skip "$mirror is not reachable (no network?)"
start=$(date +%s)
rm -rf "$root" "$root.tmp"
mkdir -p "$(dirname "$root")"
# In an unprivileged container debootstrap cannot mknod or chroot: that is a missing privilege.
debootstrap --variant=minbase sid "$root.tmp" "$mirror" >"$root.tmp.log" 2>&1 ||
  { tail -5 "$root.tmp.log"; rm -rf "$root.tmp"; skip "debootstrap sid failed (its log's end above)"; }
in_root() { chroot "$root.tmp" env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin DEBIAN_FRONTEND=noninteractive "$@"; }
echo "deb $mirror experimental main" >"$root.tmp/etc/apt/sources.list.d/experimental.list"
# A dated mirror snapshot (as CI's is) has an expired Release file; its signature still counts.
echo 'Acquire::Check-Valid-Until "false";' >"$root.tmp/etc/apt/apt.conf.d/99ferry-snapshot"
in_root apt-get -q update >/dev/null 2>"$root.tmp.log" || { cat "$root.tmp.log"; exit 1; }
in_root apt-get install -y -q --no-install-recommends libamdhip64-6 libhiprtc6 python3 python3-venv python3-cffi \
  libcurl4t64 "${py_test_pkgs[@]}" >/dev/null
in_root apt-get install -y -q --no-install-recommends -t experimental libamdhip64-7 libhiprtc7 librocm-core1 >/dev/null
in_root apt-get install -y -q --download-only --reinstall --no-install-recommends libamdhip64-6 >/dev/null
in_root apt-get install -y -q --download-only --reinstall --no-install-recommends -t experimental \
  libamdhip64-7 librocm-core1 >/dev/null
in_root dpkg-query -W libamdhip64-6 libamdhip64-7 libhiprtc6 libhiprtc7 librocm-core1 libhsa-runtime64-1 python3
rm -rf "$root.tmp/var/lib/apt/lists/"*_Packages "$root.tmp.log" # the suite uses dpkg, offline
touch "$root.tmp/.ferry-root-v5" "$root.tmp/.ferry-root-v$version"
mv "$root.tmp" "$root"
echo "sid root: made in $(( $(date +%s) - start )) s at $root ($(du -sh "$root" | cut -f1))"
