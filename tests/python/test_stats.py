"""Engine.stats() per rail: two engines in this process over tcp.so, and what its one rail (the
bind address, tcp.bind_ip) carried, byte for byte; a transport without rails reports none."""

import pytest

import ferry_te as ferry
from conftest import plugin_state

SIZE = 1 << 20


def test_tcp_rail_counts_what_moved():
    with ferry.Engine(local_ip="127.0.0.1", plugins="tcp") as target, \
            ferry.Engine(plugins="tcp") as engine:
        remote = bytearray(b"r" * SIZE)
        rr = target.register(remote)
        local = bytearray(SIZE)
        lr = engine.register(local)
        seg = engine.open_segment(target.segment_name)
        assert engine.stats()["transports"]["tcp"]["rails"]["127.0.0.1"]["completed"] == 0
        engine.read(lr, seg, rr.address)
        engine.write(lr.address, seg, rr.address + 10, 100)
        assert local == remote

        rails = engine.stats()["transports"]["tcp"]["rails"]
        assert list(rails) == ["127.0.0.1"], rails
        r = rails["127.0.0.1"]
        # One READ of 1 MiB (one slice of tcp's 1 MiB slice_size) and one WRITE of 100 bytes.
        assert (r["read_bytes"], r["write_bytes"], r["completed"]) == (SIZE, 100, 2), r
        assert (r["failures"], r["pauses"], r["paused_peers"], r["queued_bytes"]) == (0, 0, 0, 0), r
        assert r["throughput"] == 0, "one rail balances nothing: not measured"
        # The target served those bytes but initiated nothing: its rail counts none.
        served = target.stats()["transports"]["tcp"]["rails"]["127.0.0.1"]
        assert served["read_bytes"] == served["write_bytes"] == 0, served


def test_a_transport_without_rails_reports_none():
    ok, why = plugin_state("shm")
    if not ok:
        pytest.skip("SKIPPED: " + why)
    with ferry.Engine(plugins="tcp,shm") as engine:
        st = engine.stats()["transports"]
        assert st["shm"]["rails"] == {} and list(st["tcp"]["rails"]) == ["127.0.0.1"], st
