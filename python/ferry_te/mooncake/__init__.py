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


def install_as_mooncake():
    """Makes `import mooncake.engine` (and `from mooncake.engine import TransferEngine`) give
    this module, for code that cannot be edited: call it before that code imports Mooncake
    (e.g. from sitecustomize.py). Refuses when the real Mooncake package is importable, so
    that the two are never mixed in one process."""
    import importlib.util
    import sys
    real = sys.modules.get("mooncake")
    if real is None:
        try:
            spec = importlib.util.find_spec("mooncake")
        except (ImportError, ValueError):
            spec = None
        if spec is not None:
            raise ImportError("install_as_mooncake: the real Mooncake package is installed "
                              "(%s); uninstall it or import ferry_te.mooncake directly"
                              % (spec.origin or spec.submodule_search_locations))
    elif real is not sys.modules[__name__] and getattr(real, "__ferry_alias__", None) is None:
        raise ImportError("install_as_mooncake: Mooncake is already imported (%r)" % real)
    import types
    package = types.ModuleType("mooncake", "ferry_te.mooncake standing in for Mooncake")
    package.__path__ = []
    package.__ferry_alias__ = True
    package.engine = sys.modules[__name__]
    sys.modules["mooncake"] = package
    sys.modules["mooncake.engine"] = sys.modules[__name__]


__all__ = ["TransferEngine", "TransferOpcode", "TransferNotify", "Read", "Write",
           "P2PHANDSHAKE", "PROTOCOLS", "install_as_mooncake"] + sorted(_SUPPORT_PLUGINS)
