"""Engine, registered regions, segments and batches over the C API."""

import collections
import errno
import json
import os
import threading
import time
import weakref

from . import _batch, _capi
from ._arrays import build_requests
from ._failures import batch_failure
from ._config import flatten_config
from ._memory import MEMORY_HOST, MEMORY_CUDA, MEMORY_ROCM, Span, resolve, parse_kind
from .errors import FerryError, InvalidArgument, Timeout, error_for_code
from ._notify import NotificationWaits, hand_over as _hand_over

READ = 0
WRITE = 1
REMOTE_READ = 1
REMOTE_WRITE = 2

OP_PENDING = 0
OP_DONE = 1
OP_FAILED = 2

_STATE_NAMES = {OP_PENDING: "pending", OP_DONE: "done", OP_FAILED: "failed"}
_KIND_NAMES = {MEMORY_HOST: "host", MEMORY_CUDA: "cuda", MEMORY_ROCM: "rocm"}

# How long one ferry_wait_batch call may block, so that Ctrl-C reaches Python between calls.
_WAIT_SLICE_MS = 200


def _check(rc, call):
    """Raises the FerryError for a failed C call, with the C library's message."""
    if rc == 0:
        return
    ffi, lib = _capi.load()
    message = ffi.string(lib.ferry_last_error()).decode("utf-8", "replace")
    raise error_for_code(rc, message, call)


def version():
    """libferry's version string."""
    ffi, lib = _capi.load()
    return ffi.string(lib.ferry_version()).decode()


def plugin_report():
    """What `ferry-info --json` prints, as a dict: the search path, every plugin file found and
    what happened to it. FERRY_PLUGIN_PATH and FERRY_PLUGINS apply."""
    ffi, lib = _capi.load()
    size = ffi.new("size_t *", 1 << 16)
    while True:
        buf = ffi.new("char[]", size[0])
        rc = lib.ferry_plugin_report_json(buf, size)
        if rc == 0:
            return json.loads(ffi.string(buf).decode("utf-8", "replace"))
        if rc != -errno.ENOSPC:  # ENOSPC: size now holds what is needed
            _check(rc, "ferry_plugin_report_json")


OpStatus = collections.namedtuple("OpStatus", "state error transport message")
OpStatus.__doc__ = """One op of a batch: state ('pending', 'done' or 'failed'), error (negative
errno-style code when failed, else 0), the transport that carried it, and why it failed."""

RemoteRegion = collections.namedtuple("RemoteRegion", "address length kind device access")
RemoteRegion.__doc__ = """A region a peer registered: address and length in the peer, kind
('host', 'cuda', 'rocm'), GPU ordinal (-1 for host) and the access it allows
(REMOTE_READ | REMOTE_WRITE)."""


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


class _EngineState:
    """What the finalizer needs: no reference back to the Engine object."""

    def __init__(self, handle):
        self.handle = handle
        self.lock = threading.RLock()
        self.regions = {}  # address -> Region (keeps the memory alive while registered)
        self.batches = weakref.WeakSet()
        self.closed = False

    def close(self):
        with self.lock:
            if self.closed:
                return
            self.closed = True
            handle, self.handle = self.handle, None
            regions, self.regions = self.regions, {}
        ffi, lib = _capi.load()
        # Batches still in flight finish or fail inside destroy; nothing is freed twice.
        for b in list(self.batches):
            b._freed = True
        lib.ferry_engine_destroy(handle)
        for r in regions.values():
            r._registered = False
            r._span.release(ffi)


