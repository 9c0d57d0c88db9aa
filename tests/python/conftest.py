"""Fixtures of the source-tree Python tests (tests/meson.build runs them with Debian's
/usr/bin/python3 against the build tree: PYTHONPATH=python, FERRY_LIBRARY, FERRY_PLUGIN_PATH)."""

import hashlib
import json
import os
import subprocess
import sys

import numpy as np
import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


def pattern(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)


def sha256(array):
    return hashlib.sha256(array.tobytes()).hexdigest()


def plugin_state(name):
    """(loaded?, why not) for a plugin, from the plugin report."""
    import ferry_te
    rec = [p for p in ferry_te.plugin_report()["plugins"] if p["name"] == name]
    if not rec:
        return False, "%s.so is not on the plugin path (FERRY_PLUGIN_PATH=%s)" % (
            name, os.environ.get("FERRY_PLUGIN_PATH", ""))
    if rec[0]["state"] != "loaded":
        return False, "%s.so does not load here: %s" % (name, rec[0].get("reason", "?"))
    return True, ""


@pytest.fixture(params=["tcp", "shm"])
def protocol(request, monkeypatch):
    """The transport the Mooncake tests run over. Mooncake's selection loads shm.so beside
    tcp.so for any protocol, and Ferry's priority sends a same-host pair over shm, so "tcp"
    is MC_FORCE_TCP (for this process and the peers it starts), as in Mooncake's own CI."""
    ok, why = plugin_state(request.param)
    if not ok:
        print("SKIPPED: " + why)
        pytest.skip("SKIPPED: " + why)
    if request.param == "tcp":
        monkeypatch.setenv("MC_FORCE_TCP", "1")
    else:
        monkeypatch.delenv("MC_FORCE_TCP", raising=False)
    return request.param


class MooncakePeer:
    """A mooncake_peer.py child process: the target of the transfers."""

    def __init__(self, protocol, size, buffers=1, seed=1, host_id=None):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "mooncake_peer.py"), "--protocol", protocol,
             "--buffers", str(buffers), "--size", str(size), "--seed", str(seed)]
            + (["--host-id", host_id] if host_id else []),
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        info = json.loads(line) if line else {"error": self.proc.stderr.read()}
        if "error" in info:
            raise RuntimeError("mooncake_peer.py failed to start: " + info["error"])
        self.session = info["session"]
        self.addresses = info["addresses"]
        self.size = info["size"]
        self.seed = seed

    def expected(self, i):
        """The pattern buffer i started with."""
        return pattern(self.size, self.seed + i)

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self):
        if self.proc.poll() is None:
            try:
                out = self.ask("quit")
                self.proc.wait(timeout=60)
                assert out == "bye 0", out  # every buffer unregistered cleanly
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def make_peer():
    peers = []

    def make(protocol, size, buffers=1, seed=1, host_id=None):
        p = MooncakePeer(protocol, size, buffers, seed, host_id)
        peers.append(p)
        return p

    yield make
    for p in peers:
        p.close()
