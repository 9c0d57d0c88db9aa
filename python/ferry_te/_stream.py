"""Engine methods that order a batch on a CUDA stream (ferry_submit_on_stream, C API version 6;
what Mooncake's transfer_*_on_cuda calls do). Engine inherits them."""

import errno

from . import _capi
from ._arrays import build_requests
from ._handles import Batch, _check, _handle
from .errors import FerryError, InvalidArgument


def _engine():
    from . import engine  # engine imports this module: resolved at call time
    return engine


def stream_handle(ffi, stream):
    """The CUstream / cudaStream_t of `stream` as a void *: an int (torch's
    current_stream().cuda_stream; 0 is the legacy default stream), or an object with
    .cuda_stream (torch.cuda.Stream) or .ptr (cupy's Stream)."""
    for attr in ("cuda_stream", "ptr"):
        if hasattr(stream, attr):
            stream = getattr(stream, attr)
            break
    if stream is None:
        stream = 0
    try:
        value = int(stream)
    except (TypeError, ValueError):
        raise InvalidArgument(-errno.EINVAL, "stream must be a CUDA stream handle (an int), or have "
                              ".cuda_stream or .ptr; got %r" % (stream,), "submit_on_stream") from None
    if value < 0:
        raise InvalidArgument(-errno.EINVAL, "stream handle %d is negative" % value, "submit_on_stream")
    return ffi.cast("void *", value)


class StreamSubmits:
    """Mixed into Engine (self._state and self._fill are Engine's)."""

    def submit_on_stream(self, requests, stream, *, detach=False):
        """As submit(), ordered on a CUDA stream: the batch starts once the work queued on
        `stream` before this call is done (the kernel that wrote the source, say), and work
        queued on the stream after it waits until every op ended. Returns at once; what
        submit() refuses is refused here, and then nothing is enqueued. `stream`: an int
        (torch.cuda.current_stream().cuda_stream; 0 needs a CUDA context current on this
        thread, as torch makes one) or an object with .cuda_stream / .ptr. Returns a Batch,
        which waits and raises like any other (a failure is also logged once, and the stream
        goes on); it cannot be freed (ferry.Busy) until the stream reached it and its ops ended.
        detach=True: returns None and the engine frees the batch itself once it ended (fire and
        forget: a failure is only logged); the local memory must stay registered until then.
        Without the CUDA driver (libcuda.so.1) it raises FerryError (ENODEV)."""
        ffi, lib = _capi.load()
        _need(lib)
        e = _engine()
        reqs = [r if isinstance(r, e.Request) else e.Request(*r) for r in requests]
        if not reqs:
            raise InvalidArgument(-22, "no requests to submit", "submit_on_stream")
        arr = ffi.new("ferry_request_t[]", len(reqs))
        keep = []
        for i, r in enumerate(reqs):
            self._fill(ffi, arr[i], r, keep)
        return self._on_stream(ffi, lib, arr, len(reqs), stream, detach, keep)

    def submit_arrays_on_stream(self, op, segment, local, remote, lengths, stream, *, local_base=0,
                                remote_base=0, transport=None, detach=False):
        """submit_arrays() (the same arguments, one C call for every op) ordered on `stream` as
        submit_on_stream() orders it; returns a Batch, or None with detach=True."""
        ffi, lib = _capi.load()
        _need(lib)
        reqs, n, keep = build_requests(op, segment, local, remote, lengths, local_base,
                                       remote_base, transport)
        return self._on_stream(ffi, lib, reqs, n, stream, detach, keep)

    def _on_stream(self, ffi, lib, reqs, n, stream, detach, keep):
        handle = stream_handle(ffi, stream)
        out = ffi.NULL if detach else ffi.new("ferry_batch_id_t *")
        _check(lib.ferry_submit_on_stream(_handle(self._state), reqs, n, handle, out),
               "ferry_submit_on_stream")
        return None if detach else Batch(self._state, int(out[0]), n, keep)


def _need(lib):
    """A clear error instead of AttributeError when libferry predates C API version 6."""
    if not hasattr(lib, "ferry_submit_on_stream"):
        raise FerryError(-errno.ENOSYS, "this libferry has no ferry_submit_on_stream (C API version 6); "
                         "upgrade it", "ferry_submit_on_stream")
