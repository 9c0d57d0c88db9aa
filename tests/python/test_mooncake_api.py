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


# A host with every plugin, and this build's without hardware (tcp and shm only).
EVERYTHING = {p: (True, "") for p in ("tcp", "shm", "rdma", "efa", "cuda_ipc", "hip_ipc")}
BARE = {"tcp": (True, ""), "shm": (True, ""),
        "rdma": (False, "rdma.so unavailable: no RDMA devices"),
        "efa": (False, "efa.so unavailable: no EFA device"),
        "cuda_ipc": (False, "cuda_ipc.so variant-skipped: no NVIDIA driver"),
        "hip_ipc": (False, "hip_ipc.so unavailable: no /dev/kfd")}


@pytest.mark.parametrize("protocol, device, want", [
    ("tcp", "", {"plugins": "tcp,cuda_ipc,hip_ipc,shm"}),
    ("rdma", "mlx5_0,mlx5_1", {"plugins": "rdma,cuda_ipc,hip_ipc,shm", "rdma.devices": "mlx5_0,mlx5_1"}),
    ("efa", "", {"plugins": "efa,cuda_ipc,hip_ipc,shm"}),
    ("hip", "", {"plugins": "rdma,cuda_ipc,hip_ipc,shm"}),  # Mooncake: RDMA when HCAs, HIP beside
    ("nvlink_intra", "", {"plugins": "rdma,cuda_ipc,hip_ipc,shm"}),
    ("rdma,tcp", "mlx5_2", {"plugins": "rdma,tcp", "rdma.devices": "mlx5_2"}),  # Ferry's own form
    ("tcp", "mlx5_0", {"plugins": "tcp,cuda_ipc,hip_ipc,shm"}),  # no NIC list for tcp, as in Mooncake
])
def test_protocols_map_to_plugins(protocol, device, want):
    cfg, note = _setup.engine_config("127.0.0.1", "P2PHANDSHAKE", protocol, device, EVERYTHING, {})
    assert note is None
    for k, v in want.items():
        assert cfg[k] == v, (k, cfg)
    if "rdma.devices" not in want:
        assert "rdma.devices" not in cfg
    assert cfg["metadata"] == "P2PHANDSHAKE" and cfg["local_ip"] == "127.0.0.1"


@pytest.mark.parametrize("protocol, env, plugins, note", [
    # No NIC: what was asked falls back to tcp, with one line saying why.
    ("rdma", {}, ("tcp", "shm"), "protocol 'rdma' asked, tcp chosen: rdma.so unavailable: no RDMA devices"),
    ("efa", {}, ("tcp", "shm"), "protocol 'efa' asked, tcp chosen: efa.so unavailable: no EFA device"),
    ("tcp", {}, ("tcp", "shm"), None),
    ("nvlink_intra", {}, ("tcp", "shm"), "cuda_ipc.so variant-skipped: no NVIDIA driver; tcp carries"),
    ("shm", {}, ("tcp", "shm"), None),
    # MC_FORCE_TCP, any value, even empty: tcp alone.
    ("rdma", {"MC_FORCE_TCP": ""}, ("tcp",), "MC_FORCE_TCP is set, so tcp alone"),
    ("tcp", {"MC_FORCE_TCP": "true"}, ("tcp",), None),
    ("ferry", {"MC_FORCE_TCP": "1"}, ("tcp",), "MC_FORCE_TCP is set"),
])
def test_selection_without_hardware(protocol, env, plugins, note):
    got, why = _setup.select_plugins(protocol, BARE, env)
    assert got == plugins
    if note is None:
        assert why is None
    else:
        assert note in why, why


def test_selection_with_hardware_and_forcing():
    assert _setup.select_plugins("rdma", EVERYTHING, {"MC_FORCE_TCP": "1"})[0] == ("tcp",)
    got, note = _setup.select_plugins("tcp", EVERYTHING, {"MC_FORCE_HCA": "1"})
    assert got == ("rdma", "cuda_ipc", "hip_ipc", "shm") and "MC_FORCE_HCA" in note
    with pytest.raises(_setup.SetupError, match="MC_FORCE_HCA is set but rdma.so unavailable"):
        _setup.select_plugins("rdma", BARE, {"MC_FORCE_HCA": "1"})
    no_tcp = dict(BARE, tcp=(False, "tcp.so failed: gone"))
    with pytest.raises(_setup.SetupError, match="rdma.so unavailable.*tcp.so failed"):
        _setup.select_plugins("rdma", no_tcp, {})
    with pytest.raises(_setup.SetupError, match="unknown"):
        _setup.select_plugins("carrier-pigeon", EVERYTHING, {})
    # A plugin no file of which is on the path says so.
    got, note = _setup.select_plugins("efa", {"tcp": (True, "")}, {})
    assert got == ("tcp",) and "efa.so is not on the plugin path" in note


