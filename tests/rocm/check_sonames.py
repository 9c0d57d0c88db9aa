#!/usr/bin/env python3
"""Every rocm<N>/*.so under the given plugin directories that needs libamdhip64 needs exactly
libamdhip64.so.N (a rocm7/ plugin linked against ROCm 6's runtime is a mislabelled variant).
Each directory's hip_ipc.so opens it at run time instead (hip_loader.hpp: a host without an AMD
GPU never loads HIP): it needs no libamdhip64 and names exactly libamdhip64.so.N, the soname it
dlopens. Ends with "N passed, N failed".
  check_sonames.py PLUGIN_DIR...   (directories holding rocm<N>/, e.g. build/plugins/rocm)"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plugins", "hip_ipc"))
from rocm_root import dynamic  # noqa: E402

passed = failed = 0
for top in sys.argv[1:]:
    for variant in sorted(os.listdir(top)):
        m = re.fullmatch(r"rocm(\d+)", variant)
        if not m or not os.path.isdir(os.path.join(top, variant)):
            continue
        for name in sorted(os.listdir(os.path.join(top, variant))):
            if not name.endswith(".so"):
                continue
            path = os.path.join(top, variant, name)
            hip = [n for n in dynamic(path)[0] if n.startswith("libamdhip64")]
            want = "libamdhip64.so." + m.group(1)
            if name == "hip_ipc.so":
                with open(path, "rb") as f:
                    named = sorted(set(x.decode() for x in re.findall(rb"libamdhip64\.so\.\d+(?=\0)", f.read())))
                ok = hip == [] and named == [want]
                print("%s: %s needs %s, opens %s" % ("ok" if ok else "FAILED", path, ", ".join(hip) or "no libamdhip64",
                                                     ", ".join(named) or "nothing")
                      + ("" if ok else " (expected no libamdhip64 needed and %s opened)" % want))
            else:
                ok = hip in ([], [want])
                print("%s: %s needs %s" % ("ok" if ok else "FAILED", path, ", ".join(hip) or "no libamdhip64")
                      + ("" if ok else " (expected %s)" % want))
            passed, failed = passed + ok, failed + (not ok)
if passed + failed == 0:
    print("SKIPPED: no rocm<N>/*.so under " + " ".join(sys.argv[1:]))
    sys.exit(77)
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
