"""Engine methods to wait for notifications (blocking, through a pollable descriptor, in
asyncio) and to attach one to a batch (C API version 3). Engine inherits them."""

import errno
import time

from . import _capi
from ._handles import _WAIT_SLICE_MS, Batch, _check, _handle
from .errors import FerryError, InvalidArgument


def _engine():
    from . import engine  # engine imports this module: resolved at call time
    return engine


class NotificationWaits:
    """Mixed into Engine (self._state, self._fill and take_notifications are Engine's)."""

    def wait_notifications(self, timeout=None):
        """As take_notifications, but blocks until at least one notification is queued and
        returns as soon as one is (a non-empty list, oldest first); returns [] once `timeout`
        seconds (None: no limit) passed with none. Ctrl-C gets through while it waits."""
        ffi, lib = _capi.load()
        _need(lib, "ferry_wait_notifications")
        deadline = None if timeout is None else time.monotonic() + timeout
        out = ffi.new("ferry_notification_t **")
        count = ffi.new("size_t *")
        while True:
            slice_ms = _WAIT_SLICE_MS
            if deadline is not None:
                slice_ms = max(0, min(slice_ms, int((deadline - time.monotonic()) * 1000)))
            rc = lib.ferry_wait_notifications(_handle(self._state), slice_ms, out, count)
            if rc == -errno.EINPROGRESS:
                if deadline is None or time.monotonic() < deadline:
                    continue
                return []
            _check(rc, "ferry_wait_notifications")
            return hand_over(ffi, lib, out, count)

    def notification_fd(self):
        """A file descriptor that is readable exactly while notifications are queued
        (level-triggered), for selectors, select.poll or asyncio's loop.add_reader; take them
        with take_notifications(), which makes it unreadable again. The engine owns it: never
        read or close it; it is valid until the engine is closed."""
        ffi, lib = _capi.load()
        _need(lib, "ferry_notification_fd")
        fd = ffi.new("int *")
        _check(lib.ferry_notification_fd(_handle(self._state), fd), "ferry_notification_fd")
        return int(fd[0])

    async def wait_notifications_async(self, timeout=None):
        """asyncio: awaits until notifications are queued and returns them (a non-empty list),
        or [] after `timeout` seconds, without blocking the event loop (loop.add_reader on
        notification_fd()). One waiter per engine at a time: asyncio keeps one reader per fd."""
        import asyncio
        loop = asyncio.get_running_loop()
        fd = self.notification_fd()
        deadline = None if timeout is None else loop.time() + timeout
        while True:
            got = self.take_notifications()
            if got:
                return got
            ready = loop.create_future()
            loop.add_reader(fd, lambda: ready.done() or ready.set_result(None))
            try:
                left = None if deadline is None else deadline - loop.time()
                if left is not None and left <= 0:
                    return []
                await asyncio.wait_for(ready, left)
            except asyncio.TimeoutError:
                return self.take_notifications()
            finally:
                loop.remove_reader(fd)

    def submit_with_notification(self, requests, segment, message):
        """As submit(), plus `message` (bytes, at most 1 MiB) that the engine sends as a
        notification to the engine of `segment` (a Segment or its id) once every op of the batch
        succeeded: it arrives there after all the batch's WRITEs are in its memory. When an op
        fails it is not sent; Batch.wait() raises that failure (its message ends "the batch's
        notification was not sent"). wait() returns only after the notification was delivered,
        and raises when every op succeeded but delivering failed (e.g. ferry.FerryError with
        ENOBUFS: the target's queue is full)."""
        ffi, lib = _capi.load()
        _need(lib, "ferry_submit_with_notification")
        e = _engine()
        reqs = [r if isinstance(r, e.Request) else e.Request(*r) for r in requests]
        if not reqs:
            raise InvalidArgument(-22, "no requests to submit", "submit_with_notification")
        arr = ffi.new("ferry_request_t[]", len(reqs))
        keep = []
        for i, r in enumerate(reqs):
            self._fill(ffi, arr[i], r, keep)
        data = bytes(message)
        out = ffi.new("ferry_batch_id_t *")
        _check(lib.ferry_submit_with_notification(_handle(self._state), arr, len(reqs), int(segment),
                                                    data, len(data), out),
                 "ferry_submit_with_notification")
        return Batch(self._state, int(out[0]), len(reqs), keep)


def hand_over(ffi, lib, out, count):
    """Notification tuples from what ferry_take/wait_notifications returned, then frees it."""
    try:
        # `from` is a Python keyword: read the field with getattr.
        return [_engine().Notification(ffi.string(getattr(n, "from")).decode("utf-8", "replace"),
                                       bytes(ffi.buffer(n.data, n.length)) if n.length else b"")
                for n in out[0][0:count[0]]]
    finally:
        lib.ferry_free_notifications(out[0], count[0])


def _need(lib, name):
    """A clear error instead of AttributeError when libferry predates `name` (C API 3)."""
    if not hasattr(lib, name):
        raise FerryError(-errno.ENOSYS, "this libferry has no %s (C API version 3); upgrade it" % name,
                         name)