def test_storage_protocols_load_file_and_gds_beside_the_network():
    with_storage = dict(EVERYTHING, file=(True, ""), gds=(True, ""))
    got, note = _setup.select_plugins("io_uring", with_storage, {})
    assert got == ("rdma", "cuda_ipc", "hip_ipc", "shm", "gds", "file") and note is None
    # Every selection loads the storage plugins that load, so file:<path> segments open.
    assert _setup.select_plugins("tcp", with_storage, {})[0][-2:] == ("gds", "file")
    bare = dict(BARE, file=(True, ""), gds=(False, "gds.so unavailable: no libcufile.so.0"))
    got, note = _setup.select_plugins("gds", bare, {})
    assert got == ("tcp", "shm", "file")
    assert "no libcufile.so.0" in note and "file.so (GPU memory staged" in note
    assert _setup.transport_for_hint("io_uring") == "file"
    assert _setup.transport_for_hint("gds") == "gds"


def test_plugin_states_read_the_report():
    report = {"plugins": [
        {"name": "rdma", "state": "variant-skipped", "reason": "cuda13/: no driver"},
        {"name": "rdma", "state": "unavailable", "reason": "no RDMA devices"},
        {"name": "rdma", "state": "shadowed", "reason": "shadowed by x"},
        {"name": "hip_ipc", "state": "variant-skipped", "reason": "rocm6/: no HIP"},
        {"name": "tcp", "state": "loaded", "reason": "always"},
        {"name": "cuda_ipc", "state": "unavailable", "reason": "no GPU"},
        {"name": "cuda_ipc", "state": "loaded", "reason": "CUDA 13"}]}
    states = _setup.plugin_states(report)
    assert states["tcp"][0] and states["cuda_ipc"][0]
    assert states["rdma"] == (False, "rdma.so unavailable: no RDMA devices")
    assert states["hip_ipc"] == (False, "hip_ipc.so variant-skipped: rocm6/: no HIP")


def test_environment_tuning_maps_to_ferry_keys():
    from ferry_te.mooncake import _env
    env = {"MC_LOG_LEVEL": "WARNING", "MC_HANDSHAKE_CONNECT_TIMEOUT": "3", "MC_TCP_SLICE_SIZE": "65536",
           "MC_GID_INDEX": "3", "MC_IB_TC": "-1", "MC_IB_SL": "2", "MC_MTU": "4096",
           "MC_TE_FILTERS": "mlx5_0, mlx5_1", "MC_RDMA_BIND_ADDRESS": "10.0.0.9", "MC_TRANSFER_TIMEOUT": "7"}
    keys = _env.engine_keys(("rdma", "tcp"), "", env)
    assert keys == {"log_level": "warn", "handshake_timeout_ms": "3000", "tcp.connect_timeout_ms": "3000",
                    "rdma.connect_timeout_ms": "3000", "tcp.slice_size": "65536", "rdma.gid_index": "3",
                    "rdma.service_level": "2", "rdma.mtu": "4096", "rdma.devices": "mlx5_0,mlx5_1",
                    "rdma.bind_ip": "10.0.0.9", "tcp.op_timeout_ms": "7000", "rdma.op_timeout_ms": "7000"}
    # device_name wins over MC_TE_FILTERS; nothing for plugins not loaded.
    assert "rdma.devices" not in _env.engine_keys(("rdma",), "mlx5_3", env)
    assert not any(k.startswith("rdma.") for k in _env.engine_keys(("tcp",), "", env))
    for bad, why in (({"MC_LOG_LEVEL": "LOUD"}, "TRACE, INFO"), ({"MC_MTU": "9000"}, "outside 256..4096"),
                     ({"MC_TCP_SLICE_SIZE": "big"}, "not a whole number")):
        with pytest.raises(_setup.SetupError, match=why):
            _env.engine_keys(("rdma", "tcp"), "", bad)
    assert _env.redis_keys({"MC_REDIS_PASSWORD": "pw", "MC_REDIS_DB_INDEX": "3",
                            "MC_REDIS_USERNAME": "u"}) == {"redis_password": "pw", "redis_db": "3",
                                                           "redis_user": "u"}
    with pytest.raises(_setup.SetupError, match="MC_REDIS_DB_INDEX=256"):
        _env.redis_keys({"MC_REDIS_DB_INDEX": "256"})
    assert _env.rpc_port_range({}) is None
    assert _env.rpc_port_range({"MC_MIN_RPC_PORT": "16000"}) == (16000, 17000)
    assert _env.rpc_port_range({"MC_MIN_RPC_PORT": "20000"}) == (20000, 65535)
    assert _env.rpc_port_range({"MC_MIN_PRC_PORT": "16000", "MC_MAX_RPC_PORT": "16001"}) == (16000, 16001)
    with pytest.raises(_setup.SetupError, match="above MC_MAX_RPC_PORT"):
        _env.rpc_port_range({"MC_MIN_RPC_PORT": "16000", "MC_MAX_RPC_PORT": "15000"})


