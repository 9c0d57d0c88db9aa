#!/usr/bin/python3
"""Layout rules a newcomer relies on, checked on the real build and sources:

    tests/layout_test.py SOURCE_DIR BUILD_DIR

1. libferry (core/) is compiled without any plugins/ directory on its include path or in an
   -include: what core and the plugins share lives in base/ (compile_commands.json says what
   each translation unit really got). The other way round too: the plugins, base/ and the
   bindings are compiled without core/ on their include path and include nothing of it (the
   plugins see include/ferry/ and base/ only; the bindings, the public API).
2. Connection auth proofs come from one function (base/auth_proof.cpp): no source outside
   base/ and tests/ computes an HMAC itself.
3. core/ is laid out by job, one folder each (ALLOWED below), and a folder includes only from
   the folders its row names, so the layers stay one-way: util/ calls nothing of core, the engine
   calls everything below it, nothing below calls the engine. Includes name core's headers from
   core/ ("engine/route.hpp", also within a folder), public ones as "ferry/...", base/'s by name.
   Each folder's main header (MAIN_HEADER) says in a "May include:" line what its row says."""

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


def include_paths_into(units, target):
    """Of the compile commands accepted by units(unit path, command), how many there are, and
    which include-path flags ("-I<path>", "-include <path>", ...) lead into `target`, with the
    units compiled with each."""
    count, reaching = 0, {}
    for c in commands:
        unit = os.path.realpath(os.path.join(c["directory"], c["file"]))
        if not units(unit, c):
            continue
        count += 1
        args = c["arguments"] if "arguments" in c else c["command"].split()
        for i, a in enumerate(args):
            if a.startswith("-I") and len(a) > 2:
                flag, path = "-I", a[2:]
            elif a in ("-I", "-include", "-isystem", "-iquote") and i + 1 < len(args):
                flag, path = a, args[i + 1]
            else:
                continue
            real = os.path.realpath(os.path.join(c["directory"], path))
            if real == target or real.startswith(target + os.sep):
                reaching.setdefault("%s %s" % (flag, os.path.relpath(real, src)), []).append(os.path.relpath(unit, src))
    return count, reaching


core_units, reaching = include_paths_into(lambda unit, c: unit.startswith(core_dir + os.sep), plugins_dir)
for flag, units in sorted(reaching.items()):
    problems.append("%d core/ translation units (%s ...) are compiled with %s, a plugins/ path: what core and "
                    "the plugins share belongs in base/" % (len(units), units[0], flag))
# Rule 1, the other way: units of the plugins, base/ and the bindings never get core/ (their
# own targets, that is: a test that builds a plugin's decoder with core's beside it may).
outside_tops = [os.path.realpath(os.path.join(src, top)) + os.sep for top in ("plugins", "base", "bindings")]
outside_units, reaching = include_paths_into(
    lambda unit, c: any(unit.startswith(top) for top in outside_tops)
    and c.get("output", "").split("/", 1)[0] not in ("tests", "bench"), core_dir)
for flag, units in sorted(reaching.items()):
    problems.append("%d translation units outside core/ (%s ...) are compiled with %s, a core/ path: plugins see "
                    "include/ferry/ and base/ only" % (len(units), units[0], flag))
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

