"""Writes ferry_te/_ffi_abi.py: cffi's out-of-line ABI-mode module for ferry.h, built with the
package so that `import ferry_te` does not parse the header at run time (pycparser's parse was
most of the first Engine()'s time: 150-600 ms). The module carries the header's SHA-256;
_capi.py uses it only for that exact header and parses otherwise.

    gen_ffi.py <ferry.h> <ferry_te/_capi.py> <output _ffi_abi.py>
"""

import hashlib
import importlib.util
import sys


def main(header, capi_path, out):
    spec = importlib.util.spec_from_file_location("_ferry_capi_for_gen", capi_path)
    capi = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(capi)  # only for cdef_from_header: nothing is loaded
    import cffi

    with open(header, encoding="utf-8") as f:
        text = f.read()
    ffi = cffi.FFI()
    ffi.cdef(capi.cdef_from_header(text))
    ffi.set_source("ferry_te._ffi_abi", None)
    ffi.emit_python_code(out)
    with open(out, "a", encoding="utf-8") as f:
        f.write("\nHEADER_SHA256 = %r\n" % hashlib.sha256(text.encode("utf-8")).hexdigest())


if __name__ == "__main__":
    if len(sys.argv) != 4:
        sys.exit(__doc__)
    main(*sys.argv[1:])
