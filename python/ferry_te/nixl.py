"""Where this package's NIXL drop-in directory is (docs/NIXL.md).

    python3 -m ferry_te.nixl          # prints the directory, or why there is none (exit 1)
    export NIXL_PLUGIN_DIR=$(python3 -m ferry_te.nixl)
    # or: cp -r "$(python3 -m ferry_te.nixl)/." <NIXL's plugin directory>/

The directory holds libplugin_FERRY.so (the FERRY backend, Ferry's core linked in), the
libraries it needs that a host cannot be assumed to have, and the transports in ferry/plugins/:
it works by itself, copied anywhere. It is in the package only where NIXL was found when the
wheel was built (its headers fix the plugin interface the backend is compiled against); the
backend then loads into a NIXL of that release built with the same Abseil.
"""

import os
import sys

_BUILT_WITHOUT = (
    "this ferry_te was built without NIXL, so it has no NIXL drop-in directory (libplugin_FERRY.so "
    "is compiled against the NIXL release it loads into). Build the wheel where NIXL is installed: "
    "python/tools/wheels.py core --out dist --setup-arg=-Dpath_nixl=<NIXL prefix>, or build Ferry "
    "from source with -Dpath_nixl=<NIXL prefix> (docs/NIXL.md)")


def plugin_dir():
    """The NIXL drop-in directory of this package, or None when it was built without NIXL."""
    d = os.path.join(os.path.dirname(os.path.abspath(__file__)), "lib", "nixl")
    return d if os.path.isfile(os.path.join(d, "libplugin_FERRY.so")) else None


def main(argv=None):
    d = plugin_dir()
    if d is None:
        sys.stderr.write("ferry_te.nixl: %s\n" % _BUILT_WITHOUT)
        return 1
    print(d)
    return 0


if __name__ == "__main__":
    sys.exit(main())
