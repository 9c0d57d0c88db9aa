"""ELF and wheel-file primitives for wheels.py: patchelf/objdump queries, unpacking and
repacking wheels with their file modes, retagging."""

import os
import re
import subprocess
import sys
import zipfile

def log(msg):
    print("wheels: " + msg, flush=True)


def run(cmd, **kw):
    log("$ " + " ".join(cmd))
    subprocess.run(cmd, check=True, **kw)


def is_elf(path):
    try:
        with open(path, "rb") as f:
            return f.read(4) == b"\x7fELF"
    except OSError:
        return False


def patchelf(*args):
    return subprocess.run(["patchelf", *args], check=True, capture_output=True,
                          text=True).stdout.strip()


def needed(path):
    return [n for n in patchelf("--print-needed", path).splitlines() if n]


def rpath(path):
    r = patchelf("--print-rpath", path)
    return [p for p in r.split(":") if p]


def set_rpath(path, entries):
    if entries:
        patchelf("--set-rpath", ":".join(entries), path)
    else:
        patchelf("--remove-rpath", path)


def ldd_paths(path):
    """soname -> resolved path, as the dynamic loader would on this (the build) host."""
    out = subprocess.run(["ldd", path], capture_output=True, text=True).stdout
    found = {}
    for line in out.splitlines():
        m = re.match(r"\s*(\S+)\s+=>\s+(\S+)\s+\(", line)
        if m:
            found[m.group(1)] = m.group(2)
    return found


def version_maxima(path):
    """{"GLIBC": (2, 34), "GLIBCXX": (3, 4, 29), "CXXABI": (1, 3, 13)}: the newest version of
    each the ELF asks for (its version-needed entries), absent when it asks none."""
    out = subprocess.run(["objdump", "-p", path], capture_output=True, text=True, check=True).stdout
    found = {}
    for kind, ver in re.findall(r"\b(GLIBC|GLIBCXX|CXXABI)_(\d+(?:\.\d+)*)\b", out):
        v = tuple(int(x) for x in ver.split("."))
        found[kind] = max(found.get(kind, v), v)
    return found


def vstr(v):
    return ".".join(map(str, v))


def tag_glibc(plat):
    m = re.match(r"manylinux_(\d+)_(\d+)_", plat)
    return (int(m.group(1)), int(m.group(2))) if m else None


def unpack(wheel, dest):
    """Extracts a wheel keeping file modes (zipfile drops them; binaries need +x)."""
    with zipfile.ZipFile(wheel) as z:
        names = [n for n in z.namelist() if n.endswith(".dist-info/WHEEL")]
        root = os.path.join(dest, os.path.basename(os.path.dirname(names[0]))[:-len(".dist-info")])
        for info in z.infolist():
            target = z.extract(info, root)
            mode = (info.external_attr >> 16) & 0o777
            if mode and not info.is_dir():
                os.chmod(target, mode)
    return root


def pack(root, out_dir):
    os.makedirs(out_dir, exist_ok=True)
    before = set(os.listdir(out_dir))
    run([sys.executable, "-m", "wheel", "pack", "-d", out_dir, root])
    made = sorted(set(os.listdir(out_dir)) - before)
    if made:
        return os.path.join(out_dir, made[0])
    # Same name as an existing file: wheel pack overwrote it.
    dist = os.path.basename(root)
    return max((os.path.join(out_dir, n) for n in os.listdir(out_dir)
                if n.startswith(dist.replace("-", "_", 1)) or n.startswith(dist)),
               key=os.path.getmtime)


def set_tags(root, tag):
    distinfo = [d for d in os.listdir(root) if d.endswith(".dist-info")][0]
    path = os.path.join(root, distinfo, "WHEEL")
    lines = open(path).read().splitlines()
    out = [l for l in lines if not l.startswith("Tag:") and not l.startswith("Root-Is-Purelib:")]
    out.append("Root-Is-Purelib: false")
    out.append("Tag: " + tag)
    with open(path, "w") as f:
        f.write("\n".join(out) + "\n")
    # wheel pack rewrites RECORD
    record = os.path.join(root, distinfo, "RECORD")
    if os.path.exists(record):
        os.remove(record)


def elves(root):
    for d, _, files in os.walk(root):
        for f in sorted(files):
            p = os.path.join(d, f)
            if is_elf(p) and not os.path.islink(p):
                yield p
