"""The installed wheel carries ferry_te.mooncake and the array batch call (the source-tree
suite, tests/python, covers them in depth)."""

import numpy as np


def test_mooncake_loopback(ferry_mod):
    from ferry_te.mooncake import TransferEngine, TransferNotify, TransferOpcode
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, engine.last_error()
    session = "127.0.0.1:%d" % engine.get_rpc_port()
    src = np.random.default_rng(3).integers(0, 256, 1 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    assert engine.batch_register_memory([src.ctypes.data, dst.ctypes.data],
                                        [src.nbytes, dst.nbytes]) == 0
    offs = range(0, src.nbytes, 4096)
    assert engine.batch_transfer_sync_write(session, [src.ctypes.data + o for o in offs],
                                            [dst.ctypes.data + o for o in offs],
                                            [4096] * len(offs)) == 0, engine.last_error()
    assert (dst == src).all()
    assert engine.transfer_sync(session, src.ctypes.data, dst.ctypes.data, 8,
                                TransferOpcode.Write, TransferNotify("n", "m")) == 0
    assert [(n.name, n.msg) for n in engine.get_notifies()] == [("n", "m")]
    engine.close()


def test_submit_arrays_installed(ferry_mod):
    ferry = ferry_mod
    with ferry.Engine(local_ip="127.0.0.1", plugins="tcp") as engine:
        src = np.arange(1 << 16, dtype=np.uint8)
        dst = np.zeros_like(src)
        r = engine.register(src)
        engine.register(dst)
        seg = engine.open_segment(engine.segment_name)
        offs = np.arange(0, src.nbytes, 256, dtype=np.uint64)
        engine.submit_arrays(ferry.WRITE, seg, offs, offs, 256, local_base=r,
                             remote_base=dst.ctypes.data).wait()
        assert (dst == src).all()
