#!/usr/bin/python3
"""Builds Ferry's wheels. Needs Debian's python3-mesonpy, python3-wheel and patchelf.

Names (python/README.md says why): the distribution is ferry-transfer-engine, its plugin wheels
ferry-transfer-engine-<variant> (-cuda13, -rocm7 ...), the import package ferry_te.

  wheels.py core   --out DIR [--builddir DIR] [--platform TAG] [--jobs N] [--setup-arg=ARG ...]
      The core wheel: meson-python builds the meson project (pyproject.toml says how) in
      --builddir, writing nothing into the source tree, then `finalize` lays it out and
      retags it py3-none-TAG.
  wheels.py finalize WHEEL --out DIR [--platform TAG]
      What `core` does after meson-python: keep ferry/ (drop the copies meson-python makes of
      the system install: .ferry.mesonpy.libs/ and *.data/), drop meson-python's RPATH entries,
      vendor the libraries a host cannot be assumed to have (Boost, yaml-cpp) under unique
      sonames (libboost_log-<hash>.so.1.74.0, as auditwheel repair names them), check every
      ELF needs nothing else but HOST_LIBS and no symbol version past the baseline, and retag.
      The NIXL drop-in directory (ferry_te/lib/nixl/, where NIXL was found at build time) is
      vendored and checked as a tree of its own, so its files work copied anywhere; it may need
      NIXL's Abseil (NIXL_HOST_LIBS), which the NIXL host has loaded.
  wheels.py plugin --out DIR --name ferry-transfer-engine-cuda13 --variant cuda13
                   [--requires SPEC] PLUGIN.so...
      A plugin wheel: only ferry_te/lib/ferry/plugins/<variant>/<name>.so files, found by the
      core's loader as a variant directory, so wheels for different runtime majors never
      overwrite each other or the core's files.
  wheels.py check WHEEL...
      Prints each wheel's files, what every ELF in it needs from the host, and the newest
      GLIBC, GLIBCXX and CXXABI symbol versions; exits 1 past the baseline (BASELINE) or
      when the wheel's manylinux tag promises an older glibc than it needs.
  wheels.py verify WHEEL...
      Before an upload: each plugin wheel's name, its variant directory and the runtime soname
      its plugins need agree (ferry-transfer-engine-rocm7 holds rocm7/, whose hip_ipc.so needs libamdhip64.so.7);
      exits 1 naming every disagreement. `plugin` refuses to build a wheel that would fail it.
  wheels.py audit WHEEL...
      auditwheel's verdict (its analyze_wheel_abi, as `auditwheel show` runs it; auditwheel 6.7
      on PYTHONPATH: sid's Debian package in CI, PyPI's in release.yml) with the host's NIC and
      GPU runtime libraries excluded (AUDIT_EXCLUDE: what `auditwheel repair --exclude` would be
      given; the plugins drive the host's own). Exits 1 unless it matches each wheel's tag.
  wheels.py manifest --out plugin-wheels.json WHEEL...
      Describes plugin wheels (name, variant, plugins) for python/tests/test_wheels.py.

Platform tag: manylinux_2_34_<arch> by default: glibc 2.34 and GCC 11's libstdc++
(GLIBCXX_3.4.29, CXXABI_1.3.13) are the baseline, i.e. RHEL 9 / Rocky 9 / Amazon Linux 2023,
Ubuntu 22.04+, Debian 12+ (base/glibcxx_baseline.h keeps GCC 12 builds there).
"""

import argparse
import email.parser
import glob
import os
import platform
import re
import shutil
import sys
import tempfile
import zipfile

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PKG = "ferry_te"  # the import package
DIST = "ferry-transfer-engine"  # the distribution; plugin wheels are DIST-<variant>
# The oldest host a wheel must load on: glibc 2.34 (manylinux_2_34) with GCC 11's libstdc++.
BASELINE = {"GLIBC": (2, 34), "GLIBCXX": (3, 4, 29), "CXXABI": (1, 3, 13)}

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
    # (libcurl, for the etcd backend, and libcrypto are dlopened by the core when used: no
    # ELF in a wheel names them.)
]
# The same NIC and GPU runtime libraries, as auditwheel --exclude patterns (their own
# dependencies, libpsm2 and the like, drop out with them).
AUDIT_EXCLUDE = [
    "libibverbs.so.*", "librdmacm.so.*", "libefa.so.*", "libmlx4.so.*", "libmlx5.so.*",
    "libfabric.so.*", "libnuma.so.*", "libcuda.so.*", "libnvidia-ml.so.*", "libamdhip64.so.*",
    "libhsa-runtime64.so.*", "librocm-core.so.*", "libamd_comgr.so.*",
    "libabsl_*.so.*",  # NIXL's Abseil, for lib/nixl/libplugin_FERRY.so (NIXL_HOST_LIBS)
]
_HOST_RE = re.compile("^(%s)$" % "|".join(HOST_LIBS))

