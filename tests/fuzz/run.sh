#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan+UBSan) and runs each for a bounded time, starting
# from its committed corpus (tests/fuzz/corpus/<target>; new finds go to a scratch copy).
# Fails on the first crash, leak, sanitizer report or violated invariant and leaves the input
# that caused it in the scratch directory.
#   tests/fuzz/run.sh [build dir] [seconds per target]      (defaults: build-fuzz, 40)
# Environment: FUZZ_TARGETS="tcp_wire descriptor" to run a subset; CXX/CC (default clang++/clang).
set -euo pipefail
root="$(cd "$(dirname "$0")/../.." && pwd)"
export LSAN_OPTIONS="suppressions=$root/tests/sanitizers/lsan.supp:print_suppressions=0${LSAN_OPTIONS:+:$LSAN_OPTIONS}"
build="${1:-$root/build-fuzz}"
seconds="${2:-40}"
if [ ! -f "$build/build.ninja" ]; then
  CC="${CC:-clang}" CXX="${CXX:-clang++}" meson setup "$build" "$root" -Dfuzzing=enabled --buildtype=debugoptimized
fi
ninja -C "$build" -j"$(nproc)"
"$build/tests/fuzz/expected_compat_test"
targets="${FUZZ_TARGETS:-$(cd "$build/tests/fuzz" && ls *_fuzz | sed 's/_fuzz$//' | sort)}"
scratch="$(mktemp -d /tmp/ferry-fuzz.XXXXXX)"
echo "fuzz: ${seconds}s per target; scratch corpus and any crash input in $scratch"
status=0
for t in $targets; do
  mkdir -p "$scratch/$t"
  cp -r "$root/tests/fuzz/corpus/$t/." "$scratch/$t/"
  log="$scratch/$t.log"
  if "$build/tests/fuzz/${t}_fuzz" -max_total_time="$seconds" -timeout=10 -print_final_stats=1 \
      -artifact_prefix="$scratch/$t-" "$scratch/$t" >"$log" 2>&1; then
    execs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" || true)
    final=$(grep -E '^#[0-9]+[[:space:]]+DONE' "$log" | tail -1 | sed -E 's/^#[0-9]+[[:space:]]+DONE[[:space:]]+//' || true)
    echo "fuzz $t: ok, $execs runs in ${seconds}s; $final"
  else
    status=1
    echo "fuzz $t: FAILED (input and log in $scratch)"
    grep -E 'ERROR|invariant|runtime error|SUMMARY' "$log" | head -20 || true
  fi
done
exit $status
