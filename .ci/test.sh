#!/usr/bin/env bash
# Builds Ferry and runs every test; ends with "N passed, N failed".
set -euo pipefail
cd "$(dirname "$0")/.."
.ci/deps.sh
# ROCm 5.7, 6.4 and 7.2 from Debian's archive (trixie, sid, experimental; cached): one build
# makes rocm5/, rocm6/ and rocm7/. Without them (no network, not Debian) only the system's ROCm.
if rocm_roots=$(tests/rocm/fetch_rocm.sh | paste -sd, -); then
  if [ -f build/build.ninja ]; then meson configure build -Drocm_roots="$rocm_roots"
  else meson setup build --buildtype=release -Drocm_roots="$rocm_roots"; fi >/dev/null
else
  echo "ROCm packages not fetched: building the system's ROCm only (the rocm_root suite will say SKIPPED)"
fi
.ci/build.sh
status=0
meson test -C build --print-errorlogs --num-processes 1 || status=$?
# Count GoogleTest cases, and the checks of script suites (netns) that end with "N passed, N
# failed", across all suites for the closing line; say which suites skipped and why.
/usr/bin/python3 - <<'PY'
import json, re
passed = failed = 0
with open("build/meson-logs/testlog.json") as f:
    for line in f:
        t = json.loads(line)
        out = t.get("stdout", "") or ""
        m = re.findall(r"\[  PASSED  \] (\d+) test", out)
        passed += sum(map(int, m))
        if t.get("result") == "OK" and not m:
            s = re.search(r"^(\d+) passed, 0 failed$", out, re.M)
            passed += int(s.group(1)) if s else 0
        if t.get("result") == "SKIP":
            why = re.search(r"^SKIPPED: .*$", out, re.M)
            print(f"{t['name']}: {why.group(0) if why else 'SKIPPED (no reason given)'}")
        failed += sum(map(int, re.findall(r"\[  FAILED  \] (\d+) test", out)))
        if t.get("result") not in ("OK", "EXPECTEDFAIL", "SKIP") and not re.search(r"\[  FAILED  \]", out):
            failed += 1  # a suite that crashed or timed out before reporting
print(f"{passed} passed, {failed} failed")
PY
exit $status