# The NIXL drop-in directory (python/nixl/meson.build), where NIXL was found at build time. It
# must work copied anywhere, so it is vendored and checked as a tree of its own: its libraries
# come from inside it or from the host, never from the rest of the package.
NIXL_DIR = os.path.join("lib", "nixl")  # under the package
# What the NIXL host process has loaded before it loads libplugin_FERRY.so: NIXL's own Abseil
# (the backend must use the very build NIXL uses, so the wheel never carries one).
NIXL_HOST_LIBS = HOST_LIBS + [r"libabsl_\w+\.so\.\d+(\.\d+)*"]
_NIXL_HOST_RE = re.compile("^(%s)$" % "|".join(NIXL_HOST_LIBS))


from wheelfile import (  # next to this script
    elves, ldd_paths, log, needed, pack, patchelf, rpath, set_rpath, set_tags, tag_glibc, unpack,
    version_maxima, vstr)


def default_platform():
    return "manylinux_2_%d_%s" % (BASELINE["GLIBC"][1], platform.machine())


def tree_elves(root, skip=()):
    """The ELFs under root, those under the directories in skip left out."""
    skip = [os.path.join(d, "") for d in skip]
    return [p for p in elves(root) if not any(p.startswith(d) for d in skip)]


def vendor(root, libdir, skip=(), host_re=_HOST_RE):
    """Copies into libdir every library an ELF under root (outside skip) needs that is neither
    in that tree nor a host library (host_re), and what those need. Returns {soname: source}."""
    vendored = {}
    present = {os.path.basename(p) for p in tree_elves(root, skip)}
    queue = list(tree_elves(root, skip))
    while queue:
        elf = queue.pop()
        missing = [n for n in needed(elf) if n not in present and not host_re.match(n)]
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
    rename_vendored(root, libdir, vendored, skip)
    return vendored


def rename_vendored(root, libdir, vendored, skip=()):
    """libboost_log.so.1.74.0 -> libboost_log-<8 hex of its sha256>.so.1.74.0, soname and every
    DT_NEEDED naming it: a process that already has the host's (or another wheel's) Boost 1.74
    would otherwise be handed that copy instead of ours (the loader matches by soname)."""
    import hashlib
    renamed = {}
    for name in sorted(vendored):
        path = os.path.join(libdir, name)
        digest = hashlib.sha256(open(path, "rb").read()).hexdigest()[:8]
        stem, _, rest = name.partition(".so")
        new = "%s-%s.so%s" % (stem, digest, rest)
        os.rename(path, os.path.join(libdir, new))
        patchelf("--set-soname", new, os.path.join(libdir, new))
        renamed[name] = new
    for elf in tree_elves(root, skip):
        for old in needed(elf):
            if old in renamed:
                patchelf("--replace-needed", old, renamed[old], elf)
    for old, new in renamed.items():
        vendored[new] = vendored.pop(old)


def fix_rpaths(root, skip=()):
    """Each ELF's RPATH becomes exactly the $ORIGIN-relative directories of the libraries it
    needs from inside its tree (root less skip; none: no RPATH). Drops build-tree and
    meson-python entries."""
    where = {os.path.basename(p): os.path.dirname(p) for p in tree_elves(root, skip)}
    for elf in tree_elves(root, skip):
        entries = []
        for name in needed(elf):
            if name in where:
                rel = os.path.relpath(where[name], os.path.dirname(elf))
                entry = "$ORIGIN" if rel == "." else "$ORIGIN/" + rel
                if entry not in entries:
                    entries.append(entry)
        if rpath(elf) != entries:
            set_rpath(elf, entries)


