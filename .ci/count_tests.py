#!/usr/bin/env python3
"""Prints "N passed, N failed" over a meson testlog.json: GoogleTest cases, plus one failure
for a test program that crashed or timed out before GoogleTest reported, and one pass or
failure for each non-GoogleTest program (the fuzz corpus replays), and the checks of a script
suite that ends with its own "N passed, 0 failed" (netns). A skipped suite is named with its
SKIPPED reason.

Before that line, one line per failed test program: its name, meson's result, the GoogleTest
cases that failed and a sanitizer's SUMMARY line where there is one, so that the end of a CI
log (often all that is kept) says what failed."""
import json
import re
import sys

passed = failed = 0
failures = []
with open(sys.argv[1]) as f:
    for line in f:
        t = json.loads(line)
        out = t.get("stdout", "") or ""
        ok = t.get("result") in ("OK", "EXPECTEDFAIL", "SKIP")
        gtest_passed = re.findall(r"\[  PASSED  \] (\d+) test", out)
        gtest_failed = re.findall(r"\[  FAILED  \] (\d+) test", out)
        if gtest_passed or gtest_failed:
            passed += sum(map(int, gtest_passed))
            failed += sum(map(int, gtest_failed))
            if not ok and not gtest_failed:
                failed += 1  # a suite that crashed (a sanitizer report) after its cases passed
        elif ok:
            own = re.search(r"^(\d+) passed, 0 failed$", out, re.M)
            passed += int(own.group(1)) if own else 1
        else:
            failed += 1  # crashed or timed out before reporting
        if t.get("result") == "SKIP":
            why = re.search(r"^SKIPPED: .*$", out, re.M)
            print(f"{t['name']}: {why.group(0) if why else 'SKIPPED (no reason given)'}")
        if not ok or gtest_failed:
            cases = sorted(set(re.findall(r"^\[  FAILED  \] (\S+\.\S+)", out, re.M)))
            last_case = re.findall(r"^\[ RUN      \] (\S+)", out, re.M)
            summary = re.findall(r"^SUMMARY: .*$", out, re.M)
            what = f"FAILED {t.get('name')} ({t.get('result')}, {t.get('duration', 0):.0f} s)"
            if cases:
                what += ": " + ", ".join(cases)
            elif last_case:
                what += f": died in {last_case[-1]}"
            if summary:
                what += f"; {summary[-1][:300]}"
            failures.append(what)
prefix = sys.argv[2] if len(sys.argv) > 2 else ""
for what in failures:
    print(f"{prefix}{what}")
print(f"{prefix}{passed} passed, {failed} failed")
