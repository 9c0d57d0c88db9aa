"""Prints what efa.so needs to open libfabric at run time (fabric_api.cpp): the library's SONAME
and, for each function efa.so calls, the symbol version the linker would have bound (the default,
@@, one), as `KEY=VALUE` lines. Exits non-zero when any is missing (meson then links libfabric).

    fabric_versions.py <path of libfabric.so>
"""

import re
import subprocess
import sys

FUNCTIONS = ("fi_getinfo", "fi_freeinfo", "fi_dupinfo", "fi_fabric", "fi_strerror", "fi_version")


def main(lib):
    dynamic = subprocess.run(["readelf", "-dW", lib], capture_output=True, text=True, check=True).stdout
    soname = re.search(r"\(SONAME\)\s+Library soname: \[([^\]]+)\]", dynamic)
    symbols = subprocess.run(["nm", "-D", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    found = {}
    for line in symbols.splitlines():
        m = re.match(r"^\S+\s+\S\s+(\w+)@@(\S+)$", line.strip())
        if m and m.group(1) in FUNCTIONS:
            found[m.group(1)] = m.group(2)
    if not soname or set(found) != set(FUNCTIONS):
        sys.exit("cannot tell libfabric's soname or symbol versions from %s (found %s)" % (lib, found))
    print("soname=" + soname.group(1))
    for name in FUNCTIONS:
        print("%s=%s" % (name, found[name]))


if __name__ == "__main__":
    main(sys.argv[1])
