"""The wheels as installed: console commands, plugin wheels seen by ferry-info, and plugin
wheels installed side by side and removed without touching each other or the core."""

import glob
import json
import os
import re
import shutil
import subprocess
import sys
import textwrap
import zipfile

import pytest

WHEEL_DIR = os.environ.get("FERRY_TEST_WHEEL_DIR", "")


def plugin_wheels():
    path = os.path.join(WHEEL_DIR, "plugin-wheels.json")
    if not os.path.exists(path):
        return []
    with open(path) as f:
        return json.load(f)


def core_wheel():
    found = glob.glob(os.path.join(WHEEL_DIR, "ferry_transfer_engine-*-py3-none-*.whl"))
    return found[0] if found else None


def all_wheels():
    return sorted(glob.glob(os.path.join(WHEEL_DIR, "*.whl")))


def tool():
    src = os.environ.get("FERRY_SOURCE_ROOT")
    if not src:
        pytest.skip("SKIPPED: FERRY_SOURCE_ROOT is not set (run through run_wheel_tests.sh)")
    return ["/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
            os.path.join(src, "python", "tools", "wheels.py")]


def wheel_tag(path):
    return os.path.basename(path)[:-len(".whl")].split("-")[-1]


# The oldest host every wheel must load on: glibc 2.34 with GCC 11's libstdc++ (RHEL 9).
BASELINE = {"GLIBC": (2, 34), "GLIBCXX": (3, 4, 29), "CXXABI": (1, 3, 13)}


def bin_of(venv_python, name):
    return os.path.join(os.path.dirname(venv_python), name)


def ferry_info_json(venv_python, env=None):
    p = subprocess.run([bin_of(venv_python, "ferry-info"), "--json"], capture_output=True,
                       text=True, timeout=60, env=env)
    assert p.returncode in (0, 1), p.stderr
    return json.loads(p.stdout)


def clean_env():
    env = dict(os.environ)
    for k in ("FERRY_PLUGIN_PATH", "FERRY_PLUGINS", "FERRY_LIBRARY", "PYTHONPATH"):
        env.pop(k, None)
    return env


def test_core_wheel_tag_and_layout():
    wheel = core_wheel()
    if not wheel:
        pytest.skip("FERRY_TEST_WHEEL_DIR has no core wheel (run through run_wheel_tests.sh)")
    assert os.path.basename(wheel).endswith("-py3-none-manylinux_2_34_x86_64.whl"), wheel
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        wheel_meta = z.read([n for n in names if n.endswith(".dist-info/WHEEL")][0]).decode()
        entry = z.read([n for n in names if n.endswith("entry_points.txt")][0]).decode()
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
    assert "Tag: py3-none-" in wheel_meta and "cp3" not in wheel_meta
    for must in ("ferry_te/__init__.py", "ferry_te/include/ferry/ferry.h", "ferry_te/lib/libferry.so",
                 "ferry_te/lib/ferry/plugins/tcp.so", "ferry_te/bin/ferry-info",
                 "ferry_te/bin/transfer_engine_bench"):
        assert must in names, must
    assert modes["ferry_te/bin/ferry-info"] & 0o111
    assert not [n for n in names if ".mesonpy.libs" in n or ".data/" in n]
    assert not [n for n in names if "cuda_ipc" in n or "hip_ipc" in n]  # plugin wheels' job
    assert "ferry-info = ferry_te._cli:ferry_info" in entry
    assert "transfer_engine_bench = ferry_te._cli:transfer_engine_bench" in entry


def test_console_commands():
    info = subprocess.run([bin_of(sys.executable, "ferry-info")], capture_output=True, text=True,
                          timeout=60, env=clean_env())
    assert info.returncode == 0, info.stderr
    import ferry_te as ferry
    plugins = os.path.join(ferry.package_root(), "lib", "ferry", "plugins")
    assert plugins in info.stdout and "tcp" in info.stdout
    # The console command passes its arguments through: tcp.so's option table (plugin ABI 1.2).
    options = subprocess.run([bin_of(sys.executable, "ferry-info"), "--options", "tcp"], capture_output=True,
                             text=True, timeout=60, env=clean_env())
    assert options.returncode == 0, options.stderr
    assert "  lanes = 2\n" in options.stdout, options.stdout
    bench = subprocess.run(
        [bin_of(sys.executable, "transfer_engine_bench"), "--loopback", "--protocol=tcp",
         "--operation=write", "--buffer_size=16777216", "--block_size=65536", "--batch_size=16",
         "--threads=1", "--duration=1", "--verify"],
        capture_output=True, text=True, timeout=120, env=clean_env())
    assert bench.returncode == 0, bench.stdout + bench.stderr
    assert "Test completed" in bench.stdout


