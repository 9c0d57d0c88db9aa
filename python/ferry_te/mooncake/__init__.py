"""Mooncake's Python transfer engine API over Ferry: for SGLang's and vLLM's Mooncake
connectors, change

    from mooncake.engine import TransferEngine

into

    from ferry_te.mooncake import TransferEngine

and nothing else. docs/MOONCAKE.md says what maps to what, and what differs."""

from ._engine import TransferEngine
from ._notify import TransferNotify
from ._setup import P2PHANDSHAKE, PROTOCOLS
from ._types import TransferOpcode

# pybind11's export_values(): the enum members at module level too.
Read = TransferOpcode.Read
Write = TransferOpcode.Write

# Mooncake's SUPPORT_* flags, by what this Ferry install can load (computed when first read).
_SUPPORT_PLUGINS = {
    "SUPPORT_EFA": ("efa",), "SUPPORT_HIP": ("hip_ipc",), "SUPPORT_INTRA_NVLINK": ("cuda_ipc",),
    "SUPPORT_CUDA": ("cuda_ipc",), "SUPPORT_MNNVL": (), "SUPPORT_MUSA": (),
}


def __getattr__(name):
    if name not in _SUPPORT_PLUGINS:
        raise AttributeError("module %r has no attribute %r" % (__name__, name))
    wanted = _SUPPORT_PLUGINS[name]
    value = False
    if wanted:
        from ..engine import plugin_report
        try:
            value = any(p.get("name") in wanted and p.get("state") == "loaded"
                        for p in plugin_report().get("plugins", []))
        except Exception:  # a report that cannot be read means: not supported here
            value = False
    globals()[name] = value
    return value


__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify", "Read", "Write",
           "P2PHANDSHAKE", "PROTOCOLS"] + sorted(_SUPPORT_PLUGINS)
