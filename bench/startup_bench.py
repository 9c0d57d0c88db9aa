#!/usr/bin/python3
"""How long a process takes to discover Ferry's plugins, and Python to make its first Engine.

Times, in fresh processes, `ferry-info` (wall time, and its own `Discovery:` figure) and
`import ferry_te; ferry_te.Engine()` for one or more build trees, alternating between them for
--rounds rounds, and prints the medians, so a baseline tree (say main's) and a candidate are
measured in the same run:

    bench/startup_bench.py build                 # this build
    bench/startup_bench.py /tmp/main-build build # baseline first, then the ratio
"""
import argparse
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

PY = "/usr/bin/python3"
ENGINE = ("import time, sys; t = time.perf_counter(); sys.path.insert(0, sys.argv[1]); import ferry_te; "
          "e = ferry_te.Engine(local_ip='127.0.0.1'); print('%.3f' % ((time.perf_counter() - t) * 1e3)); e.close()")


def wall_ms(cmd, env):
    t = time.perf_counter()
    out = subprocess.run(cmd, capture_output=True, text=True, env=env)
    return (time.perf_counter() - t) * 1e3, out.stdout


def stage_package(build, source, into):
    """The package as it installs: the sources, the build's pre-parsed header and version, the
    headers; libferry is the build's (FERRY_LIBRARY)."""
    pkg = os.path.join(into, "ferry_te")
    shutil.copytree(os.path.join(source, "python", "ferry_te"), pkg,
                    ignore=shutil.ignore_patterns("__pycache__", "*.in"))
    for f in ("_ffi_abi.py", "_version.py"):
        if os.path.exists(os.path.join(build, "python", f)):
            shutil.copy(os.path.join(build, "python", f), pkg)
    shutil.copytree(os.path.join(source, "include", "ferry"), os.path.join(pkg, "include", "ferry"))
    return into


def measure(build, pkg, env):
    ms, out = wall_ms([os.path.join(build, "core", "ferry-info")], env)
    m = re.search(r"Discovery:\s*([\d.]+) ms", out)
    own = float(m.group(1)) if m else float("nan")
    py = subprocess.run([PY, "-c", ENGINE, pkg], capture_output=True, text=True,
                        env=dict(env, FERRY_LIBRARY=os.path.join(build, "core", "libferry.so")), cwd="/tmp")
    try:
        engine = float(py.stdout.strip().splitlines()[-1])
    except (IndexError, ValueError):
        sys.exit("%s: import ferry_te + Engine() failed: %s" % (build, py.stderr.strip()[-400:]))
    return ms, own, engine


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("builds", nargs="+", help="meson build directories (the first is the baseline)")
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--source", default=os.path.dirname(os.path.dirname(os.path.abspath(__file__))),
                    help="the source tree the builds' Python package comes from (default: this one)")
    args = ap.parse_args()
    tmp = tempfile.mkdtemp(prefix="ferry-startup-")
    args.builds = [os.path.abspath(b) for b in args.builds]
    pkgs = {b: stage_package(b, args.source, os.path.join(tmp, str(i))) for i, b in enumerate(args.builds)}
    env = {k: v for k, v in os.environ.items() if not k.startswith("FERRY_")}
    results = {b: [] for b in args.builds}
    for _ in range(args.rounds):
        for b in args.builds:
            results[b].append(measure(b, pkgs[b], env))
    base = None
    for b in args.builds:
        med = [statistics.median(r[i] for r in results[b]) for i in range(3)]
        line = "%s: ferry-info %.1f ms wall (its own Discovery: %.1f ms), import + first Engine() %.1f ms" % (
            b, med[0], med[1], med[2])
        if base:
            line += " (%.2fx / %.2fx of the baseline)" % (med[0] / base[0], med[2] / base[2])
        base = base or med
        print(line)
    shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
