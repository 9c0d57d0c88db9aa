"""Mooncake's stream-ordered calls (transfer_write_on_cuda, batch_transfer_read_on_cuda, ...)
through ferry_te.mooncake against the strict fake CUDA driver (tests/gpu_fake): a slow async
copy writes the source on the stream just before the call, as a kernel writes a KV block, and
the peer receives what it wrote; a failed batch is raised by the next call; bad input raises
RuntimeError as Mooncake's calls do."""

import time

import numpy as np
import pytest

from conftest import pattern
from fake_cuda import cuda  # noqa: F401,F811 (the fixture)
from ferry_te.mooncake import TransferEngine

SIZE = 1 << 20
HOST = "127.0.0.1"


def engine_pair(monkeypatch):
    monkeypatch.setenv("MC_FORCE_TCP", "1")  # GPU memory from this host's fake GPU, staged over tcp
    target, engine = TransferEngine(), TransferEngine()
    for e in (target, engine):
        assert e.initialize(HOST, "P2PHANDSHAKE", "rdma", "") == 0, e.last_error()
    return target, engine


def test_mooncake_on_cuda_calls_follow_the_stream(cuda, monkeypatch):  # noqa: F811
    target, engine = engine_pair(monkeypatch)
    remote = np.zeros(2 * SIZE, np.uint8)
    assert target.register_memory(remote.ctypes.data, remote.nbytes) == 0
    session = "%s:%d" % (HOST, target.get_rpc_port())
    dev = cuda.alloc(2 * SIZE)
    assert engine.register_memory(dev, 2 * SIZE, "cuda:0") == 0, engine.last_error()
    stream = cuda.stream()

    # The "kernel" (a 300 ms async copy) writes the source; the write is queued behind it.
    kv = pattern(SIZE, 41)
    cuda.lib.ferry_fake_cuda_delay_next_copy_us(300000)
    cuda.put_async(dev, kv, stream)
    t0 = time.monotonic()
    assert engine.transfer_write_on_cuda(session, dev, remote.ctypes.data, SIZE, stream) is None
    assert time.monotonic() - t0 < 0.25, "the call waited for the stream"
    cuda.sync(stream)  # work after the call waits for the transfer: syncing covers it
    assert (remote[:SIZE] == kv).all()

    # Batch form, both halves, then read them back into the second half of device memory.
    more = pattern(SIZE, 42)
    cuda.put_async(dev + SIZE, more, stream)
    engine.batch_transfer_write_on_cuda(session, [dev, dev + SIZE], [remote.ctypes.data + SIZE, remote.ctypes.data],
                                        [SIZE, SIZE], stream)
    cuda.sync(stream)
    assert (remote[SIZE:] == kv).all() and (remote[:SIZE] == more).all()
    engine.batch_transfer_read_on_cuda(session, [dev + SIZE], [remote.ctypes.data + SIZE], [SIZE], stream)
    cuda.sync(stream)
    back = np.zeros(SIZE, np.uint8)
    cuda.get(dev + SIZE, back)
    assert (back == kv).all()

    # Refused at the call, as Mooncake raises: no such segment, lists that differ in length.
    with pytest.raises(RuntimeError, match="127.0.0.1:1"):
        engine.transfer_write_on_cuda("127.0.0.1:1", dev, remote.ctypes.data, 8, stream)
    with pytest.raises(RuntimeError, match="entries"):
        engine.batch_transfer_write_on_cuda(session, [dev, dev], [remote.ctypes.data], [8, 8], stream)

    # A batch that fails at the target (past its buffer) does not end the process: the next
    # call raises it, once, and the stream goes on.
    engine.transfer_write_on_cuda(session, dev, remote.ctypes.data + 2 * SIZE, 4096, stream)
    cuda.sync(stream)
    with pytest.raises(RuntimeError, match="an earlier transfer_write_on_cuda to 127.0.0.1:[0-9]+ failed"):
        engine.transfer_write_on_cuda(session, dev, remote.ctypes.data, 8, stream)
    engine.transfer_write_on_cuda(session, dev, remote.ctypes.data, 8, stream)
    cuda.sync(stream)
    engine.close()
    target.close()
    cuda.lib.cuStreamDestroy_v2(stream)