def report(root, plat=None):
    """Per ELF: what it needs from the host and its newest symbol versions. Returns (problems,
    {kind: newest version over all ELFs}). Past BASELINE, or past the glibc of plat's
    manylinux tag, is a problem: such a wheel installs where it cannot load."""
    problems = []
    newest = {}
    # The NIXL drop-in directory is a tree of its own: what it needs comes from inside it.
    nixl = [d for d in glob.glob(os.path.join(root, "*", NIXL_DIR)) if os.path.isdir(d)]
    present_nixl = {os.path.basename(p) for d in nixl for p in elves(d)}
    present = {os.path.basename(p) for p in tree_elves(root, nixl)}
    limit = dict(BASELINE)
    if plat and tag_glibc(plat):
        limit["GLIBC"] = min(limit["GLIBC"], tag_glibc(plat))
    for elf in elves(root):
        rel = os.path.relpath(elf, root)
        in_nixl = any(elf.startswith(os.path.join(d, "")) for d in nixl)
        host = [n for n in needed(elf) if n not in (present_nixl if in_nixl else present)]
        bad = [n for n in host if not (_NIXL_HOST_RE if in_nixl else _HOST_RE).match(n)]
        maxima = version_maxima(elf)
        log("  %-48s host: %s (%s)" % (rel, ", ".join(host) or "-", ", ".join(
            "%s_%s" % (k, vstr(maxima[k])) for k in ("GLIBC", "GLIBCXX", "CXXABI") if k in maxima) or "no versions"))
        for kind, v in maxima.items():
            newest[kind] = max(newest.get(kind, v), v)
            if v > limit[kind]:
                problems.append("%s needs %s_%s, newer than the baseline's %s_%s (RHEL 9: glibc 2.34, "
                                "GCC 11's libstdc++): `objdump -T` names the symbol; bind it to an older "
                                "version (base/glibcxx_baseline.h) or avoid it" % (rel, kind, vstr(v), kind, vstr(limit[kind])))
        if bad:
            problems.append("%s needs %s (not in %s, not a host library)" % (
                rel, ", ".join(bad), "its NIXL drop-in directory" if in_nixl else "the wheel"))
        for r in rpath(elf):
            if not r.startswith("$ORIGIN"):
                problems.append("%s has an absolute RPATH entry %s" % (rel, r))
    return problems, newest


def log_maxima(newest, prefix=""):
    log("%snewest symbol versions needed: %s (baseline %s)" % (prefix, ", ".join(
        "%s_%s" % (k, vstr(newest[k])) for k in ("GLIBC", "GLIBCXX", "CXXABI") if k in newest) or "none",
        ", ".join("%s_%s" % (k, vstr(v)) for k, v in BASELINE.items())))


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
        nixl = os.path.join(pkg, NIXL_DIR)
        skip = [nixl] if os.path.isdir(nixl) else []
        vendored = vendor(pkg, os.path.join(pkg, "lib"), skip)
        fix_rpaths(root, skip)
        for name, src in sorted(vendored.items()):
            log("vendored %s (from %s)" % (name, src))
        if skip:
            # Its own copies (same files, same hashed sonames as lib/'s): copied out of the
            # wheel, the directory still has everything but NIXL's Abseil.
            for name, src in sorted(vendor(nixl, nixl, host_re=_NIXL_HOST_RE).items()):
                log("vendored %s into %s/ (from %s)" % (name, NIXL_DIR, src))
            fix_rpaths(nixl)
            log("NIXL drop-in directory: %s/%s/ (libplugin_FERRY.so; NIXL's Abseil from the host)" % (PKG, NIXL_DIR))
        else:
            log("no NIXL drop-in directory: NIXL was not found when this wheel was built")
        problems, newest = report(root, plat)
        log_maxima(newest)
        if problems:
            raise SystemExit("wheels: " + "\n  ".join(["the wheel would not load everywhere its tag says:"] + problems))
        set_tags(root, "py3-none-" + plat)
        return pack(root, out_dir)


class _NativeFileInBuildDir:
    """pathlib for meson-python, except that <source>/.mesonpy-*-file.ini is <builddir>/..."""

    def __init__(self, builddir):
        import pathlib
        self._pathlib = pathlib
        base = type(pathlib.Path())

        class Path(base):
            def __truediv__(self, key):
                if key in (".mesonpy-native-file.ini", ".mesonpy-cross-file.ini"):
                    return base(builddir) / key
                return super().__truediv__(key)
        self.Path = Path

    def __getattr__(self, name):
        return getattr(self._pathlib, name)


