#!/usr/bin/env bash
# Builds Ferry with a sanitizer in its own directory and runs tests under it; ends with
# "N passed, N failed" like .ci/test.sh.
#   .ci/sanitize.sh address   ASan+UBSan (LSan included), every test except the netns suite
#   .ci/sanitize.sh thread    TSan, the engine and transport tests
# The python_wheels test is not built here (-Dpython=disabled): it runs the system python,
# which would need libasan/libtsan preloaded; it runs in the plain build (.ci/test.sh).
set -euo pipefail
cd "$(dirname "$0")/.."
kind="${1:?usage: .ci/sanitize.sh address|thread}"
supp="$PWD/tests/sanitizers"
case "$kind" in
  address)
    build=build-asan
    sanitize=address,undefined
    tests=()  # all of them
    extra=(-Dbenchmarks=disabled)  # the benches are not tests; CI has 2 cores
    # No vptr check: UBSan tests whether a vtable is readable by writing it into a pipe
    # (sanitizer_common's IsAccessibleMemoryRange), which fails in a process out of file
    # descriptors and is then reported as "invalid vptr" and aborts it. The out-of-descriptor
    # tests (tcp_flood_test, shm_limits_test) make exactly such processes: a report from a
    # ServerConn constructed at EMFILE killed the target in 1 run of 8 under load.
    cxx_extra="-fno-sanitize=vptr"
    export ASAN_OPTIONS="detect_leaks=1:halt_on_error=1:abort_on_error=1:print_summary=1:detect_stack_use_after_return=0"
    export UBSAN_OPTIONS="halt_on_error=1:abort_on_error=1:print_stacktrace=1:print_summary=1"
    export LSAN_OPTIONS="suppressions=$supp/lsan.supp:print_suppressions=0"
    ;;
  thread)
    build=build-tsan
    sanitize=thread
    tests=(engine region_index tcp_engine shm_engine efa_engine transport_conformance transport_shm_efa fault_engine fault_transport submit_async stream_submit gpu_ipc_batch failover)
    # Build only what those tests load (CI has 2 cores).
    extra=(-Dbenchmarks=disabled -Dplugin_rdma=disabled -Dplugin_cuda_ipc=disabled -Dplugin_hip_ipc=disabled -Dnixl=disabled)
    # Exit (66) rather than abort on a report: libfabric's psm provider (libinfinipath) installs
    # a SIGABRT handler that calls backtrace(), which deadlocked inside TSan's report lock.
    export TSAN_OPTIONS="halt_on_error=1:abort_on_error=0:exitcode=66:second_deadlock_stack=1:suppressions=$supp/tsan.supp"
    ;;
  *) echo "unknown sanitizer '$kind': use address or thread" >&2; exit 2 ;;
esac
if [ ! -f "$build/build.ninja" ]; then
  # -O1 with line tables only (-g1): about half the compile time of -O2 -g on CI's 2 cores,
  # and the sanitizers' reports still name files and lines.
  meson setup "$build" -Doptimization=1 -Ddebug=false -Dcpp_args="-g1 ${cxx_extra:-}" -Dc_args=-g1 \
    -Db_sanitize="$sanitize" -Db_lundef=false -Dpython=disabled "${extra[@]}"
fi
echo "== $kind sanitizer: building in $build (python_wheels not built: see .ci/sanitize.sh)"
ninja -C "$build" -j"$(nproc)"
status=0
# Tests that this build has (efa_engine only where libfabric is installed, and so on).
available=$(meson test -C "$build" --no-rebuild --list 2>/dev/null | sed 's/^.* \/ //')
selected=()
for t in "${tests[@]}"; do
  if grep -qx "$t" <<<"$available"; then selected+=("$t"); else echo "$kind: test $t is not built here, not run"; fi
done
if [ "$kind" = thread ] && [ ${#selected[@]} -eq 0 ]; then echo "$kind: no test to run" >&2; exit 1; fi
meson test -C "$build" --print-errorlogs --num-processes 1 --no-suite netns --timeout-multiplier 3 \
  "${selected[@]}" || status=$?
/usr/bin/python3 .ci/count_tests.py "$build/meson-logs/testlog.json" "$kind sanitizer: "
exit $status
