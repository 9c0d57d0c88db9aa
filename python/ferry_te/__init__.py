"""Ferry: move bytes between the host and GPU memory of processes, over pluggable transports.

    import numpy as np, ferry_te as ferry
    with ferry.Engine(local_ip="127.0.0.1") as target, ferry.Engine() as engine:
        remote = np.arange(1 << 20, dtype=np.uint8)
        target.register(remote)
        local = np.zeros_like(remote)
        engine.register(local)
        seg = engine.open_segment(target.segment_name)
        engine.read(local, seg, remote.ctypes.data)
        assert (local == remote).all()

The bindings load libferry's C API (ferry.h) through cffi in ABI mode."""

import importlib.util as _util
import os as _os
import sys as _sys

# cffi is a dependency, but `pip install --no-deps` and images without it (NVIDIA's PyTorch
# image) exist: say so here, not as a bare ModuleNotFoundError inside Engine(). The console
# commands (ferry-info, transfer_engine_bench, ferry-nixl-dir and `python3 -m ferry_te.nixl`)
# only exec bundled binaries or print paths, and work without it.
if _util.find_spec("cffi") is None and _os.path.basename(_sys.argv[0] if _sys.argv else "") not in (
        "ferry-info", "transfer_engine_bench", "ferry-nixl-dir", "-m"):
    raise ImportError(
        "ferry_te needs cffi, which %s cannot import: install it with `%s -m pip install "
        "'cffi>=1.15'` (or Debian/Ubuntu's python3-cffi for the system Python)"
        % (_sys.executable, _sys.executable), name="cffi")

from .engine import (Batch, BlockTable, Engine, LOCAL_MEMORY, Notification, OpStatus, Region,
                     RemoteRegion, Request, Segment, SharedBuffer, READ, REMOTE_READ, REMOTE_WRITE, WRITE,
                     plugin_report, version)
from .errors import (AlreadyExists, BadAddress, Busy, Canceled, ConnectionFailed, FerryError,
                     InvalidArgument, NotFound, OutOfMemory, PermissionDenied, ProtocolError,
                     Timeout, Unsupported, WaitTimeout)
from ._memory import MEMORY_CUDA, MEMORY_HOST, MEMORY_ROCM
from . import _capi

try:
    from ._version import __version__
except ImportError:  # the source tree, not an installed package
    __version__ = "0+source"


def library_path():
    """The libferry this package loaded."""
    return _capi.library_path()


def package_root():
    """The installed package directory: lib/ (libferry, lib/ferry/plugins/), bin/, include/."""
    import os
    return os.path.dirname(os.path.abspath(__file__))


__all__ = [
    "Engine", "Region", "SharedBuffer", "Segment", "Batch", "BlockTable", "LOCAL_MEMORY", "Request", "OpStatus", "RemoteRegion", "Notification",
    "READ", "WRITE", "REMOTE_READ", "REMOTE_WRITE", "MEMORY_HOST", "MEMORY_CUDA", "MEMORY_ROCM",
    "FerryError", "InvalidArgument", "BadAddress", "NotFound", "AlreadyExists", "PermissionDenied",
    "Busy", "Timeout", "WaitTimeout", "ConnectionFailed", "Unsupported", "OutOfMemory",
    "ProtocolError", "Canceled", "version", "plugin_report", "library_path", "package_root",
]
