#!/usr/bin/python3
"""Runs the source-tree Python tests (tests/python) with pytest, against the build tree:

    tests/python/run.py SOURCE_DIR LIBFERRY [pytest args]

PYTHONPATH gets SOURCE_DIR/python and FERRY_LIBRARY the given libferry; FERRY_PLUGIN_PATH
comes from the caller (tests/meson.build sets the build's plugin directories). Exits 77
(meson's "skipped") with a SKIPPED line when pytest, numpy or cffi is missing."""

import importlib.util
import os
import subprocess
import sys


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    source, libferry = sys.argv[1], sys.argv[2]
    missing = [m for m in ("pytest", "numpy", "cffi") if importlib.util.find_spec(m) is None]
    if missing:
        print("SKIPPED: %s cannot import %s (Debian: apt-get install %s)" % (
            sys.executable, ", ".join(missing), " ".join("python3-" + m for m in missing)))
        return 77
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(
        [os.path.join(source, "python")] + [p for p in [env.get("PYTHONPATH")] if p])
    env["FERRY_LIBRARY"] = libferry
    env.setdefault("FERRY_PLUGINS", "")
    here = os.path.join(source, "tests", "python")
    return subprocess.call([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                            "-rs", here] + sys.argv[3:], env=env, cwd=here)


if __name__ == "__main__":
    sys.exit(main())
