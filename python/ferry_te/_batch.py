"""Many ranges or addresses in one C call (ferry_register_batch, ferry_unregister_batch), laid out
column by column in one buffer (array('Q') and strided memoryview assignment), so that 100k ranges
cost no Python object per range beyond the caller's ints."""

import sys
from array import array

# ferry_memory_range_t as four little-endian u64 words: addr, length, memory_kind | device << 32,
# access | reserved << 32 (checked against cffi's view of ferry.h before use).
_FIELDS = (("addr", 0), ("length", 8), ("memory_kind", 16), ("device", 20), ("access", 24),
           ("reserved", 28))


def _words_layout(ffi):
    return (sys.byteorder == "little" and ffi.sizeof("ferry_memory_range_t") == 32
            and all(ffi.offsetof("ferry_memory_range_t", f) == o for f, o in _FIELDS))


def _column(values, n):
    """An array('Q') of n entries: `values` (a sequence of ints) or one int repeated."""
    if isinstance(values, int):
        return array("Q", [values]) * n
    col = array("Q", values)
    if len(col) != n:
        raise ValueError("%d values where %d ranges were given" % (len(col), n))
    return col


def register_ranges(ffi, lib, handle, addresses, lengths, kinds, devices, access):
    """Registers n ranges: addresses and lengths are sequences of ints; kinds, devices and access
    each a sequence or one int for all. Returns the C code."""
    n = len(addresses)
    if not _words_layout(ffi):
        raise RuntimeError("ferry_memory_range_t in ferry.h is not the 32-byte layout this module writes")
    words = array("Q", bytes(32 * max(n, 1)))
    view = memoryview(words)
    view[0:4 * n:4] = _column(addresses, n)
    view[1:4 * n:4] = _column(lengths, n)
    if isinstance(kinds, int) and isinstance(devices, int):
        view[2:4 * n:4] = _column(kinds | (devices & 0xffffffff) << 32, n)
    else:
        kinds = [kinds] * n if isinstance(kinds, int) else kinds
        devices = [devices] * n if isinstance(devices, int) else devices
        view[2:4 * n:4] = _column([k | (d & 0xffffffff) << 32 for k, d in zip(kinds, devices)], n)
    view[3:4 * n:4] = _column(access, n)
    return lib.ferry_register_batch(handle, ffi.from_buffer("ferry_memory_range_t[]", words), n)


def unregister_addresses(ffi, lib, handle, addresses):
    """addresses: ints. Returns the C code."""
    addrs = array("Q", addresses or [0])
    return lib.ferry_unregister_batch(handle, ffi.from_buffer("void *[]", addrs), len(addresses))
