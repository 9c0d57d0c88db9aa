#!/usr/bin/env python3
"""Prints "N passed, N failed" over a meson testlog.json: GoogleTest cases, plus one failure
for a test program that crashed or timed out before GoogleTest reported, and one pass or
failure for each non-GoogleTest program (the fuzz corpus replays, scripts)."""
import json
import re
import sys

passed = failed = 0
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
            passed += 1
        else:
            failed += 1  # crashed or timed out before reporting
prefix = sys.argv[2] if len(sys.argv) > 2 else ""
print(f"{prefix}{passed} passed, {failed} failed")
