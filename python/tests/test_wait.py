"""Batch.wait(): an op that failed with ETIMEDOUT ends the wait with that failure (ferry.Timeout),
a wait whose own timeout passed raises ferry.WaitTimeout and leaves the batch valid. A peer
process stopped with SIGSTOP makes tcp.so time the op out after tcp.op_timeout_ms."""

import errno
import os
import signal
import threading
import time

import numpy as np
import pytest

SIZE = 4 << 20


def _in_thread(fn, limit):
    """Runs fn in a thread; fails the test instead of hanging it when fn never returns."""
    out = {}

    def run():
        try:
            out["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - handed back to the test
            out["error"] = e

    t = threading.Thread(target=run, daemon=True)
    start = time.monotonic()
    t.start()
    t.join(limit)
    assert not t.is_alive(), "still blocked after %d s: the op's failure was taken for 'keep waiting'" % limit
    return out, time.monotonic() - start


def _stop(pid):
    """SIGSTOP, then wait until every thread of the process has stopped (kill() returns first)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for tid in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/stat" % (pid, tid)) as f:
                states.append(f.read().rsplit(")", 1)[1].split()[0])
        if all(s in "Tt" for s in states):
            return
        time.sleep(0.01)
    raise AssertionError("process %d did not stop" % pid)


@pytest.fixture
def stopped_peer(make_peer, ferry_mod):
    rec = [p for p in ferry_mod.plugin_report()["plugins"] if p["name"] == "tcp"]
    if not rec or rec[0]["state"] != "loaded":
        pytest.skip("SKIPPED: tcp.so does not load here: %s" % (rec[0]["reason"] if rec else "not found"))
    peer = make_peer("tcp", SIZE, seed=3)
    yield peer
    os.kill(peer.pid, signal.SIGCONT)


def test_op_timeout_ends_read_write_and_wait(ferry_mod, stopped_peer):
    ferry = ferry_mod
    peer = stopped_peer
    with ferry.Engine(plugins="tcp", tcp__op_timeout_ms=1500) as engine:
        local = np.zeros(SIZE, dtype=np.uint8)
        region = engine.register(local)
        seg = engine.open_segment(peer.segment)
        engine.read(region.view(0, 4096), seg, peer.address)  # connected before the stall
        _stop(peer.pid)

        for what, call in (("write", lambda: engine.write(region.view(0, 1 << 20), seg, peer.address)),
                           ("read", lambda: engine.read(region.view(0, 1 << 20), seg, peer.address))):
            out, took = _in_thread(call, 60)
            err = out.get("error")
            assert isinstance(err, ferry.Timeout), (what, out)
            assert not isinstance(err, ferry.WaitTimeout), (what, err)
            assert err.code == -errno.ETIMEDOUT, (what, err)
            assert "op 0 failed" in err.message, err.message
            assert took < 30, (what, took)

        batch = engine.submit([(ferry.WRITE, region.view(0, 1 << 20), seg, peer.address)])
        with pytest.raises(ferry.WaitTimeout) as early:
            batch.wait(timeout=0.05)
        assert isinstance(early.value, ferry.Timeout)  # `except ferry.Timeout` still catches it
        assert batch.status(0).state == "pending"  # the batch stays valid
        out, took = _in_thread(batch.wait, 60)
        err = out.get("error")
        assert isinstance(err, ferry.Timeout) and not isinstance(err, ferry.WaitTimeout), out
        assert batch.status(0).state == "failed"
        batch.free()
