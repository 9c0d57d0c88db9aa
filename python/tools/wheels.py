#!/usr/bin/python3
"""Builds Ferry's wheels. Needs Debian's python3-mesonpy, python3-wheel and patchelf.

  wheels.py core   --out DIR [--builddir DIR] [--platform TAG] [--jobs N] [--setup-arg=ARG ...]
      The core wheel `ferry`: meson-python builds the meson project (pyproject.toml says how),
      then `finalize` lays it out and retags it py3-none-TAG.
  wheels.py finalize WHEEL --out DIR [--platform TAG]
      What `core` does after meson-python: keep ferry/ (drop the copies meson-python makes of
      the system install: .ferry.mesonpy.libs/ and *.data/), drop meson-python's RPATH entries,
      vendor the libraries a host cannot be assumed to have (Boost, yaml-cpp), check every ELF
      needs nothing else but HOST_LIBS, and retag.
  wheels.py plugin --out DIR --name ferry-cuda13 --variant cuda13 [--requires SPEC] PLUGIN.so...
      A plugin wheel: only ferry/lib/ferry/plugins/<variant>/<name>.so files, found by the
      core's loader as a variant directory, so wheels for different runtime majors never
      overwrite each other or the core's files.
  wheels.py check WHEEL...
      Prints each wheel's files and what every ELF in it needs from the host.
  wheels.py verify WHEEL...
      Before an upload: each plugin wheel's name, its variant directory and the runtime soname
      its plugins need agree (ferry-rocm7 holds rocm7/, whose hip_ipc.so needs libamdhip64.so.7);
      exits 1 naming every disagreement. `plugin` refuses to build a wheel that would fail it.
  wheels.py manifest --out plugin-wheels.json WHEEL...
      Describes plugin wheels (name, variant, plugins) for python/tests/test_wheels.py.

Platform tag: linux_<arch> by default. PyPI accepts only manylinux/musllinux tags; check
prints the newest glibc symbol version used, which is what manylinux_2_<N> must not exceed.
"""

import argparse
import email.parser
import glob
import os
import platform
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = "ferry"

# Libraries a wheel never carries: the C runtime every host has, and the system libraries of
# the runtimes and NICs the plugins drive (loaded from the host, never vendored).
HOST_LIBS = [
    r"ld-linux(-x86-64|-aarch64)?\.so\.\d+", r"lib(c|m|dl|pthread|rt|resolv|util)\.so\.\d+",
    r"libstdc\+\+\.so\.6", r"libgcc_s\.so\.1",
    # NICs
    r"libibverbs\.so\.\d+", r"librdmacm\.so\.\d+", r"libefa\.so\.\d+", r"libmlx[45]\.so\.\d+",
    r"libfabric\.so\.\d+", r"libnuma\.so\.\d+",
    # GPU runtimes
    r"libcuda\.so\.\d+", r"libnvidia-ml\.so\.\d+", r"libamdhip64\.so\.\d+",
    r"libhsa-runtime64\.so\.\d+", r"librocm-core\.so\.\d+", r"libamd_comgr\.so\.\d+",
    # Linked by the core for the etcd metadata backend; too deep a tree (TLS, Kerberos, LDAP)
    # to vendor, so the host must have it. (Better: dlopen it when etcd is configured.)
    r"libcurl\.so\.4",
]
_HOST_RE = re.compile("^(%s)$" % "|".join(HOST_LIBS))


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


def glibc_max(path):
    """Newest GLIBC_x.y symbol version the ELF asks for, as a (major, minor) tuple."""
    out = subprocess.run(["objdump", "-T", path], capture_output=True, text=True).stdout
    versions = [tuple(int(x) for x in m) for m in re.findall(r"GLIBC_(\d+)\.(\d+)", out)]
    return max(versions) if versions else (0, 0)


def glibcxx_max(path):
    out = subprocess.run(["objdump", "-T", path], capture_output=True, text=True).stdout
    versions = [tuple(int(x) for x in m.split(".")) for m in re.findall(r"GLIBCXX_(3\.4(?:\.\d+)?)\b", out)]
    return max(versions) if versions else None


def default_platform():
    return "linux_" + platform.machine()


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


