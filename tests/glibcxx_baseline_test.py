#!/usr/bin/python3
"""libferry and every plugin built here load with the wheels' libstdc++ baseline (GCC 11's:
GLIBCXX_3.4.29, CXXABI_1.3.13; python/tools/wheels.py BASELINE), in every build and not only
when wheels are made: base/glibcxx_baseline.h, which core/ and plugins/ -include, keeps GCC 12's
GLIBCXX_3.4.30 condition_variable::wait out. Reads each ELF's version-needed entries as
`wheels.py check` does.

    tests/glibcxx_baseline_test.py SOURCE_DIR BUILD_DIR"""

import glob
import os
import sys

src, build = sys.argv[1], sys.argv[2]
sys.path.insert(0, os.path.join(src, "python", "tools"))
from wheelfile import version_maxima, vstr  # noqa: E402
from wheels import BASELINE  # noqa: E402

found = glob.glob(os.path.join(build, "core", "libferry.so.*")) + glob.glob(
    os.path.join(build, "plugins", "**", "*.so"), recursive=True)
# Not meson's .p directories; not the NIXL backend (libplugin_FERRY.so), which NIXL loads and
# whose libstdc++ floor is NIXL's.
elves = sorted(p for p in set(found)
               if os.path.isfile(p) and not os.path.islink(p) and os.path.basename(p) != "libplugin_FERRY.so")
if not any(os.path.basename(e).startswith("libferry.so") for e in elves):
    print("FAIL: no libferry.so under %s/core: is it built?" % build)
    sys.exit(1)
problems = []
for elf in elves:
    maxima = version_maxima(elf)
    for kind in ("GLIBCXX", "CXXABI"):
        if kind in maxima and maxima[kind] > BASELINE[kind]:
            problems.append("%s needs %s_%s, newer than the baseline's %s_%s: `objdump -T %s | grep %s_%s` "
                            "names the symbol; bind it to an older version in base/glibcxx_baseline.h or "
                            "avoid it" % (os.path.relpath(elf, build), kind, vstr(maxima[kind]), kind,
                                          vstr(BASELINE[kind]), elf, kind, vstr(maxima[kind])))
for p in problems:
    print("FAIL: " + p)
if problems:
    sys.exit(1)
print("glibcxx baseline: %d ELFs within GLIBCXX_%s / CXXABI_%s" %
      (len(elves), vstr(BASELINE["GLIBCXX"]), vstr(BASELINE["CXXABI"])))
