"""Batches from arrays: one ferry_submit for n ops, no Python object per op.

The request array is filled column by column (numpy, or strided memoryview assignment when
numpy is absent) in the exact layout of ferry_request_t, which is read from cffi's own view of
ferry.h (sizeof/offsetof), so it cannot drift from the header."""

import errno
import sys
from array import array

from . import _capi
from .errors import InvalidArgument

# numpy is optional (array('Q') and memoryviews work without it) and imported on the first
# submit_arrays, not with the package: importing it costs ~0.1 s, most of a first Engine().
_np = None

_FIELDS = ("opcode", "reserved", "local_addr", "segment", "remote_addr", "length", "transport")
_layout = None


class _Layout:
    """ferry_request_t as cffi sees it: size, and each field's offset in 8-byte words."""

    def __init__(self, ffi):
        self.size = ffi.sizeof("ferry_request_t")
        self.offset = {f: ffi.offsetof("ferry_request_t", f) for f in _FIELDS}
        # The memoryview path writes opcode+reserved as one little-endian u64 word; every other
        # field must be an aligned u64 (true on every LP64 ABI Ferry builds for).
        self.words_ok = (sys.byteorder == "little" and self.size % 8 == 0
                         and self.offset["reserved"] == self.offset["opcode"] + 4
                         and all(self.offset[f] % 8 == 0 for f in _FIELDS if f != "reserved")
                         and ffi.sizeof("void *") == 8)
        self.dtype = None
        if _np is not None:
            types = {"opcode": "<u4", "reserved": "<u4", "transport": "<u8"}
            self.dtype = _np.dtype({"names": list(_FIELDS),
                                    "formats": [types.get(f, "<u8") for f in _FIELDS],
                                    "offsets": [self.offset[f] for f in _FIELDS],
                                    "itemsize": self.size})


def _get_layout(ffi):
    global _layout, _np
    if _layout is None:
        try:
            import numpy
            _np = numpy
        except ImportError:
            pass
        _layout = _Layout(ffi)
    return _layout


def _bad(message):
    return InvalidArgument(-errno.EINVAL, message, "submit_arrays")


def parse_op(op, call):
    """READ (0, 'read') or WRITE (1, 'write') as the C opcode."""
    if isinstance(op, str):
        op = {"read": 0, "write": 1}.get(op.lower(), op)
    if isinstance(op, bool) or op not in (0, 1):  # FERRY_READ, FERRY_WRITE
        raise InvalidArgument(-errno.EINVAL, "op must be ferry.READ, ferry.WRITE, 'read' or 'write', not %r" % (op,),
                              call)
    return int(op)


def _column_np(x, name, n):
    """x as a uint64 numpy array of n entries (a scalar is broadcast)."""
    if isinstance(x, int):
        if x < 0:
            raise _bad("%s is %d; addresses and lengths are >= 0" % (name, x))
        return x
    if isinstance(x, (list, tuple, range)):
        # array('Q') converts Python ints 3-4x faster than numpy does, and rejects negatives.
        try:
            return _np.frombuffer(array("Q", x), dtype=_np.uint64)
        except (OverflowError, TypeError):
            raise _bad("%s must hold integers >= 0 below 2**64" % name) from None
    a = _np.asarray(x)
    if a.ndim == 0 or (a.dtype.kind == "O" and not hasattr(x, "__len__")):
        raise _bad("%s must be a sequence of ints or a buffer of uint64 (got %s)"
                   % (name, type(x).__name__))
    if a.ndim != 1:
        a = a.reshape(-1)
    if a.dtype.kind not in "ui":
        if a.dtype.kind == "O" or a.size == 0:  # Python ints beyond int64, or empty lists
            try:
                a = _np.array(x, dtype=_np.uint64).reshape(-1)
            except (OverflowError, TypeError, ValueError):
                raise _bad("%s must hold integers >= 0 below 2**64" % name) from None
        else:
            raise _bad("%s must be integers (got dtype %s)" % (name, a.dtype))
    elif a.dtype.kind == "i" and a.size and int(a.min()) < 0:
        i = int(_np.argmax(a < 0))
        raise _bad("%s[%d] is %d; addresses and lengths are >= 0" % (name, i, int(a[i])))
    if n is not None and a.size != n:
        raise _bad("%s has %d entries, the other arrays %d" % (name, a.size, n))
    return a


def _column_buf(x, name, n):
    """x as a sequence of n unsigned 64-bit ints the memoryview path can assign from."""
    if isinstance(x, int):
        if x < 0:
            raise _bad("%s is %d; addresses and lengths are >= 0" % (name, x))
        return x
    if isinstance(x, (list, tuple, range)):
        try:
            col = array("Q", x)
        except (OverflowError, TypeError):
            raise _bad("%s must hold integers >= 0 below 2**64" % name) from None
    else:
        try:
            mv = memoryview(x)
        except TypeError:
            raise _bad("%s must be a sequence of ints or a buffer of uint64 (got %s)"
                       % (name, type(x).__name__)) from None
        if mv.format not in ("Q", "L", "<Q", "=Q") or mv.itemsize != 8:
            if mv.itemsize == 8 and mv.format.lstrip("<=@") in ("q", "l"):
                col = array("Q")
                try:
                    col.extend(v for v in mv.cast("B").cast("q"))
                except (OverflowError, TypeError):
                    raise _bad("%s has negative entries" % name) from None
            else:
                try:
                    col = array("Q", mv.tolist())
                except (OverflowError, TypeError):
                    raise _bad("%s must hold integers >= 0 below 2**64" % name) from None
        else:
            col = mv.cast("B").cast("Q")
    if n is not None and len(col) != n:
        raise _bad("%s has %d entries, the other arrays %d" % (name, len(col), n))
    return col


