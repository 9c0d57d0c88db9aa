#!/usr/bin/env bash
# Fetches sid's python3-auditwheel and python3-pyelftools (pure Python) as Debian packages,
# with the ROCm fetch's private apt configuration (tests/rocm/private_apt.sh; nothing is
# installed on the host, nothing comes from PyPI), and unpacks them into CACHE/auditwheel:
#   python/tools/fetch_auditwheel.sh [CACHE_DIR]   (default: $FERRY_ROCM_CACHE or /var/cache/ferry-rocm)
# prints the directory to put on PYTHONPATH for Debian's /usr/bin/python3 (-m auditwheel).
set -euo pipefail
cache=${1:-${FERRY_ROCM_CACHE:-/var/cache/ferry-rocm}}
dest=$cache/auditwheel
version=1 # bump when the package set changes
if [ ! -f "$dest/.ferry-fetched-v$version" ]; then
  . "$(cd "$(dirname "$0")/../../tests/rocm" && pwd)/private_apt.sh"
  # The lists fetch_rocm.sh keeps are reused when they are there (they name sid's versions).
  ls "$apt_dir/lists/"*sid*Packages* >/dev/null 2>&1 || apt-get "${apt_opts[@]}" update >&2
  rm -rf "$dest" && mkdir -p "$dest"
  for p in python3-auditwheel python3-pyelftools; do deb_extract "$p/sid" "$dest"; done
  touch "$dest/.ferry-fetched-v$version"
fi
echo "$dest/usr/lib/python3/dist-packages"
