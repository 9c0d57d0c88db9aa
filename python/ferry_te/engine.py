"""The Engine over the C API: configuration, registration, peers, notifications and transfers.
What it hands out (regions, segments, batches) is in _handles."""

import collections
import errno
import json
import os
import weakref

from . import _batch, _capi
from ._arrays import build_requests
from ._config import flatten_config
from ._memory import MEMORY_HOST, Span, resolve, parse_kind
from .errors import FerryError, InvalidArgument, Timeout
from ._notify import NotificationWaits, hand_over as _hand_over
from ._stats import EngineStats
from ._stream import StreamSubmits
from ._blocks import BlockTable, BlockTransfers, LOCAL_MEMORY  # noqa: F401
# Re-exported: the package, the Mooncake shim and users import these from here.
from ._handles import (OP_DONE, OP_FAILED, OP_PENDING, Batch, OpStatus, Region,  # noqa: F401
                       RemoteRegion, Segment, SharedBuffer, _EngineState, _check, _handle)

READ = 0
WRITE = 1
REMOTE_READ = 1
REMOTE_WRITE = 2


def version():
    """libferry's version string."""
    ffi, lib = _capi.load()
    return ffi.string(lib.ferry_version()).decode()


def plugin_report():
    """What `ferry-info --json` prints, as a dict: the search path, every plugin file found and
    what happened to it. FERRY_PLUGIN_PATH, FERRY_PLUGINS and FERRY_PLUGIN_TRUST apply."""
    ffi, lib = _capi.load()
    size = ffi.new("size_t *", 1 << 16)
    while True:
        buf = ffi.new("char[]", size[0])
        rc = lib.ferry_plugin_report_json(buf, size)
        if rc == 0:
            return json.loads(ffi.string(buf).decode("utf-8", "replace"))
        if rc != -errno.ENOSPC:  # ENOSPC: size now holds what is needed
            _check(rc, "ferry_plugin_report_json")


Notification = collections.namedtuple("Notification", "sender message")
Notification.__doc__ = "A notification a peer sent: its segment name and the message bytes."


class Request(collections.namedtuple("Request", "op local segment remote length transport")):
    """One transfer. op: ferry.READ (remote -> local) or ferry.WRITE (local -> remote) or the
    strings 'read'/'write'. local: a registered Region, an object register() accepts (a view of
    registered memory), or an int address. segment: from Engine.open_segment. remote: address in
    the peer (int, or a RemoteRegion). length: bytes (default: all of local). transport: force
    one transport (default: by priority)."""

    __slots__ = ()

    def __new__(cls, op, local, segment, remote, length=None, transport=None):
        return super().__new__(cls, op, local, segment, remote, length, transport)


