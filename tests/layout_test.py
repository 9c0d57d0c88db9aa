#!/usr/bin/python3
"""Layout rules a newcomer relies on, checked on the real build and sources:

    tests/layout_test.py SOURCE_DIR BUILD_DIR

1. libferry (core/) is compiled without any plugins/ directory on its include path or in an
   -include: what core and the plugins share lives in base/ (compile_commands.json says what
   each translation unit really got).
2. Connection auth proofs come from one function (base/auth_proof.cpp): no source outside
   base/ and tests/ computes an HMAC itself."""

import json
import os
import re
import sys

src, build = sys.argv[1], sys.argv[2]
problems = []

with open(os.path.join(build, "compile_commands.json")) as f:
    commands = json.load(f)
plugins_dir = os.path.realpath(os.path.join(src, "plugins"))
core_dir = os.path.realpath(os.path.join(src, "core"))
core_units = 0
reaching = {}  # "-I<path>" or "-include <path>" -> core units compiled with it
for c in commands:
    unit = os.path.realpath(os.path.join(c["directory"], c["file"]))
    if not unit.startswith(core_dir + os.sep):
        continue
    core_units += 1
    args = c["arguments"] if "arguments" in c else c["command"].split()
    for i, a in enumerate(args):
        if a.startswith("-I") and len(a) > 2:
            flag, path = "-I", a[2:]
        elif a in ("-I", "-include", "-isystem", "-iquote") and i + 1 < len(args):
            flag, path = a, args[i + 1]
        else:
            continue
        real = os.path.realpath(os.path.join(c["directory"], path))
        if real == plugins_dir or real.startswith(plugins_dir + os.sep):
            reaching.setdefault("%s %s" % (flag, os.path.relpath(real, src)), []).append(os.path.relpath(unit, src))
for flag, units in sorted(reaching.items()):
    problems.append("%d core/ translation units (%s ...) are compiled with %s, a plugins/ path: what core and "
                    "the plugins share belongs in base/" % (len(units), units[0], flag))
if core_units == 0:
    problems.append("compile_commands.json lists no core/ translation unit: is %s a configured build?" % build)

hmac = re.compile(r"\bHmacSha256\b|\bhmac_sha256\s*\(")
for top in ("core", "plugins", "bench", "include"):
    for root, _, files in os.walk(os.path.join(src, top)):
        for name in files:
            if not name.endswith((".c", ".h", ".cpp", ".hpp")):
                continue
            path = os.path.join(root, name)
            with open(path, errors="replace") as f:
                for n, line in enumerate(f, 1):
                    if hmac.search(line):
                        problems.append("%s:%d computes an HMAC: call ferry_auth::make_proof / proof_matches "
                                        "(base/auth_proof.hpp) instead" % (os.path.relpath(path, src), n))

for p in problems:
    print("FAIL: " + p)
if problems:
    sys.exit(1)
print("layout: %d core translation units, none reaching into plugins/; no HMAC outside base/" % core_units)
