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


def test_a_mooncake_program_runs_unchanged(ferry_mod, tmp_path):
    """`python3 -m ferry_te.mooncake SCRIPT` runs a program that imports mooncake.engine, with
    SGLang's literal protocol "rdma" (tcp here, with no RDMA NIC)."""
    import subprocess
    import sys
    script = tmp_path / "uses_mooncake.py"
    script.write_text("import sys\n"
                      "from mooncake.engine import TransferEngine, TransferOpcode\n"
                      "e = TransferEngine()\n"
                      "assert e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'rdma', '') == 0\n"
                      "print('ready', sys.argv[1:], e.get_rpc_port() > 0)\n")
    out = subprocess.run([sys.executable, "-m", "ferry_te.mooncake", str(script), "x"],
                         capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "ready ['x'] True", out.stderr
