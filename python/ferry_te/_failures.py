"""The error Batch.wait() raises when ops failed: how many, and the first few, read from each
op's own status (ferry_get_status), so the text does not depend on the wording of the C
library's wait message (which is only the fallback)."""

import collections

from . import _capi
from .errors import error_for_code

# How many failed ops the message names; the rest are counted.
SHOWN = 3

FailedOp = collections.namedtuple("FailedOp", "index error transport message")
FailedOp.__doc__ = "An op of a batch that failed: its index, error code, transport and why."


def _text(ffi, chars):
    return ffi.string(chars).decode("utf-8", "replace")


def _c_counts(c_message, count, total, first):
    """Whether the C library's own message already names the failures as this module would."""
    if total == 1:
        return ("op %d failed" % first) in c_message
    return ("%d of %d ops failed" % (count, total)) in c_message


def _why(f):
    message = f.message or "error %d" % f.error
    if f.transport and not message.startswith(f.transport + ":"):
        message = "%s: %s" % (f.transport, message)
    return message


def batch_failure(batch, rc):
    """The FerryError for a wait that returned rc < 0 because ops failed. It carries
    .failed_count and .failed_ops (the first SHOWN as FailedOp)."""
    ffi, lib = _capi.load()
    c_message = _text(ffi, lib.ferry_last_error())  # before other calls replace it
    state = batch._state
    failed, count = [], 0
    st = ffi.new("ferry_op_status_t *")
    with state.lock:
        handle = None if state.closed else state.handle
        for i in range(batch.count if handle is not None else 0):
            if lib.ferry_get_status(handle, batch.id, i, st) != 0:
                failed, count = [], 0
                break
            if st.state == 2:  # FERRY_OP_FAILED
                count += 1
                if len(failed) < SHOWN:
                    failed.append(FailedOp(i, int(st.error), _text(ffi, st.transport),
                                           _text(ffi, st.message)))
    if not count:  # statuses unreadable: the C message is all there is
        err = error_for_code(rc, c_message, "ferry_wait_batch")
        err.failed_count, err.failed_ops = None, []
        return err
    if _c_counts(c_message, count, batch.count, failed[0].index):
        # A libferry that counts failures itself (C API 3) says more (e.g. that the batch's
        # notification was not sent): its words, unchanged.
        text = c_message
    else:
        # The same shape: "N of M ops failed: op I failed: why; ...; and K more".
        parts = ["op %d failed: %s" % (f.index, _why(f)) for f in failed]
        text = "; ".join(parts)
        if batch.count > 1:
            text = "%d of %d ops failed: %s" % (count, batch.count, text)
        if count > len(failed):
            text += "; and %d more (status() gives each op's error)" % (count - len(failed))
    err = error_for_code(rc, text, "ferry_wait_batch")
    err.failed_count, err.failed_ops = count, failed
    return err
