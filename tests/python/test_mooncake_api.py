"""ferry_te.mooncake without a peer: Mooncake's arguments mapped to Ferry's configuration,
and every bad input answered with Mooncake's return convention plus a reason."""

import errno
import json
import threading

import numpy as np
import pytest

import ferry_te.mooncake as mooncake
from ferry_te.mooncake import TransferEngine, TransferNotify, TransferOpcode
from ferry_te.mooncake import _setup
from ferry_te.mooncake._notify import decode_notification, encode_notification


def test_types_match_mooncake():
    assert int(TransferOpcode.Read) == 0 and int(TransferOpcode.Write) == 1
    assert mooncake.Read is TransferOpcode.Read and TransferEngine.TransferOpcode is TransferOpcode
    n = TransferNotify()
    assert (n.name, n.msg) == ("", "")
    n = TransferNotify(name="a", msg="b")
    n.msg = "c"
    assert n == TransferNotify("a", "c")
    assert isinstance(mooncake.SUPPORT_EFA, bool) and mooncake.SUPPORT_MNNVL is False


def test_notification_payload_round_trips():
    for note in (TransferNotify("", ""), TransferNotify("room:1", "x" * 1000),
                 TransferNotify("ü", "\udcff")):
        assert decode_notification("peer", encode_notification(note)) == note
    # A plain Ferry notification (no framing) reads as (sender, text).
    assert decode_notification("10.0.0.1:5", b"hello") == TransferNotify("10.0.0.1:5", "hello")
    assert decode_notification("s", b"MCN1\xff\xff\xff\xff") == TransferNotify(
        "s", "MCN1\udcff\udcff\udcff\udcff")


@pytest.mark.parametrize("protocol, device, want", [
    ("tcp", "", {"plugins": "tcp"}),
    ("rdma", "mlx5_0,mlx5_1", {"plugins": "rdma", "rdma.devices": "mlx5_0,mlx5_1"}),
    ("efa", "", {"plugins": "efa"}),
    ("hip", "", {"plugins": "hip_ipc"}),
    ("nvlink_intra", "", {"plugins": "cuda_ipc"}),
    ("rdma,tcp", "mlx5_2", {"plugins": "rdma,tcp", "protocols": "rdma,tcp",
                           "rdma.devices": "mlx5_2"}),
    ("tcp", "mlx5_0", {"plugins": "tcp"}),  # no NIC list for tcp, as in Mooncake
])
def test_protocols_map_to_plugins(protocol, device, want):
    cfg = _setup.engine_config("127.0.0.1", "P2PHANDSHAKE", protocol, device)
    for k, v in want.items():
        assert cfg[k] == v, (k, cfg)
    if "rdma.devices" not in want:
        assert "rdma.devices" not in cfg
    assert cfg["metadata"] == "P2PHANDSHAKE" and cfg["local_ip"] == "127.0.0.1"