def vendor(root, libdir):
    """Copies into libdir every library an ELF under root needs that is neither in the package
    nor a HOST_LIBS one (and what those need). Returns {soname: source}."""
    vendored = {}
    present = {os.path.basename(p) for p in elves(root)}
    queue = list(elves(root))
    while queue:
        elf = queue.pop()
        missing = [n for n in needed(elf) if n not in present and not _HOST_RE.match(n)]
        if not missing:
            continue
        resolved = ldd_paths(elf)
        for name in missing:
            src = resolved.get(name)
            if not src or not os.path.exists(src):
                raise SystemExit("wheels: %s needs %s, which is neither on this host nor a "
                                 "host library (HOST_LIBS)" % (elf, name))
            dst = os.path.join(libdir, name)
            shutil.copy2(os.path.realpath(src), dst)
            os.chmod(dst, 0o755)
            vendored[name] = os.path.realpath(src)
            present.add(name)
            queue.append(dst)
    return vendored


def fix_rpaths(root):
    """Each ELF's RPATH becomes exactly the $ORIGIN-relative directories of the libraries it
    needs from inside the wheel (none: no RPATH). Drops build-tree and meson-python entries."""
    where = {os.path.basename(p): os.path.dirname(p) for p in elves(root)}
    for elf in elves(root):
        entries = []
        for name in needed(elf):
            if name in where:
                rel = os.path.relpath(where[name], os.path.dirname(elf))
                entry = "$ORIGIN" if rel == "." else "$ORIGIN/" + rel
                if entry not in entries:
                    entries.append(entry)
        if rpath(elf) != entries:
            set_rpath(elf, entries)


def report(root):
    """Per ELF: what it needs from the host. Returns (problems, newest glibc)."""
    problems = []
    newest = (0, 0)
    present = {os.path.basename(p) for p in elves(root)}
    for elf in elves(root):
        rel = os.path.relpath(elf, root)
        host = [n for n in needed(elf) if n not in present]
        bad = [n for n in host if not _HOST_RE.match(n)]
        newest = max(newest, glibc_max(elf))
        cxx = glibcxx_max(elf)
        log("  %-48s host: %s%s" % (rel, ", ".join(host) or "-",
                                    " (GLIBCXX_%s)" % ".".join(map(str, cxx)) if cxx else ""))
        if bad:
            problems.append("%s needs %s (not in the wheel, not a host library)" % (rel, ", ".join(bad)))
        for r in rpath(elf):
            if not r.startswith("$ORIGIN"):
                problems.append("%s has an absolute RPATH entry %s" % (rel, r))
    return problems, newest


def finalize(wheel, out_dir, plat):
    with tempfile.TemporaryDirectory(prefix="ferry-wheel-") as tmp:
        root = unpack(wheel, tmp)
        for name in sorted(os.listdir(root)):
            if name.endswith(".mesonpy.libs") or name.endswith(".data"):
                # meson-python's copy of the system install (libdir, bindir, includedir): the
                # package carries its own under ferry/.
                log("dropping %s/ (the system-install copy; the package has its own)" % name)
                shutil.rmtree(os.path.join(root, name))
        pkg = os.path.join(root, PKG)
        vendored = vendor(pkg, os.path.join(pkg, "lib"))
        fix_rpaths(root)
        for name, src in sorted(vendored.items()):
            log("vendored %s (from %s)" % (name, src))
        problems, newest = report(root)
        if problems:
            raise SystemExit("wheels: " + "\n  ".join(["the wheel is not self-contained:"] + problems))
        log("newest glibc symbol version needed: %d.%d (manylinux_%d_%d)" % (newest + newest))
        set_tags(root, "py3-none-" + plat)
        return pack(root, out_dir)


def build_core(args):
    out = os.path.abspath(args.out)
    os.makedirs(out, exist_ok=True)
    # Default: build-pywheel next to the default build dir, so that compile commands match
    # (same relative paths and flags) and ccache serves the objects that build made.
    builddir = os.path.abspath(args.builddir or os.path.join(REPO, "build-pywheel"))
    sys.path.insert(0, "/usr/lib/python3/dist-packages")
    import mesonpy  # Debian's python3-mesonpy
    settings = {"compile-args": ["-j%d" % args.jobs], "builddir": builddir}
    if args.setup_arg:
        settings["setup-args"] = args.setup_arg
    native = os.path.join(REPO, ".mesonpy-native-file.ini")
    native_existed = os.path.exists(native)
    if not native_existed and os.path.exists(os.path.join(builddir, "meson-private", "coredata.dat")):
        # meson-python 0.12 reconfigures an existing build dir (applying pyproject.toml's
        # options) only when it finds its native file unchanged; it is removed again below.
        with open(native, "w") as f:
            f.write("\n[binaries]\npython = '%s'\n" % sys.executable)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="ferry-mesonpy-") as raw:
        os.chdir(REPO)  # meson-python builds the project in the current directory
        try:
            name = mesonpy.build_wheel(raw, settings)
        finally:
            os.chdir(cwd)
            if not native_existed and os.path.exists(native):
                os.remove(native)  # meson-python leaves it in the source tree
        log("meson-python made %s" % name)
        final = finalize(os.path.join(raw, name), out, args.platform)
    log("core wheel: %s" % final)
    print(final)