class Region:
    """Memory registered with an engine. Keeps the registered object alive until unregister()
    (or the engine's close). A context manager that unregisters on exit."""

    def __init__(self, state, span, access):
        self._state = state
        self._span = span
        self.access = access
        self._registered = True

    address = property(lambda self: self._span.address, doc="start address")
    length = property(lambda self: self._span.length, doc="bytes")
    device = property(lambda self: self._span.device, doc="GPU ordinal, -1 for host memory")
    kind = property(lambda self: _KIND_NAMES.get(self._span.kind, "?"),
                    doc="'host', 'cuda' or 'rocm'")
    obj = property(lambda self: self._span.owner, doc="the registered object (None for raw)")
    registered = property(lambda self: self._registered)

    def __len__(self):
        return self.length

    def view(self, offset=0, length=None):
        """A sub-range usable as the local side of a request."""
        if length is None:
            length = self.length - offset
        if offset < 0 or length <= 0 or offset + length > self.length:
            raise ValueError("range [%d, %d) is outside the region of %d bytes"
                             % (offset, offset + length, self.length))
        s = self._span
        return Span(s.address + offset, length, s.kind, s.device, s.readonly, owner=self)

    def unregister(self):
        """Unregisters; a second call does nothing."""
        state = self._state
        with state.lock:
            if not self._registered or state.closed:
                self._registered = False
                return
            ffi, lib = _capi.load()
            self._release(state, ffi, lib)
            self._registered = False
            state.regions.pop(self.address, None)

    def _release(self, state, ffi, lib):
        _check(lib.ferry_unregister(state.handle, ffi.cast("void *", self.address)), "ferry_unregister")
        self._span.release(ffi)

    close = unregister

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.unregister()

    def __repr__(self):
        return "<ferry.Region %#x+%d %s%s%s>" % (
            self.address, self.length, self.kind,
            "" if self.device < 0 else ":%d" % self.device,
            "" if self._registered else " unregistered")


class SharedBuffer(Region):
    """Host memory the engine allocated to share (Engine.alloc_shared): a sealed memfd that
    shm.so hands to authorised peers on this host, so their transfers into it are one memcpy.
    A Region (view(), address, length) whose free() (or unregister/close/exit) unmaps it:
    never use its memory after that."""

    def memoryview(self):
        """The buffer's bytes, writable; valid until free()."""
        ffi, _ = _capi.load()
        return memoryview(ffi.buffer(ffi.cast("char *", self.address), self.length))

    def _release(self, state, ffi, lib):
        """Unregisters and unmaps (ferry_free_shared)."""
        _check(lib.ferry_free_shared(state.handle, ffi.cast("void *", self.address)), "ferry_free_shared")

    free = close = Region.unregister


class Segment:
    """A peer's memory, opened by name. int(segment) is the C segment id."""

    def __init__(self, state, segment_id, name):
        self._state = state
        self.id = segment_id
        self.name = name
        self._open = True

    def __int__(self):
        return self.id

    __index__ = __int__

    def regions(self):
        """The regions the peer has registered, re-read from its metadata."""
        state = self._state
        ffi, lib = _capi.load()
        if not hasattr(lib, "ferry_segment_regions"):
            raise FerryError(-errno.ENOSYS, "this libferry has no ferry_segment_regions", "regions")
        count = ffi.new("size_t *", 16)
        while True:
            n = count[0]
            out = ffi.new("ferry_remote_region_t[]", max(n, 1))
            rc = lib.ferry_segment_regions(_handle(state), self.id, out, count)
            if rc == 0:
                return [RemoteRegion(int(r.addr), int(r.length),
                                     _KIND_NAMES.get(r.memory_kind, "?"), int(r.device),
                                     int(r.access)) for r in out[0:count[0]]]
            if rc != -errno.ENOSPC or count[0] <= n:
                _check(rc, "ferry_segment_regions")

    def close(self):
        state = self._state
        with state.lock:
            if not self._open or state.closed:
                self._open = False
                return
            ffi, lib = _capi.load()
            _check(lib.ferry_close_segment(state.handle, self.id), "ferry_close_segment")
            self._open = False

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return "<ferry.Segment %r id=%d>" % (self.name, self.id)


def _handle(state):
    if state.closed:
        raise FerryError(-errno.EBADF, "the engine is closed", None)
    return state.handle


def _free_batch(state, batch_id, flag):
    """Finalizer of a Batch nobody freed. Never blocks: a batch still in flight stays with the
    engine (its local memory is registered, so the engine keeps it alive) until destroy."""
    with state.lock:
        if flag[0] or state.closed:
            return
        ffi, lib = _capi.load()
        if lib.ferry_free_batch(state.handle, batch_id) == 0:
            flag[0] = True


