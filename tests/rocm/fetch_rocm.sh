#!/usr/bin/env bash
# Fetches the HIP headers and libraries of ROCm 5.7 (trixie), 6.4 (sid) and 7.2 (experimental)
# from Debian's archive into one prefix per major, for building rocm<N>/hip_ipc.so:
#   tests/rocm/fetch_rocm.sh [CACHE_DIR]   (default: $FERRY_ROCM_CACHE or /var/cache/ferry-rocm)
# prints the prefixes (CACHE/rocm5/usr ...), one a line, for -Drocm_roots.
# These packages need a newer C library than Debian 12's: a -shared plugin links against them,
# an executable would not, so nothing here is installed on the host. A private apt
# configuration (private_apt.sh: its own sources list, lists and cache) reaches them; the
# host's /etc/apt is only read, for its mirror.
set -euo pipefail
cache=${1:-${FERRY_ROCM_CACHE:-/var/cache/ferry-rocm}}
# major  suite         packages (the -dev at the version of that suite, and its runtime)
specs=(
  "5 trixie libamdhip64-dev libamdhip64-5"
  "6 sid libamdhip64-dev libamdhip64-6"
  "7 experimental libamdhip64-dev libamdhip64-7"
)
. "$(cd "$(dirname "$0")" && pwd)/private_apt.sh"
stamp() { echo "$cache/rocm$1/.ferry-fetched"; }
need=0
for s in "${specs[@]}"; do read -r major _ <<<"$s"; [ -f "$(stamp "$major")" ] || need=1; done
if [ $need = 1 ]; then
  apt-get "${apt_opts[@]}" update >&2
  for s in "${specs[@]}"; do
    read -r major suite pkgs <<<"$s"
    [ -f "$(stamp "$major")" ] && continue
    rm -rf "$cache/rocm$major" && mkdir -p "$cache/rocm$major"
    for p in $pkgs; do deb_extract "$p/$suite" "$cache/rocm$major"; done
    touch "$(stamp "$major")"
  done
fi
for s in "${specs[@]}"; do read -r major _ <<<"$s"; echo "$cache/rocm$major/usr"; done
