"""What an Engine hands out: registered regions (Region, SharedBuffer), opened peers (Segment),
submitted transfers (Batch), and the engine state they share without a reference back to the
Engine object (its finalizer needs none)."""

import collections
import errno
import threading
import time
import weakref

from . import _capi
from ._failures import batch_failure
from ._memory import MEMORY_HOST, MEMORY_CUDA, MEMORY_ROCM, Span
from .errors import FerryError, InvalidArgument, error_for_code

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


OpStatus = collections.namedtuple("OpStatus", "state error transport message")
OpStatus.__doc__ = """One op of a batch: state ('pending', 'done' or 'failed'), error (negative
errno-style code when failed, else 0), the transport that carried it, and why it failed."""

RemoteRegion = collections.namedtuple("RemoteRegion", "address length kind device access")
RemoteRegion.__doc__ = """A region a peer registered: address and length in the peer, kind
('host', 'cuda', 'rocm'), GPU ordinal (-1 for host) and the access it allows
(REMOTE_READ | REMOTE_WRITE)."""


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
