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
    # "op I failed: why", as the C library words one failure (the op's message starts with
    # its transport's name when the transport failed it).
    parts = ["op %d failed: %s" % (f.index, _why(f)) for f in failed]
    if count == 1:
        text = parts[0] + ("" if batch.count == 1 else " (1 of %d ops failed)" % batch.count)
    else:
        text = "%d of %d ops failed; %s%s" % (
            count, batch.count, "; ".join(parts),
            "; and %d more" % (count - len(failed)) if count > len(failed) else "")
    err = error_for_code(rc, text, "ferry_wait_batch")
    err.failed_count, err.failed_ops = count, failed
    return err