def normalized(name):
    return re.sub(r"[-_.]+", "-", name).lower()


def variant_problems(name, root):
    """A plugin wheel whose name, variant directory and runtime soname disagree installs a
    plugin the loader picks on the wrong hosts (Mooncake's ROCm release review asked for this
    check). `root`: the unpacked wheel. Returns the disagreements, in words."""
    plugins = os.path.join(root, PKG, "lib", "ferry", "plugins")
    variants = sorted(d for d in os.listdir(plugins) if os.path.isdir(os.path.join(plugins, d))) \
        if os.path.isdir(plugins) else []
    problems = []
    if len(variants) > 1:
        problems.append("%s holds several variant directories (%s): one wheel per runtime major"
                        % (name, ", ".join(variants)))
    for variant in variants:
        if normalized(name) != "ferry-" + variant:
            problems.append("%s holds the %s/ variant directory: its name must be ferry-%s" % (name, variant, variant))
        m = re.fullmatch(r"rocm(\d+)", variant)
        if not m:
            continue
        want = "libamdhip64.so." + m.group(1)
        for so in sorted(glob.glob(os.path.join(plugins, variant, "*.so"))):
            hip = [n for n in elf_needed(so) if n.startswith("libamdhip64.so")]
            if (hip or os.path.basename(so) == "hip_ipc.so") and hip != [want]:
                problems.append("%s: %s/%s needs %s, but %s/ is for %s" % (
                    name, variant, os.path.basename(so), ", ".join(hip) or "no libamdhip64", variant, want))
    return problems


def elf_needed(path):
    # The pure-Python ELF reader meson uses for the same check at configure time (no patchelf
    # needed where `verify` runs before an upload).
    sys.path.insert(0, os.path.join(REPO, "plugins", "hip_ipc"))
    from rocm_root import dynamic
    return dynamic(path)[0]


def verify(args):
    status = 0
    for wheel in args.wheels:
        with tempfile.TemporaryDirectory(prefix="ferry-verify-") as tmp:
            root = unpack(wheel, tmp)
            with zipfile.ZipFile(wheel) as z:
                meta = z.read([n for n in z.namelist() if n.endswith(".dist-info/METADATA")][0]).decode()
            name = email.parser.Parser().parsestr(meta)["Name"]
            problems = variant_problems(name, root)
            if normalized(os.path.basename(wheel).split("-")[0]) != normalized(name):
                problems.append("%s: the file name says %s but METADATA says %s" % (
                    os.path.basename(wheel), os.path.basename(wheel).split("-")[0], name))
            for p in problems:
                log("PROBLEM: " + p)
            log("%s: %s" % (os.path.basename(wheel), "problems above" if problems else "name, variant and sonames agree"))
            status |= bool(problems)
    return status


def build_plugin(args):
    name = args.name
    dist = name.replace("-", "_")
    version = args.version or project_version()
    requires = args.requires if args.requires is not None else "ferry==%s" % version
    with tempfile.TemporaryDirectory(prefix="ferry-plugin-wheel-") as tmp:
        root = os.path.join(tmp, "%s-%s" % (dist, version))
        plugdir = os.path.join(root, PKG, "lib", "ferry", "plugins", *( [args.variant] if args.variant else []))
        os.makedirs(plugdir)
        for so in args.plugins:
            if not so.endswith(".so"):
                raise SystemExit("wheels: %s: a plugin file is <name>.so" % so)
            dst = os.path.join(plugdir, os.path.basename(so))
            shutil.copy2(so, dst)
            os.chmod(dst, 0o755)
        fix_rpaths(root)
        info = os.path.join(root, "%s-%s.dist-info" % (dist, version))
        os.makedirs(info)
        where = "ferry/lib/ferry/plugins/" + (args.variant + "/" if args.variant else "")
        summary = args.summary or "Ferry transport plugins %s (%s)" % (
            ", ".join(os.path.basename(p)[:-3] for p in args.plugins), args.variant or "any host")
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write("Metadata-Version: 2.1\nName: %s\nVersion: %s\nSummary: %s\n"
                    "License: Apache-2.0\n" % (name, version, summary))
            if requires:
                f.write("Requires-Dist: %s\n" % requires)
            f.write("\nAdds %s to the ferry package's plugin directory (%s); the loader prefers "
                    "the %s/ variant directory when that runtime is installed. `ferry-info` "
                    "lists it.\n" % (", ".join(os.path.basename(p) for p in args.plugins), where,
                                     args.variant or "plugin"))
        with open(os.path.join(info, "WHEEL"), "w") as f:
            f.write("Wheel-Version: 1.0\nGenerator: ferry wheels.py\nRoot-Is-Purelib: false\n"
                    "Tag: py3-none-%s\n" % args.platform)
        problems, newest = report(root)
        problems += variant_problems(name, root)
        if problems:
            raise SystemExit("wheels: " + "\n  ".join(["plugin wheel problems:"] + problems))
        final = pack(root, os.path.abspath(args.out))
    log("plugin wheel: %s" % final)
    print(final)


