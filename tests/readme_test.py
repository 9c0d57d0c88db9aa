#!/usr/bin/python3
"""Runs the ```sh command blocks of README.md as a newcomer would, from the source directory, so
the test fails when the README drifts from what the tree does.

    tests/readme_test.py SOURCE_DIR BUILD_DIR

Every block must be known below (a new or changed block fails until it is listed): each is run
line by line in one bash, with the CI adjustments named in RUN (shorter durations, free ports),
or listed as SKIPPED with the reason. A line ending in `# exits N` must exit N; other lines 0;
a line ending in `&` starts a background job (checked by the lines after it)."""

import os
import re
import shlex
import socket
import subprocess
import sys
import time

SHORT = " --duration=1 --buffer_size=67108864"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# First line of a block -> how to run it: ("run", [(pattern, replacement), ...]) or ("skip", why).
# The replacements keep each command as written and only shorten or re-port it for CI.
def plans():
    port = str(free_port())
    plot = []
    if subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"], capture_output=True).returncode != 0:
        plot = [(r"^/usr/bin/python3 bench/plot_sweep\.py.*",
                 'echo "SKIPPED: bench/plot_sweep.py: no matplotlib (apt-get install python3-matplotlib)"')]
    bench = [(r"^(build/bench/transfer_engine_bench --(?:loopback|mode=initiator)[^#&]*?)(\s*(#.*)?)$", r"\1" + SHORT + r"\2"),
             (r"^(build/bench/transfer_engine_bench --mode=target[^&]*?) &", r"\1 --buffer_size=67108864 &"),
             (r"127\.0\.0\.1:7000", "127.0.0.1:" + port)]
    return {
        ".ci/demo.sh": ("run", [(r"^\.ci/demo\.sh", "DURATION=1 .ci/demo.sh --buffer_size=67108864"),
                                (r"^\.ci/test\.sh.*", "echo \"SKIPPED: .ci/test.sh (it runs this test, and every other)\"")]),
        "build/core/ferry-info ": ("run", []),
        "build/bench/transfer_engine_bench --loopback --protocol=tcp": ("run", bench),
        "build/bench/transfer_engine_bench --mode=target --protocol=tcp --metadata_server": ("run", bench),
        "build/bench/transfer_engine_bench --mode=target --local_server_name": ("run", bench),  # managed buffers
        "build/bench/registration_bench --regions 100000 --batch": ("run", []),
        "build/bench/transfer_engine_bench --protocol=file": ("run", [
            (r"^(build/bench/transfer_engine_bench --protocol=file[^#]*?)(\s*(#.*)?)$", r"\1" + SHORT + r"\2"),
            (r"^bench/file_vs_fio\.sh build", "DURATION=1 REPEAT=1 SIZE=67108864 bench/file_vs_fio.sh build")]),
        "bench/tcp_vs_iperf3.sh build": ("run", [(r"^bench/tcp_vs_iperf3\.sh build",
                                                   "DURATION=1 REPEAT=1 IPERF_PORT=%d bench/tcp_vs_iperf3.sh build" % free_port()),
                                                  (r"^(build/bench/submit_poll_bench)", r"\1 --benchmark_min_time=0.01")]),
        "build/bench/transfer_engine_bench --loopback --sweep": ("run", [(r"--duration=1", "--duration=0.2 --buffer_size=67108864 "
                                                                          "--sweep_block_sizes=4096,1048576 --sweep_batch_sizes=1,16 --sweep_threads=1,2"),
                                                                         (r"sweep\.(json|png)", r"{tmp}/sweep.\1")] + plot),
        "/usr/bin/python3 python/tools/wheels.py": ("skip", "builds the wheel with meson-python in build-pywheel/ "
                                                    "(minutes); the python_wheels test builds, installs and tests the same wheel"),
    }


def blocks(readme):
    return re.findall(r"^```sh\n(.*?)^```", open(readme).read(), re.M | re.S)


def plan_for(block, table):
    for key, plan in table.items():
        if block.startswith(key):
            return key, plan
    return None, None


def run_block(block, subs, tmp, env):
    lines = []
    for line in block.splitlines():
        for pat, rep in subs:
            line = re.sub(pat, rep.replace("{tmp}", tmp), line)
        lines.append(line)
    # Background jobs (a bench target) end with the block, whatever happened.
    script = ["set -uo pipefail", "trap 'kill $(jobs -p) 2>/dev/null' EXIT"]
    for n, line in enumerate(lines, 1):
        cmd = line.split(" #")[0].strip() if not line.lstrip().startswith("#") else ""
        if not cmd:
            continue
        m = re.search(r"#\s*exits (\d+)", line)
        want = int(m.group(1)) if m else 0
        script.append("echo %s" % shlex.quote("+ " + cmd))
        script.append(cmd)
        if cmd.endswith("&") or cmd.endswith("$!"):
            continue
        script.append('rc=$?; [ $rc -eq %d ] || { echo %s "exited $rc (the README says %d)"; exit 1; }'
                      % (want, shlex.quote("FAIL: README line " + line.strip()), want))
    t0 = time.monotonic()
    p = subprocess.run(["bash", "-c", "\n".join(script)], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    return p.returncode, p.stdout, time.monotonic() - t0


def main():
    src, build = map(os.path.realpath, sys.argv[1:3])
    if build != os.path.join(src, "build"):
        print("SKIPPED: the README's commands use build/ in the source directory; this build is %s" % build)
        return 0
    os.chdir(src)
    tmp = os.environ.get("TMPDIR", "/tmp")
    tmp = subprocess.check_output(["mktemp", "-d", os.path.join(tmp, "ferry-readme-XXXXXX")], text=True).strip()
    # As a newcomer's shell: none of the test harness's plugin settings.
    env = {k: v for k, v in os.environ.items() if k not in ("FERRY_PLUGIN_PATH", "FERRY_PLUGINS", "LD_LIBRARY_PATH")}
    table = plans()
    seen, failed, ran, skipped = set(), 0, 0, 0
    for block in blocks(os.path.join(src, "README.md")):
        key, plan = plan_for(block, table)
        first = block.splitlines()[0]
        if plan is None:
            print("FAIL: README block starting %r is not listed in tests/readme_test.py: add how CI runs it "
                  "(or why it cannot) there" % first)
            failed += 1
            continue
        seen.add(key)
        if plan[0] == "skip":
            print("SKIPPED: README block %r: %s" % (first, plan[1]))
            skipped += 1
            continue
        print("== README block %r" % first, flush=True)
        rc, out, secs = run_block(block, plan[1], tmp, env)
        sys.stdout.write(out)
        print("== %s in %.1f s" % ("ok" if rc == 0 else "FAILED (exit %d)" % rc, secs), flush=True)
        ran += 1
        failed += rc != 0
    for key in table:
        if key not in seen:
            print("FAIL: tests/readme_test.py lists a block starting %r that README.md no longer has" % key)
            failed += 1
    subprocess.run(["rm", "-rf", tmp])
    print("%d blocks run, %d skipped, %d failed" % (ran, skipped, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
