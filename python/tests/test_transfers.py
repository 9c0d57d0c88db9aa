"""Two Python processes moving numpy buffers, every byte checked."""

import hashlib
import os

import numpy as np
import pytest

from conftest import has_plugin

SIZE = 32 << 20
BLOCK = 1 << 20


def pattern(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)


@pytest.fixture(params=["tcp", "shm"])
def transport(request, plugin_dir, ferry_mod):
    name = request.param
    if not has_plugin(plugin_dir, name):
        pytest.skip("%s.so is not in this ferry build (%s has no %s.so: plugins/%s is not in the "
                    "tree or was not built)" % (name, plugin_dir, name, name))
    rec = [p for p in ferry_mod.plugin_report()["plugins"] if p["name"] == name]
    if not rec or rec[0]["state"] != "loaded":
        pytest.skip("%s.so does not load on this host: %s" % (name, rec[0]["reason"] if rec else "?"))
    return name


def test_two_processes(ferry_mod, make_peer, transport):
    ferry = ferry_mod
    peer = make_peer(transport, SIZE, seed=11)
    with ferry.Engine(plugins=transport) as engine:
        local = np.zeros(SIZE, dtype=np.uint8)
        region = engine.register(local)
        seg = engine.open_segment(peer.segment)
        regions = seg.regions()
        assert any(r.address == peer.address and r.length == SIZE for r in regions), regions

        # READ the peer's buffer as a batch of 1 MiB requests, polled to completion.
        reqs = [ferry.Request(ferry.READ, region.view(off, BLOCK), seg, peer.address + off)
                for off in range(0, SIZE, BLOCK)]
        with engine.submit(reqs) as batch:
            while not batch.poll():
                pass
            statuses = batch.statuses
        assert all(s.state == "done" and s.error == 0 for s in statuses), statuses[:3]
        assert {s.transport for s in statuses} == {transport}
        assert np.array_equal(local, pattern(SIZE, 11))

        # WRITE a new pattern back; the peer hashes what landed in its memory.
        local[:] = pattern(SIZE, 12)
        batch = engine.submit([(ferry.WRITE, region.view(off, BLOCK), seg, peer.address + off)
                               for off in range(0, SIZE, BLOCK)])
        batch.wait(timeout=120)
        batch.free()
        assert peer.ask("sha256") == hashlib.sha256(local.tobytes()).hexdigest()

        # What the engine counted: 32 READs and 32 WRITEs of 1 MiB over this transport.
        st = engine.stats()
        t = st["transports"][transport]
        assert (t["read"]["done"], t["read"]["bytes"], t["read"]["failed"]) == (SIZE // BLOCK, SIZE, 0), t
        assert (t["write"]["done"], t["write"]["bytes"]) == (SIZE // BLOCK, SIZE), t
        assert sum(t["read"]["latency_buckets"]) == SIZE // BLOCK
        assert len(t["read"]["latency_buckets"]) == len(st["latency_bounds_seconds"]) + 1 == 20
        assert st["batches"] == 2 and st["segments_open"] == 1 and t["peers"] == 1
        # tcp.so's one rail is its bind address, and carried every byte in 1 MiB slices; shm.so
        # reports no rails.
        if transport == "tcp":
            rail = t["rails"]["127.0.0.1"]
            assert list(t["rails"]) == ["127.0.0.1"], t["rails"]
            assert (rail["read_bytes"], rail["write_bytes"], rail["completed"]) == (SIZE, SIZE, 2 * SIZE // BLOCK), rail
            assert (rail["failures"], rail["pauses"], rail["paused_peers"], rail["queued_bytes"]) == (0, 0, 0, 0), rail
        else:
            assert t["rails"] == {}, t["rails"]
        assert engine.metrics_address == ""

        # Synchronous calls on views: a numpy slice of registered memory is a valid local.
        assert peer.ask("fill 13") == "ok"
        expect = pattern(SIZE, 13)
        engine.read(local[4096:4096 + 65536], seg, peer.address + 8192)
        assert np.array_equal(local[4096:4096 + 65536], expect[8192:8192 + 65536])
        local[:BLOCK] = 7
        engine.write(local[:BLOCK], seg, peer.address + SIZE - BLOCK, transport=transport)
        expect[SIZE - BLOCK:] = 7
        assert peer.ask("sha256") == hashlib.sha256(expect.tobytes()).hexdigest()
        seg.close()
    assert peer.close() == 0


def test_one_process_pair_all_transfer_forms(ferry_mod):
    """Target and initiator engines in one process, over tcp: int addresses, raw tuples,
    bytearray and memoryview locals."""
    ferry = ferry_mod
    with ferry.Engine(local_ip="127.0.0.1", plugins="tcp") as target, \
            ferry.Engine(plugins="tcp") as engine:
        remote = bytearray(os.urandom(1 << 20))
        rr = target.register(remote)
        local = bytearray(1 << 20)
        lr = engine.register(local)
        seg = engine.open_segment(target.segment_name)
        engine.read(lr, seg, rr.address)
        assert local == remote
        mv = memoryview(local)[100:200]
        mv[:] = b"x" * 100
        engine.write(mv, seg, rr.address + 5)
        assert remote[5:105] == b"x" * 100
        engine.read(lr.address + 1000, seg, rr.address + 2000, 10)
        assert local[1000:1010] == remote[2000:2010]
        engine.transfer([("write", lr.view(0, 16), seg, rr.address, 16, "tcp")])
        assert remote[:16] == local[:16]