class _WorkDirInBuildDir:
    """tempfile for meson-python, except that its working directory (.mesonpy-XXXX, the staged
    install) goes under the build dir, not the source tree, where a killed build left it."""

    def __init__(self, builddir):
        self._builddir = builddir

    def TemporaryDirectory(self, *args, **kw):
        kw["dir"] = self._builddir
        return tempfile.TemporaryDirectory(*args, **kw)

    def __getattr__(self, name):
        return getattr(tempfile, name)


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
    # meson-python 0.12 writes its native file (.mesonpy-native-file.ini) into the source
    # tree and reconfigures an existing build dir only when that file is unchanged: one left
    # by an interrupted build broke the next, and two builds shared it. Here it lives in the
    # build dir instead (so each build has its own, and the checkout stays as it was), and so
    # does its working directory (.mesonpy-XXXX).
    os.makedirs(builddir, exist_ok=True)
    native = os.path.join(builddir, ".mesonpy-native-file.ini")
    if os.path.exists(os.path.join(builddir, "meson-private", "coredata.dat")):
        with open(native, "w") as f:  # what meson-python writes: an existing dir is reconfigured
            f.write("\n[binaries]\npython = '%s'\n" % sys.executable)
    cwd = os.getcwd()
    with tempfile.TemporaryDirectory(prefix="ferry-mesonpy-") as raw:
        os.chdir(REPO)  # meson-python builds the project in the current directory
        real = mesonpy.pathlib, mesonpy.tempfile
        mesonpy.pathlib, mesonpy.tempfile = _NativeFileInBuildDir(builddir), _WorkDirInBuildDir(builddir)
        try:
            name = mesonpy.build_wheel(raw, settings)
        finally:
            mesonpy.pathlib, mesonpy.tempfile = real
            os.chdir(cwd)
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
        if normalized(name) != DIST + "-" + variant:
            problems.append("%s holds the %s/ variant directory: its name must be %s-%s" % (name, variant, DIST, variant))
        m = re.fullmatch(r"rocm(\d+)", variant)
        if not m:
            continue
        want = "libamdhip64.so." + m.group(1)
        for so in sorted(glob.glob(os.path.join(plugins, variant, "*.so"))):
            hip = elf_hip_runtimes(so)  # needed, or (hip_ipc.so) opened at run time
            if (hip or os.path.basename(so) == "hip_ipc.so") and hip != [want]:
                problems.append("%s: %s/%s needs %s, but %s/ is for %s" % (
                    name, variant, os.path.basename(so), ", ".join(hip) or "no libamdhip64", variant, want))
    return problems


def elf_hip_runtimes(path):
    # The pure-Python ELF reader meson uses for the same check at configure time (no patchelf
    # needed where `verify` runs before an upload).
    sys.path.insert(0, os.path.join(REPO, "plugins", "gpu_ipc", "hip"))
    from rocm_root import hip_runtimes
    return hip_runtimes(path)


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


def plugin_metadata_head(name, version, summary):
    """The core's license, requires-python, classifiers and URLs (pyproject.toml), so that a
    plugin wheel passes `twine check` as the core wheel does."""
    try:
        import tomllib
    except ImportError:  # Python < 3.11 (release.yml's Ubuntu 22.04 containers): pip's copy
        from pip._vendor import tomli as tomllib
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        project = tomllib.load(f)["project"]
    lines = ["Metadata-Version: 2.1", "Name: " + name, "Version: " + version, "Summary: " + summary,
             "License: " + project["license"]["text"], "Requires-Python: " + project["requires-python"]]
    lines += ["Classifier: " + c for c in project.get("classifiers", [])]
    lines += ["Project-URL: %s, %s" % kv for kv in project.get("urls", {}).items()]
    return "\n".join(lines) + "\n"