def test_plugin_wheels_appear_in_ferry_info():
    wheels = plugin_wheels()
    if not wheels:
        pytest.skip("no plugin wheels were built for this run")
    import ferry_te as ferry
    root = os.path.join(ferry.package_root(), "lib", "ferry", "plugins")
    report = ferry_info_json(sys.executable, clean_env())
    by_path = {p["path"]: p for p in report["plugins"]}
    for w in wheels:
        for name in w["plugins"]:
            path = os.path.join(root, *([w["variant"]] if w["variant"] else []), name + ".so")
            assert path in by_path, (path, sorted(by_path))
            rec = by_path[path]
            assert rec["variant"] == w["variant"]
            # Loaded, or skipped/unavailable with the loader's reason (no such GPU runtime here).
            assert rec["state"] == "loaded" or rec["reason"], rec
    # The core's plugins still load next to them.
    assert by_path[os.path.join(root, "tcp.so")]["state"] == "loaded"
    text = subprocess.run([bin_of(sys.executable, "ferry-info")], capture_output=True, text=True,
                          timeout=60, env=clean_env()).stdout
    for w in wheels:
        for name in w["plugins"]:
            assert name in text


def test_plugin_wheels_side_by_side(tmp_path):
    """A second venv: core + every plugin wheel; uninstalling one leaves the rest intact."""
    wheels = plugin_wheels()
    core = core_wheel()
    if not wheels or not core:
        pytest.skip("needs the core wheel and plugin wheels (run through run_wheel_tests.sh)")
    venv = tmp_path / "venv"
    base = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys._base_executable
    subprocess.run([base, "-m", "venv", "--system-site-packages", str(venv)], check=True,
                   timeout=120)
    py = str(venv / "bin" / "python")
    pip = [py, "-m", "pip", "install", "-q", "--no-index", "--no-deps"]
    subprocess.run(pip + [core], check=True, timeout=300)
    for w in wheels:  # one at a time, as users would
        subprocess.run(pip + [w["wheel"]], check=True, timeout=300)
    before = ferry_info_json(py, clean_env())
    paths = {p["path"] for p in before["plugins"]}
    site_root = subprocess.run([py, "-c", "import ferry_te; print(ferry_te.package_root())"],
                               capture_output=True, text=True, check=True,
                               env=clean_env()).stdout.strip()
    plugroot = os.path.join(site_root, "lib", "ferry", "plugins")
    expected = {os.path.join(plugroot, *([w["variant"]] if w["variant"] else []), n + ".so")
                for w in wheels for n in w["plugins"]}
    assert expected <= paths
    gone = wheels[0]
    subprocess.run([py, "-m", "pip", "uninstall", "-y", "-q", gone["name"]], check=True,
                   timeout=120)
    after = ferry_info_json(py, clean_env())
    after_paths = {p["path"] for p in after["plugins"]}
    for n in gone["plugins"]:
        assert os.path.join(plugroot, *([gone["variant"]] if gone["variant"] else []),
                            n + ".so") not in after_paths
    for w in wheels[1:]:
        for n in w["plugins"]:
            assert os.path.join(plugroot, *([w["variant"]] if w["variant"] else []),
                                n + ".so") in after_paths
    tcp = [p for p in after["plugins"] if p["name"] == "tcp"]
    assert tcp and tcp[0]["state"] == "loaded"
    # The bindings still work with what is left (where this venv's base Python has cffi).
    if subprocess.run([py, "-c", "import cffi"], capture_output=True).returncode == 0:
        subprocess.run([py, "-c", "import ferry_te; ferry_te.Engine(plugins='tcp').close()"],
                       check=True, timeout=60, env=clean_env())
    shutil.rmtree(venv)