# Rule 3: core/ by job. Folder -> the folders it may include from (besides itself, include/ferry/
# and base/). Derived from the includes as they are; a new edge is a design decision: make it
# here and in the folder's main header, or move the code so it points down.
BELOW_ENGINE = {"metadata", "control", "staging", "metrics", "loader", "util"}
ALLOWED = {
    "util": set(),                               # logger, fds, sockets, codecs, file trust
    "loader": {"util"},                          # plugin files, runtime probes, shared objects
    "control": {"util"},                         # engine-to-engine channel, cluster secret
    "metadata": {"control", "util"},             # descriptors and their stores (P2P serves on control/)
    "staging": {"loader", "util"},               # GPU copies through pinned memory (runtime_probe)
    "metrics": {"loader", "util"},               # counters, ferry_metrics.so loaded like a plugin
    "engine": BELOW_ENGINE,                      # the engine and its settings
    "api": BELOW_ENGINE | {"engine"},            # the C API over the engine
    "tools": BELOW_ENGINE | {"engine"},          # ferry-info and what it prints
}
MAIN_HEADER = {
    "util": "util/log.hpp",
    "loader": "loader/plugin_loader.hpp",
    "control": "control/control_protocol.hpp",
    "metadata": "metadata/metadata.hpp",
    "staging": "staging/stage_service.hpp",
    "metrics": "metrics/metrics.hpp",
    "engine": "engine/engine_impl.hpp",
    "api": "api/c_api.cpp",
    "tools": "tools/ferry_info.cpp",
}
SKIP = {"ferry"}  # core/ferry/: the build tree's plugin directory (meson.build files only)
include_re = re.compile(r'^\s*#\s*include\s*"([^"]+)"', re.M)
sources = (".c", ".h", ".cpp", ".hpp")
core_files = 0
for entry in sorted(os.listdir(core_dir)):
    path = os.path.join(core_dir, entry)
    if os.path.isfile(path):
        if entry.endswith(sources):
            problems.append("core/%s sits in core/ itself: put it in the folder of its job (%s)"
                            % (entry, ", ".join(sorted(ALLOWED))))
        continue
    if entry in SKIP:
        continue
    if entry not in ALLOWED:
        problems.append("core/%s/ is no folder of tests/layout_test.py's ALLOWED: give it a row (what it may "
                        "include) and a main header that says so" % entry)
        continue
    for root, _, files in os.walk(path):
        for name in sorted(files):
            if not name.endswith(sources):
                continue
            file = os.path.join(root, name)
            rel = os.path.relpath(file, core_dir)
            core_files += 1
            with open(file, errors="replace") as f:
                text = f.read()
            for m in include_re.finditer(text):
                inc = m.group(1)
                where = "core/%s:%d" % (rel, text.count("\n", 0, m.start()) + 1)
                top = inc.split("/", 1)[0]
                if "/" in inc and top in ALLOWED and os.path.isfile(os.path.join(core_dir, inc)):
                    if top != entry and top not in ALLOWED[entry]:
                        may = ", ".join(sorted(t + "/" for t in ALLOWED[entry]))
                        problems.append('%s includes "%s": %s/ may include %s (tests/layout_test.py, ALLOWED)'
                                        % (where, inc, entry, "only " + may if may else "nothing else of core/"))
                elif inc.startswith("ferry/") and os.path.isfile(os.path.join(src, "include", inc)):
                    pass
                elif "/" not in inc and os.path.isfile(os.path.join(src, "base", inc)):
                    pass
                elif os.path.isfile(os.path.join(os.path.dirname(file), inc)):
                    problems.append('%s includes "%s" by its place beside the file: name it from core/ ("%s")'
                                    % (where, inc, os.path.relpath(os.path.join(os.path.dirname(file), inc), core_dir)))
                else:
                    problems.append('%s includes "%s", which is neither core/<folder>/..., include/ferry/ nor base/'
                                    % (where, inc))
if core_files == 0:
    problems.append("no sources under core/<folder>/: is %s the source tree?" % src)
may_re = re.compile(r"^\s*(?://|\*)\s*May include:\s*(.*)$", re.M)
for folder, header in sorted(MAIN_HEADER.items()):
    try:
        with open(os.path.join(core_dir, header), errors="replace") as f:
            head = f.read(4000)
    except OSError:
        problems.append("core/%s, the main header of %s/, is missing" % (header, folder))
        continue
    m = may_re.search(head)
    said = set(re.findall(r"\b([a-z_]+)/", m.group(1).split("(")[0])) if m else None
    if said != ALLOWED[folder]:
        problems.append('core/%s does not open with "May include: %s" as ALLOWED says of %s/ (it says %s)'
                        % (header, ", ".join(sorted(t + "/" for t in ALLOWED[folder])) or "none",
                           folder, "nothing" if said is None else ", ".join(sorted(t + "/" for t in said)) or "none"))

# Outside core/: the plugins, base/ and the public headers include nothing of core/ (rule 1 checks
# the include paths; this the text, for a path that climbs out of the file's own directory).
for top in ("plugins", "base", "bindings", "include"):
    for root, _, files in os.walk(os.path.join(src, top)):
        for name in files:
            if not name.endswith(sources):
                continue
            file = os.path.join(root, name)
            with open(file, errors="replace") as f:
                text = f.read()
            for m in include_re.finditer(text):
                target = os.path.realpath(os.path.join(os.path.dirname(file), m.group(1)))
                if m.group(1).startswith("core/") or target.startswith(core_dir + os.sep):
                    problems.append('%s:%d includes "%s", a core/ header: %s'
                                    % (os.path.relpath(file, src), text.count("\n", 0, m.start()) + 1, m.group(1),
                                       "the plugins see include/ferry/ and base/ only" if top == "plugins"
                                       else "only the engine's own code does"))

for p in problems:
    print("FAIL: " + p)
if problems:
    sys.exit(1)
print("layout: %d core translation units, none reaching into plugins/, %d outside core/ none reaching into it; "
      "%d core/ files in %d folders, every include along ALLOWED; no HMAC outside base/"
      % (core_units, outside_units, core_files, len(ALLOWED)))