def test_metadata_and_host_forms(monkeypatch):
    assert _setup.metadata_url("P2PHANDSHAKE") == "P2PHANDSHAKE"
    assert _setup.metadata_url("10.0.0.5:2379") == "etcd://10.0.0.5:2379"
    assert _setup.metadata_url("etcd://10.0.0.5:2379") == "etcd://10.0.0.5:2379"
    assert _setup.metadata_url("10.0.0.5:2379", "etcd") == "etcd://10.0.0.5:2379"
    for bad in ("redis://10.0.0.5:6379", "http://10.0.0.5:8080/metadata"):
        with pytest.raises(_setup.SetupError, match="not in (redis|http)"):
            _setup.metadata_url(bad)
    cfg = _setup.engine_config("127.0.0.1:17777", "P2PHANDSHAKE", "tcp", "")
    assert cfg["rpc_port"] == "17777" and "local_server_name" not in cfg
    # tcp data goes over local_hostname's address too, not tcp.so's default 127.0.0.1.
    assert _setup.engine_config("10.0.0.5", "P2PHANDSHAKE", "tcp", "")["tcp.bind_ip"] == "10.0.0.5"
    assert "tcp.bind_ip" not in _setup.engine_config("10.0.0.5", "P2PHANDSHAKE", "rdma", "")
    cfg = _setup.engine_config("127.0.0.1:17777", "etcd://127.0.0.1:2379", "tcp", "")
    assert cfg["local_server_name"] == "127.0.0.1:17777"
    assert _setup.split_host("[::1]:80") == ("::1", 80)
    assert _setup.engine_config("localhost", "P2PHANDSHAKE", "tcp", "")["local_ip"] in (
        "127.0.0.1", "::1")
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "2")  # Mooncake's floor is 5 s
    assert _setup.engine_config("127.0.0.1", "P2PHANDSHAKE", "tcp", "")["tcp.op_timeout_ms"] == \
        "5000"
    monkeypatch.setenv("MC_TRANSFER_TIMEOUT", "soon")
    with pytest.raises(_setup.SetupError, match="MC_TRANSFER_TIMEOUT"):
        _setup.engine_config("127.0.0.1", "P2PHANDSHAKE", "tcp", "")


@pytest.mark.parametrize("args, code, why", [
    (("127.0.0.1", "P2PHANDSHAKE", "nvlink", ""), -errno.EPROTONOSUPPORT, "multi-node NVLink"),
    (("127.0.0.1", "P2PHANDSHAKE", "cxi", ""), -errno.EPROTONOSUPPORT, "CXI"),
    (("127.0.0.1", "P2PHANDSHAKE", "carrier-pigeon", ""), -errno.EPROTONOSUPPORT, "unknown"),
    (("127.0.0.1", "redis://127.0.0.1:6379", "tcp", ""), -errno.EPROTONOSUPPORT, "redis"),
    (("", "P2PHANDSHAKE", "tcp", ""), -errno.EINVAL, "local_hostname is empty"),
    (("no-such-host.invalid", "P2PHANDSHAKE", "tcp", ""), -errno.EHOSTUNREACH, "resolve"),
])
def test_initialize_refuses_with_a_reason(args, code, why):
    engine = TransferEngine()
    assert engine.initialize(*args) == code
    assert why in engine.last_error(), engine.last_error()


def test_calls_before_initialize_return_codes():
    engine = TransferEngine()
    assert engine.get_rpc_port() == -errno.EBADF and "initialize()" in engine.last_error()
    assert engine.register_memory(4096, 4096) == -errno.EBADF
    assert engine.transfer_sync_write("127.0.0.1:1", 4096, 0, 8) == -errno.EBADF
    assert engine.batch_transfer_async_write("127.0.0.1:1", [4096], [0], [8]) == 0
    assert engine.allocate_managed_buffer(4096) == 0
    assert engine.get_notifies() == [] and engine.get_engine_ptr() == 0


@pytest.fixture
def engine():
    e = TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0, e.last_error()
    yield e
    e.close()


