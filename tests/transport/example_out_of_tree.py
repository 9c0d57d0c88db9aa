#!/usr/bin/python3
"""Builds plugins/example/example.c out of tree with the one compiler line of
plugins/example/README.md (run as written, PREFIX pointing where include/ferry/plugin.h is), and
loads the result into the transport conformance suite.

    example_out_of_tree.py SOURCE_DIR TRANSPORT_CONFORMANCE_TEST [INCLUDE_PREFIX]

INCLUDE_PREFIX (default SOURCE_DIR) holds include/ferry/plugin.h: the tree, or a staged
`meson install --destdir` prefix."""

import os
import re
import shutil
import subprocess
import sys
import tempfile


def compile_line(readme):
    blocks = re.findall(r"```sh\n(.*?)```", open(readme).read(), re.S)
    lines = [l for b in blocks for l in b.splitlines() if re.match(r"(cc|gcc|clang) ", l)]
    if len(lines) != 1:
        sys.exit(f"FAIL: {readme} must show exactly one compiler line in a ```sh block, found {lines}")
    return lines[0]


def main():
    src, conformance = sys.argv[1], sys.argv[2]
    prefix = os.path.abspath(sys.argv[3] if len(sys.argv) > 3 else src)
    line = compile_line(os.path.join(src, "plugins/example/README.md"))
    with tempfile.TemporaryDirectory(prefix="ferry-example-") as tmp:
        # An author's directory: example.c and nothing else of the tree.
        shutil.copy(os.path.join(src, "plugins/example/example.c"), tmp)
        env = dict(os.environ, PREFIX=prefix)
        print("+", line, f"(PREFIX={prefix})", flush=True)
        r = subprocess.run(["bash", "-ec", line], cwd=tmp, env=env, capture_output=True, text=True)
        if r.returncode != 0 or r.stderr.strip():
            sys.exit(f"FAIL: the README's line (rc {r.returncode}):\n{r.stdout}{r.stderr}")
        so = os.path.join(tmp, "example.so")
        nm = subprocess.run(["nm", "-D", "--defined-only", so], capture_output=True, text=True, check=True)
        exported = sorted(l.split()[-1] for l in nm.stdout.splitlines() if l.strip())
        if exported != ["ferry_plugin_v1"]:
            sys.exit(f"FAIL: example.so must export only ferry_plugin_v1, exports {exported}")
        env = dict(os.environ, FERRY_TEST_EXAMPLE_PLUGIN=so)
        r = subprocess.run([conformance, "--gtest_filter=Example/*:ExamplePlugin.*"], env=env)
        if r.returncode != 0:
            sys.exit(f"FAIL: the conformance suite over the out-of-tree example.so (rc {r.returncode})")
    print("PASS: built out of tree with the README's line; conformance suite passed")


main()