def check(args):
    status = 0
    for wheel in args.wheels:
        with tempfile.TemporaryDirectory(prefix="ferry-check-") as tmp:
            root = unpack(wheel, tmp)
            log(os.path.basename(wheel))
            with zipfile.ZipFile(wheel) as z:
                for i in z.infolist():
                    log("  %10d %o %s" % (i.file_size, (i.external_attr >> 16) & 0o777, i.filename))
            problems, newest = report(root)
            log("  newest glibc symbol version: %d.%d" % newest)
            for p in problems:
                log("  PROBLEM: " + p)
                status = 1
    return status


def manifest(args):
    """plugin-wheels.json for the tests: each plugin wheel's distribution name, variant
    directory and plugins, read from the wheel itself."""
    out = []
    for wheel in args.wheels:
        with zipfile.ZipFile(wheel) as z:
            names = z.namelist()
            meta = z.read([n for n in names if n.endswith(".dist-info/METADATA")][0]).decode()
        dist = email.parser.Parser().parsestr(meta)["Name"]
        variants, plugins = set(), []
        for n in names:
            m = re.match(r"^ferry/lib/ferry/plugins/(?:([^/]+)/)?([^/]+)\.so$", n)
            if m:
                variants.add(m.group(1) or "")
                plugins.append(m.group(2))
        if len(variants) != 1:
            raise SystemExit("wheels: %s is not a plugin wheel of one variant directory" % wheel)
        out.append({"name": dist, "variant": variants.pop(), "plugins": sorted(plugins),
                    "wheel": os.path.abspath(wheel)})
    import json
    with open(args.out, "w") as f:
        json.dump(out, f, indent=1)
    for w in out:
        log("%s: %s/%s" % (w["name"], w["variant"] or ".", ",".join(w["plugins"])))


def project_version():
    text = open(os.path.join(REPO, "meson.build")).read()
    m = re.search(r"version:\s*'([^']+)'", text)
    return m.group(1) if m else "0.0.0"


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("core")
    c.add_argument("--out", required=True)
    c.add_argument("--builddir", help="meson build directory to (re)use (default: build-pywheel)")
    c.add_argument("--platform", default=default_platform())
    c.add_argument("--jobs", type=int, default=min(2, os.cpu_count() or 1))
    c.add_argument("--setup-arg", action="append", default=[], help="extra `meson setup` argument")
    f = sub.add_parser("finalize")
    f.add_argument("wheel")
    f.add_argument("--out", required=True)
    f.add_argument("--platform", default=default_platform())
    p = sub.add_parser("plugin")
    p.add_argument("--out", required=True)
    p.add_argument("--name", required=True, help="distribution name, e.g. ferry-cuda13")
    p.add_argument("--variant", default="", help="variant subdirectory: cuda13, rocm6, ... ('' for none)")
    p.add_argument("--version", help="default: the meson project's version")
    p.add_argument("--requires", help="Requires-Dist (default: ferry==VERSION; '' for none)")
    p.add_argument("--summary")
    p.add_argument("--platform", default=default_platform())
    p.add_argument("plugins", nargs="+")
    k = sub.add_parser("check")
    k.add_argument("wheels", nargs="+")
    v = sub.add_parser("verify")
    v.add_argument("wheels", nargs="+")
    m = sub.add_parser("manifest")
    m.add_argument("--out", required=True)
    m.add_argument("wheels", nargs="+")
    args = ap.parse_args()
    if args.cmd == "core":
        build_core(args)
    elif args.cmd == "finalize":
        print(finalize(args.wheel, args.out, args.platform))
    elif args.cmd == "plugin":
        build_plugin(args)
    elif args.cmd == "manifest":
        manifest(args)
    elif args.cmd == "verify":
        return verify(args)
    else:
        return check(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
