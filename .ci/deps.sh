#!/usr/bin/env bash
# Installs the Debian packages Ferry builds and tests with, skipping those already present.
set -euo pipefail
packages=(
  g++ meson ninja-build pkg-config ccache
  libboost-dev libboost-filesystem-dev libboost-log-dev libboost-program-options-dev
  libyaml-cpp-dev nlohmann-json3-dev libgtest-dev libbenchmark-dev
  iperf3 python3
  libamdhip64-dev libhsa-runtime-dev
  libcurl4-openssl-dev etcd-server curl iproute2 openssl libssl3
  redis-server libhiredis-dev python3-aiohttp
  prometheus-cpp-dev prometheus
  python3-mesonpy python3-wheel python3-cffi python3-numpy python3-pytest python3-venv patchelf twine
  python3-matplotlib
  libfabric-dev libfabric-bin ucx-utils
  clang libclang-rt-dev clang-format
  libibverbs-dev ibverbs-providers
  liburing-dev fio
  debootstrap
)
missing=()
for p in "${packages[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ ${#missing[@]} -eq 0 ]; then
  echo "deps: all ${#packages[@]} packages present"
  exit 0
fi
sudo=""
[ "$(id -u)" -eq 0 ] || sudo="sudo"
echo "deps: installing ${missing[*]}"
$sudo env DEBIAN_FRONTEND=noninteractive apt-get update -q
$sudo env DEBIAN_FRONTEND=noninteractive apt-get install -y -q --no-install-recommends "${missing[@]}"