def build_plugin(args):
    name = args.name
    dist = name.replace("-", "_")
    version = args.version or project_version()
    requires = args.requires if args.requires is not None else "%s==%s" % (DIST, version)
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
        where = PKG + "/lib/ferry/plugins/" + (args.variant + "/" if args.variant else "")
        summary = args.summary or "Ferry transport plugins %s (%s)" % (
            ", ".join(os.path.basename(p)[:-3] for p in args.plugins), args.variant or "any host")
        with open(os.path.join(info, "METADATA"), "w") as f:
            f.write(plugin_metadata_head(name, version, summary))
            if requires:
                f.write("Requires-Dist: %s\n" % requires)
            f.write("Description-Content-Type: text/plain\n")
            f.write("\nAdds %s to the ferry_te package's plugin directory (%s); the loader prefers "
                    "the %s/ variant directory when that runtime is installed. `ferry-info` "
                    "lists it.\n" % (", ".join(os.path.basename(p) for p in args.plugins), where,
                                     args.variant or "plugin"))
        with open(os.path.join(info, "WHEEL"), "w") as f:
            f.write("Wheel-Version: 1.0\nGenerator: ferry wheels.py\nRoot-Is-Purelib: false\n"
                    "Tag: py3-none-%s\n" % args.platform)
        problems, newest = report(root, args.platform)
        log_maxima(newest)
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
            plat = os.path.basename(wheel)[:-len(".whl")].split("-")[-1]
            problems, newest = report(root, plat)
            log_maxima(newest, "  ")
            for p in problems:
                log("  PROBLEM: " + p)
                status = 1
    return status


def audit(args):
    import pathlib
    try:
        import auditwheel
        from auditwheel.wheel_abi import analyze_wheel_abi
        from auditwheel.wheeltools import get_wheel_architecture, get_wheel_libc
    except ImportError as e:
        raise SystemExit("wheels: audit needs auditwheel 6.7 on PYTHONPATH (%s): "
                         "python/tools/fetch_auditwheel.sh prints where sid's is" % e)
    from importlib.metadata import PackageNotFoundError, version
    try:
        aw_version = version("auditwheel")
    except PackageNotFoundError:  # Debian's unpacked tree: its .egg-info/dist-info may be absent
        aw_version = "(from %s)" % os.path.dirname(auditwheel.__file__)
    log("auditwheel %s, excluding %s" % (aw_version, " ".join(AUDIT_EXCLUDE)))
    status = 0
    for wheel in args.wheels:
        fn = pathlib.Path(wheel)
        tag = fn.name[:-len(".whl")].split("-")[-1]
        info = analyze_wheel_abi(get_wheel_libc(fn.name), get_wheel_architecture(fn.name), fn,
                                 frozenset(AUDIT_EXCLUDE), disable_isa_ext_check=False, allow_graft=False)
        verdict = info.overall_policy.name
        # Agreement: the tag is one auditwheel accepts for the wheel, i.e. the most compatible
        # tag auditwheel finds (a plugin needing only glibc 2.17: manylinux_2_17) is no newer
        # than the one it carries. `linux_*` (an external library) never agrees.
        ok = verdict == tag or (tag_glibc(verdict) is not None and tag_glibc(tag) is not None
                                and verdict.split("_", 3)[3] == tag.split("_", 3)[3]
                                and tag_glibc(verdict) <= tag_glibc(tag))
        log("%s: auditwheel: consistent with %s%s" % (fn.name, verdict, (", so with its tag %s" % tag
            if verdict != tag else "") if ok else " -- NOT with its tag %s; external versioned symbols: %s" % (
                tag, "; ".join("%s %s" % (k, sorted(v)) for k, v in sorted(info.versioned_symbols.items())))))
        status |= not ok
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
            m = re.match(r"^ferry_te/lib/ferry/plugins/(?:([^/]+)/)?([^/]+)\.so$", n)
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
    p.add_argument("--name", required=True, help="distribution name, e.g. %s-cuda13" % DIST)
    p.add_argument("--variant", default="", help="variant subdirectory: cuda13, rocm6, ... ('' for none)")
    p.add_argument("--version", help="default: the meson project's version")
    p.add_argument("--requires", help="Requires-Dist (default: %s==VERSION; '' for none)" % DIST)
    p.add_argument("--summary")
    p.add_argument("--platform", default=default_platform())
    p.add_argument("plugins", nargs="+")
    k = sub.add_parser("check")
    k.add_argument("wheels", nargs="+")
    v = sub.add_parser("verify")
    v.add_argument("wheels", nargs="+")
    a = sub.add_parser("audit")
    a.add_argument("wheels", nargs="+")
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
    elif args.cmd == "audit":
        return audit(args)
    else:
        return check(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
