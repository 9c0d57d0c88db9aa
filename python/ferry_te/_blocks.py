"""Block tables (C API version 8): KV-cache pages named once, then moved by index, as a paged
KV cache (vLLM's block tables) addresses them. Engine inherits the methods."""

import errno
from array import array

from . import _capi
from ._arrays import parse_op
from ._handles import Batch, _check, _handle
from .errors import FerryError, InvalidArgument

LOCAL_MEMORY = 0  # create_block_table's segment for this engine's own registered memory


def _bad(message, call):
    return InvalidArgument(-errno.EINVAL, message, call)


def _column(ffi, x, ctype, code, name, call, base=0):
    """x (a sequence of ints, an array('Q'/'I'), a numpy array or a C-contiguous buffer of the
    right item size) as a C array of `ctype`, plus `base` added to every entry; returns (cdata,
    n, what keeps it alive)."""
    size = ffi.sizeof(ctype)
    if isinstance(x, int):
        x = [x]
    if base == 0 and not isinstance(x, (list, tuple, range)):
        try:
            mv = memoryview(x)
        except TypeError:
            mv = None
        if mv is not None and mv.contiguous and mv.itemsize == size and mv.format.lstrip("<=") in "QLI":
            keep = ffi.from_buffer(ctype + "[]", mv)
            return keep, len(mv) if mv.ndim == 1 else mv.nbytes // size, keep
    try:
        values = array(code, (int(v) + base for v in (x.tolist() if hasattr(x, "tolist") else x)))
    except (OverflowError, TypeError, ValueError):
        raise _bad("%s must hold integers >= 0 that fit %s" % (name, ctype), call) from None
    keep = ffi.from_buffer(ctype + "[]", values)
    return keep, len(values), (keep, values)


class BlockTable:
    """Blocks checked once (create_block_table); pass it to submit_blocks. destroy() (or a
    with-block) releases it; transfers already submitted from it go on."""

    def __init__(self, state, table_id, count, segment):
        self._state = state
        self.id = table_id
        self.count = count
        self.segment = segment

    def destroy(self):
        if self.id is None:
            return
        _, lib = _capi.load()
        _check(lib.ferry_destroy_block_table(_handle(self._state), self.id), "ferry_destroy_block_table")
        self.id = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.destroy()

    def __len__(self):
        return self.count

    def __repr__(self):
        return "BlockTable(id=%r, blocks=%d, segment=%d)" % (self.id, self.count, self.segment)


class BlockTransfers:
    """Mixed into Engine (self._state is Engine's)."""

    def create_block_table(self, addrs, lengths, *, segment=LOCAL_MEMORY, base=0):
        """A table of len(addrs) blocks: block i is lengths[i] bytes (or `lengths` bytes, one
        int for all) at addrs[i] + base (`base`: an int or a Region), inside this engine's
        registered memory (segment LOCAL_MEMORY, the default) or a region of an open segment
        (a Segment or its id). Every block is checked here, once. Returns a BlockTable."""
        ffi, lib = _capi.load()
        _need(lib)
        call = "create_block_table"
        base = int(getattr(base, "address", base))
        seg = int(getattr(segment, "id", segment))
        a, n, keep_a = _column(ffi, addrs, "uint64_t", "Q", "addrs", call, base)
        l, nl, keep_l = _column(ffi, lengths, "uint64_t", "Q", "lengths", call)
        out = ffi.new("ferry_block_table_t *")
        _check(lib.ferry_create_block_table(_handle(self._state), seg, a, n, l, nl, out), "ferry_create_block_table")
        del keep_a, keep_l
        return BlockTable(self._state, int(out[0]), n, seg)

    def submit_blocks(self, op, local, local_index, remote, remote_index):
        """Moves pair i: block local_index[i] of the local table and block remote_index[i] of
        the remote one (equal lengths), READ or WRITE ('read', 'write'), without blocking.
        Indices: sequences of ints, array('I'), uint32 numpy arrays. Returns a Batch of
        len(local_index) ops. On cuda_ipc and hip_ipc the whole transfer is one copy kernel
        launch from the second transfer between two tables on."""
        ffi, lib = _capi.load()
        _need(lib)
        call = "submit_blocks"
        code = parse_op(op, call)
        for t, side in ((local, "local"), (remote, "remote")):
            if not isinstance(t, BlockTable) or t.id is None:
                raise _bad("the %s table must be a BlockTable that was not destroyed, not %r" % (side, t), call)
        li, n, keep_l = _column(ffi, local_index, "uint32_t", "I", "local_index", call)
        ri, m, keep_r = _column(ffi, remote_index, "uint32_t", "I", "remote_index", call)
        if n != m:
            raise _bad("%d local indices but %d remote ones; give one of each per pair" % (n, m), call)
        out = ffi.new("ferry_batch_id_t *")
        _check(lib.ferry_submit_blocks(_handle(self._state), code, local.id, li, remote.id, ri, n, out),
               "ferry_submit_blocks")
        return Batch(self._state, int(out[0]), n, [keep_l, keep_r])


def _need(lib):
    """A clear error instead of AttributeError when libferry predates C API version 8."""
    if not hasattr(lib, "ferry_submit_blocks"):
        raise FerryError(-errno.ENOSYS, "this libferry has no block tables (C API version 8); upgrade it",
                         "ferry_submit_blocks")