class Batch:
    """Transfers submitted together. poll() drives progress without blocking; wait() blocks and
    raises the first failure; statuses gives each op. Free it with free() or a with-block (which
    waits for the ops before freeing)."""

    def __init__(self, state, batch_id, count, keep):
        self._state = state
        self.id = batch_id
        self.count = count
        self._keep = keep  # the objects requests point into, alive while in flight
        self._flag = [False]  # freed
        self._checked = False
        self._finalizer = weakref.finalize(self, _free_batch, state, batch_id, self._flag)
        state.batches.add(self)

    @property
    def _freed(self):
        return self._flag[0]

    @_freed.setter
    def _freed(self, value):
        self._flag[0] = value
        if value:
            self._finalizer.detach()

    def __len__(self):
        return self.count

    def status(self, index):
        if self._freed:
            raise InvalidArgument(-errno.EINVAL, "batch %d was freed" % self.id, "status")
        ffi, lib = _capi.load()
        st = ffi.new("ferry_op_status_t *")
        _check(lib.ferry_get_status(_handle(self._state), self.id, index, st), "ferry_get_status")
        return OpStatus(_STATE_NAMES.get(st.state, str(st.state)), int(st.error),
                        ffi.string(st.transport).decode("utf-8", "replace"),
                        ffi.string(st.message).decode("utf-8", "replace"))

    @property
    def statuses(self):
        """Each op's OpStatus, queried now (this also drives progress)."""
        return [self.status(i) for i in range(self.count)]

    def poll(self):
        """True once every op is done or failed; never blocks."""
        return all(s.state != "pending" for s in self.statuses)

    def wait(self, timeout=None):
        """Blocks until every op finished, or `timeout` seconds (None: no limit) pass. Raises
        the first failed op's error (a FerryError with the C message; ferry.Timeout when that
        op timed out), or ferry.WaitTimeout when `timeout` passes first with ops still in flight
        (the batch stays valid)."""
        if self._freed:
            raise InvalidArgument(-errno.EINVAL, "batch %d was freed" % self.id, "wait")
        ffi, lib = _capi.load()
        deadline = None if timeout is None else time.monotonic() + timeout
        self._checked = True
        while True:
            slice_ms = _WAIT_SLICE_MS
            if deadline is not None:
                left = deadline - time.monotonic()
                slice_ms = max(0, min(slice_ms, int(left * 1000)))
            # -EINPROGRESS is only "this slice passed"; an op's own failure (-ETIMEDOUT too)
            # is a different code and ends the wait.
            rc = lib.ferry_wait_batch(_handle(self._state), self.id, slice_ms)
            if rc == -errno.EINPROGRESS and (deadline is None or time.monotonic() < deadline):
                continue
            if rc not in (0, -errno.EINPROGRESS):
                raise batch_failure(self, rc)  # how many ops failed, and the first few
            _check(rc, "ferry_wait_batch")
            return

    def free(self):
        """Releases the batch; raises ferry.Busy while ops are in flight. Twice is harmless."""
        if self._freed or self._state.closed:
            self._freed = True
            return
        ffi, lib = _capi.load()
        _check(lib.ferry_free_batch(self._state.handle, self.id), "ferry_free_batch")
        self._freed = True
        self._keep = None

    def __enter__(self):
        return self

    def __exit__(self, exc_type, exc, tb):
        """Without an exception: waits (raising a failure nobody has seen yet) and frees. With
        one (a wait() timed out, say): frees if the ops are finished, else leaves the batch to
        the engine rather than block."""
        if self._freed:
            return
        if exc_type is not None:
            self._free_quietly()
            return
        seen = self._checked
        try:
            self.wait()
        except FerryError:
            self._free_quietly()
            if not seen:
                raise
            return
        self.free()

    def _free_quietly(self):
        try:
            self.free()
        except FerryError:
            pass

    def __repr__(self):
        return "<ferry.Batch id=%d ops=%d%s>" % (self.id, self.count, " freed" if self._freed else "")


class Engine(NotificationWaits):
    """A Ferry engine.

        Engine()                                       # defaults (README "Configuration")
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
