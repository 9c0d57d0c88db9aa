"""Shared fixtures. These tests run against the INSTALLED ferry package (run_wheel_tests.sh
installs the wheels into a fresh virtualenv and runs pytest there, outside the source tree)."""

import json
import os
import subprocess
import sys

import pytest

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.fixture(scope="session")
def ferry_mod():
    import ferry_te as ferry
    return ferry


@pytest.fixture(scope="session")
def plugin_dir(ferry_mod):
    return os.path.join(ferry_mod.package_root(), "lib", "ferry", "plugins")


def has_plugin(plugin_dir, name):
    return os.path.isfile(os.path.join(plugin_dir, name + ".so"))


class Peer:
    """A peer.py child process serving one buffer."""

    def __init__(self, plugins, size, seed):
        self.proc = subprocess.Popen(
            [sys.executable, os.path.join(HERE, "peer.py"), "--plugins", plugins, "--size",
             str(size), "--seed", str(seed)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        line = self.proc.stdout.readline()
        if not line:
            err = self.proc.stderr.read()
            raise RuntimeError("peer failed to start: " + err)
        info = json.loads(line)
        self.segment = info["segment"]
        self.address = info["address"]
        self.size = info["size"]
        self.pid = info["pid"]

    def ask(self, command):
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()
        return self.proc.stdout.readline().strip()

    def close(self):
        if self.proc.poll() is None:
            try:
                self.ask("quit")
                self.proc.wait(timeout=30)
            except (BrokenPipeError, subprocess.TimeoutExpired):
                self.proc.kill()
                self.proc.wait()
        return self.proc.returncode


@pytest.fixture
def make_peer():
    peers = []

    def make(plugins, size, seed=1):
        p = Peer(plugins, size, seed)
        peers.append(p)
        return p

    yield make
    for p in peers:
        p.close()
