"""The wheels as installed: console commands, plugin wheels seen by ferry-info, and plugin
wheels installed side by side and removed without touching each other or the core."""

import glob
import json
import os
import shutil
import subprocess
import sys
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
    found = glob.glob(os.path.join(WHEEL_DIR, "ferry-*-py3-none-*.whl"))
    return found[0] if found else None


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
    assert os.path.basename(wheel).endswith("-py3-none-linux_x86_64.whl") or "manylinux" in wheel
    with zipfile.ZipFile(wheel) as z:
        names = z.namelist()
        wheel_meta = z.read([n for n in names if n.endswith(".dist-info/WHEEL")][0]).decode()
        entry = z.read([n for n in names if n.endswith("entry_points.txt")][0]).decode()
        modes = {i.filename: (i.external_attr >> 16) & 0o777 for i in z.infolist()}
    assert "Tag: py3-none-" in wheel_meta and "cp3" not in wheel_meta
    for must in ("ferry/__init__.py", "ferry/include/ferry/ferry.h", "ferry/lib/libferry.so",
                 "ferry/lib/ferry/plugins/tcp.so", "ferry/bin/ferry-info",
                 "ferry/bin/transfer_engine_bench"):
        assert must in names, must
    assert modes["ferry/bin/ferry-info"] & 0o111
    assert not [n for n in names if ".mesonpy.libs" in n or ".data/" in n]
    assert not [n for n in names if "cuda_ipc" in n or "hip_ipc" in n]  # plugin wheels' job
    assert "ferry-info = ferry._cli:ferry_info" in entry
    assert "transfer_engine_bench = ferry._cli:transfer_engine_bench" in entry


def test_console_commands():
    info = subprocess.run([bin_of(sys.executable, "ferry-info")], capture_output=True, text=True,
                          timeout=60, env=clean_env())
    assert info.returncode == 0, info.stderr
    import ferry
    plugins = os.path.join(ferry.package_root(), "lib", "ferry", "plugins")
    assert plugins in info.stdout and "tcp" in info.stdout
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
    import ferry
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
    site_root = subprocess.run([py, "-c", "import ferry; print(ferry.package_root())"],
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
        subprocess.run([py, "-c", "import ferry; ferry.Engine(plugins='tcp').close()"],
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
            member = "ferry/lib/ferry/plugins/%s/hip_ipc.so" % variant
            so[variant] = z.extract(member, str(tmp_path / variant))
    ok = subprocess.run(tool + ["verify", good["wheel"]], capture_output=True, text=True, timeout=120)
    assert ok.returncode == 0, ok.stdout + ok.stderr
    # Another major's hip_ipc.so in this major's variant directory.
    bad = subprocess.run(tool + ["plugin", "--out", str(tmp_path / "out"), "--name", "ferry-" + good_variant,
                                 "--variant", good_variant, so[other_variant]],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    want = "ferry-%s: %s/hip_ipc.so needs libamdhip64.so.%s, but %s/ is for libamdhip64.so.%s" % (
        good_variant, good_variant, other_variant[4:], good_variant, good_variant[4:])
    assert want in bad.stdout + bad.stderr, bad.stdout + bad.stderr
    # A wheel named after one major holding another's variant directory.
    bad = subprocess.run(tool + ["plugin", "--out", str(tmp_path / "out"), "--name", "ferry-" + other_variant,
                                 "--variant", good_variant, so[good_variant]],
                         capture_output=True, text=True, timeout=120)
    assert bad.returncode != 0
    assert "holds the %s/ variant directory: its name must be ferry-%s" % (good_variant, good_variant) in bad.stderr
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
