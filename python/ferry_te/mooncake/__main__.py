"""Runs a program written for Mooncake on Ferry, unchanged:

    python3 -m ferry_te.mooncake SCRIPT.py [ARGS...]
    python3 -m ferry_te.mooncake -m MODULE [ARGS...]

install_as_mooncake() first, so the program's `from mooncake.engine import TransferEngine`
gets ferry_te.mooncake; then the script (or module) runs as __main__ with ARGS as sys.argv."""

import os
import runpy
import sys

from . import install_as_mooncake


def main(argv):
    if not argv or argv[0] in ("-h", "--help") or (argv[0] == "-m" and len(argv) < 2):
        print(__doc__.strip(), file=sys.stderr if not argv or argv[0] == "-m" else sys.stdout)
        return 0 if argv and argv[0] in ("-h", "--help") else 2
    install_as_mooncake()
    if argv[0] == "-m":
        sys.argv = [argv[1]] + argv[2:]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = argv
        sys.path.insert(0, os.path.dirname(os.path.abspath(argv[0])))  # as `python3 SCRIPT` does
        runpy.run_path(argv[0], run_name="__main__")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
