#!/usr/bin/python3
"""Runs the command blocks of README.md and of the docs it links to (DOCS below) as a newcomer
would, from the source directory, so the test fails when a page drifts from what the tree does.

    tests/readme_test.py SOURCE_DIR BUILD_DIR

Every ```sh block must be known below (a new or changed block fails until it is listed): each is
run line by line in one bash, with the CI adjustments named in its plan (shorter durations, free
ports), or listed as skipped with the reason. A line ending in `# exits N` must exit N; other
lines 0; a line ending in `&` starts a background job (checked by the lines after it). A block of
any language whose first line names a file (`// example.cpp`, `# example.py`) is written to that
name in a scratch directory for the command blocks after it; README.md's ```cpp and ```python
blocks must name one, so that its examples run. Relative links of these pages, and the docs/*.md
files they mention, must exist.

BUILD_DIR must be SOURCE_DIR/build (a link to another tree's build works: then what would build
in it, .ci/demo.sh, is skipped, and files the commands would write under build/ go to the
scratch directory)."""

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


# The pages whose blocks run: README.md and the docs it links to. PERFORMANCE.md, RELIABILITY.md
# and DESIGN.md are left out: their blocks are the record of how measurements and long fault runs
# were made (minutes each, some on GPU machines).
DOCS = ["README.md", "docs/API.md", "docs/OPTIONS.md", "docs/SECURITY.md", "docs/PYTHON.md",
        "docs/BENCHMARKS.md", "docs/MOONCAKE.md", "docs/NIXL.md", "docs/DEPLOYMENT.md",
        "docs/METRICS.md", "docs/STORAGE.md", "docs/GPU_IPC.md", "docs/RDMA.md", "docs/FAILOVER.md"]

NO_NIXL = "NIXL is not installed here (the nixl meson suite runs where it is)"