def test_every_mooncake_variable_is_documented():
    """docs/MOONCAKE.md's table of MC_* variables is this module's, row for row."""
    import os
    import re
    from ferry_te.mooncake import _env
    doc = open(os.path.join(os.path.dirname(__file__), "..", "..", "docs", "MOONCAKE.md")).read()
    rows = dict(re.findall(r"^\| `(MC_[A-Z0-9_]+)` \| (honoured|ignored) \|", doc, re.M))
    want = {**{k: "honoured" for k in _env.HONOURED}, **{k: "ignored" for k in _env.IGNORED}}
    assert rows == want
    assert not set(_env.HONOURED) & set(_env.IGNORED)


def test_metadata_and_host_forms():
    url = _setup.metadata_url
    assert url("P2PHANDSHAKE") == "P2PHANDSHAKE"
    assert url("10.0.0.5:2379") == "etcd://10.0.0.5:2379"
    assert url("etcd://10.0.0.5:2379") == "etcd://10.0.0.5:2379"
    assert url("10.0.0.5:2379", "etcd") == "etcd://10.0.0.5:2379"
    assert url("http://10.0.0.5:8080/metadata") == "http://10.0.0.5:8080/metadata"
    assert url("10.0.0.5:8080/metadata", "http") == "http://10.0.0.5:8080/metadata"
    assert url("redis://10.0.0.5:6379") == "redis://10.0.0.5:6379"
    assert url("", environ={"MC_METADATA_SERVER": "redis://h:1"}) == "redis://h:1"
    for bad in ("memcached://10.0.0.5:11211", ""):
        with pytest.raises(_setup.SetupError, match="memcached|MC_METADATA_SERVER"):
            url(bad, environ={})

    def config(host, metadata, env=None):
        return _setup.engine_config(host, metadata, "tcp", "", BARE, env or {})[0]

    # P2PHANDSHAKE: the session is ip:port with a port this engine picks, as in Mooncake.
    cfg = config("127.0.0.1:17777", "P2PHANDSHAKE")
    assert "rpc_port" not in cfg and "local_server_name" not in cfg
    # tcp data goes over local_hostname's address too, not tcp.so's default 127.0.0.1.
    assert config("10.0.0.5", "P2PHANDSHAKE")["tcp.bind_ip"] == "10.0.0.5"
    # A metadata server: the segment is named local_hostname; its port is bound only with
    # MC_LEGACY_RPC_PORT_BINDING; MC_TCP_BIND_ADDRESS picks the address.
    cfg = config("127.0.0.1:17777", "etcd://127.0.0.1:2379")
    assert cfg["local_server_name"] == "127.0.0.1:17777" and "rpc_port" not in cfg
    cfg = config("127.0.0.1:17777", "http://127.0.0.1:1/metadata", {"MC_LEGACY_RPC_PORT_BINDING": ""})
    assert cfg["rpc_port"] == "17777"
    cfg = config("node-a:17777", "redis://127.0.0.1:6379",
                 {"MC_TCP_BIND_ADDRESS": "127.0.0.2", "MC_REDIS_PASSWORD": "pw"})
    assert cfg["local_ip"] == cfg["tcp.bind_ip"] == "127.0.0.2" and cfg["redis_password"] == "pw"
    assert _setup.split_host("[::1]:80") == ("::1", 80)
    assert config("localhost", "P2PHANDSHAKE")["local_ip"] in ("127.0.0.1", "::1")
    assert config("127.0.0.1", "P2PHANDSHAKE", {"MC_TRANSFER_TIMEOUT": "2"})["tcp.op_timeout_ms"] == "5000"
    with pytest.raises(_setup.SetupError, match="MC_TRANSFER_TIMEOUT"):
        config("127.0.0.1", "P2PHANDSHAKE", {"MC_TRANSFER_TIMEOUT": "soon"})
    # The control port: fixed, from Mooncake's range, or any.
    assert _setup.control_ports({"rpc_port": "5"}) == ["5"]
    assert _setup.control_ports({}, {}) == ["0"]
    ports = _setup.control_ports({}, {"MC_MIN_RPC_PORT": "20000", "MC_MAX_RPC_PORT": "20009"})
    assert sorted(ports) == [str(p) for p in range(20000, 20010)]


