"""Engine methods that report what the data path did (ferry_stats, C API version 7; per rail,
ferry_rail_stats, version 8) and where the Prometheus endpoint listens (engine key metrics_port).
Engine inherits them."""

import errno

from . import _capi
from ._handles import _check, _handle
from .errors import FerryError


def _op(c, bounds):
    buckets = [int(c.latency_buckets[k]) for k in range(len(bounds) + 1)]
    return {
        "done": int(c.done),
        "failed": int(c.failed),
        "bytes": int(c.bytes),
        "latency_sum_seconds": float(c.latency_sum_seconds),
        # Not cumulative: latency_buckets[k] counts ops in (bounds[k-1], bounds[k]], the last
        # one those above bounds[-1].
        "latency_buckets": buckets,
    }


_RAIL_FIELDS = ("read_bytes", "write_bytes", "completed", "failures", "pauses", "paused_peers", "queued_bytes")


def _rails(ffi, lib, handle):
    """{transport: {rail: {...}}} from ferry_rail_stats; {} from a libferry older than version 8."""
    if not hasattr(lib, "ferry_rail_stats"):
        return {}
    n = ffi.new("size_t *", 16)
    while True:
        rails = ffi.new("ferry_engine_rail_stats_t[]", n[0])
        rc = lib.ferry_rail_stats(handle, rails, n)
        if rc != -errno.ENOSPC:
            break
    _check(rc, "ferry_rail_stats")
    out = {}
    for r in rails[0:n[0]]:
        entry = {name: int(getattr(r, name)) for name in _RAIL_FIELDS}
        entry["throughput"] = float(r.throughput)
        out.setdefault(ffi.string(r.transport).decode(), {})[ffi.string(r.rail).decode()] = entry
    return out


class EngineStats:
    def stats(self):
        """What the data path did since the engine started (counts only grow):
        {"batches", "segments_open", "staging": {...}, "latency_bounds_seconds": [...],
        "transports": {"tcp": {"read": {"done", "failed", "bytes", "latency_sum_seconds",
        "latency_buckets"}, "write": {...}, "peers", "failovers", "pauses", "paused_paths",
        "rails": {...}}, ..., "none": ops no transport took}}. failovers: ops that failed on the
        transport and were posted again on another path; pauses: times one of its paths was paused;
        paused_paths: paused now. rails: per local rail of the transport (tcp.rails' addresses, or
        bind_ip; rdma's NICs), summed over peers: {"10.0.1.2": {"read_bytes", "write_bytes",
        "completed", "failures", "pauses", "paused_peers", "queued_bytes", "throughput"}}; empty
        for transports without rails (docs/METRICS.md)."""
        ffi, lib = _capi.load()
        _need(lib, "ferry_stats")
        out = ffi.new("ferry_engine_stats_t *")
        n = ffi.new("size_t *", 8)
        while True:
            transports = ffi.new("ferry_transport_stats_t[]", n[0])
            rc = lib.ferry_stats(_handle(self._state), out, transports, n)
            if rc != -errno.ENOSPC:
                break
        _check(rc, "ferry_stats")
        bounds_ptr = lib.ferry_latency_bounds()
        nb = len(ffi.new("ferry_op_stats_t *").latency_buckets) - 1
        bounds = [float(bounds_ptr[k]) for k in range(nb)]
        st = out.staging
        rails = _rails(ffi, lib, _handle(self._state))
        return {
            "batches": int(out.batches),
            "segments_open": int(out.segments_open),
            "staging": {name: int(getattr(st, name)) for name in (
                "max_bytes", "slice_bytes", "lent_bytes", "peak_lent_bytes", "acquire_refused", "copies",
                "copy_failures")},
            "latency_bounds_seconds": bounds,
            "transports": {
                ffi.string(t.transport).decode(): {
                    "read": _op(t.read, bounds), "write": _op(t.write, bounds), "peers": int(t.peers),
                    "failovers": int(t.failovers), "pauses": int(t.pauses), "paused_paths": int(t.paused_paths),
                    "rails": rails.get(ffi.string(t.transport).decode(), {})}
                for t in transports[0:n[0]]},
        }

    @property
    def metrics_address(self):
        """"127.0.0.1:9100" where the Prometheus endpoint listens, or "" when metrics_port is
        not set."""
        ffi, lib = _capi.load()
        _need(lib, "ferry_metrics_address")
        return ffi.string(lib.ferry_metrics_address(_handle(self._state))).decode()


def _need(lib, name):
    """A clear error instead of AttributeError when libferry predates C API version 7."""
    if not hasattr(lib, name):
        raise FerryError(-errno.ENOSYS, "this libferry has no %s (C API version 7); upgrade it" % name, name)
