"""The transfer calls of Mooncake's TransferEngine (sync, async, status, notifications), a
part of ferry_te.mooncake.TransferEngine kept in a file of its own."""

import errno
import logging

from .. import _capi
from ..engine import READ, WRITE
from ..errors import FerryError
from . import _setup
from ._errors import NOT_INITIALIZED, CallFailed, NotReady, code_of
from ._notify import TransferNotify, decode_notification, encode_notification

log = logging.getLogger("ferry_te.mooncake")


class Transfers:
    """Mixed into TransferEngine, which provides _ready, _segment, _forget, _fail, _lock,
    _engine and _batches."""

    # -- transfers ------------------------------------------------------------------------
    def _submit(self, call, target_hostname, op, buffers, peers, lengths, transport_hint,
                notification=None):
        """(segment, Batch) for one array submit; raises CallFailed. With notification
        (bytes) and a libferry that attaches notifications to batches (C API 3), the engine
        sends it once every op succeeded: the Batch then has .notified set."""
        try:
            transport = _setup.transport_for_hint(transport_hint)
        except _setup.SetupError as e:
            raise CallFailed(e.code, "%s: %s" % (call, e))
        seg = self._segment(target_hostname, call)
        try:
            if notification is not None and _attached_notifications():
                return seg, _submit_with_notification(self._engine, op, seg, buffers, peers,
                                                      lengths, transport, notification)
            return seg, self._engine.submit_arrays(op, seg, buffers, peers, lengths,
                                                   transport=transport)
        except FerryError as e:
            raise CallFailed(code_of(e), "%s to %s: %s" % (call, target_hostname, e))

    def _sync(self, call, target_hostname, op, buffers, peers, lengths, notify, hint):
        try:
            payload = None if notify is None else encode_notification(notify)
            seg, batch = self._submit(call, target_hostname, op, buffers, peers, lengths, hint,
                                      payload)
            try:
                batch.wait()  # every Ferry op ends within its transport's op_timeout_ms
            except FerryError as e:
                self._forget(target_hostname, seg)
                raise CallFailed(code_of(e), "%s to %s: %s" % (call, target_hostname, e))
            finally:
                batch._free_quietly()
            if payload is not None and not getattr(batch, "notified", False):
                # A libferry without ferry_submit_with_notification: sent here, once the batch
                # completed (so after its bytes are visible there); the same payload.
                try:
                    self._engine.send_notification(seg, payload)
                except FerryError as e:
                    raise CallFailed(code_of(e), "%s: the transfer completed but its "
                                      "notification to %s failed: %s" % (call, target_hostname, e))
        except NotReady:
            return self._fail(-errno.EBADF, "%s: %s" % (call, NOT_INITIALIZED))
        except CallFailed as e:
            return self._fail(e.code, str(e))
        return 0

    def transfer_sync_write(self, target_hostname, buffer, peer_buffer_address, length,
                            transport_hint=""):
        return self._sync("transfer_sync_write", target_hostname, WRITE, [buffer],
                          [peer_buffer_address], [length], None, transport_hint)

    def transfer_sync_read(self, target_hostname, buffer, peer_buffer_address, length,
                           transport_hint=""):
        return self._sync("transfer_sync_read", target_hostname, READ, [buffer],
                          [peer_buffer_address], [length], None, transport_hint)

    def transfer_sync(self, target_hostname, buffer, peer_buffer_address, length, opcode,
                      notify=None, transport_hint=""):
        """One READ or WRITE (opcode: TransferOpcode); with notify (a TransferNotify), the
        peer's get_notifies() returns it once the bytes are there."""
        return self._sync("transfer_sync", target_hostname, _op(opcode), [buffer],
                          [peer_buffer_address], [length], _notify(notify), transport_hint)

    def batch_transfer_sync_write(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        """Writes every (buffer, peer address, length) in one submit; 0 when all arrived.
        The three may be lists of ints or arrays (numpy, array('Q'))."""
        return self._sync("batch_transfer_sync_write", target_hostname, WRITE, buffers,
                          peer_buffer_addresses, lengths, None, transport_hint)

    def batch_transfer_sync_read(self, target_hostname, buffers, peer_buffer_addresses,
                                 lengths, transport_hint=""):
        return self._sync("batch_transfer_sync_read", target_hostname, READ, buffers,
                          peer_buffer_addresses, lengths, None, transport_hint)

    def batch_transfer_sync(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                            opcode, notify=None, transport_hint=""):
        return self._sync("batch_transfer_sync", target_hostname, _op(opcode), buffers,
                          peer_buffer_addresses, lengths, _notify(notify), transport_hint)

    def _async(self, call, target_hostname, op, buffers, peers, lengths, hint):
        try:
            _, batch = self._submit(call, target_hostname, op, buffers, peers, lengths, hint)
        except NotReady:
            self._fail(-errno.EBADF, "%s: %s" % (call, NOT_INITIALIZED))
            return 0
        except CallFailed as e:
            self._fail(e.code, str(e))
            return 0  # batch ids are unsigned: 0 is Mooncake's failure value
        with self._lock:
            self._batches[batch.id] = (batch, target_hostname)
        return batch.id

    def batch_transfer_async_write(self, target_hostname, buffers, peer_buffer_addresses,
                                   lengths, transport_hint=""):
        """Submits and returns a batch id (0 on failure) for get_batch_transfer_status."""
        return self._async("batch_transfer_async_write", target_hostname, WRITE, buffers,
                           peer_buffer_addresses, lengths, transport_hint)

    def batch_transfer_async_read(self, target_hostname, buffers, peer_buffer_addresses,
                                  lengths, transport_hint=""):
        return self._async("batch_transfer_async_read", target_hostname, READ, buffers,
                           peer_buffer_addresses, lengths, transport_hint)

    def batch_transfer_async(self, target_hostname, buffers, peer_buffer_addresses, lengths,
                             opcode, transport_hint=""):
        return self._async("batch_transfer_async", target_hostname, _op(opcode), buffers,
                           peer_buffer_addresses, lengths, transport_hint)

    def transfer_submit_write(self, target_hostname, buffer, peer_buffer_address, length,
                              transport_hint=""):
        """One WRITE, submitted; a batch id (0 on failure) for transfer_check_status."""
        return self._async("transfer_submit_write", target_hostname, WRITE, [buffer],
                           [peer_buffer_address], [length], transport_hint)

    def _take(self, batch_id):
        with self._lock:
            return self._batches.pop(int(batch_id), None)

    def get_batch_transfer_status(self, batch_ids):
        """Waits for every batch; 0 when all succeeded, else the first failure's code. The ids
        are spent either way (Mooncake frees them too)."""
        rc = 0
        for bid in list(batch_ids):
            entry = self._take(bid)
            if entry is None:
                rc = rc or self._fail(-errno.ENOENT, "get_batch_transfer_status: batch %s is "
                                      "not a pending batch id of this engine" % bid)
                continue
            batch, target = entry
            try:
                batch.wait()
            except FerryError as e:
                rc = rc or self._fail(code_of(e), "batch %d to %s: %s" % (bid, target, e))
            finally:
                batch._free_quietly()
        return rc

    def transfer_check_status(self, batch_id):
        """1 done, 0 still in flight, -1 failed, -2 timed out (Mooncake's values); a finished
        batch id is spent."""
        with self._lock:
            entry = self._batches.get(int(batch_id))
        if entry is None:
            self._fail(-errno.ENOENT, "transfer_check_status: %s is not a pending batch id"
                       % batch_id)
            return -1
        batch, target = entry
        try:
            statuses = batch.statuses
        except FerryError as e:
            self._take(batch_id)
            self._fail(code_of(e), "transfer_check_status(%d): %s" % (batch_id, e))
            return -1
        if any(s.state == "pending" for s in statuses):
            return 0
        self._take(batch_id)
        batch._free_quietly()
        bad = [s for s in statuses if s.state == "failed"]
        if not bad:
            return 1
        self._fail(bad[0].error, "batch %d to %s: %s" % (batch_id, target, bad[0].message))
        return -2 if bad[0].error == -errno.ETIMEDOUT else -1

    # -- ordered on a CUDA stream ---------------------------------------------------------
    def _on_cuda(self, call, target_hostname, op, buffers, peers, lengths, stream_ptr, hint):
        """Mooncake's *_on_cuda: the batch starts once the work queued on the stream before
        the call is done, and work queued after it waits for every op to end (the engine's
        ferry_submit_on_stream). Returns None; raises RuntimeError where Mooncake raises (no
        such segment, lists of different lengths, the stream refused) and for an earlier
        *_on_cuda batch that failed since the last call (Mooncake ends the process then)."""
        self._reap_on_cuda(call)
        try:
            transport = _setup.transport_for_hint(hint)
            seg = self._segment(target_hostname, call)
            batch = self._ready().submit_arrays_on_stream(op, seg, buffers, peers, lengths,
                                                          stream_ptr, transport=transport)
        except NotReady:
            self._fail(-errno.EBADF, "%s: %s" % (call, NOT_INITIALIZED))
            raise RuntimeError("%s: %s" % (call, NOT_INITIALIZED)) from None
        except (_setup.SetupError, CallFailed) as e:
            self._fail(e.code, "%s: %s" % (call, e))
            raise RuntimeError("%s: %s" % (call, e)) from None
        except (FerryError, ValueError, TypeError) as e:
            self._fail(code_of(e), "%s to %s: %s" % (call, target_hostname, e))
            raise RuntimeError("%s to %s: %s" % (call, target_hostname, e)) from None
        with self._lock:
            self._on_cuda_batches.append((call, target_hostname, batch))

    def _reap_on_cuda(self, call):
        """Frees the *_on_cuda batches that ended; raises for the first that failed."""
        with self._lock:
            pending, self._on_cuda_batches = self._on_cuda_batches, []
        failed, keep = None, []
        for entry in pending:
            earlier, target, batch = entry
            try:
                if not batch.poll():
                    keep.append(entry)
                    continue
                batch.wait(0)
            except FerryError as e:
                failed = failed or "%s: an earlier %s to %s failed: %s" % (call, earlier, target, e)
            batch._free_quietly()
        with self._lock:
            self._on_cuda_batches[:0] = keep
        if failed:
            self._fail(-errno.EIO, failed, logging.ERROR)
            raise RuntimeError(failed)

    def transfer_write_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                               stream_ptr, transport_hint=""):
        """One WRITE ordered on the CUDA stream stream_ptr (torch's
        current_stream().cuda_stream): it starts when the work queued before it is done."""
        self._on_cuda("transfer_write_on_cuda", target_hostname, WRITE, [buffer],
                      [peer_buffer_address], [length], stream_ptr, transport_hint)

    def transfer_read_on_cuda(self, target_hostname, buffer, peer_buffer_address, length,
                              stream_ptr, transport_hint=""):
        self._on_cuda("transfer_read_on_cuda", target_hostname, READ, [buffer],
                      [peer_buffer_address], [length], stream_ptr, transport_hint)

    def batch_transfer_write_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                     lengths, stream_ptr, transport_hint=""):
        self._on_cuda("batch_transfer_write_on_cuda", target_hostname, WRITE, buffers,
                      peer_buffer_addresses, lengths, stream_ptr, transport_hint)

    def batch_transfer_read_on_cuda(self, target_hostname, buffers, peer_buffer_addresses,
                                    lengths, stream_ptr, transport_hint=""):
        self._on_cuda("batch_transfer_read_on_cuda", target_hostname, READ, buffers,
                      peer_buffer_addresses, lengths, stream_ptr, transport_hint)

    # -- notifications --------------------------------------------------------------------
    def get_notifies(self):
        """The TransferNotify peers sent (transfer_sync(..., notify)) since the last call."""
        try:
            notes = self._ready().take_notifications()
        except NotReady:
            self._fail(-errno.EBADF, "get_notifies: " + NOT_INITIALIZED)
            return []
        except FerryError as e:
            self._fail(code_of(e), "get_notifies: %s" % e, logging.ERROR)
            return []
        return [decode_notification(n.sender, n.message) for n in notes]


def _attached_notifications():
    """Whether this libferry sends a notification attached to a batch (C API version 3)."""
    _, lib = _capi.load()
    return hasattr(lib, "ferry_submit_with_notification")


def _submit_with_notification(engine, op, seg, buffers, peers, lengths, transport, payload):
    from .._arrays import build_requests
    from ..engine import Batch, _check, _handle
    ffi, lib = _capi.load()
    reqs, n, keep = build_requests(op, seg, buffers, peers, lengths, 0, 0, transport)
    out = ffi.new("ferry_batch_id_t *")
    _check(lib.ferry_submit_with_notification(_handle(engine._state), reqs, n, int(seg),
                                              payload, len(payload), out),
           "ferry_submit_with_notification")
    batch = Batch(engine._state, int(out[0]), n, keep)
    batch.notified = True
    return batch


def _op(opcode):
    value = int(opcode)
    if value not in (READ, WRITE):
        raise ValueError("opcode must be TransferOpcode.Read or TransferOpcode.Write, not %r"
                         % (opcode,))
    return value


def _notify(notify):
    if notify is None or isinstance(notify, TransferNotify):
        return notify
    raise TypeError("notify must be a TransferNotify or None, not %s" % type(notify).__name__)
