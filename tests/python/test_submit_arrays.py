"""Engine.submit_arrays: n ops from arrays in one ferry_submit, against a second process, with
numpy and without it; the error when several ops fail; bad input refused with a reason."""

import errno
from array import array

import numpy as np
import pytest

import ferry_te as ferry
import ferry_te._arrays as arrays
from conftest import sha256

SIZE = 1 << 20
BLOCK = 4096
N = SIZE // BLOCK  # 256 ops


@pytest.fixture(params=["numpy", "no numpy"])
def numpy_mode(request, monkeypatch):
    """The same calls through the numpy path and through the memoryview path numpy-less
    installs take."""
    if request.param == "no numpy":
        monkeypatch.setattr(arrays, "_np", None)
    monkeypatch.setattr(arrays, "_layout", None)
    yield request.param
    arrays._layout = None


def test_layout_matches_the_header():
    ffi, _ = ferry._capi.load()
    lay = arrays._Layout(ffi)
    assert lay.size == ffi.sizeof("ferry_request_t") and lay.words_ok
    assert lay.dtype.itemsize == lay.size
    for name in arrays._FIELDS:
        assert lay.dtype.fields[name][1] == ffi.offsetof("ferry_request_t", name)


def test_read_write_two_processes(protocol, make_peer, numpy_mode):
    peer = make_peer(protocol, SIZE, buffers=1, seed=21)
    remote = peer.addresses[0]
    with ferry.Engine(plugins=protocol) as engine:
        local = np.zeros(SIZE, np.uint8)
        region = engine.register(local)
        seg = engine.open_segment(peer.session)
        # READ every block, in reverse order, offsets from the region (array('Q')).
        offs = array("Q", range(0, SIZE, BLOCK))
        rev = array("Q", reversed(offs))
        with engine.submit_arrays(ferry.READ, seg, offs, rev, BLOCK, local_base=region,
                                  remote_base=remote) as batch:
            batch.wait()
        want = peer.expected(0).reshape(N, BLOCK)[::-1].reshape(-1)
        assert sha256(local) == sha256(want)
        # WRITE it back in order, absolute addresses as lists of ints and a lengths list.
        src = [region.address + (N - 1 - i) * BLOCK for i in range(N)]
        dst = [remote + i * BLOCK for i in range(N)]
        engine.submit_arrays("write", seg, src, dst, [BLOCK] * N).wait()
        assert peer.ask("sha256 0") == sha256(peer.expected(0))
        # A memoryview of uint64 and mixed lengths (the first op 1 byte, the rest whole).
        local[:] = 0
        lens = array("Q", [1] + [BLOCK] * (N - 1))
        engine.submit_arrays(ferry.READ, seg, memoryview(offs), memoryview(offs),
                             memoryview(lens), local_base=region.address,
                             remote_base=remote).wait()
        want = peer.expected(0).copy()
        want[1:BLOCK] = 0
        assert sha256(local) == sha256(want)


def test_several_failed_ops_are_counted_and_named(protocol, make_peer, numpy_mode):
    peer = make_peer(protocol, SIZE, buffers=2, seed=31)
    with ferry.Engine(plugins=protocol) as engine:
        local = np.zeros(2 * SIZE, np.uint8)
        region = engine.register(local)
        seg = engine.open_segment(peer.session)
        assert peer.ask("unregister 1") == "0"  # after this engine read the descriptor
        offs = array("Q", range(0, SIZE, BLOCK))
        dst = [peer.addresses[0] + o for o in offs] + [peer.addresses[1] + o for o in offs]
        batch = engine.submit_arrays(ferry.WRITE, seg, list(range(0, 2 * SIZE, BLOCK)), dst,
                                     BLOCK, local_base=region)
        with pytest.raises(ferry.FerryError) as info:
            batch.wait()
        err = info.value
        assert err.failed_count == N
        assert [f.index for f in err.failed_ops] == [N, N + 1, N + 2]
        text = str(err)
        assert "%d of %d ops failed" % (N, 2 * N) in text and "and %d more" % (N - 3) in text
        assert "%d of %d ops failed: op %d failed" % (N, 2 * N, N) in text, text
        assert "op %d failed" % (N + 2) in text and "op %d failed" % (N + 3) not in text, text
        assert text.count("not inside") == 3, text
        batch.free()
        # The ops into the registered buffer landed; the failed ones wrote nothing anywhere.
        assert peer.ask("sha256 0") == sha256(np.zeros(SIZE, np.uint8))


def test_one_failed_op_reads_as_before(make_peer):
    peer = make_peer("tcp", SIZE, buffers=2, seed=41)
    with ferry.Engine(plugins="tcp") as engine:
        local = np.zeros(SIZE, np.uint8)
        region = engine.register(local)
        seg = engine.open_segment(peer.session)
        assert peer.ask("unregister 1") == "0"
        batch = engine.submit_arrays(ferry.READ, seg, [0, BLOCK], [peer.addresses[0],
                                                                    peer.addresses[1]],
                                     BLOCK, local_base=region)
        with pytest.raises(ferry.BadAddress, match=r"^ferry_wait_batch: 1 of 2 ops failed: "
                                                   r"op 1 failed.*tcp: .*not inside") as info:
            batch.wait()
        assert info.value.failed_count == 1 and info.value.failed_ops[0].index == 1
        batch.free()


@pytest.mark.parametrize("args, why", [
    (([0, 8], [0], 8), r"remote has 1 entries, the first array 2"),
    (([0, 8], [0, 8], [8, 8, 8]), r"lengths has 3 entries"),
    (([0, 8], [0, 8], [8, 0]), r"lengths\[1\] is 0"),
    (([0, 8], [0, 8], 0), r"length is 0"),
    (([0, -8], [0, 8], 8), r"local must hold integers >= 0|local\[1\] is -8"),
    (([], [], 8), r"no ops to submit"),
    ((0, 0, 8), r"must be an array"),
    (([0, 8], [0, 8], ["8", "8"]), r"lengths must"),
])
def test_bad_input_is_refused_with_the_reason(args, why, numpy_mode):
    with ferry.Engine(plugins="tcp") as engine:
        with pytest.raises(ferry.InvalidArgument, match=why):
            engine.submit_arrays(ferry.WRITE, 1, *args)


def test_bad_arrays_and_ops():
    with ferry.Engine(plugins="tcp") as engine:
        with pytest.raises(ferry.InvalidArgument, match="must be integers"):
            engine.submit_arrays(ferry.WRITE, 1, np.zeros(2), [0, 8], 8)
        with pytest.raises(ferry.InvalidArgument, match=r"local\[1\] is -8"):
            engine.submit_arrays(ferry.WRITE, 1, np.array([0, -8]), [0, 8], 8)
        with pytest.raises(ferry.InvalidArgument, match="op must be"):
            engine.submit_arrays(7, 1, [0], [0], 8)
        with pytest.raises(ferry.InvalidArgument, match="sequence of ints or a buffer"):
            engine.submit_arrays(ferry.WRITE, 1, object(), [0], 8)
        # Memory nobody registered: the C library names the op and the range.
        with pytest.raises(ferry.FerryError) as info:
            engine.submit_arrays(ferry.WRITE, 1, [4096], [0], 8)
        assert info.value.code in (-errno.EFAULT, -errno.ENOENT) and "op 0" in str(info.value)
