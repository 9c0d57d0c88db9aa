"""Loads libferry through cffi in ABI mode: no compiler at install time, one wheel for every
CPython 3. The declarations come from ferry.h itself: pre-parsed at build time (_ffi_abi.py,
tools/gen_ffi.py) for the header the package ships, parsed at import for any other."""

import hashlib
import os
import re
import threading

_PKG_DIR = os.path.dirname(os.path.abspath(__file__))

# Installed package first (the wheel's own copy), then the source tree (python/ferry_te next to
# include/ferry). FERRY_HEADER names another copy.
_HEADER_CANDIDATES = (
    os.path.join(_PKG_DIR, "include", "ferry", "ferry.h"),
    os.path.join(_PKG_DIR, os.pardir, os.pardir, "include", "ferry", "ferry.h"),
)


def cdef_from_header(text):
    """Turns ferry.h into what cffi's cdef() accepts: preprocessor lines go, so does every
    `#ifdef __cplusplus ... #endif` block (extern "C" braces), and FERRY_C_API."""
    out = []
    skip_depth = 0  # > 0 while inside an #ifdef __cplusplus block (counting nested #if)
    for line in text.splitlines():
        stripped = line.strip()
        if stripped.startswith("#"):
            directive = stripped[1:].strip()
            if skip_depth:
                if re.match(r"if(n?def)?\b", directive):
                    skip_depth += 1
                elif re.match(r"endif\b", directive):
                    skip_depth -= 1
                continue
            if re.match(r"ifdef\s+__cplusplus\b", directive):
                skip_depth = 1
            continue
        if skip_depth:
            continue
        out.append(line)
    return re.sub(r"\bFERRY_C_API\b", "", "\n".join(out))


def find_header():
    env = os.environ.get("FERRY_HEADER")
    candidates = ((env,) if env else ()) + _HEADER_CANDIDATES
    for path in candidates:
        if os.path.isfile(path):
            return os.path.normpath(path)
    raise ImportError(
        "ferry_te: cannot find ferry.h (looked in %s); reinstall the ferry-transfer-engine wheel or set FERRY_HEADER"
        % ", ".join(os.path.normpath(p) for p in candidates))


def library_candidates():
    """Where libferry is looked for, in order: inside the installed package, $FERRY_LIBRARY,
    then the dynamic loader's own search (a system install). A generator: ctypes.util's
    find_library runs ldconfig and the compiler (~150 ms), so it is asked only when every
    earlier candidate failed."""
    yield os.path.join(_PKG_DIR, "lib", "libferry.so")
    env = os.environ.get("FERRY_LIBRARY")
    if env:
        yield env
    yield "libferry.so.0"
    import ctypes.util  # here: it imports subprocess and more (~20 ms)

    found = ctypes.util.find_library("ferry")
    if found:
        yield found


class _Loaded:
    def __init__(self):
        self.ffi = None
        self.lib = None
        self.library_path = None
        self.header_path = None
        self.lock = threading.Lock()


_loaded = _Loaded()


def _prebuilt_ffi(header_text):
    """The FFI the package was built with (tools/gen_ffi.py), when it was built from this very
    header; None otherwise (a source tree, FERRY_HEADER naming another copy)."""
    try:
        from . import _ffi_abi
    except ImportError:
        return None
    digest = hashlib.sha256(header_text.encode("utf-8")).hexdigest()
    return _ffi_abi.ffi if getattr(_ffi_abi, "HEADER_SHA256", None) == digest else None


def load():
    """(ffi, lib), loaded once."""
    if _loaded.lib is not None:
        return _loaded.ffi, _loaded.lib
    with _loaded.lock:
        if _loaded.lib is not None:
            return _loaded.ffi, _loaded.lib
        header = find_header()
        with open(header, encoding="utf-8") as f:
            text = f.read()
        ffi = _prebuilt_ffi(text)
        if ffi is None:
            import cffi  # here, so that the console commands work without it

            ffi = cffi.FFI()
            ffi.cdef(cdef_from_header(text))
        errors = []
        lib = None
        for candidate in library_candidates():
            if os.sep in candidate and not os.path.exists(candidate):
                errors.append("%s: no such file" % candidate)
                continue
            try:
                lib = ffi.dlopen(candidate)
            except OSError as e:
                errors.append("%s: %s" % (candidate, e))
                continue
            _loaded.library_path = os.path.abspath(candidate) if os.sep in candidate else candidate
            break
        if lib is None:
            raise ImportError("ferry_te: cannot load libferry:\n  " + "\n  ".join(errors))
        _loaded.header_path = header
        _loaded.ffi = ffi
        _loaded.lib = lib
        return ffi, lib


def library_path():
    load()
    return _loaded.library_path


def header_path():
    load()
    return _loaded.header_path
