#!/usr/bin/env python3
"""What a ROCm root holds, for meson (plugins/gpu_ipc/hip/meson.build) and the soname tests.

  rocm_root.py root ROOT MULTIARCH   prints prefix=, include=, library=, soname= lines: ROOT may
                                     be an install prefix (/opt/rocm-7.2.0, /usr, an unpacked
                                     Debian package's .../usr) or the directory above its usr/
  rocm_root.py needed FILE           prints the DT_NEEDED entries of an ELF file, one a line

The library is looked for only inside the root (lib/<multiarch>, lib, lib64): a HIP library
from elsewhere would silently pair one ROCm's headers with another's runtime.
"""
import glob
import os
import re
import struct
import sys

DT_NEEDED, DT_STRTAB, DT_SONAME = 1, 5, 14


def dynamic(path):
    """(needed list, soname or None) of a 64- or 32-bit little/big-endian ELF shared object."""
    with open(path, "rb") as f:
        data = f.read()
    if data[:4] != b"\x7fELF":
        raise ValueError("%s is not an ELF file" % path)
    is64, end = data[4] == 2, "<" if data[5] == 1 else ">"
    if is64:
        phoff, phentsize, phnum = struct.unpack_from(end + "Q", data, 32)[0], *struct.unpack_from(end + "HH", data, 54)
    else:
        phoff, phentsize, phnum = struct.unpack_from(end + "I", data, 28)[0], *struct.unpack_from(end + "HH", data, 42)
    loads, dyn = [], None
    for i in range(phnum):
        off = phoff + i * phentsize
        if is64:
            ptype, _, poff, pvaddr, _, pfilesz = struct.unpack_from(end + "IIQQQQ", data, off)
        else:
            ptype, poff, pvaddr, _, pfilesz = struct.unpack_from(end + "IIIII", data, off)
        if ptype == 1:
            loads.append((pvaddr, poff, pfilesz))
        elif ptype == 2:
            dyn = (poff, pfilesz)
    if dyn is None:
        return [], None
    entry = end + ("qQ" if is64 else "iI")
    size = struct.calcsize(entry)
    tags, strtab = [], None
    for off in range(dyn[0], dyn[0] + dyn[1], size):
        tag, val = struct.unpack_from(entry, data, off)
        if tag == 0:
            break
        if tag == DT_STRTAB:
            strtab = val
        tags.append((tag, val))
    base = next(o + strtab - v for v, o, s in loads if v <= strtab < v + s)  # vaddr -> file offset

    def string(at):
        return data[base + at:data.index(b"\0", base + at)].decode()

    needed = [string(v) for t, v in tags if t == DT_NEEDED]
    soname = next((string(v) for t, v in tags if t == DT_SONAME), None)
    return needed, soname


def hip_runtimes(path):
    """The libamdhip64 sonames an ELF file uses: those it needs (DT_NEEDED) and, for hip_ipc.so,
    which opens it at run time (hip_loader.hpp), the soname literal it dlopens. Sorted."""
    found = set(n for n in dynamic(path)[0] if n.startswith("libamdhip64.so"))
    if os.path.basename(path) == "hip_ipc.so":
        with open(path, "rb") as f:
            found.update(m.decode() for m in re.findall(rb"libamdhip64\.so\.\d+(?=\0)", f.read()))
    return sorted(found)


def describe(root, multiarch):
    prefix = root.rstrip("/") or "/"
    if not os.path.isfile(os.path.join(prefix, "include/hip/hip_version.h")) and \
            os.path.isfile(os.path.join(prefix, "usr/include/hip/hip_version.h")):
        prefix = os.path.join(prefix, "usr")
    include = os.path.join(prefix, "include")
    print("prefix=" + prefix)
    print("include=" + (include if os.path.isfile(os.path.join(include, "hip/hip_version.h")) else ""))
    library = ""
    for d in ["lib/" + multiarch, "lib", "lib64"]:
        d = os.path.join(prefix, d)
        candidates = [os.path.join(d, "libamdhip64.so")] + sorted(glob.glob(os.path.join(d, "libamdhip64.so.[0-9]*")))
        library = next((c for c in candidates if os.path.isfile(c)), "")
        if library:
            break
    print("library=" + library)
    print("soname=" + ((dynamic(library)[1] or "") if library else ""))


def main():
    if len(sys.argv) == 4 and sys.argv[1] == "root":
        describe(sys.argv[2], sys.argv[3])
    elif len(sys.argv) == 3 and sys.argv[1] == "needed":
        print("\n".join(dynamic(sys.argv[2])[0]))
    else:
        sys.exit(__doc__)


if __name__ == "__main__":
    main()
