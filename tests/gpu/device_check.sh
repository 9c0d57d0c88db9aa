#!/usr/bin/env bash
# device_check.sh: the GPU small-block bench and the GPU test suites on a machine that
# has a GPU but none of the build's libraries (a lent H200: another distribution, no Boost,
# yaml-cpp, gtest or libfabric), from a build made elsewhere.
#
#   tests/gpu/device_check.sh pack BUILD DEST     # here: copy what the runs need into DEST
#   bash DEST/device_check.sh run DEST OUT [WHAT] # there: WHAT = "bench tests" (default), or
#                                                 # "write", "read", "tests", "gds" (any of them)
# "gds": storage segments on the GPU: cuda_gds_test (gds.so and file.so's staged path), then at
# 1 MiB READ and WRITE a raw cuFile loop (cufile_raw_bench), gds.so and file.so staged
# (transfer_engine_bench --use_vram), on a GDS_FILE_BYTES file (default 4 GiB) in GDS_DIR
# (default DEST/gds: put it on the NVMe, e.g. GDS_DIR=/local/nvme); SECONDS_EACH per measurement (5).
#
# For the lent device: DEST inside the repo's checkout and git-ignored (build-gpu/ matches the
# .gitignore's /build*/), named in the run's carry (13 MB for a release build); OUT = $OUT.
# pack copies, keeping the build's layout under DEST/build/: gpu_ipc_bench, the GPU test binaries
# and their peers, the plugins they load (cuda_ipc, tcp, shm, efa), libferry; stripped. It adds
# DEST/lib/: every shared library those need except glibc's, libstdc++, libgcc_s and the driver's
# (libcuda, libnvidia-*): the other machine has newer ones of those, and libcuda must be its
# driver's. cudart is linked statically (cudart_static). The test binaries hold the absolute
# paths of their peers (FERRY_*_PEER_BIN), so run links the original build path to DEST/build.
# Meson is not needed there: run starts the test binaries itself, with the environment meson
# test gives them (tests/gpu/meson.build).
set -euo pipefail

BINS=(bench/gpu_ipc_bench tests/ferry_test_peer tests/gpu/ferry_gpu_test_peer tests/gpu/cuda_ipc_test
    tests/gpu/cuda_staging_test tests/gpu/cuda_host_transports_test tests/gpu/cuda_stream_submit_test
    tests/gpu/cuda_copy_kernel_test tests/gpu/cuda_gds_test bench/cufile_raw_bench bench/transfer_engine_bench
    core/ferry-info)
PLUGIN_DIRS=(plugins/gpu_ipc/cuda plugins/tcp plugins/shm plugins/efa plugins/file plugins/gds)
# Loaded with dlopen, so ldd does not list them: efa.so's libfabric (its tcp provider).
DLOPENED=(libfabric.so.1)
TESTS=(cuda_ipc_test cuda_copy_kernel_test cuda_staging_test cuda_host_transports_test cuda_stream_submit_test
    cuda_gds_test)
# Not carried: present (newer) on the other machine, or the driver's own.
SYSTEM_RE='/(ld-linux[^/]*|libc|libm|libdl|libpthread|librt|libresolv|libutil|libstdc\+\+|libgcc_s|libcuda|libnvidia-[^/]*)\.so'

