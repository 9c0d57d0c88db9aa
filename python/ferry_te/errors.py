"""Exceptions raised for C API failures. Every one carries `.code` (a negative errno-style
number, as the C API returned it) and `.message` (the C library's own words)."""

import errno
import os

__all__ = [
    "FerryError", "InvalidArgument", "BadAddress", "NotFound", "AlreadyExists", "PermissionDenied",
    "Busy", "Timeout", "WaitTimeout", "ConnectionFailed", "Unsupported", "OutOfMemory",
    "ProtocolError", "Canceled",
    "error_for_code",
]


class FerryError(Exception):
    """A Ferry C API call failed."""

    def __init__(self, code, message, call=None):
        self.code = int(code)
        self.message = message or ""
        self.call = call
        name = errno.errorcode.get(-self.code, str(self.code))
        text = self.message
        if not text and self.code < 0:
            text = os.strerror(-self.code)
        prefix = "%s: " % call if call else ""
        super().__init__("%s%s [%s]" % (prefix, text, name))

    @property
    def errno_name(self):
        return errno.errorcode.get(-self.code, str(self.code))


class InvalidArgument(FerryError, ValueError):
    """EINVAL: a bad argument or configuration value."""


class BadAddress(FerryError):
    """EFAULT: an address range outside every region the peer (or this engine) registered."""


class NotFound(FerryError, LookupError):
    """ENOENT, ENODEV: no such segment, region, batch, plugin or device."""


class AlreadyExists(FerryError):
    """EEXIST: e.g. the range is already registered."""


class PermissionDenied(FerryError, PermissionError):
    """EACCES, EPERM: the peer's region does not allow this access."""


class Busy(FerryError):
    """EBUSY: e.g. freeing a batch whose ops are still in flight."""


class Timeout(FerryError, TimeoutError):
    """ETIMEDOUT: an op (or a connection, a metadata request) timed out. Raised by
    Batch.wait() when an op itself failed with ETIMEDOUT: the batch is finished."""


class WaitTimeout(Timeout):
    """EINPROGRESS from ferry_wait_batch: the wait's own `timeout` passed while ops were still
    in flight. The batch stays valid (wait again, or poll it). A Timeout, so `except
    ferry.Timeout` catches both; `isinstance(e, ferry.WaitTimeout)` tells them apart."""


class ConnectionFailed(FerryError, ConnectionError):
    """ECONNREFUSED, ECONNRESET, EHOSTUNREACH, ENOTCONN, EPIPE: the peer went away."""


class Unsupported(FerryError):
    """EOPNOTSUPP, EPROTONOSUPPORT, ENOSYS: no transport can do this."""


class OutOfMemory(FerryError, MemoryError):
    """ENOMEM."""


class ProtocolError(FerryError):
    """EPROTO: a peer sent something this engine does not understand."""


class Canceled(FerryError):
    """ECANCELED."""


_BY_ERRNO = {}
for _cls, _names in (
    (InvalidArgument, ("EINVAL",)),
    (BadAddress, ("EFAULT",)),
    (NotFound, ("ENOENT", "ENODEV", "ENXIO")),
    (AlreadyExists, ("EEXIST",)),
    (PermissionDenied, ("EACCES", "EPERM")),
    (Busy, ("EBUSY", "EAGAIN")),
    (Timeout, ("ETIMEDOUT",)),
    (ConnectionFailed, ("ECONNREFUSED", "ECONNRESET", "ECONNABORTED", "EHOSTUNREACH",
                        "ENETUNREACH", "ENOTCONN", "EPIPE")),
    (Unsupported, ("EOPNOTSUPP", "ENOTSUP", "EPROTONOSUPPORT", "ENOSYS")),
    (OutOfMemory, ("ENOMEM",)),
    (ProtocolError, ("EPROTO",)),
    (Canceled, ("ECANCELED",)),
    (WaitTimeout, ("EINPROGRESS",)),
):
    for _name in _names:
        if hasattr(errno, _name):
            _BY_ERRNO[getattr(errno, _name)] = _cls


def error_for_code(code, message, call=None):
    """The FerryError subclass instance for a negative errno-style code."""
    cls = _BY_ERRNO.get(-int(code), FerryError)
    return cls(code, message, call)
