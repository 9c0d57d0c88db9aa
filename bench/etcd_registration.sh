#!/usr/bin/env bash
# Registration over etcd: bench/registration_bench of this tree against a baseline's, one etcd of
# this script's own on loopback, in one call.
#
#   bench/etcd_registration.sh --build-baseline BASELINE_BUILD OUT   # once, outside the timing
#   bench/etcd_registration.sh [BUILD] [BASELINE_BENCH]
#
# --build-baseline compiles this tree's bench/registration_bench.cpp against another build (e.g.
# /work/main/build: main's headers, libferry_internal.a and plugins) into OUT, so both sides run
# the same driver and only the engine differs (a baseline without unregister_memory_batch
# unregisters one by one). The run: ROUNDS (default 2) rounds, each alternating baseline and this
# tree:
#   - 10k and 100k regions over etcd, one register_memory_batch call (and, where the engine has
#     it, one unregister_memory_batch call; the baseline skips unregistering 100k one by one:
#     minutes);
#   - 1k and 10k regions over etcd, one register_memory call per region (ONE_BY_ONE="1000 10000");
#   - 100k regions over P2PHANDSHAKE, one batch call (what etcd adds).
# After each etcd run: etcd's WAL fsyncs and backend commits during it (from its /metrics), and
# its CPU time. ETCD_PORT (default 24510, and +1 for etcd's peer port) must be free.
# PYTHON_ROWS=1 adds bench/python_registration_bench.py (the Mooncake shim's batch calls): this
# tree at 10k and 100k over etcd and 100k over P2PHANDSHAKE; with BASELINE_PYTHON (a python/
# directory) and BASELINE_LIBFERRY, the baseline's shim too (10k over etcd: it registers one by
# one).
set -euo pipefail

if [ "${1:-}" = --build-baseline ]; then
    base=$(readlink -f "${2:?usage: --build-baseline BASELINE_BUILD OUT}")
    out=$(readlink -m "${3:?usage: --build-baseline BASELINE_BUILD OUT}")
    src=$(readlink -f "$(dirname "$0")/registration_bench.cpp")
    /usr/bin/python3 - "$base" "$src" "$out" <<'EOF'
import json, re, shlex, subprocess, sys
base, src, out = sys.argv[1:]
cmd = next(c for c in json.load(open(base + "/compile_commands.json"))
           if c["file"].endswith("bench/registration_bench.cpp"))
args = shlex.split(cmd["command"])
keep, skip = [], 0
for a in args:
    if skip:
        skip -= 1
        continue
    if a in ("-MQ", "-MF", "-o", "-c"):
        skip = 1
        continue
    if a == "-MD" or a.endswith("registration_bench.cpp"):
        continue
    keep.append(a)
ninja = open(base + "/build.ninja").read()
link = re.search(r"build bench/registration_bench: cpp_LINKER .*\n LINK_ARGS = (.*)\n", ninja).group(1)
obj = out + ".o"
subprocess.run(keep + ["-c", src, "-o", obj], cwd=cmd["directory"], check=True)
subprocess.run([keep[0] if keep[0] != "ccache" else keep[1], obj, "-o", out] + shlex.split(link),
               cwd=cmd["directory"], check=True)
print("baseline bench: " + out)
EOF
    exit 0
fi

build=${1:-build}
baseline=${2:-}
rounds=${ROUNDS:-2}
port=${ETCD_PORT:-24510}
this=$(readlink -f "$build/bench/registration_bench")
[ -x "$this" ] || { echo "$this is missing: ninja -C $build bench/registration_bench" >&2; exit 1; }
[ -z "$baseline" ] || [ -x "$baseline" ] || { echo "$baseline is not an executable" >&2; exit 1; }
dir=$(mktemp -d)
etcd=
cleanup() {
    local rc=$?
    [ -z "$etcd" ] || { kill "$etcd" 2>/dev/null; wait "$etcd" 2>/dev/null || true; }
    rm -rf "$dir"
    exit $rc
}
trap cleanup EXIT
c=http://127.0.0.1:$port p=http://127.0.0.1:$((port + 1))
etcd --data-dir "$dir/data" --listen-client-urls $c --advertise-client-urls $c --listen-peer-urls $p \
    --initial-advertise-peer-urls $p --initial-cluster default=$p >"$dir/etcd.log" 2>&1 &