pack() {
    local build dest f lib
    build=$(cd "$1" && pwd) dest=$2
    rm -rf "$dest" && mkdir -p "$dest/build" "$dest/lib"
    echo "$build" >"$dest/build_root"
    git -C "$build/.." log -1 --format='%H %s' >"$dest/commit" 2>/dev/null || true
    cp "$0" "$dest/device_check.sh"
    local files=()
    for f in "${BINS[@]}"; do [[ -e $build/$f ]] && files+=("$f") || echo "pack: $f not built: not carried"; done
    for f in "${PLUGIN_DIRS[@]}"; do
        for so in "$build/$f"/*.so; do [[ -e $so ]] && files+=("${so#"$build"/}"); done
    done
    for so in "$build"/core/libferry.so*; do [[ -f $so && ! -d $so ]] && files+=("${so#"$build"/}"); done
    for f in "${files[@]}"; do
        mkdir -p "$dest/build/$(dirname "$f")"
        if [[ -L $build/$f ]]; then cp -P "$build/$f" "$dest/build/$f"; continue; fi
        cp "$build/$f" "$dest/build/$f"
        strip --strip-unneeded "$dest/build/$f"
    done
    local libs=() name
    for name in "${DLOPENED[@]}"; do
        lib=$(ldconfig -p | awk -v n="$name" '$1 == n && /x86-64/ {print $NF; exit}')
        if [[ -n $lib ]]; then libs+=("$lib"); else echo "pack: $name not found here: not carried"; fi
    done
    for f in "${files[@]}"; do [[ -L $build/$f ]] || libs+=("$build/$f"); done
    for lib in "${libs[@]}"; do
        [[ $lib == "$build"/* ]] || echo "$lib"
        ldd "$lib" | awk '/=> \// {print $3}'
    done | sort -u | while read -r lib; do
        [[ $lib =~ $SYSTEM_RE || $lib == "$build"/* ]] && continue
        cp -L "$lib" "$dest/lib/$(basename "$lib")"
        strip --strip-unneeded "$dest/lib/$(basename "$lib")" 2>/dev/null || true
    done
    du -sh "$dest" "$dest/lib" "$dest/build"
}

run() {
    local dest out what root orig
    dest=$(cd "$1" && pwd) out=$2 what=${3:-"bench tests"}
    mkdir -p "$out"
    orig=$(cat "$dest/build_root")
    if [[ ! -e $orig ]]; then mkdir -p "$(dirname "$orig")" && ln -sfn "$dest/build" "$orig"; fi
    export LD_LIBRARY_PATH="$dest/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
    root=$orig
    {
        date -u
        uname -r
        nproc
        nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.sm,clocks.mem --format=csv || true
        cat "$dest/commit" 2>/dev/null || true
        for f in "${BINS[@]}"; do ldd "$root/$f" | grep -E 'not found' && echo "MISSING for $f"; done
        true
    } 2>&1 | tee "$out/machine.txt"
    local ops=()
    [[ " $what " == *" bench "* || " $what " == *" write "* ]] && ops+=(write)
    [[ " $what " == *" bench "* || " $what " == *" read "* ]] && ops+=(read)
    for op in "${ops[@]}"; do
        echo "== gpu_ipc_bench --op $op ($(date -u +%T) UTC, load $(cut -d' ' -f1-3 /proc/loadavg))"
        FERRY_PLUGIN_PATH="$root/plugins/gpu_ipc/cuda" "$root/bench/gpu_ipc_bench" --sizes-kib 64,256,1024 \
            --batch 64,256 --seconds 1.5 --rounds 5 --op "$op" 2>&1 | tee "$out/bench_$op.txt"
    done
    [[ " $what " == *" gds "* ]] && storage "$root" "$dest" "$out"
    [[ " $what " == *" tests "* ]] || return 0
    local plugin_path="" d t rc fails=0
    for d in "${PLUGIN_DIRS[@]}"; do plugin_path+="${plugin_path:+:}$root/$d"; done
    for t in "${TESTS[@]}"; do
        echo "== $t ($(date -u +%T) UTC)"
        rc=0
        FERRY_PLUGIN_PATH=$plugin_path FERRY_PLUGINS='' timeout 300 "$root/tests/gpu/$t" >"$out/test_$t.txt" 2>&1 ||
            rc=$?
        grep -E '^\[ *(PASSED|FAILED|SKIPPED) *\]|SKIPPED:|^\[ *OK|^\[ *FAILED' "$out/test_$t.txt" || true
        echo "$t: exit $rc"
        [[ $rc == 0 ]] || fails=$((fails + 1))
    done
    echo "test binaries failed: $fails"
}

# gds.so against a raw cuFile loop and file.so's staged path, READ and WRITE at 1 MiB.
storage() {
    local root=$1 dest=$2 out=$3 dir=${GDS_DIR:-$2/gds} bytes=${GDS_FILE_BYTES:-4294967296} secs=${SECONDS_EACH:-5}
    local plugin_path="$root/plugins/gds:$root/plugins/file" file op rc=0
    mkdir -p "$dir"
    file=$dir/ferry_gds.bin
    echo "== storage ($(date -u +%T) UTC): $file, $bytes bytes, on $(df -h --output=source,fstype "$dir" | tail -1)"
    lsmod 2>/dev/null | grep -E '^nvidia_fs' || echo "nvidia-fs is not loaded: cuFile runs in compatibility mode"
    FERRY_PLUGIN_PATH=$plugin_path "$root/core/ferry-info" | grep -A4 -E '^  (gds|file) ' | tee "$out/storage_ferry_info.txt" || true
    echo "== cuda_gds_test"
    FERRY_PLUGIN_PATH=$plugin_path FERRY_PLUGINS='' timeout 300 "$root/tests/gpu/cuda_gds_test" \
        >"$out/test_cuda_gds_test.txt" 2>&1 || rc=$?
    grep -E '^\[ *(PASSED|FAILED|SKIPPED|OK) *\]|SKIPPED:|  gds  \[' "$out/test_cuda_gds_test.txt" || true
    echo "cuda_gds_test: exit $rc"
    # Lay the file out once (a write pass), so READs read written blocks.
    "$root/bench/cufile_raw_bench" "$file" write 1048576 4 2 "$bytes" >/dev/null 2>&1 ||
        dd if=/dev/zero of="$file" bs=1M count=$((bytes >> 20)) oflag=direct status=none
    for op in read write; do
        echo "== 1 MiB $op: raw cuFile loop (4 threads), gds.so (16 in flight), file.so staged (16 in flight)"
        "$root/bench/cufile_raw_bench" "$file" "$op" 1048576 4 "$secs" "$bytes" 2>&1 | tee -a "$out/storage_$op.txt" || true
        for proto in gds file; do
            FERRY_PLUGIN_PATH=$plugin_path "$root/bench/transfer_engine_bench" --protocol=$proto \
                --segment_id="file:$file" --use_vram --gpu_id=0 --operation=$op --buffer_size="$bytes" \
                --block_size=1048576 --batch_size=4 --inflight_batches=4 --duration="$secs" \
                --option plugins=$proto 2>&1 | sed "s/^/$proto.so: /" | tee -a "$out/storage_$op.txt" || true
        done
    done
    rm -f "$file"
}

case ${1:-} in
pack) pack "$2" "$3" ;;
run) run "$2" "$3" "${4:-}" ;;
*)
    sed -n '2,8p' "$0"
    exit 2
    ;;
esac
