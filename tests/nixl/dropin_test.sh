#!/bin/sh
# The NIXL drop-in directory works by copying: its files (libplugin_FERRY.so and ferry/plugins/)
# copied into an empty directory load through a real NIXL with NIXL_PLUGIN_DIR pointed there,
# no Ferry anywhere else (no FERRY_PLUGIN_PATH, nothing of Ferry on LD_LIBRARY_PATH: only NIXL's
# own library and Abseil directories, which NIXL itself needs), and move data over tcp.
# Usage: dropin_test.sh <backend build dir> <ferry-nixl-info> <nixl_ferry_test> <NIXL's library path>
set -eu
src=$1 info=$2 host=$3 nixl_libs=$4
tmp=$(mktemp -d /tmp/ferry-nixl-dropin-XXXXXX)
trap 'rm -rf "$tmp"' EXIT
mkdir -p "$tmp/ferry/plugins"
cp "$src/libplugin_FERRY.so" "$tmp/"
cp "$src"/ferry/plugins/*.so "$tmp/ferry/plugins/"
ls -R "$tmp"

# Nothing of Ferry may be needed from outside the directory.
if readelf -d "$tmp/libplugin_FERRY.so" | grep -q 'libferry'; then
    echo "FAIL: libplugin_FERRY.so still needs libferry.so"; exit 1
fi
run() { env -i PATH=/usr/bin:/bin HOME="$tmp" NIXL_PLUGIN_DIR="$tmp" LD_LIBRARY_PATH="$nixl_libs" "$@"; }

out=$(run "$info" protocols=tcp 2>&1) || { echo "$out"; echo "FAIL: ferry-nixl-info did not create the backend"; exit 1; }
echo "$out"
echo "$out" | grep -q "note.transport_dir *$tmp/ferry/plugins" || { echo "FAIL: transports not reported from $tmp/ferry/plugins"; exit 1; }
echo "$out" | grep -q "^drop-in directory: $tmp\$" || { echo "FAIL: ferry-nixl-info does not name the drop-in directory $tmp"; exit 1; }
run "$host" --protocols=tcp --gtest_filter='NixlFerry.TwoProcesses*:NixlFerry.LocalTransfer*'
echo "drop-in directory $tmp works by itself"

# Its transports are checked as every Ferry plugin is: with ferry/plugins/ writable by others
# they are skipped, and creating the backend fails saying which directory and what fixes it.
chmod 0777 "$tmp/ferry/plugins"
if out=$(run "$info" protocols=tcp 2>&1); then
    echo "$out"; echo "FAIL: the backend loaded transports from $tmp/ferry/plugins, which others can write"; exit 1
fi
echo "$out" | grep -q "$tmp/ferry/plugins is writable by others (mode 0777); fix: chmod go-w $tmp/ferry/plugins" || {
    echo "$out"; echo "FAIL: the backend does not say that $tmp/ferry/plugins is writable by others, and the fix"; exit 1; }
chmod 0755 "$tmp/ferry/plugins"
echo "a drop-in directory others can write is refused, with the fix"
