"""Waiting for notifications: Engine.wait_notifications (blocking, with a timeout),
Engine.notification_fd with selectors and with asyncio's loop.add_reader,
Engine.wait_notifications_async, and Engine.submit_with_notification, whose notification a
server in this process takes from a sender in another process and then checks the bytes."""

import asyncio
import selectors
import subprocess
import sys
import textwrap
import threading
import time

import numpy as np
import pytest


def _send_later(engine, segment, messages, delay=0.2):
    """Sends from another thread after `delay` (so the waiter is already blocked)."""
    def run():
        time.sleep(delay)
        for m in messages:
            engine.send_notification(segment, m)
    t = threading.Thread(target=run, daemon=True)
    t.start()
    return t


def test_wait_notifications_returns_on_arrival_and_times_out(ferry_mod):
    ferry = ferry_mod
    with ferry.Engine(plugins="tcp") as server, ferry.Engine(plugins="tcp") as client:
        start = time.monotonic()
        assert server.wait_notifications(timeout=0.3) == []
        waited = time.monotonic() - start
        assert 0.3 <= waited < 5, waited

        seg = client.open_segment(server.segment_name)
        t = _send_later(client, seg, [b"wake"])
        start = time.monotonic()
        got = server.wait_notifications(timeout=60)
        took = time.monotonic() - start
        t.join()
        assert got == [ferry.Notification(client.segment_name, b"wake")]
        assert took < 30, "ran into the timeout instead of returning on arrival: %.1f s" % took

        client.send_notification(seg, b"a")
        client.send_notification(seg, b"b")
        assert [n.message for n in server.wait_notifications()] == [b"a", b"b"]
        assert server.take_notifications() == []


def test_notification_fd_with_selectors(ferry_mod):
    ferry = ferry_mod
    with ferry.Engine(plugins="tcp") as server, ferry.Engine(plugins="tcp") as client:
        fd = server.notification_fd()
        assert fd >= 0 and fd == server.notification_fd()
        seg = client.open_segment(server.segment_name)
        with selectors.DefaultSelector() as sel:
            sel.register(fd, selectors.EVENT_READ)
            assert sel.select(0) == []
            client.send_notification(seg, b"one")
            client.send_notification(seg, b"two")
            assert len(sel.select(10)) == 1
            assert len(sel.select(0)) == 1, "level-triggered: still readable until taken"
            assert [n.message for n in server.take_notifications()] == [b"one", b"two"]
            assert sel.select(0) == [], "drained: no longer readable"
            t = _send_later(client, seg, [b"three"], delay=0.1)
            assert len(sel.select(30)) == 1
            t.join()
            assert [n.message for n in server.take_notifications()] == [b"three"]
            assert sel.select(0) == []


def test_notification_fd_with_asyncio(ferry_mod):
    ferry = ferry_mod

    async def serve(server, client, seg):
        loop = asyncio.get_running_loop()
        # The plain way: a reader on the descriptor, take on readiness.
        arrived = asyncio.Event()
        loop.add_reader(server.notification_fd(), arrived.set)
        try:
            t = _send_later(client, seg, [b"via add_reader"], delay=0.1)
            await asyncio.wait_for(arrived.wait(), 30)
            t.join()
            got = server.take_notifications()
        finally:
            loop.remove_reader(server.notification_fd())
        assert [n.message for n in got] == [b"via add_reader"]

        # The helper: the loop keeps running while it waits (a ticker counts on).
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                await asyncio.sleep(0.01)
                ticks += 1

        tick = asyncio.ensure_future(ticker())
        assert await server.wait_notifications_async(timeout=0.3) == []
        assert ticks >= 5, "the wait blocked the event loop"
        t = _send_later(client, seg, [b"via helper", b"and another"], delay=0.1)
        got = await server.wait_notifications_async(timeout=30)
        t.join()
        tick.cancel()
        got += server.take_notifications()  # the second may come after the first wake-up
        assert [n.message for n in got] == [b"via helper", b"and another"]
        assert [n.sender for n in got] == [client.segment_name] * 2

    with ferry.Engine(plugins="tcp") as server, ferry.Engine(plugins="tcp") as client:
        seg = client.open_segment(server.segment_name)
        asyncio.run(serve(server, client, seg))


_SENDER = textwrap.dedent("""
    import sys
    import numpy as np
    import ferry_te as ferry
    target, address, length, value = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    with ferry.Engine(plugins="tcp") as engine:
        src = np.full(length, value, dtype=np.uint8)
        engine.register(src)
        seg = engine.open_segment(target)
        chunk = length // 8
        reqs = [ferry.Request(ferry.WRITE, src[i * chunk:(i + 1) * chunk], seg, address + i * chunk)
                for i in range(8)]
        batch = engine.submit_with_notification(reqs, seg, b"written %d" % value)
        try:
            batch.wait(60)
            print("OK", flush=True)
        except ferry.FerryError as e:
            print("ERROR", e.errno_name, e.message, flush=True)
        batch.free()
""")


def test_submit_with_notification_from_another_process(ferry_mod):
    ferry = ferry_mod
    with ferry.Engine(plugins="tcp") as server:
        dst = np.zeros(4 << 20, dtype=np.uint8)
        server.register(dst)
        proc = subprocess.Popen([sys.executable, "-c", _SENDER, server.segment_name,
                                 str(dst.ctypes.data), str(dst.nbytes), "42"],
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            got = server.wait_notifications(timeout=60)
            # Checked the moment it is taken: every WRITE of the batch is in already.
            assert (dst == 42).all(), "the notification came before the bytes"
            out, err = proc.communicate(timeout=60)
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        assert out.strip() == "OK", out + err
        assert len(got) == 1 and got[0].message == b"written 42", got


def test_submit_with_notification_not_sent_when_an_op_fails(ferry_mod):
    ferry = ferry_mod
    with ferry.Engine(plugins="tcp") as server, ferry.Engine(plugins="tcp") as client:
        kept = np.zeros(4096, dtype=np.uint8)
        dropped = np.zeros(4096, dtype=np.uint8)
        server.register(kept)
        server.register(dropped)
        src = np.full(4096, 3, dtype=np.uint8)
        client.register(src)
        seg = client.open_segment(server.segment_name)
        reqs = [(ferry.WRITE, src, seg, kept.ctypes.data), (ferry.WRITE, src, seg, dropped.ctypes.data)]
        with client.submit_with_notification(reqs, seg, b"all in") as batch:
            batch.wait(60)
        # wait() returned after delivery: it is there already.
        assert [n.message for n in server.take_notifications()] == [b"all in"]
        server.unregister(dropped)  # the client's cached descriptor still lists it
        with pytest.raises(ferry.FerryError) as e:
            with client.submit_with_notification(reqs, seg, b"never") as batch:
                batch.wait(60)
        assert "1 of 2 ops failed: op 1 failed (WRITE 4096 bytes)" in e.value.message, e.value.message
        assert "notification was not sent" in e.value.message, e.value.message
        assert server.wait_notifications(timeout=0.3) == []
        with pytest.raises(ferry.FerryError) as e:
            client.submit_with_notification(reqs, seg, bytes((1 << 20) + 1))
        assert e.value.errno_name == "EMSGSIZE"