# Per page, first line of a block -> how to run it: ("run", [(pattern, replacement), ...]) or
# ("skip", why). The replacements keep each command as written and only shorten or re-port it
# for CI ({tmp}: the scratch directory). `borrowed`: build/ links to another tree's build.
def plans(borrowed):
    port = str(free_port())
    plot = []
    if subprocess.run(["/usr/bin/python3", "-c", "import matplotlib"], capture_output=True).returncode != 0:
        plot = [(r"^/usr/bin/python3 bench/plot_sweep\.py.*",
                 'echo "SKIPPED: bench/plot_sweep.py: no matplotlib (apt-get install python3-matplotlib)"')]
    bench = [(r"^(build/bench/transfer_engine_bench --(?:loopback|mode=initiator)[^#&]*?)(\s*(#.*)?)$", r"\1" + SHORT + r"\2"),
             (r"^(build/bench/transfer_engine_bench --mode=target[^&]*?) &", r"\1 --buffer_size=67108864 &"),
             (r"127\.0\.0\.1:7000", "127.0.0.1:" + port)]
    # Files the commands write under build/ go to {tmp} when build/ is another tree's.
    files = [(r"build/kv\.bin", "{tmp}/kv.bin"), (r"(file_vs_fio\.sh build)", r"\1 {tmp}/file_vs_fio.bin")] if borrowed else []
    demo = ("run", [(r"^\.ci/demo\.sh", "DURATION=1 .ci/demo.sh --buffer_size=67108864"),
                    (r"^\.ci/test\.sh.*", "echo \"SKIPPED: .ci/test.sh (it runs this test, and every other)\"")])
    if borrowed:
        demo = ("skip", "build/ links to %s, another tree's build: .ci/demo.sh would build that tree's sources in it"
                % os.path.realpath("build"))
    return {
        "README.md": {
            ".ci/demo.sh": demo,
            "g++ -std=c++2b -Iinclude example.cpp": ("run", [(r"(?<![\w/])example\.(cpp|py)\b", r"{tmp}/example.\1"),
                                                             (r"-o example\b", "-o {tmp}/example"),
                                                             (r"^\./example$", "{tmp}/example")]),
        },
        "docs/API.md": {},
        "docs/OPTIONS.md": {
            "build/core/ferry-info ": ("run", []),
        },
        "docs/SECURITY.md": {},
        "docs/PYTHON.md": {
            "/usr/bin/python3 python/tools/wheels.py": ("skip", "builds the wheel with meson-python in build-pywheel/ "
                                                        "(minutes); the python_wheels test builds, installs and tests the same wheel"),
        },
        "docs/BENCHMARKS.md": {
            "build/bench/transfer_engine_bench --loopback --protocol=tcp": ("run", bench),
            "build/bench/transfer_engine_bench --mode=target --local_server_name": ("run", bench),  # managed buffers
            "build/bench/registration_bench --regions 100000 --batch": ("run", []),
            "build/bench/transfer_engine_bench --protocol=file": ("run", files + [
                (r"^(build/bench/transfer_engine_bench --protocol=file[^#]*?)(\s*(#.*)?)$", r"\1" + SHORT + r"\2"),
                (r"^bench/file_vs_fio\.sh build", "DURATION=1 REPEAT=1 SIZE=67108864 bench/file_vs_fio.sh build")]),
            "bench/tcp_vs_iperf3.sh build": ("run", [(r"^bench/tcp_vs_iperf3\.sh build",
                                                       "DURATION=1 REPEAT=1 IPERF_PORT=%d bench/tcp_vs_iperf3.sh build" % free_port()),
                                                      (r"^(build/bench/submit_poll_bench)", r"\1 --benchmark_min_time=0.01")]),
            "build/bench/transfer_engine_bench --loopback --sweep": ("run", [(r"--duration=1", "--duration=0.2 --buffer_size=67108864 "
                                                                              "--sweep_block_sizes=4096,1048576 --sweep_batch_sizes=1,16 --sweep_threads=1,2"),
                                                                             (r"sweep\.(json|png)", r"{tmp}/sweep.\1")] + plot),
        },
        "docs/MOONCAKE.md": {
            "build/bench/transfer_engine_bench --mode=target --protocol=tcp --metadata_server": ("run", bench),
            "/usr/bin/python3 $FERRY/tests/metadata/http_metadata_server.py": (
                "skip", "runs Mooncake's own test files from a Mooncake checkout, which is not in this tree "
                "(test_mooncake_metadata.py runs the same against transfer_engine_target.py)"),
        },
        "docs/NIXL.md": {
            "export FERRY_LOCAL_IP=10.0.0.5": ("skip", "the environment of a vLLM host on a cluster (its addresses and etcd)"),
            "meson setup build -Dpath_nixl=": ("skip", "reconfigures build/ against a NIXL installation; " + NO_NIXL),
            "export NIXL_PLUGIN_DIR=/usr/local/lib": ("skip", "for Ferry installed with its NIXL backend; " + NO_NIXL),
            "ferry-nixl-dir": ("skip", "for a ferry_te wheel built with the NIXL backend; " + NO_NIXL),
            "/usr/bin/python3 python/tools/wheels.py core --out dist --setup-arg=-Dpath_nixl": (
                "skip", "builds a wheel against a NIXL installation; " + NO_NIXL),
            "ferry-nixl-info": ("skip", "for a build with the NIXL backend; " + NO_NIXL),
            "meson setup /tmp/build-nixl": ("skip", "a build against a NIXL installation; " + NO_NIXL),
            "NIXL_PLUGIN_DIR=build/bindings/nixl bench/nixl_bench": ("skip", "for a build with the NIXL backend; " + NO_NIXL),
        },
        "docs/DEPLOYMENT.md": {
            "etcd --name etcd1": ("skip", "starts one member of a three-host etcd cluster on 10.0.0.11-13"),
            "  --listen-client-urls https://": ("skip", "flags of the etcd command above (TLS), not a command"),
            "etcdctl role add root": ("skip", "turns on authentication in the etcd it reaches, for good "
                                      "(tests/etcd_secure_test.cpp does it on an etcd of its own)"),
            "ferry-info ": ("run", [(r"(^|\s)ferry-info(?=\s|$)", r"\1build/core/ferry-info")]),  # installed: on PATH
        },
        "docs/METRICS.md": {
            "build/bench/transfer_engine_bench --mode=target --protocol=tcp --local_server_name": ("run", bench + [
                (r"(--metrics_port=9100) &", r"\1 --buffer_size=67108864 &"), (r"\b9100\b", str(free_port()))]),
        },
        "docs/STORAGE.md": {
            "tests/gpu/device_check.sh pack build build-gpu": ("skip", "packs a CUDA build for a GPU host, where the "
                                                           "second line runs"),
        },
        "docs/GPU_IPC.md": {},
        "docs/RDMA.md": {
            "meson test -C build --num-processes 1 rdma_logic rdma_conformance": (
                "skip", "runs meson test (which rebuilds first); rdma_logic and rdma_conformance are tests of "
                "the same suite, and rdma_conformance needs an RDMA NIC"),
        },
        "docs/FAILOVER.md": {},
    }


