"""Engine.register_batch / unregister_batch and the Mooncake shim's batch_register_memory /
batch_unregister_memory: all or none, the failing range named, over P2PHANDSHAKE and over an etcd
this module starts (FERRY_ETCD_BIN, which tests/meson.build sets where etcd is installed)."""

import errno
import os
import shutil
import socket
import subprocess
import tempfile
import time
import urllib.request

import numpy as np
import pytest

import ferry_te
from ferry_te.mooncake import TransferEngine

HOST = "127.0.0.1"
SIZE = 4096
COUNT = 64


def _free_ports(n):
    socks = [socket.socket() for _ in range(n)]
    for s in socks:
        s.bind((HOST, 0))
    ports = [s.getsockname()[1] for s in socks]
    for s in socks:
        s.close()
    return ports


@pytest.fixture(scope="module")
def etcd_url():
    binary = os.environ.get("FERRY_ETCD_BIN", "")
    if not binary:
        print("SKIPPED: FERRY_ETCD_BIN is not set (etcd is not installed where this was built)")
        pytest.skip("SKIPPED: FERRY_ETCD_BIN is not set")
    data = tempfile.mkdtemp(prefix="ferry-etcd-")
    client, peer = _free_ports(2)
    c, p = "http://%s:%d" % (HOST, client), "http://%s:%d" % (HOST, peer)
    with open(os.path.join(data, "etcd.log"), "wb") as log:
        proc = subprocess.Popen([binary, "--data-dir", os.path.join(data, "d"),
                                 "--listen-client-urls", c, "--advertise-client-urls", c,
                                 "--listen-peer-urls", p, "--initial-advertise-peer-urls", p,
                                 "--initial-cluster", "default=" + p], stdout=log, stderr=log)
    try:
        deadline = time.monotonic() + 20
        while True:
            try:
                urllib.request.urlopen(urllib.request.Request(
                    c + "/v3/maintenance/status", data=b"{}"), timeout=1).read()
                break
            except OSError:
                if time.monotonic() > deadline or proc.poll() is not None:
                    raise RuntimeError("etcd did not start: " + open(os.path.join(data, "etcd.log")).read()[-2000:])
                time.sleep(0.1)
        yield "etcd://%s:%d/ferry-pytest-%d" % (HOST, client, os.getpid())
    finally:
        proc.kill()
        proc.wait()
        shutil.rmtree(data, ignore_errors=True)


@pytest.fixture(params=["p2p", "etcd"])
def metadata(request):
    if request.param == "p2p":
        return "P2PHANDSHAKE"
    return request.getfixturevalue("etcd_url")


def _engine(metadata, name):
    keys = {"plugins": "tcp", "local_ip": HOST, "metadata": metadata}
    if metadata != "P2PHANDSHAKE":
        keys.update(local_server_name=name, etcd_lease_ttl_s="2")
    return ferry_te.Engine(keys)


def test_register_batch_all_or_none(metadata):
    target, initiator = _engine(metadata, "batch-target"), _engine(metadata, "batch-initiator")
    with target, initiator:
        bufs = [bytearray(os.urandom(SIZE)) for _ in range(COUNT)]
        local = bytearray(SIZE)
        initiator.register(local)
        seg = initiator.open_segment(target.segment_name)

        # An overlap in the middle: nothing stays registered, the error names the range, and the
        # buffers are let go (a bytearray with a live export cannot resize).
        bad = bufs[:10] + [_inside(bufs[3])] + bufs[10:]
        with pytest.raises(ferry_te.AlreadyExists) as e:
            target.register_batch(bad)
        assert "range 10 of %d" % (COUNT + 1) in str(e.value) and "range 3 of this batch" in str(e.value)
        assert target.regions == [] and seg.regions() == []
        bufs[0].append(1)
        bufs[0].pop()

        regions = target.register_batch(bufs, ferry_te.REMOTE_READ)
        assert [r.address for r in regions] == [_addr(b) for b in bufs]
        assert all(r.registered and r.access == ferry_te.REMOTE_READ for r in regions)
        assert len(seg.regions()) == COUNT
        for i in (0, COUNT // 2, COUNT - 1):
            initiator.read(local, seg, regions[i].address)
            assert local == bufs[i]

        # An address where no region starts: nothing is unregistered.
        with pytest.raises(ferry_te.NotFound) as e:
            target.unregister_batch(regions[:5] + [regions[5].address + 8])
        assert "address 5 of 6" in str(e.value)
        assert len(target.regions) == COUNT and all(r.registered for r in regions)
        # Regions, registered objects and addresses, in one call.
        target.unregister_batch(regions[:20] + bufs[20:40] + [r.address for r in regions[40:]])
        assert target.regions == [] and not any(r.registered for r in regions)
        assert seg.regions() == []
        bufs[0].append(1)  # let go
        target.unregister_batch(regions[:3])  # already unregistered: skipped


def _addr(buf):
    import ctypes
    return ctypes.addressof((ctypes.c_char * len(buf)).from_buffer(buf))


def _inside(buf):
    """A raw range inside `buf` (overlapping it)."""
    return (_addr(buf) + 100, 64)


def test_mooncake_batch_register_memory(metadata):
    engine = TransferEngine()
    assert engine.initialize(HOST, metadata, "tcp", "") == 0, engine.last_error()
    peer = _engine(metadata, "mooncake-peer")
    try:
        kv = np.zeros(COUNT * SIZE, np.uint8)
        addrs = [kv.ctypes.data + i * SIZE for i in range(COUNT)]
        caps = [SIZE] * COUNT
        seg = peer.open_segment(engine.get_session_id())
        bad = addrs[:]
        bad[40] = addrs[7] + 8
        rc = engine.batch_register_memory(bad, caps)
        assert rc == -7, (rc, engine.last_error())  # Mooncake's ERR_ADDRESS_OVERLAPPED
        assert engine.last_error_code() == -errno.EEXIST
        assert "range 40 of 64" in engine.last_error()
        assert seg.regions() == []
        assert engine.batch_register_memory(addrs, caps[:-1]) == -1  # ERR_INVALID_ARGUMENT

        assert engine.batch_register_memory(addrs, caps) == 0, engine.last_error()
        assert len(seg.regions()) == COUNT
        # Mooncake's convention for a list with an address never registered: every other one
        # is unregistered, and the failure's code comes back.
        rc = engine.batch_unregister_memory(addrs[:10] + [addrs[10] + 1])
        assert rc == -3, rc  # ERR_ADDRESS_NOT_REGISTERED
        assert len(seg.regions()) == COUNT - 10
        assert engine.batch_unregister_memory(addrs[10:]) == 0, engine.last_error()
        assert seg.regions() == []
        assert engine.register_memory(addrs[0], SIZE) == 0  # nothing left over
    finally:
        peer.close()
        engine.close()