class Engine(NotificationWaits, StreamSubmits, BlockTransfers, EngineStats):
    """A Ferry engine.

        Engine()                                       # defaults (docs/OPTIONS.md)
        Engine(local_ip="127.0.0.1", plugins="tcp", tcp__lanes=2)
        Engine({"tcp": {"lanes": 2}, "plugins": ["tcp", "shm"]})
        Engine.from_file("ferry.yaml", log_level="debug")

    Keyword names use '__' for '.', lists become comma lists (plugin_path: colon list). A
    context manager; close() (or garbage collection, or interpreter exit) destroys it and drops
    every registration."""

    def __init__(self, config=None, **keys):
        self._init(None, config, keys)

    @classmethod
    def from_file(cls, path, config=None, **keys):
        """Engine from a YAML file; `config` and keywords override its keys."""
        self = cls.__new__(cls)
        self._init(os.fspath(path), config, keys)
        return self

    def _init(self, path, config, keys):
        self._state = None
        flat = flatten_config(config, keys)
        ffi, lib = _capi.load()
        ckeys = [ffi.new("char[]", k.encode()) for k in flat]
        cvals = [ffi.new("char[]", v.encode()) for v in flat.values()]
        karr = ffi.new("const char *[]", ckeys) if ckeys else ffi.NULL
        varr = ffi.new("const char *[]", cvals) if cvals else ffi.NULL
        out = ffi.new("ferry_engine_t **")
        if path is None:
            _check(lib.ferry_engine_create(karr, varr, len(flat), out), "ferry_engine_create")
        else:
            _check(lib.ferry_engine_create_from_file(path.encode(), karr, varr, len(flat), out),
                   "ferry_engine_create_from_file")
        self._state = _EngineState(out[0])
        self._finalizer = weakref.finalize(self, _EngineState.close, self._state)
        self.config = flat

    # -- lifetime -------------------------------------------------------------------------
    def close(self):
        """Destroys the engine; registrations, segments and batches go with it."""
        if self._state is not None:
            self._finalizer()

    @property
    def closed(self):
        return self._state is None or self._state.closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        if self.closed:
            return "<ferry.Engine closed>"
        return "<ferry.Engine %s>" % self.segment_name

    # -- identity -------------------------------------------------------------------------
    @property
    def segment_name(self):
        """The name peers pass to open_segment ("ip:port" with P2PHANDSHAKE)."""
        ffi, lib = _capi.load()
        buf = ffi.new("char[]", 1024)
        _check(lib.ferry_engine_segment_name(_handle(self._state), buf, 1024),
               "ferry_engine_segment_name")
        return ffi.string(buf).decode()

    # -- memory ---------------------------------------------------------------------------
    def register(self, obj, access=None, *, device=None, kind=None):
        """Registers memory so this engine can move it and peers can reach it.

        obj: anything with the buffer protocol (bytearray, numpy array, memoryview, mmap), an
        object with __cuda_array_interface__ or data_ptr() (torch tensors: kind and device come
        from the tensor), or a raw (address, length[, device]) tuple where device is -1/'cpu',
        'cuda:N', 'rocm:N' or an int CUDA ordinal. access: REMOTE_READ | REMOTE_WRITE (default:
        both, or REMOTE_READ for read-only buffers). Returns a Region; the engine keeps it (and
        obj) alive until unregister()."""
        ffi, lib = _capi.load()
        span, access = _span_for(ffi, obj, access, device, kind)
        state = self._state
        with state.lock:
            rc = lib.ferry_register(_handle(state), ffi.cast("void *", span.address), span.length,
                                    span.kind, span.device, access)
            _check(rc, "ferry_register")
            region = Region(state, span, access)
            state.regions[span.address] = region
        return region

    def register_batch(self, objs, access=None, *, device=None, kind=None):
        """Registers every object as register() does (access, device and kind apply to each),
        all or none, in one C call that publishes them together: with etcd one transaction per
        ~100 chunks of 128 regions instead of one per region (KV caches of many blocks). Returns
        the Regions, in order. When one fails, none stays registered and the FerryError names it
        ("range 7 of 100 [0x..., +4096): ...")."""
        ffi, lib = _capi.load()
        spans = []
        for i, obj in enumerate(objs):
            try:
                spans.append(_span_for(ffi, obj, access, device, kind))
            except (TypeError, ValueError) as e:
                for span, _ in spans:
                    span.release(ffi)
                what = "register_batch: object %d: %s" % (i, getattr(e, "message", e))
                if isinstance(e, FerryError):
                    raise type(e)(e.code, what + "; nothing was registered", e.call) from e
                raise type(e)(what + "; nothing was registered") from e
        state = self._state
        with state.lock:
            rc = _batch.register_ranges(
                ffi, lib, _handle(state), [s.address for s, _ in spans], [s.length for s, _ in spans],
                [s.kind for s, _ in spans], [s.device for s, _ in spans], [a for _, a in spans])
            if rc != 0:
                for span, _ in spans:
                    span.release(ffi)
                _check(rc, "ferry_register_batch")
            regions = [Region(state, span, a) for span, a in spans]
            for region in regions:
                state.regions[region.address] = region
        return regions

    def alloc_shared(self, length, access=None):
        """Allocates `length` bytes (rounded up to pages) of host memory to share and registers
        it (access: REMOTE_READ | REMOTE_WRITE by default): a sealed memfd that shm.so hands to
        authorised peers on this host, which then copy with memcpy instead of cross-memory
        attach. Returns a SharedBuffer; free() it (not unregister through the address)."""
        ffi, lib = _capi.load()
        if access is None:
            access = REMOTE_READ | REMOTE_WRITE
        if int(length) <= 0:
            raise InvalidArgument(-errno.EINVAL, "alloc_shared: length must be > 0", "alloc_shared")
        out = ffi.new("void **")
        state = self._state
        with state.lock:
            _check(lib.ferry_alloc_shared(_handle(state), int(length), access, out), "ferry_alloc_shared")
            address = int(ffi.cast("uintptr_t", out[0]))
            page = os.sysconf("SC_PAGE_SIZE")
            span = resolve(ffi, (address, (int(length) + page - 1) // page * page))
            buf = SharedBuffer(state, span, access)
            state.regions[address] = buf
        return buf

    def unregister(self, what):
        """Unregisters a Region, the object that was registered, or a start address."""
        if isinstance(what, Region):
            what.unregister()
            return
        state = self._state
        with state.lock:
            address = _address_of(state, what)
            region = state.regions.get(address)
            if region is not None:
                region.unregister()
                return
            ffi, lib = _capi.load()
            _check(lib.ferry_unregister(_handle(state), ffi.cast("void *", address)),
                   "ferry_unregister")

    def unregister_batch(self, items):
        """Unregisters Regions, registered objects or start addresses (as unregister() takes
        them), all or none, in one C call that publishes it together. Regions already
        unregistered are skipped. When one address is not where a region starts (or comes
        twice), nothing is unregistered and the FerryError names it. SharedBuffers are freed
        with their free(), not here."""
        state = self._state
        ffi, lib = _capi.load()
        with state.lock:
            addresses = []
            owners = None  # id(registered object) -> its address, made on first need
            for what in items:
                if isinstance(what, Region) and not what.registered:
                    continue
                if owners is None and not isinstance(what, (Region, int)):
                    owners = {id(r.obj): r.address for r in state.regions.values() if r.obj is not None}
                address = _address_of(state, what, owners)
                if isinstance(state.regions.get(address), SharedBuffer):
                    raise InvalidArgument(-errno.EINVAL, "unregister_batch: %r is a SharedBuffer; "
                                          "free() it" % (what,), "unregister_batch")
                addresses.append(address)
            _check(_batch.unregister_addresses(ffi, lib, _handle(state), addresses),
                   "ferry_unregister_batch")
            for address in addresses:
                region = state.regions.pop(address, None)
                if region is not None:
                    region._registered = False
                    region._span.release(ffi)

    @property
    def regions(self):
        """The Regions registered now."""
        with self._state.lock:
            return list(self._state.regions.values())

    # -- peers ----------------------------------------------------------------------------
    def open_segment(self, name):
        """Opens a peer's segment by name (its engine's segment_name)."""
        ffi, lib = _capi.load()
        out = ffi.new("ferry_segment_id_t *")
        _check(lib.ferry_open_segment(_handle(self._state), str(name).encode(), out),
               "ferry_open_segment")
        return Segment(self._state, int(out[0]), str(name))

    def segment_regions(self, segment):
        """The regions a peer has registered (see Segment.regions)."""
        if not isinstance(segment, Segment):
            segment = Segment(self._state, int(segment), str(segment))
        return segment.regions()

    # -- notifications --------------------------------------------------------------------
    def send_notification(self, segment, message):
        """Sends bytes (at most 1 MiB) to the engine of an open segment (a Segment or its id);
        returns once that engine has queued them. Sent after a completed WRITE, it arrives after
        the written bytes are visible there."""
        ffi, lib = _capi.load()
        data = bytes(message)
        _check(lib.ferry_send_notification(_handle(self._state), int(segment), data, len(data)),
               "ferry_send_notification")

    def take_notifications(self):
        """Drains the notifications peers sent so far, oldest first: a list of Notification
        (sender segment name, message bytes)."""
        ffi, lib = _capi.load()
        out = ffi.new("ferry_notification_t **")
        count = ffi.new("size_t *")
        _check(lib.ferry_take_notifications(_handle(self._state), out, count),
               "ferry_take_notifications")
        return _hand_over(ffi, lib, out, count)

    # -- transfers ------------------------------------------------------------------------
    def submit(self, requests):
        """Submits Requests (or tuples in Request's field order) without blocking; returns a
        Batch."""
        ffi, lib = _capi.load()
        reqs = [r if isinstance(r, Request) else Request(*r) for r in requests]
        if not reqs:
            raise InvalidArgument(-22, "no requests to submit", "submit")
        arr = ffi.new("ferry_request_t[]", len(reqs))
        keep = []
        for i, r in enumerate(reqs):
            self._fill(ffi, arr[i], r, keep)
        out = ffi.new("ferry_batch_id_t *")
        _check(lib.ferry_submit(_handle(self._state), arr, len(reqs), out), "ferry_submit")
        return Batch(self._state, int(out[0]), len(reqs), keep)

    def submit_arrays(self, op, segment, local, remote, lengths, *, local_base=0, remote_base=0,
                      transport=None):
        """Submits len(local) ops in one C call, no Python object per op: op (READ, WRITE,
        'read', 'write') for all; local/remote: arrays (numpy, array('Q'), uint64 buffers, lists
        of ints) of addresses, or offsets added to local_base (int or Region) / remote_base;
        lengths: an array or one int. Returns a Batch. docs/MOONCAKE.md has the figures."""
        ffi, lib = _capi.load()
        reqs, n, keep = build_requests(op, segment, local, remote, lengths, local_base,
                                       remote_base, transport)
        out = ffi.new("ferry_batch_id_t *")
        _check(lib.ferry_submit(_handle(self._state), reqs, n, out), "ferry_submit")
        return Batch(self._state, int(out[0]), n, keep)

    def transfer(self, requests, timeout=None):
        """Submits, waits (raising the first failure) and frees."""
        with self.submit(requests) as batch:
            batch.wait(timeout)

    def read(self, local, segment, remote, length=None, *, transport=None, timeout=None):
        """Copies `length` bytes (default: all of local) from `remote` in the peer into local
        memory, and returns when they are there. Raises a FerryError on failure."""
        self.transfer([Request(READ, local, segment, remote, length, transport)], timeout)

    def write(self, local, segment, remote, length=None, *, transport=None, timeout=None):
        """Copies local memory to `remote` in the peer, and returns once the bytes are in the
        peer's memory. Raises a FerryError on failure."""
        self.transfer([Request(WRITE, local, segment, remote, length, transport)], timeout)

    def _fill(self, ffi, c, r, keep):
        op = r.op
        if isinstance(op, str):
            op = {"read": READ, "write": WRITE}.get(op.lower())
        if op not in (READ, WRITE):
            raise InvalidArgument(-22, "op must be ferry.READ, ferry.WRITE, 'read' or 'write'",
                                  "submit")
        local = r.local
        if isinstance(local, Region):
            span = local._span
        elif isinstance(local, int):
            if r.length is None:
                raise InvalidArgument(-22, "a request with an int local address needs a length",
                                      "submit")
            span = Span(local, r.length)
        else:
            span = resolve(ffi, local)
        length = span.length if r.length is None else int(r.length)
        if length <= 0 or length > span.length:
            raise InvalidArgument(-22, "length %d does not fit the local buffer of %d bytes"
                                  % (length, span.length), "submit")
        if op == READ and span.readonly:
            raise InvalidArgument(-22, "cannot READ into a read-only buffer", "submit")
        remote = r.remote
        remote = getattr(remote, "address", remote)
        keep.append(span)
        c.opcode = op
        c.reserved = 0
        c.local_addr = ffi.cast("void *", span.address)
        c.segment = int(r.segment)
        c.remote_addr = int(remote)
        c.length = length
        if r.transport:
            t = ffi.new("char[]", str(r.transport).encode())
            keep.append(t)
            c.transport = t
        else:
            c.transport = ffi.NULL


def _device_override(device, kind, span):
    from ._memory import parse_device
    k, ordinal = parse_device(device, kind if kind is not None else
                              (span.kind if span.kind != MEMORY_HOST else None))
    return k, ordinal


def _span_for(ffi, obj, access, device, kind):
    """(Span, access) for what register() takes: access defaults to what the buffer allows."""
    span = resolve(ffi, obj, device=device, kind=kind)
    if device is not None and not isinstance(obj, tuple):
        span.kind, span.device = _device_override(device, kind, span)
    if access is None:
        access = REMOTE_READ if span.readonly else (REMOTE_READ | REMOTE_WRITE)
    if span.readonly and access & REMOTE_WRITE:
        raise InvalidArgument(-22, "a read-only buffer cannot be registered with REMOTE_WRITE",
                              "register")
    return span, access


def _address_of(state, what, owners=None):
    """The start address unregister() means by `what`: a Region's, an int, the registered
    object's (found by identity; `owners` maps id(object) to its address when given), or what
    resolve() makes of it."""
    if isinstance(what, Region):
        return what.address
    if isinstance(what, int):
        return what
    if owners is not None:
        if id(what) in owners:
            return owners[id(what)]
    else:
        for r in state.regions.values():
            if r.obj is what:
                return r.address
    ffi, _ = _capi.load()
    return resolve(ffi, what).address


__all__ = [
    "Engine", "Region", "Segment", "Batch", "Request", "OpStatus", "RemoteRegion", "READ",
    "WRITE", "REMOTE_READ", "REMOTE_WRITE", "version", "plugin_report", "parse_kind",
]