FILE_BLOCK = re.compile(r"^(?://|#)\s*([\w.-]+\.(?:cpp|c|py))\s*$")


def blocks(path):
    """(language, text) of every fenced block of a page."""
    return re.findall(r"^```(\w*)\n(.*?)^```", open(path).read(), re.M | re.S)


def plan_for(block, table):
    for key, plan in table.items():
        if block.startswith(key):
            return key, plan
    return None, None


def check_links(src, doc):
    """Relative links of a page, and the docs/*.md files it mentions, exist."""
    text = open(os.path.join(src, doc)).read()
    bad = []
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"^[a-z]+:|^#", target):
            continue
        path = os.path.normpath(os.path.join(src, os.path.dirname(doc), target.split("#")[0]))
        if not os.path.exists(path):
            bad.append("link %s" % target)
    for name in sorted(set(re.findall(r"(?<![\w/.-])docs/[\w-]+\.md", text))):
        if not os.path.exists(os.path.join(src, name)):
            bad.append("mention of %s" % name)
    return bad


def run_block(doc, block, subs, tmp, env):
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
        script.append('rc=$?; [ $rc -eq %d ] || { echo %s "exited $rc (%s says %d)"; exit 1; }'
                      % (want, shlex.quote("FAIL: %s line %s" % (doc, line.strip())), doc, want))
    t0 = time.monotonic()
    p = subprocess.run(["bash", "-c", "\n".join(script)], env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, text=True, timeout=600)
    return p.returncode, p.stdout, time.monotonic() - t0


def main():
    src, build = map(os.path.realpath, sys.argv[1:3])
    if build != os.path.realpath(os.path.join(src, "build")):
        print("SKIPPED: the docs' commands use build/ in the source directory; this build is %s" % build)
        return 0
    os.chdir(src)
    borrowed = os.path.islink("build")
    tmp = os.environ.get("TMPDIR", "/tmp")
    tmp = subprocess.check_output(["mktemp", "-d", os.path.join(tmp, "ferry-readme-XXXXXX")], text=True).strip()
    # As a newcomer's shell: none of the test harness's plugin settings.
    env = {k: v for k, v in os.environ.items() if k not in ("FERRY_PLUGIN_PATH", "FERRY_PLUGINS", "LD_LIBRARY_PATH")}
    tables = plans(borrowed)
    failed, ran, skipped = 0, 0, 0
    for doc in DOCS:
        table = tables[doc]
        seen = set()
        for bad in check_links(src, doc):
            print("FAIL: %s: %s: no such file" % (doc, bad))
            failed += 1
        for lang, block in blocks(os.path.join(src, doc)):
            first = block.splitlines()[0] if block.strip() else ""
            named = FILE_BLOCK.match(first)
            if lang != "sh":
                if named:
                    with open(os.path.join(tmp, named.group(1)), "w") as f:
                        f.write(block)
                elif doc == "README.md" and lang in ("c", "cpp", "python"):
                    print("FAIL: README.md's %s block starting %r names no file (`// example.cpp`, `# example.py`), "
                          "so no command block runs it" % (lang, first))
                    failed += 1
                continue
            key, plan = plan_for(block, table)
            if plan is None:
                print("FAIL: %s block starting %r is not listed in tests/readme_test.py: add how CI runs it "
                      "(or why it cannot) there" % (doc, first))
                failed += 1
                continue
            seen.add(key)
            if plan[0] == "skip":
                print("SKIPPED: %s block %r: %s" % (doc, first, plan[1]))
                skipped += 1
                continue
            print("== %s block %r" % (doc, first), flush=True)
            rc, out, secs = run_block(doc, block, plan[1], tmp, env)
            sys.stdout.write(out)
            print("== %s in %.1f s" % ("ok" if rc == 0 else "FAILED (exit %d)" % rc, secs), flush=True)
            ran += 1
            failed += rc != 0
        for key in table:
            if key not in seen:
                print("FAIL: tests/readme_test.py lists a block starting %r that %s no longer has" % (key, doc))
                failed += 1
    subprocess.run(["rm", "-rf", tmp])
    print("%d blocks run, %d skipped, %d failed" % (ran, skipped, failed))
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
