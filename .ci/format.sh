#!/usr/bin/env bash
# Checks that every tracked C and C++ source follows .clang-format (clang-format 14, Debian 12's).
# To fix what it reports: .ci/format.sh --fix (rewrites the files in place).
set -euo pipefail
cd "$(dirname "$0")/.."
mapfile -t files < <(git ls-files '*.c' '*.h' '*.cpp' '*.hpp' ':!:subprojects/*')
if [ "${1:-}" = --fix ]; then
  clang-format -i "${files[@]}"
  exit 0
fi
if ! clang-format --dry-run --Werror "${files[@]}" 2>/tmp/ferry-format.$$; then
  echo "format: $(grep -c ': error: ' /tmp/ferry-format.$$) places differ from .clang-format, in these files:" >&2
  grep ': error: ' /tmp/ferry-format.$$ | cut -d: -f1 | sort -u | head -50 >&2
  echo "fix them with: .ci/format.sh --fix (or clang-format -i FILE)" >&2
  rm -f /tmp/ferry-format.$$
  exit 1
fi
rm -f /tmp/ferry-format.$$
echo "format: ${#files[@]} files follow .clang-format"
