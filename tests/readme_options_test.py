#!/usr/bin/python3
"""Checks the option tables of docs/OPTIONS.md against what the built plugins and the engine say
about themselves (`ferry-info --options`), so a missing, stale or wrong row fails CI.

    tests/readme_options_test.py SOURCE_DIR FERRY_INFO [--write]

- Transport options: docs/OPTIONS.md's rows `| \\`<plugin>.<option>\\` | ... |` must be exactly the rows
  `ferry-info --options --markdown` generates for every plugin this build loaded, and name no
  option such a plugin does not publish. Plugins the page documents but this build did not
  load (no CUDA toolkit, say) are reported as SKIPPED. --write rewrites the rows in place.
- Engine keys: every key of the engine's table (core/engine/config.cpp) has a row in docs/OPTIONS.md's
  table of engine keys, and that table names no key the engine rejects.
FERRY_PLUGIN_PATH says where the plugins are (meson sets it to the build's plugin directories)."""

import json
import re
import subprocess
import sys

NOT_DOCUMENTED = {"example"}  # the template for plugin authors, not installed
ROW = re.compile(r"^\| `([a-z0-9_]+)\.([a-z0-9_]+)` \|")
ENGINE_ROW = re.compile(r"^\| `([a-z0-9_]+)` \|")


def ferry_info(binary, *args):
    p = subprocess.run([binary, "--options", *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if p.returncode != 0:
        sys.exit("FAIL: %s --options %s exited %d: %s" % (binary, " ".join(args), p.returncode, p.stderr))
    return p.stdout


def main():
    src, binary = sys.argv[1:3]
    write = "--write" in sys.argv[3:]
    doc = "docs/OPTIONS.md"
    path = src + "/" + doc
    lines = open(path).read().split("\n")
    report = json.loads(ferry_info(binary, "--json"))
    loaded = {p["name"] for p in report["plugins"]} - NOT_DOCUMENTED
    generated = {}
    for line in ferry_info(binary, "--markdown").split("\n"):
        m = ROW.match(line)
        if m and m.group(1) in loaded:
            generated[(m.group(1), m.group(2))] = line
    failed = 0

    documented = {}
    for n, line in enumerate(lines):
        m = ROW.match(line)
        if m:
            documented[(m.group(1), m.group(2))] = n
    for key, n in sorted(documented.items(), key=lambda kv: kv[1]):
        plugin, option = key
        if plugin not in loaded:
            continue
        if key not in generated:
            print("FAIL: %s line %d documents %s.%s, which %s.so does not accept (ferry-info --options %s): "
                  "remove the row" % (doc, n + 1, plugin, option, plugin, plugin))
            failed += 1
        elif lines[n] != generated[key]:
            if write:
                lines[n] = generated[key]
                continue
            print("FAIL: %s line %d documents %s.%s wrongly:\n  page:       %s\n  ferry-info: %s\n"
                  "  (tests/readme_options_test.py SOURCE_DIR FERRY_INFO --write fixes it)"
                  % (doc, n + 1, plugin, option, lines[n], generated[key]))
            failed += 1
    for key, row in generated.items():
        if key not in documented:
            print("FAIL: %s has no row for %s.%s; add, to the %s.so table:\n  %s" % (doc, key[0], key[1], key[0], row))
            failed += 1
    for plugin in sorted({p for p, _ in documented} - loaded):
        print("SKIPPED: %s.so is not loaded in this build, so %s's %s.* rows are not checked" % (plugin, doc, plugin))
    for plugin in sorted(loaded):
        print("checked %s.so: %d options" % (plugin, sum(1 for p, _ in generated if p == plugin)))

    # The engine's keys against the page's table of engine keys (`| key | default | meaning |`).
    engine = {k["name"] for k in report["engine"]}
    in_table, table_keys = False, set()
    for line in lines:
        if line.startswith("| key | default | meaning |"):
            in_table = True
        elif in_table and not line.startswith("|"):
            break
        elif in_table:
            m = ENGINE_ROW.match(line)
            if m:
                table_keys.add(m.group(1))
    for k in sorted(engine - table_keys):
        print("FAIL: %s's table of engine keys has no row for the engine key %s (ferry-info --options engine)" % (doc, k))
        failed += 1
    for k in sorted(table_keys - engine):
        print("FAIL: %s's table of engine keys documents %s, which the engine does not accept" % (doc, k))
        failed += 1
    print("checked %d engine keys" % len(engine))

    if write:
        open(path, "w").write("\n".join(lines))
    print("%d problems" % failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
