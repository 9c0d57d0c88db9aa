"""Console commands of the wheel: exec the binaries bundled in ferry_te/bin/."""

import os
import sys

_BIN = os.path.join(os.path.dirname(os.path.abspath(__file__)), "bin")


def _exec(name):
    path = os.path.join(_BIN, name)
    if not os.access(path, os.X_OK):
        sys.stderr.write("%s: %s is missing from this ferry installation (reinstall the wheel)\n"
                         % (name, path))
        return 127
    sys.stdout.flush()
    sys.stderr.flush()
    os.execv(path, [name] + sys.argv[1:])


def ferry_info():
    return _exec("ferry-info")


def transfer_engine_bench():
    return _exec("transfer_engine_bench")


def ferry_nixl_dir():
    from .nixl import main
    return main()


if __name__ == "__main__":
    sys.exit(_exec(sys.argv.pop(1)))
