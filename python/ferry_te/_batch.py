"""Many ranges or addresses in one C call (ferry_register_batch, ferry_unregister_batch): packed
with struct into one buffer, so that 100k ranges cost no cffi object per range."""

import array
import struct

# ferry_memory_range_t: addr, length, memory_kind, device, access, reserved (32 bytes, no padding).
_RANGE = struct.Struct("=QQIiII")


def register_ranges(ffi, lib, handle, ranges):
    """ranges: a sequence of (address, length, kind, device, access). Returns the C code."""
    n = len(ranges)
    if ffi.sizeof("ferry_memory_range_t") != _RANGE.size:
        raise RuntimeError("ferry.h's ferry_memory_range_t is %d bytes, not %d"
                           % (ffi.sizeof("ferry_memory_range_t"), _RANGE.size))
    buf = bytearray(_RANGE.size * max(n, 1))
    pack, size = _RANGE.pack_into, _RANGE.size
    for i, (address, length, kind, device, access) in enumerate(ranges):
        pack(buf, i * size, address, length, kind, device, access, 0)
    return lib.ferry_register_batch(handle, ffi.from_buffer("ferry_memory_range_t[]", buf), n)


def unregister_addresses(ffi, lib, handle, addresses):
    """addresses: ints. Returns the C code."""
    addrs = array.array("Q", addresses or [0])
    return lib.ferry_unregister_batch(handle, ffi.from_buffer("void *[]", addrs), len(addresses))
