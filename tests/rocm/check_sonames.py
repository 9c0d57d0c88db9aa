#!/usr/bin/env python3
"""Every rocm<N>/*.so under the given plugin directories that needs libamdhip64 needs exactly
libamdhip64.so.N (a rocm7/ plugin linked against ROCm 6's runtime is a mislabelled variant).
Each directory's hip_ipc.so opens it at run time instead (hip_loader.hpp: a host without an AMD
GPU never loads HIP): it needs no libamdhip64 and names exactly libamdhip64.so.N, the soname it
dlopens; and it names the hipRTC it dlopens for its copy kernel (hip_copy_kernel.cpp):
libhiprtc.so.N from ROCm 6 on, none in ROCm 5 (where libamdhip64.so.5 carries hipRTC). Ends with
"N passed, N failed".
  check_sonames.py PLUGIN_DIR...   (directories holding rocm<N>/, e.g. build/plugins/rocm)"""
import os
import re
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "plugins", "gpu_ipc", "hip"))
from rocm_root import dynamic, hip_runtimes  # noqa: E402

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
            uses = hip_runtimes(path)
            want = "libamdhip64.so." + m.group(1)
            ok = hip == [] and uses == [want] if name == "hip_ipc.so" else hip in ([], [want])
            print("%s: %s needs %s, opens %s" % ("ok" if ok else "FAILED", path, ", ".join(hip) or "no libamdhip64",
                                                 ", ".join(u for u in uses if u not in hip) or "nothing")
                  + ("" if ok else " (expected %s)" % (want + (", opened, not needed" if name == "hip_ipc.so" else ""))))
            passed, failed = passed + ok, failed + (not ok)
            if name == "hip_ipc.so":
                with open(path, "rb") as f:
                    rtc = sorted(set(n.decode() for n in re.findall(rb"libhiprtc\.so\.\d+(?=\0)", f.read())))
                want_rtc = ["libhiprtc.so." + m.group(1)] if int(m.group(1)) >= 6 else []
                ok = rtc == want_rtc
                print("%s: %s opens hipRTC from %s" % ("ok" if ok else "FAILED", path,
                                                       ", ".join(rtc) or "libamdhip64.so." + m.group(1))
                      + ("" if ok else " (expected %s)" % (", ".join(want_rtc) or "no libhiprtc")))
                passed, failed = passed + ok, failed + (not ok)
if passed + failed == 0:
    print("SKIPPED: no rocm<N>/*.so under " + " ".join(sys.argv[1:]))
    sys.exit(77)
print("%d passed, %d failed" % (passed, failed))
sys.exit(1 if failed else 0)