def test_mislabelled_rocm_wheels_are_refused(tmp_path):
    """A plugin wheel whose name, variant directory and libamdhip64 soname disagree is refused
    by `wheels.py plugin` and, for one already built, by `wheels.py verify` (release.yml runs it
    before every upload)."""
    rocm = {w["variant"]: w for w in plugin_wheels() if w["variant"].startswith("rocm") and "hip_ipc" in w["plugins"]}
    if len(rocm) < 2:
        pytest.skip("needs hip_ipc plugin wheels of two ROCm majors (a build with -Drocm_roots)")
    src = os.environ.get("FERRY_SOURCE_ROOT")
    if not src:
        pytest.skip("FERRY_SOURCE_ROOT is not set (run through run_wheel_tests.sh)")
    tool = ["/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable,
            os.path.join(src, "python", "tools", "wheels.py")]
    (good_variant, good), (other_variant, other) = sorted(rocm.items())[-1], sorted(rocm.items())[0]
    so = {}
    for variant, w in ((good_variant, good), (other_variant, other)):
        with zipfile.ZipFile(w["wheel"]) as z:
            member = "ferry_te/lib/ferry/plugins/%s/hip_ipc.so" % variant
            so[variant] = z.extract(member, str(tmp_path / variant))
    ok = subprocess.run(tool + ["verify", good["wheel"]], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # Another major's hip_ipc.so in this major's variant directory.
    bad = subprocess.run(tool + ["plugin", "--out", str(tmp_path / "out"), "--name", "ferry-transfer-engine-" + good_variant,
                                 "--variant", good_variant, so[other_variant]],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    want = "ferry-transfer-engine-%s: %s/hip_ipc.so needs libamdhip64.so.%s, but %s/ is for libamdhip64.so.%s" % (
        good_variant, good_variant, other_variant[4:], good_variant, good_variant[4:])
    assert want in bad.stdout + bad.stderr, bad.stdout + bad.stderr
    # A wheel named after one major holding another's variant directory.
    bad = subprocess.run(tool + ["plugin", "--out", str(tmp_path / "out"), "--name", "ferry-transfer-engine-" + other_variant,
                                 "--variant", good_variant, so[good_variant]],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    assert "holds the %s/ variant directory: its name must be ferry-transfer-engine-%s" % (good_variant, good_variant) in bad.stderr
    # An already-built wheel with the wrong plugin swapped in: verify fails it.
    swapped = tmp_path / os.path.basename(good["wheel"])
    with zipfile.ZipFile(good["wheel"]) as zin, zipfile.ZipFile(swapped, "w") as zout:
        for info in zin.infolist():
            data = zin.read(info)
            if info.filename.endswith("/hip_ipc.so"):
                data = open(so[other_variant], "rb").read()
            zout.writestr(info, data)
    bad = subprocess.run(tool + ["verify", str(swapped)], capture_output=True, text=True, timeout=120)
    assert bad.returncode == 1 and want in bad.stdout, bad.stdout + bad.stderr


def test_every_wheel_within_the_baseline():
    """Every ELF of every wheel built: no GLIBC past 2.34, no GLIBCXX/CXXABI past GCC 11's
    libstdc++ (3.4.29 / 1.3.13), as `wheels.py check` reports them; tagged manylinux_2_34."""
    wheels = all_wheels()
    if not wheels:
        pytest.skip("SKIPPED: FERRY_TEST_WHEEL_DIR has no wheels (run through run_wheel_tests.sh)")
    for whl in wheels:
        assert wheel_tag(whl) == "manylinux_2_34_x86_64", whl
        p = subprocess.run(tool() + ["check", whl], capture_output=True, text=True, timeout=300)
        assert p.returncode == 0, p.stdout + p.stderr
        line = [l for l in p.stdout.splitlines() if "newest symbol versions needed:" in l]
        assert line, p.stdout
        for kind, ver in re.findall(r"\b(GLIBC|GLIBCXX|CXXABI)_(\d+(?:\.\d+)*)\b", line[0].split("(baseline")[0]):
            assert tuple(int(x) for x in ver.split(".")) <= BASELINE[kind], (whl, kind, ver)


def test_check_refuses_a_gcc12_only_symbol(tmp_path):
    """A plugin that needs GLIBCXX_3.4.30 (GCC 12's condition_variable::wait, without
    base/glibcxx_baseline.h) is refused, naming the symbol version and the baseline."""
    if not shutil.which("g++"):
        pytest.skip("SKIPPED: no g++ here")
    src = tmp_path / "cv.cpp"
    src.write_text("#include <condition_variable>\n#include <mutex>\nstd::mutex m; std::condition_variable cv;\n"
                   "extern \"C\" void ferry_plugin_v1() { std::unique_lock<std::mutex> l(m); cv.wait(l); }\n")
    so = tmp_path / "cv.so"
    subprocess.run(["g++", "-shared", "-fPIC", "-O1", str(src), "-o", str(so)], check=True, timeout=120)
    if "GLIBCXX_3.4.30" not in subprocess.run(["objdump", "-T", str(so)], capture_output=True, text=True).stdout:
        pytest.skip("SKIPPED: this g++ is older than GCC 12 (no GLIBCXX_3.4.30 to refuse)")
    bad = subprocess.run(tool() + ["plugin", "--out", str(tmp_path / "out"), "--name", "ferry-transfer-engine-x",
                                   "--requires", "", str(so)], capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    assert "cv.so needs GLIBCXX_3.4.30, newer than the baseline's GLIBCXX_3.4.29" in bad.stderr, bad.stderr


def test_auditwheel_agrees_with_every_tag():
    """sid's python3-auditwheel (a Debian package, never PyPI) finds each wheel consistent with
    exactly the tag it carries."""
    wheels = all_wheels()
    if not wheels:
        pytest.skip("SKIPPED: FERRY_TEST_WHEEL_DIR has no wheels (run through run_wheel_tests.sh)")
    aw = os.environ.get("FERRY_AUDITWHEEL_PATH")
    if not aw:
        if os.environ.get("CI") == "true":
            pytest.fail("no auditwheel: python/tools/fetch_auditwheel.sh failed (run_wheel_tests.sh printed why)")
        pytest.skip("SKIPPED: no auditwheel (python/tools/fetch_auditwheel.sh could not fetch it)")
    env = dict(os.environ, PYTHONPATH=aw)
    # auditwheel show as is: an external NIC/GPU library (rdma.so's libibverbs) makes it say
    # linux_x86_64, which is the point of `wheels.py audit`'s exclusions.
    rdma = [w for w in wheels if "rdma.so" in " ".join(zipfile.ZipFile(w).namelist())]
    if rdma:
        p = subprocess.run(["/usr/bin/python3", "-m", "auditwheel", "show", rdma[0]], capture_output=True,
                           text=True, timeout=300, env=env)
        assert 'consistent with the following platform tag: "linux_x86_64"' in " ".join(p.stdout.split()), p.stdout + p.stderr
    p = subprocess.run(tool() + ["audit", *wheels], capture_output=True, text=True, timeout=600, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    for whl in wheels:
        assert re.search(r"%s: auditwheel: consistent with manylinux_2_(\d+)_x86_64" % re.escape(os.path.basename(whl)),
                         p.stdout), p.stdout


def test_twine_check_every_wheel():
    """The metadata PyPI shows and checks (license, URLs, classifiers, requires-python, the
    README) is complete: Debian's twine, --strict."""
    wheels = all_wheels()
    if not wheels:
        pytest.skip("SKIPPED: FERRY_TEST_WHEEL_DIR has no wheels (run through run_wheel_tests.sh)")
    twine = shutil.which("twine", path="/usr/bin")
    if not twine:
        if os.environ.get("CI") == "true":
            pytest.fail("Debian's twine is not installed (.ci/deps.sh installs it)")
        pytest.skip("SKIPPED: Debian's twine is not installed (apt-get install twine)")
    p = subprocess.run([twine, "check", "--strict", *wheels], capture_output=True, text=True, timeout=300)
    assert p.returncode == 0, p.stdout + p.stderr
    for whl in wheels:
        with zipfile.ZipFile(whl) as z:
            meta = z.read([n for n in z.namelist() if n.endswith(".dist-info/METADATA")][0]).decode()
        for field in ("License: Apache-2.0", "Requires-Python: >=3.8", "Project-URL: Source, ",
                      "Classifier: Operating System :: POSIX :: Linux"):
            assert field in meta, (whl, field)


def test_vendored_libraries_have_their_own_sonames():
    core = core_wheel()
    if not core:
        pytest.skip("SKIPPED: FERRY_TEST_WHEEL_DIR has no core wheel (run through run_wheel_tests.sh)")
    with zipfile.ZipFile(core) as z:
        libs = [n for n in z.namelist() if re.match(r"ferry_te/lib/lib(boost|yaml)", n)]
    assert libs
    for n in libs:  # libboost_log-0123abcd.so.1.74.0, as auditwheel repair names them
        assert re.match(r"ferry_te/lib/lib[\w+-]+-[0-9a-f]{8}\.so(\.\d+)*$", n), n


def test_loads_next_to_the_system_boost(ferry_mod):
    """A process that already loaded the host's Boost (as a Debian-packaged program would)
    gets the wheel's own copy for Ferry, not the host's: both are mapped, Ferry works."""
    system = "/usr/lib/x86_64-linux-gnu/libboost_log.so.1.74.0"
    if not os.path.exists(system):
        pytest.skip("SKIPPED: no system Boost.Log 1.74 here (%s)" % system)
    script = textwrap.dedent("""
        import ctypes, os, sys
        ctypes.CDLL(%r, mode=ctypes.RTLD_GLOBAL)
        import ferry_te
        with ferry_te.Engine(plugins="tcp") as e:
            pass
        maps = {l.split()[-1] for l in open("/proc/self/maps") if "libboost_log" in l}
        print("\\n".join(sorted(maps)))
    """ % system)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                       env=clean_env())
    assert p.returncode == 0, p.stdout + p.stderr
    maps = p.stdout.split()
    root = ferry_mod.package_root()
    assert os.path.realpath(system) in [os.path.realpath(m) for m in maps], maps
    assert [m for m in maps if m.startswith(os.path.join(root, "lib", "libboost_log-"))], maps


def test_missing_cffi_is_a_clear_import_error(tmp_path):
    """In a venv without cffi (NVIDIA's PyTorch image has none), `import ferry_te` says what to
    install; the console commands, which need no cffi, still work."""
    core = core_wheel()
    if not core:
        pytest.skip("SKIPPED: FERRY_TEST_WHEEL_DIR has no core wheel (run through run_wheel_tests.sh)")
    venv = tmp_path / "nocffi"
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True, timeout=120)
    py = str(venv / "bin" / "python")
    subprocess.run([sys.executable, "-m", "pip", "--python", py, "install", "-q", "--no-index", "--no-deps",
                    core], check=True, timeout=300)
    assert subprocess.run([py, "-c", "import cffi"], capture_output=True).returncode != 0
    p = subprocess.run([py, "-c", "import ferry_te"], capture_output=True, text=True, timeout=60,
                       env=clean_env())
    assert p.returncode == 1
    assert "ImportError: ferry_te needs cffi" in p.stderr, p.stderr
    assert "-m pip install 'cffi>=1.15'" in p.stderr, p.stderr
    info = subprocess.run([str(venv / "bin" / "ferry-info")], capture_output=True, text=True, timeout=60,
                          env=clean_env())
    assert info.returncode == 0 and "tcp" in info.stdout, info.stdout + info.stderr


NIXL_DIR = "ferry_te/lib/nixl/"


def test_ferry_nixl_dir_names_the_directory_or_why_there_is_none():
    """`ferry-nixl-dir` (and `python3 -m ferry_te.nixl`) prints the installed NIXL drop-in
    directory where the wheel has one, else says it was built without NIXL, exit 1."""
    core = core_wheel()
    if not core:
        pytest.skip("SKIPPED: FERRY_TEST_WHEEL_DIR has no core wheel (run through run_wheel_tests.sh)")
    with zipfile.ZipFile(core) as z:
        has = NIXL_DIR + "libplugin_FERRY.so" in z.namelist()
    import ferry_te as ferry
    want = os.path.join(ferry.package_root(), "lib", "nixl")
    for cmd in ([bin_of(sys.executable, "ferry-nixl-dir")], [sys.executable, "-m", "ferry_te.nixl"]):
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, env=clean_env())
        if has:
            assert p.returncode == 0 and p.stdout.strip() == want, (cmd, p.stdout, p.stderr)
        else:
            assert p.returncode == 1 and "built without NIXL" in p.stderr, (cmd, p.stdout, p.stderr)


def test_nixl_dropin_directory_copied_out_of_the_wheel_loads_in_a_real_nixl(tmp_path):
    """The wheel's ferry_te/lib/nixl/, its files copied into an empty directory, is a NIXL plugin
    directory by itself: NIXL_PLUGIN_DIR there, nothing of Ferry on LD_LIBRARY_PATH (only NIXL's
    own library and Abseil directories), no other Ferry around (env -i); the FERRY backend loads,
    finds its transports beside it and moves verified data between two processes over tcp."""
    core = core_wheel()
    if not core:
        pytest.skip("SKIPPED: FERRY_TEST_WHEEL_DIR has no core wheel (run through run_wheel_tests.sh)")
    info, host, libs = (os.environ.get("FERRY_TEST_NIXL_" + k, "") for k in ("INFO", "HOST", "LIBS"))
    with zipfile.ZipFile(core) as z:
        members = [i for i in z.infolist() if i.filename.startswith(NIXL_DIR) and not i.is_dir()]
        if not info or not host:
            assert not members, "a wheel built without NIXL carries %s" % members[0].filename
            pytest.skip("SKIPPED: NIXL was not found by this build (configure it with -Dpath_nixl=<NIXL "
                        "prefix>, docs/NIXL.md); the core wheel has no NIXL drop-in directory")
        assert NIXL_DIR + "libplugin_FERRY.so" in [m.filename for m in members], [m.filename for m in members]
        assert NIXL_DIR + "ferry/plugins/tcp.so" in [m.filename for m in members]
        dst = tmp_path / "nixl-plugins"
        dst.mkdir()
        for m in members:  # copied file by file, modes kept, into the empty directory
            out = dst / m.filename[len(NIXL_DIR):]
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_bytes(z.read(m))
            out.chmod((m.external_attr >> 16) & 0o777 or 0o644)
    # Every library an ELF of the directory needs is in it, or the C runtime, or NIXL's Abseil.
    sys.path.insert(0, os.path.join(os.environ["FERRY_SOURCE_ROOT"], "python", "tools"))
    import wheels
    from wheelfile import elves, needed, rpath
    present = {os.path.basename(p) for p in elves(str(dst))}
    for elf in elves(str(dst)):
        outside = [n for n in needed(elf) if n not in present and not wheels._NIXL_HOST_RE.match(n)]
        assert not outside, (elf, outside)
        assert all(r.startswith("$ORIGIN") for r in rpath(elf)), (elf, rpath(elf))
    assert not [n for n in needed(str(dst / "libplugin_FERRY.so")) if n.startswith("libferry")]
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "NIXL_PLUGIN_DIR": str(dst), "LD_LIBRARY_PATH": libs}
    p = subprocess.run([info, "protocols=tcp"], capture_output=True, text=True, timeout=120, env=env)
    assert p.returncode == 0, p.stdout + p.stderr
    assert re.search(r"note\.transport_dir\s+%s/ferry/plugins" % re.escape(str(dst)), p.stdout), p.stdout
    p = subprocess.run([host, "--protocols=tcp", "--gtest_filter=NixlFerry.TwoProcesses*:NixlFerry.LocalTransfer*"],
                       capture_output=True, text=True, timeout=300, env=env)
    assert p.returncode == 0 and "[  PASSED  ]" in p.stdout, p.stdout[-4000:] + p.stderr[-2000:]