etcd=$!
for _ in $(seq 100); do
    curl -s -m 1 -X POST $c/v3/maintenance/status -d '{}' >/dev/null && break
    sleep 0.2
done
echo "etcd $(etcd --version | head -1 | cut -d' ' -f3) on 127.0.0.1:$port, data in $dir (filesystem: $(stat -f -c %T "$dir"))"

metric() { curl -s $c/metrics | awk -v m="$1" '$1 == m { print $2 }'; }
cpu() { awk '{ print $14 + $15 }' /proc/$etcd/stat; }
run() {  # label binary args...
    local label=$1 bin=$2
    shift 2
    local f0 fs0 b0 bs0 t0
    f0=$(metric etcd_disk_wal_fsync_duration_seconds_count) fs0=$(metric etcd_disk_wal_fsync_duration_seconds_sum)
    b0=$(metric etcd_disk_backend_commit_duration_seconds_count) bs0=$(metric etcd_disk_backend_commit_duration_seconds_sum)
    t0=$(cpu)
    printf '%-9s ' "$label"
    "$bin" --registration-only "$@" | tr -d '\n'
    /usr/bin/python3 -c 'import sys; a = [float(x) for x in sys.argv[1:]]; hz = 100.0
print("; etcd: %d WAL fsyncs (%.0f ms), %d backend commits (%.0f ms), %.2f s CPU"
      % (a[4] - a[0], (a[5] - a[1]) * 1e3, a[6] - a[2], (a[7] - a[3]) * 1e3, (a[9] - a[8]) / hz))' \
        "$f0" "$fs0" "$b0" "$bs0" \
        "$(metric etcd_disk_wal_fsync_duration_seconds_count)" "$(metric etcd_disk_wal_fsync_duration_seconds_sum)" \
        "$(metric etcd_disk_backend_commit_duration_seconds_count)" "$(metric etcd_disk_backend_commit_duration_seconds_sum)" \
        "$t0" "$(cpu)"
}

for round in $(seq "$rounds"); do
    echo "== round $round"
    for n in 10000 100000; do
        extra=()
        [ "$n" = 100000 ] && extra=(--no-unregister)
        [ -n "$baseline" ] && run baseline "$baseline" --etcd 127.0.0.1:$port --batch --regions $n "${extra[@]}"
        run this "$this" --etcd 127.0.0.1:$port --batch --regions $n
    done
    for n in ${ONE_BY_ONE:-1000 10000}; do
        [ -n "$baseline" ] && run baseline "$baseline" --etcd 127.0.0.1:$port --regions $n
        run this "$this" --etcd 127.0.0.1:$port --regions $n
    done
    [ -n "$baseline" ] && printf '%-9s ' baseline && "$baseline" --registration-only --batch --regions 100000
    printf '%-9s ' this && "$this" --registration-only --batch --regions 100000
    if [ "${PYTHON_ROWS:-0}" = 1 ]; then
        pyrun() {  # label python-dir libferry args...
            local label=$1 py=$2 lib=$3
            shift 3
            PYTHONPATH=$py FERRY_LIBRARY=$lib FERRY_PLUGIN_PATH=$(dirname "$lib")/ferry/plugins FERRY_PLUGINS= \
                /usr/bin/python3 "$(dirname "$0")/python_registration_bench.py" --label "$(printf '%-10s' "$label")" "$@"
        }
        here=$(readlink -f "$(dirname "$0")/../python")
        lib=$(readlink -f "$build/core/libferry.so")
        if [ -n "${BASELINE_PYTHON:-}" ]; then
            pyrun baseline "$BASELINE_PYTHON" "$BASELINE_LIBFERRY" --etcd 127.0.0.1:$port --regions 10000
            pyrun baseline "$BASELINE_PYTHON" "$BASELINE_LIBFERRY" --regions 100000
        fi
        pyrun this "$here" "$lib" --etcd 127.0.0.1:$port --regions 10000,100000
        pyrun this "$here" "$lib" --regions 100000
    fi
done