def _count(*cols):
    for c in cols:
        if not isinstance(c, int):
            return len(c)
    return None


def build_requests(op, segment, local, remote, lengths, local_base=0, remote_base=0,
                   transport=None):
    """The C request array for n ops, and what must stay alive with it. op: READ (0, 'read')
    or WRITE (1, 'write') for every op; local/remote: arrays of addresses (or offsets added to local_base /
    remote_base); lengths: an array or one int for all. Returns (cdata, n, keep)."""
    ffi, _ = _capi.load()
    lay = _get_layout(ffi)
    op = parse_op(op, "submit_arrays")
    segment = int(segment)
    local_base = int(getattr(local_base, "address", local_base))
    remote_base = int(getattr(remote_base, "address", remote_base))
    keep = []
    tptr = 0
    if transport:
        t = ffi.new("char[]", str(transport).encode())
        keep.append(t)
        tptr = int(ffi.cast("uintptr_t", t))
    if lay.dtype is not None:
        return _build_np(ffi, lay, op, segment, local, remote, lengths, local_base, remote_base,
                         tptr, keep)
    return _build_buf(ffi, lay, op, segment, local, remote, lengths, local_base, remote_base,
                      tptr, keep)


def _check_lengths_np(lengths, n):
    if isinstance(lengths, int):
        if lengths == 0:
            raise _bad("length is 0; every op moves > 0 bytes")
        return
    zero = lengths == 0
    if zero.any():
        raise _bad("lengths[%d] is 0; every op moves > 0 bytes" % int(_np.argmax(zero)))


def _build_np(ffi, lay, op, segment, local, remote, lengths, local_base, remote_base, tptr, keep):
    # One length for every op (block transfers) is a scalar: no array to convert.
    uniform = (isinstance(lengths, list) and lengths and type(lengths[0]) is int
               and lengths.count(lengths[0]) == len(lengths))
    cols = [_column_np(x, name, None) for x, name in (
        (local, "local"), (remote, "remote"), (lengths[0] if uniform else lengths, "lengths"))]
    n = _count(*cols)
    if n is None:
        n = len(lengths) if uniform else None
    if n is None:
        raise _bad("local, remote or lengths must be an array (one entry per op)")
    for c, name in zip(cols, ("local", "remote", "lengths")):
        size = len(lengths) if uniform and name == "lengths" else (
            None if isinstance(c, int) else len(c))
        if size is not None and size != n:
            raise _bad("%s has %d entries, the first array %d (one entry per op in each)"
                       % (name, size, n))
    if uniform and lengths[0] == 0:
        raise _bad("lengths[0] is 0; every op moves > 0 bytes")
    if n == 0:
        raise _bad("no ops to submit (the arrays are empty)")
    lcol, rcol, ncol = cols
    _check_lengths_np(ncol, n)
    req = _np.zeros(n, dtype=lay.dtype)
    req["opcode"] = op
    req["local_addr"] = lcol
    if local_base:
        req["local_addr"] += _np.uint64(local_base)
    req["segment"] = int(segment)
    req["remote_addr"] = rcol
    if remote_base:
        req["remote_addr"] += _np.uint64(remote_base)
    req["length"] = ncol
    if tptr:
        req["transport"] = tptr
    keep.append(req)
    return ffi.from_buffer("ferry_request_t[]", req), n, keep


def _build_buf(ffi, lay, op, segment, local, remote, lengths, local_base, remote_base, tptr, keep):
    cols = [_column_buf(x, name, None) for x, name in ((local, "local"), (remote, "remote"),
                                                       (lengths, "lengths"))]
    n = _count(*cols)
    if n is None:
        raise _bad("local, remote or lengths must be an array (one entry per op)")
    for c, name in zip(cols, ("local", "remote", "lengths")):
        if not isinstance(c, int) and len(c) != n:
            raise _bad("%s has %d entries, the first array %d (one entry per op in each)"
                       % (name, len(c), n))
    if n == 0:
        raise _bad("no ops to submit (the arrays are empty)")
    lcol, rcol, ncol = cols
    if isinstance(ncol, int):
        if ncol == 0:
            raise _bad("length is 0; every op moves > 0 bytes")
    else:
        for i, v in enumerate(ncol):
            if v == 0:
                raise _bad("lengths[%d] is 0; every op moves > 0 bytes" % i)
    if local_base and not isinstance(lcol, int):
        lcol = array("Q", (v + local_base for v in lcol))
    elif local_base:
        lcol += local_base
    if remote_base and not isinstance(rcol, int):
        rcol = array("Q", (v + remote_base for v in rcol))
    elif remote_base:
        rcol += remote_base
    reqs = ffi.new("ferry_request_t[]", n)
    keep.append(reqs)
    if not lay.words_ok:  # an ABI the word view cannot describe: fill field by field
        for i in range(n):
            r = reqs[i]
            r.opcode = op
            r.local_addr = ffi.cast("void *", lcol if isinstance(lcol, int) else lcol[i])
            r.segment = int(segment)
            r.remote_addr = rcol if isinstance(rcol, int) else rcol[i]
            r.length = ncol if isinstance(ncol, int) else ncol[i]
            r.transport = ffi.cast("const char *", tptr)
        return reqs, n, keep
    words = memoryview(ffi.buffer(reqs)).cast("B").cast("Q")
    stride = lay.size // 8

    def put(field, value):
        start = lay.offset[field] // 8
        if isinstance(value, int):
            words[start::stride] = array("Q", [value]) * n
        else:
            words[start::stride] = value

    put("opcode", op)  # reserved, the high half of that word, stays 0
    put("local_addr", lcol)
    put("segment", int(segment))
    put("remote_addr", rcol)
    put("length", ncol)
    if tptr:
        put("transport", tptr)
    words.release()
    return reqs, n, keep
