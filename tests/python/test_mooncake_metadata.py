"""What Mooncake's own Python transfer-engine tests check (mooncake-wheel/tests/
transfer_engine_initiator_test.py against transfer_engine_target.py, as Mooncake's
scripts/run_tests.sh runs them: MC_FORCE_TCP, protocol "tcp", named segments), against the
metadata servers Mooncake's CI and its users run: its HTTP metadata server
(tests/metadata/http_metadata_server.py speaks the same protocol) and Redis (a real
redis-server with a password and a database index, as MC_REDIS_PASSWORD / MC_REDIS_DB_INDEX
give them). The target is a second process run as a Mooncake program unchanged
(`python3 -m ferry_te.mooncake`). Every byte is checked."""

import json
import os
import random
import shutil
import socket
import string
import subprocess
import sys
import time

import pytest

from ferry_te.mooncake import TransferEngine

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(HERE))
HTTP_SERVER = os.path.join(ROOT, "tests", "metadata", "http_metadata_server.py")
REDIS_PASSWORD = "ferry-test-password"


def skip(why):
    print("SKIPPED: " + why)
    pytest.skip("SKIPPED: " + why)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """A metadata server of one kind in a child process, on a loopback port of its own."""

    def __init__(self, kind, tmp_path):
        self.kind, self.env = kind, {}
        if kind == "http":
            try:
                import aiohttp  # noqa: F401
            except ImportError:
                skip("aiohttp is missing (Debian: apt-get install python3-aiohttp)")
            self.proc = subprocess.Popen(["/usr/bin/python3", HTTP_SERVER, "--port", "0"],
                                         stdout=subprocess.PIPE, text=True)
            line = self.proc.stdout.readline().split()
            assert line and line[0] == "READY", "the HTTP metadata server did not start"
            self.url = line[1]
        else:
            binary = shutil.which("redis-server")
            if binary is None:
                skip("redis-server is missing (Debian: apt-get install redis-server)")
            port = free_port()
            self.proc = subprocess.Popen(
                [binary, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
                 "--requirepass", REDIS_PASSWORD, "--dir", str(tmp_path)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            deadline = time.monotonic() + 10
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), 0.2).close()
                    break
                except OSError:
                    assert time.monotonic() < deadline and self.proc.poll() is None, "redis-server did not start"
                    time.sleep(0.05)
            self.url = "redis://127.0.0.1:%d" % port
            self.env = {"MC_REDIS_PASSWORD": REDIS_PASSWORD, "MC_REDIS_DB_INDEX": "3"}

    def close(self):
        self.proc.terminate()
        self.proc.wait(30)


@pytest.fixture(params=["http", "redis"])
def mooncake_ci(request, tmp_path, monkeypatch):
    """Mooncake's CI environment: a metadata server, MC_FORCE_TCP=true, and the target."""
    server = Server(request.param, tmp_path)
    env = {"MC_METADATA_SERVER": server.url, "MC_FORCE_TCP": "true", "PROTOCOL": "tcp",
           "TARGET_SERVER_NAME": "127.0.0.1:%d" % free_port(), "TARGET_CAPACITY": str(4 << 20),
           **server.env}
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    target = subprocess.Popen([sys.executable, "-m", "ferry_te.mooncake",
                               os.path.join(HERE, "mooncake_target.py")],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    info = json.loads(target.stdout.readline() or '{"error": "the target exited"}')
    try:
        assert "error" not in info, info
        yield info
    finally:
        target.stdin.close()
        target.wait(60)
        server.close()


def text(n):
    chars = string.ascii_letters + string.digits + string.punctuation
    return "".join(random.choices(chars, k=n)).encode()


def test_mooncakes_initiator_checks(mooncake_ci):
    """transfer_engine_initiator_test.py's checks, each against the target process."""
    adaptor = TransferEngine()
    me = "127.0.0.1:%d" % free_port()
    assert adaptor.initialize(me, os.environ["MC_METADATA_SERVER"], "tcp", "") == 0, adaptor.last_error()
    target, dst = mooncake_ci["name"], mooncake_ci["address"]
    # Nothing registered yet: the fallback managed buffer, as the test does.
    assert adaptor.get_first_buffer_address(me) == 0
    src = adaptor.allocate_managed_buffer(4 << 20)
    assert src != 0, adaptor.last_error()
    assert adaptor.get_first_buffer_address(target) == dst != 0

    # test_random_write_circle_times: write, clear, read back, compare.
    for i in range(200):
        data = text(random.randint(16, 256))
        assert adaptor.write_bytes_to_buffer(src, data, len(data)) == 0
        assert adaptor.transfer_sync_write(target, src, dst, len(data)) == 0, (i, adaptor.last_error())
        assert adaptor.write_bytes_to_buffer(src, bytes(len(data)), len(data)) == 0
        assert adaptor.transfer_sync_read(target, src, dst, len(data)) == 0, (i, adaptor.last_error())
        assert adaptor.read_bytes_from_buffer(src, len(data)) == data

    # test_batch_write_read and test_async_batch_write_read: 100 slices 1 KiB apart.
    srcs = [src + i * 1024 for i in range(100)]
    dsts = [dst + i * 1024 for i in range(100)]
    for sync in (True, False):
        for _ in range(2):
            datas = [text(random.randint(32, 128)) for _ in range(100)]
            lens = [len(d) for d in datas]
            for a, d in zip(srcs, datas):
                assert adaptor.write_bytes_to_buffer(a, d, len(d)) == 0
            if sync:
                assert adaptor.batch_transfer_sync_write(target, srcs, dsts, lens) == 0, adaptor.last_error()
            else:
                bid = adaptor.batch_transfer_async_write(target, srcs, dsts, lens)
                assert bid != 0 and adaptor.get_batch_transfer_status([bid]) == 0, adaptor.last_error()
            for a, n in zip(srcs, lens):
                assert adaptor.write_bytes_to_buffer(a, bytes(n), n) == 0
            if sync:
                assert adaptor.batch_transfer_sync_read(target, srcs, dsts, lens) == 0, adaptor.last_error()
            else:
                bid = adaptor.batch_transfer_async_read(target, srcs, dsts, lens)
                assert bid != 0 and adaptor.get_batch_transfer_status([bid]) == 0, adaptor.last_error()
            assert [adaptor.read_bytes_from_buffer(a, n) for a, n in zip(srcs, lens)] == datas

    # test_async_submit_to_unknown_peer_returns_zero: the metadata server has no such segment.
    t0 = time.monotonic()
    assert adaptor.batch_transfer_async_write("unreachable_peer:9", [0], [0], [16]) == 0
    assert adaptor.transfer_submit_write("unreachable_peer:9", 0, 0, 16) == 0
    # test_send_probe_reachable_peer / test_send_probe_unknown_peer.
    assert adaptor.send_probe(target) == 0, adaptor.last_error()
    assert adaptor.send_probe("unreachable_peer:9") != 0
    assert time.monotonic() - t0 < 30, "an unknown peer took the metadata timeout to refuse"
    assert "unreachable_peer:9" in adaptor.last_error()
    assert adaptor.free_managed_buffer(src, 4 << 20) == 0
    adaptor.close()
