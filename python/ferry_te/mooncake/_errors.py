"""Errors inside ferry_te.mooncake, and Mooncake's return codes for Ferry's."""

import errno


class SetupError(Exception):
    """A Mooncake argument Ferry cannot serve: .code (negative errno) and the message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


class NotReady(Exception):
    """A call before initialize() or after close()."""


class CallFailed(Exception):
    """A call that failed with Ferry's code (.code) and a message naming what and why."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


NOT_INITIALIZED = "the TransferEngine is not initialized: call initialize() first"


def code_of(e):
    """The negative errno-style code of a FerryError (-1 where it has none)."""
    return e.code if isinstance(getattr(e, "code", None), int) and e.code < 0 else -1


# Ferry's errno-style codes -> Mooncake's error.h, for the calls that return its engine's codes
# (registration, send_probe); everything else Mooncake answers with -1.
_MOONCAKE_CODES = {
    errno.EINVAL: -1, errno.EBADF: -1, errno.E2BIG: -1,  # ERR_INVALID_ARGUMENT
    errno.EFAULT: -3, errno.ENOENT: -3,                  # ERR_ADDRESS_NOT_REGISTERED
    errno.ENODEV: -6,                                    # ERR_DEVICE_NOT_FOUND
    errno.EEXIST: -7,                                    # ERR_ADDRESS_OVERLAPPED
    errno.EHOSTUNREACH: -101,                            # ERR_DNS
    errno.ECONNREFUSED: -102, errno.ECONNRESET: -102, errno.EPIPE: -102,
    errno.ETIMEDOUT: -102,                               # ERR_SOCKET
    errno.EPROTO: -103,                                  # ERR_MALFORMED_JSON
    errno.EACCES: -104, errno.EPERM: -104,               # ERR_REJECT_HANDSHAKE
    errno.ENOMEM: -302,                                  # ERR_MEMORY
    errno.EOPNOTSUPP: -303, errno.EPROTONOSUPPORT: -303,  # ERR_NOT_IMPLEMENTED
}
ERR_METADATA = -200


def mooncake_code(code):
    """Mooncake's error.h code for a Ferry code (-1 where it has none closer)."""
    return _MOONCAKE_CODES.get(-code, -1) if code < 0 else -1


def describe(code):
    """'ECONNREFUSED, -111' for a code."""
    name = errno.errorcode.get(-code) if code < 0 else None
    return "%s, %d" % (name, code) if name else str(code)