def test_bad_arguments(engine):
    buf = np.zeros(1 << 16, np.uint8)
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -errno.EALREADY
    assert engine.register_memory(buf.ctypes.data, 0) == -errno.EINVAL
    assert engine.register_memory(buf.ctypes.data, buf.nbytes, "npu:0") == -errno.EINVAL
    assert "location 'npu:0'" in engine.last_error()
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) < 0  # already registered
    assert engine.batch_register_memory([1, 2], [3]) == -errno.EINVAL
    me = engine.get_session_id()
    rc = engine.batch_transfer_sync_write(me, [buf.ctypes.data] * 2, [buf.ctypes.data], [8, 8])
    assert rc == -errno.EINVAL and "1 entries" in engine.last_error(), engine.last_error()
    rc = engine.batch_transfer_sync_write(me, [buf.ctypes.data], [buf.ctypes.data], [0])
    assert rc == -errno.EINVAL and "lengths[0] is 0" in engine.last_error()
    rc = engine.transfer_sync_write(me, buf.ctypes.data, buf.ctypes.data, 8, "carrier-pigeon")
    assert rc < 0 and "carrier-pigeon" in engine.last_error()
    with pytest.raises(ValueError, match="opcode"):
        engine.transfer_sync(me, buf.ctypes.data, buf.ctypes.data, 8, 5)
    with pytest.raises(TypeError, match="TransferNotify"):
        engine.transfer_sync(me, buf.ctypes.data, buf.ctypes.data, 8, TransferOpcode.Write, "x")
    assert engine.get_batch_transfer_status([12345]) == -errno.ENOENT
    assert engine.transfer_check_status(12345) == -1
    assert engine.free_managed_buffer(buf.ctypes.data, 8) == -errno.EINVAL
    assert engine.unregister_memory(buf.ctypes.data) == 0
    assert engine.unregister_memory(buf.ctypes.data) < 0  # twice
    # Buffer helpers reach only memory registered through this engine.
    assert engine.write_bytes_to_buffer(buf.ctypes.data, b"abc", 3) == -errno.EFAULT
    with pytest.raises(ValueError, match="not inside"):
        engine.read_bytes_from_buffer(buf.ctypes.data, 3)
    m = engine.allocate_managed_buffer(100)
    assert engine.write_bytes_to_buffer(m, b"abc", 4) == -errno.EINVAL  # more than given
    assert engine.write_bytes_to_buffer(m + 4090, b"abcdefgh", 8) == -errno.EFAULT
    assert engine.free_managed_buffer(m, 100) == 0


def test_loopback_from_many_threads(engine):
    """SGLang transfers from a thread pool: one engine, one session, concurrent calls."""
    me = engine.get_session_id()
    src = np.random.default_rng(5).integers(0, 256, 1 << 20, dtype=np.uint8)
    dst = np.zeros_like(src)
    assert engine.batch_register_memory([src.ctypes.data, dst.ctypes.data],
                                        [src.nbytes, dst.nbytes]) == 0
    chunk = src.nbytes // 8
    results = []

    def work(t):
        offs = range(t * chunk, (t + 1) * chunk, 4096)
        results.append(engine.batch_transfer_sync_write(
            me, [src.ctypes.data + o for o in offs], [dst.ctypes.data + o for o in offs],
            [4096] * len(offs)))

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert results == [0] * 8
    assert (dst == src).all()
    topo = json.loads(engine.get_local_topology())
    assert list(topo) == ["cpu:0"] and "preferred_hca" in topo["cpu:0"]


def test_install_as_mooncake_serves_the_original_import():
    import subprocess
    import sys
    code = ("import ferry_te.mooncake as m; m.install_as_mooncake(); "
            "from mooncake.engine import TransferEngine, TransferOpcode; "
            "assert TransferEngine is m.TransferEngine; "
            "e = TransferEngine(); assert e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0; "
            "print(e.get_rpc_port() > 0)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == "True", out.stderr


def test_alloc_shared_is_registered_memfd_memory():
    """Engine.alloc_shared: page-rounded, registered, writable through memoryview(), a memfd
    mapping (what shm.so hands to peers), and gone after free()."""
    import ferry_te as ferry
    with ferry.Engine({"plugins": "tcp"}) as engine:
        buf = engine.alloc_shared(100)
        assert isinstance(buf, ferry.SharedBuffer) and buf.length == 4096
        mv = buf.memoryview()
        mv[:3] = b"abc"
        assert bytes(mv[:3]) == b"abc"
        del mv
        with open("/proc/self/maps") as f:
            assert any("%x-" % buf.address in line and "/memfd:ferry-shared" in line for line in f)
        assert buf in engine.regions
        buf.free()
        buf.free()  # a second call does nothing
        assert buf not in engine.regions