def test_ports_come_from_mooncakes_range(monkeypatch):
    """MC_MIN/MAX_RPC_PORT: the engine binds a port of the range, the next where one is held."""
    import socket
    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    monkeypatch.setenv("MC_MIN_RPC_PORT", str(port))
    monkeypatch.setenv("MC_MAX_RPC_PORT", str(port + 1))
    e = TransferEngine()
    rc = e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "")
    if rc != 0 and "in use" in e.last_error():  # port + 1 is taken by someone else too
        pytest.skip("SKIPPED: ports %d and %d are both held on this host" % (port, port + 1))
    assert rc == 0, e.last_error()
    assert e.get_rpc_port() == port + 1
    e.close()
    held.close()


@pytest.mark.parametrize("args, code, why", [
    (("127.0.0.1", "P2PHANDSHAKE", "nvlink", ""), -errno.EPROTONOSUPPORT, "multi-node NVLink"),
    (("127.0.0.1", "P2PHANDSHAKE", "cxi", ""), -errno.EPROTONOSUPPORT, "CXI"),
    (("127.0.0.1", "P2PHANDSHAKE", "carrier-pigeon", ""), -errno.EPROTONOSUPPORT, "unknown"),
    (("127.0.0.1", "memcached://127.0.0.1:11211", "tcp", ""), -errno.EPROTONOSUPPORT, "memcached"),
    (("", "P2PHANDSHAKE", "tcp", ""), -errno.EINVAL, "local_hostname is empty"),
    (("no-such-host.invalid", "P2PHANDSHAKE", "tcp", ""), -errno.EHOSTUNREACH, "resolve"),
])
def test_initialize_refuses_with_a_reason(args, code, why):
    engine = TransferEngine()
    assert engine.initialize(*args) == -1  # Mooncake's value; Ferry's code is kept
    assert engine.last_error_code() == code
    assert why in engine.last_error(), engine.last_error()


def test_calls_before_initialize_return_codes():
    engine = TransferEngine()
    assert engine.get_rpc_port() == -1 and "initialize()" in engine.last_error()
    assert engine.last_error_code() == -errno.EBADF
    assert engine.register_memory(4096, 4096) == -1  # ERR_INVALID_ARGUMENT
    assert engine.transfer_sync_write("127.0.0.1:1", 4096, 0, 8) == -1
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
    assert engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1
    assert engine.last_error_code() == -errno.EALREADY
    assert engine.register_memory(buf.ctypes.data, 0) == -1  # ERR_INVALID_ARGUMENT
    assert engine.register_memory(buf.ctypes.data, buf.nbytes, "npu:0") == -1
    assert "location 'npu:0'" in engine.last_error()
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == 0
    assert engine.register_memory(buf.ctypes.data, buf.nbytes) == -7  # ERR_ADDRESS_OVERLAPPED
    assert engine.batch_register_memory([1, 2], [3]) == -1
    me = engine.get_session_id()
    rc = engine.batch_transfer_sync_write(me, [buf.ctypes.data] * 2, [buf.ctypes.data], [8, 8])
    assert rc == -1 and engine.last_error_code() == -errno.EINVAL
    assert "1 entries" in engine.last_error(), engine.last_error()
    rc = engine.batch_transfer_sync_write(me, [buf.ctypes.data], [buf.ctypes.data], [0])
    assert rc == -1 and "lengths[0] is 0" in engine.last_error()
    rc = engine.transfer_sync_write(me, buf.ctypes.data, buf.ctypes.data, 8, "carrier-pigeon")
    assert rc < 0 and "carrier-pigeon" in engine.last_error()
    with pytest.raises(ValueError, match="opcode"):
        engine.transfer_sync(me, buf.ctypes.data, buf.ctypes.data, 8, 5)
    with pytest.raises(TypeError, match="TransferNotify"):
        engine.transfer_sync(me, buf.ctypes.data, buf.ctypes.data, 8, TransferOpcode.Write, "x")
    assert engine.get_batch_transfer_status([12345]) == -1
    assert engine.transfer_check_status(12345) == -1
    assert engine.free_managed_buffer(buf.ctypes.data, 8) == -1
    assert engine.unregister_memory(buf.ctypes.data) == 0
    assert engine.unregister_memory(buf.ctypes.data) == -3  # twice: ERR_ADDRESS_NOT_REGISTERED
    # Buffer helpers reach only memory registered through this engine.
    assert engine.write_bytes_to_buffer(buf.ctypes.data, b"abc", 3) == -1
    with pytest.raises(ValueError, match="not inside"):
        engine.read_bytes_from_buffer(buf.ctypes.data, 3)
    m = engine.allocate_managed_buffer(100)
    assert engine.write_bytes_to_buffer(m, b"abc", 4) == -1  # more than given
    assert engine.last_error_code() == -errno.EINVAL
    assert engine.write_bytes_to_buffer(m + 4090, b"abcdefgh", 8) == -1
    assert engine.last_error_code() == -errno.EFAULT
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
