"""Engine.submit never waits on the network (ferry_submit): against a peer process stopped with
SIGSTOP (its kernel accepts the TCP connection, the process answers nothing), submit returns at
once and the op fails with the connect's error by the connect timeout; once the peer answers
again, the next op to it is served."""

import os
import signal
import time

import numpy as np
import pytest

import ferry_te as ferry

STALL_MS = 4000


def stop_process(pid):
    """SIGSTOP, then wait until every thread has stopped (kill returns before they do, and an
    op submitted in between may still be served)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        states = []
        for task in os.listdir("/proc/%d/task" % pid):
            with open("/proc/%d/task/%s/stat" % (pid, task)) as f:
                text = f.read()
            states.append(text[text.rfind(")") + 2])
        if all(s in "tT" for s in states):
            return
        time.sleep(0.005)  # polling /proc, nothing to wait on
    raise AssertionError("process %d did not stop" % pid)


def test_submit_to_a_hanging_peer_returns_at_once(make_peer):
    peer = make_peer("tcp", 1 << 16)
    with ferry.Engine({"plugins": "tcp", "tcp.connect_timeout_ms": str(STALL_MS)}) as engine:
        local = np.zeros(1 << 16, np.uint8)
        engine.register(local)
        seg = engine.open_segment(peer.session)
        stop_process(peer.proc.pid)
        try:
            t0 = time.monotonic()
            batch = engine.submit([(ferry.READ, local, seg, peer.addresses[0])])
            took = time.monotonic() - t0
            assert took < 0.2, "submit waited %.0f ms on the connect" % (took * 1000)
            assert batch.statuses[0].state == "pending"
            with pytest.raises(ferry.FerryError) as e:
                batch.wait(STALL_MS / 1000 + 20)
            assert e.value.errno_name == "EHOSTUNREACH" and "timed out" in e.value.message, \
                e.value.message
            batch.free()
        finally:
            os.kill(peer.proc.pid, signal.SIGCONT)
        # Answering again: a retry after the failed connect's back-off is served.
        deadline = time.monotonic() + 30
        while True:
            try:
                engine.read(local, seg, peer.addresses[0], timeout=30)
                break
            except ferry.FerryError as e:
                assert "connecting failed moments ago" in e.message, e.message
                assert time.monotonic() < deadline, e.message
                time.sleep(0.2)  # the 1 s back-off of a transport that failed to connect
        assert (local == peer.expected(0)[:1 << 16]).all()
