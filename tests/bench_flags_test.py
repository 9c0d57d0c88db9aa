#!/usr/bin/python3
"""transfer_engine_bench against the command lines of Mooncake's documentation.

Each case runs the real bench binary: targets and initiators as separate processes on
127.0.0.1 (P2PHANDSHAKE, ports the kernel picks), or --loopback. Mooncake's lines are taken as
its docs print them (docs/source/design/transfer-engine/*.md, getting_started/build.md), with
--protocol=tcp where they name hardware this host lacks, and shorter --duration/--buffer_size.
Flags Ferry has no equivalent for must fail with a message naming the flag and the fix.

usage: bench_flags_test.py BENCH_BINARY
"""
import json
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import unittest

BENCH = None
BUF = "--buffer_size=67108864"  # 64 MiB: quick to fill on a loaded 2-core CI machine
SHORT = "--duration=0.5"
DEADLINE = 120  # seconds any one bench process may take (liveness, not speed)


def run(*args, env=None):
    e = dict(os.environ)
    e.update(env or {})
    p = subprocess.run([BENCH, *args], capture_output=True, text=True, timeout=DEADLINE, env=e)
    return p.returncode, p.stdout, p.stderr


class Target:
    """A target process; its segment name is read from its `segment X ready:` line."""

    def __init__(self, *args, env=None):
        e = dict(os.environ)
        e.update(env or {})
        self.proc = subprocess.Popen([BENCH, *args], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=e)
        self.segment = None
        self.lines = []
        end = time.monotonic() + DEADLINE
        while self.segment is None:
            left = end - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [], left)[0]:
                self.stop()
                raise AssertionError("target %s printed no ready line in %d s" % (args, DEADLINE))
            line = self.proc.stdout.readline()
            if not line:
                rc = self.proc.wait(timeout=DEADLINE)
                raise AssertionError("target %s exited %d before ready: %s" % (args, rc, self.proc.stderr.read()))
            self.lines.append(line)
            m = re.match(r"segment (\S+) ready: (\d+) bytes registered in (\S+) memory", line)
            if m:
                self.segment, self.where = m.group(1), m.group(3)

    def stop(self):
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        rc = self.proc.wait(timeout=DEADLINE)
        self.proc.stdout.close()
        self.proc.stderr.close()
        return rc

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        rc = self.stop()
        if exc[0] is None:
            assert rc == 0, "target exited %d after SIGTERM" % rc


def completed(test, rc, out, err):
    test.assertEqual(rc, 0, "stdout:\n%s\nstderr:\n%s" % (out, err))
    m = re.search(r"Test completed: duration [\d.]+, batch count (\d+), throughput ([\d.]+) (\S+)/s", out)
    test.assertIsNotNone(m, out)
    test.assertGreater(int(m.group(1)), 0, out)
    return m


class MooncakeCommandLines(unittest.TestCase):
    def test_efa_doc_lines_over_tcp_two_processes(self):
        # efa_transport.md, "Target Node" / "Initiator Node", --protocol=tcp, CPU-to-CPU
        # ("pass --use_vram=false ... drop --gpu_id=-1").
        with Target("--mode=target", "--protocol=tcp", "--metadata_server=P2PHANDSHAKE", BUF,
                    "--use_vram=false", "--local_server_name=127.0.0.1") as t:
            self.assertEqual(t.where, "host")
            self.assertTrue(t.segment.startswith("127.0.0.1:"), t.segment)
            rc, out, err = run("--mode=initiator", "--protocol=tcp", "--metadata_server=P2PHANDSHAKE",
                               "--segment_id=" + t.segment, "--operation=write", SHORT, "--threads=4",
                               "--block_size=1048576", "--batch_size=16", BUF, "--use_vram=false",
                               "--report_unit=GB")
            m = completed(self, rc, out, err)
            self.assertEqual(m.group(3), "GB")
            self.assertIn("Memory: initiator host, target host", out)

    def test_tuning_doc_auto_discovery(self):
        # transfer-engine-bench-tuning.md: --auto_discovery on both sides; Ferry's engine picks
        # the transport (shm or tcp on one host).
        with Target("--mode=target", "--auto_discovery", "--metadata_server=P2PHANDSHAKE", BUF,
                    "--local_server_name=127.0.0.1:0") as t:
            rc, out, err = run("--mode=initiator", "--auto_discovery", "--metadata_server=P2PHANDSHAKE",
                               "--segment_id=" + t.segment, SHORT, BUF, "--json", "--verify")
            self.assertEqual(rc, 0, err)
            r = json.loads(out)
            self.assertEqual(r["protocol"], "auto")
            self.assertIn(r["transport"], ("shm", "tcp"))
            self.assertTrue(r["verified"])
            self.assertGreater(r["batches"], 0)

    def test_index_doc_target_and_initiator_with_names(self):
        # index.md / run-examples.md: --local_server_name on both sides, read (the default).
        with Target("--mode=target", "--metadata_server=P2PHANDSHAKE", "--protocol=tcp", BUF,
                    "--local_server_name=127.0.0.1:0") as t:
            rc, out, err = run("--metadata_server=P2PHANDSHAKE", "--segment_id=" + t.segment,
                               "--local_server_name=127.0.0.1:0", "--protocol=tcp", SHORT, BUF,
                               "--operation=read", "--batch_size=32", "--block_size=65536", "--threads=2",
                               "--verify")
            completed(self, rc, out, err)
            self.assertIn("every byte verified", out)

    def test_gflags_forms(self):
        # gflags takes --flag value, -flag=value, -flag value, --noflag and --flag=0; Mooncake
        # users type all of them.
        with Target("-mode", "target", "--protocol", "tcp", "-buffer_size=67108864", "--nouse_vram",
                    "--init_mem=1", "-local_server_name", "127.0.0.1") as t:
            rc, out, err = run("-mode=initiator", "--segment_id", t.segment, "--protocol", "tcp",
                               "--duration", "0.5", "-buffer_size", "67108864", "--batch_size", "8",
                               "--block_size", "0x10000", "--report_precision", "4", "--report_unit", "MiB",
                               "--use_vram", "false", "--noauto_discovery", "--verify=true", "--backend=classic")
            m = completed(self, rc, out, err)
            self.assertRegex(m.group(2), r"^\d+\.\d{4}$")
            self.assertEqual(m.group(3), "MiB")

    def test_glog_flags_are_noted_and_ignored(self):
        rc, out, err = run("--loopback", "--protocol=tcp", SHORT, BUF, "--logtostderr", "--v=1", "--minloglevel", "0")
        completed(self, rc, out, err)
        self.assertIn("--v is glog's", err)
        self.assertIn("--minloglevel is glog's", err)

    def test_flagfile_and_dashed_names(self):
        # --flagfile (gflags), and --auto-discovery as index.md writes it.
        with tempfile.NamedTemporaryFile("w", suffix=".flags") as f:
            f.write("# Mooncake-style flag file\n--protocol=tcp\n--block_size=1048576\n\n--batch_size=4\n")
            f.flush()
            rc, out, err = run("--loopback", "--flagfile=" + f.name, SHORT, BUF, "--json", "--auto-discovery")
            self.assertEqual(rc, 0, err)
            r = json.loads(out)
            self.assertEqual((r["block_size"], r["batch_size"]), (1048576, 4))

    def test_loopback_json_says_where_memory_lives(self):
        rc, out, err = run("--loopback", "--protocol=tcp", SHORT, BUF, "--json", "--operation=write", "--verify")
        self.assertEqual(rc, 0, err)
        r = json.loads(out)
        self.assertEqual((r["initiator_memory"], r["target_memory"], r["transport"]), ("host", "host", "tcp"))

    def test_help_lists_every_documented_flag(self):
        rc, out, err = run("--help")
        self.assertEqual(rc, 0, err)
        for flag in ("mode", "metadata_server", "local_server_name", "segment_id", "operation", "protocol",
                     "device_name", "nic_priority_matrix", "auto_discovery", "buffer_size", "batch_size",
                     "block_size", "duration", "threads", "report_unit", "report_precision", "use_vram", "gpu_id",
                     "init_mem", "backend"):
            self.assertRegex(out, r"\n  --%s " % flag)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class MooncakeEtcdLines(unittest.TestCase):
    """build.md's and run-examples.md's etcd lines (--metadata_server=host:2379, Mooncake's bare
    form, and --local_server_name as the segment's name) against an etcd this test starts on
    kernel-chosen loopback ports."""

    def setUp(self):
        etcd = shutil.which("etcd") or ("/usr/bin/etcd" if os.path.exists("/usr/bin/etcd") else None)
        if not etcd:
            print("SKIPPED: no etcd binary (apt-get install etcd-server)")
            self.skipTest("SKIPPED: no etcd")
        self.dir = tempfile.TemporaryDirectory()
        client, peer = "http://127.0.0.1:%d" % free_port(), "http://127.0.0.1:%d" % free_port()
        self.endpoint = client[len("http://"):]
        self.log = open(os.path.join(self.dir.name, "etcd.log"), "w")
        self.etcd = subprocess.Popen([etcd, "--data-dir", os.path.join(self.dir.name, "data"),
                                      "--listen-client-urls", client, "--advertise-client-urls", client,
                                      "--listen-peer-urls", peer, "--initial-advertise-peer-urls", peer,
                                      "--initial-cluster", "default=" + peer], stdout=self.log, stderr=self.log)
        end = time.monotonic() + 60
        while True:  # ready once its client port takes connections
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", int(self.endpoint.split(":")[1]))) == 0:
                    break
            if self.etcd.poll() is not None or time.monotonic() > end:
                self.tearDown()
                raise AssertionError("etcd did not start: " + open(self.log.name).read()[-2000:])
            time.sleep(0.1)

    def tearDown(self):
        self.etcd.kill()
        self.etcd.wait()
        self.log.close()
        self.dir.cleanup()

    def test_bare_host_port_and_segment_names(self):
        name = "bench-flags-target-%d" % os.getpid()
        with Target("--protocol=tcp", "--metadata_server=" + self.endpoint, "--mode=target",
                    "--local_server_name=" + name, BUF) as t:
            self.assertEqual(t.segment, name)
            rc, out, err = run("--metadata_server=" + self.endpoint, "--segment_id=" + name,
                               "--local_server_name=bench-flags-initiator-%d" % os.getpid(), "--protocol=tcp",
                               SHORT, BUF, "--verify")
            completed(self, rc, out, err)
            self.assertIn("etcd at " + self.endpoint, err)

    def test_target_named_by_its_hostname(self):
        # index.md: --local_server_name is optional; the target is then named by hostname(2).
        with Target("--mode=target", "--metadata_server=etcd://" + self.endpoint, "--protocol=tcp", BUF) as t:
            self.assertEqual(t.segment, socket.gethostname())
            rc, out, err = run("--metadata_server=etcd://" + self.endpoint, "--segment_id=" + socket.gethostname(),
                               "--protocol=tcp", SHORT, BUF)
            completed(self, rc, out, err)


class ClearMessages(unittest.TestCase):
    def refused(self, args, *texts, env=None):
        rc, out, err = run(*args, env=env)
        self.assertNotEqual(rc, 0, out)
        for t in texts:
            self.assertIn(t, err)
        self.assertNotIn("unrecognised", err)
        self.assertNotIn("unrecognized", err)
        return err

    def test_protocols_ferry_lacks(self):
        # kunpeng_ub_transport.md and sunrise_link_transport.md lines.
        self.refused(["--mode=target", "--protocol=ub", "--device_name=urma0", "--local_server_name=127.0.0.1",
                      "--metadata_server=P2PHANDSHAKE"], "--protocol=ub: Ferry has no Kunpeng UB")
        self.refused(["--mode=initiator", "--protocol=sunrise_link", "--metadata_server=P2PHANDSHAKE",
                      "--segment_id=10.0.0.2:1", "--gpu_id=0", "--block_size=8388608", "--batch_size=32"],
                     "--protocol=sunrise_link: Ferry has no Sunrise Link transport")

    def test_segment_size_of_the_ub_docs(self):
        self.refused(["--mode=initiator", "--protocol=tcp", "--segment_size=8388608", "--segment_id=127.0.0.1:1"],
                     "--segment_size", "--buffer_size")

    def test_metadata_servers_ferry_lacks(self):
        self.refused(["--mode=target", "--metadata_server=memcached://10.0.0.1:11211"],
                     "unknown scheme memcached://", "http://host:8080/metadata")

    def test_redis_and_http_metadata_servers(self):
        # Handed to the engine as they are: against closed loopback ports it says which server it
        # could not reach (and Mooncake's MC_REDIS_* reach it as redis_* keys).
        fast = "--option=metadata_retry_ms=0"
        self.refused(["--mode=target", "--metadata_server=redis://127.0.0.1:1", fast],
                     "Redis metadata: cannot reach Redis", "redis://127.0.0.1:1")
        self.refused(["--mode=target", "--metadata_server=http://127.0.0.1:1/metadata", fast],
                     "HTTP metadata: cannot reach HTTP metadata server", "http://127.0.0.1:1/metadata")
        self.refused(["--mode=target", "--metadata_server=redis://127.0.0.1:1", fast],
                     "config key 'redis_db' 'seven' is not a Redis database index", env={"MC_REDIS_DB_INDEX": "seven"})
        # The URL's /db wins over MC_REDIS_DB_INDEX, as in Mooncake.
        self.refused(["--mode=target", "--metadata_server=redis://127.0.0.1:1/2", fast],
                     "Redis metadata: cannot reach Redis", env={"MC_REDIS_DB_INDEX": "seven"})

    def test_bare_host_port_is_etcd(self):
        # build.md's --metadata_server=10.1.101.3:2379 form, pointed at a closed loopback port.
        err = self.refused(["--mode=target", "--protocol=tcp", "--metadata_server=127.0.0.1:1", BUF,
                            "--option", "metadata_retry_ms=0"], "etcd at 127.0.0.1:1")
        self.assertIn("127.0.0.1:1", err.splitlines()[-1])

    def test_unknown_flags(self):
        self.refused(["--loopback", "--no_such_flag=1"], "unknown flag --no_such_flag")
        self.refused(["--loopback", "--batchsize=3"], "did you mean --batch_size?")
        self.refused(["--xport_type=rdma"], "tebench")
        self.refused(["--batch_size=many"], "--batch_size: 'many' is not an integer")
        self.refused(["--loopback", "--segment_id"], "--segment_id is missing its value")

    def test_nic_priority_matrix_names_the_rdma_devices(self):
        # Mooncake's matrix format: location -> [preferred NICs, other NICs].
        with tempfile.NamedTemporaryFile("w", suffix=".json") as f:
            json.dump({"cpu:0": [["mlx5_0", "mlx5_1"], ["mlx5_2"]], "cuda:0": [["mlx5_1"], []]}, f)
            f.flush()
            rc, out, err = run("--loopback", "--nic_priority_matrix=" + f.name, SHORT, BUF,
                               env={"FERRY_PLUGINS": "tcp"})
        self.assertNotEqual(rc, 0, out)
        self.assertIn("rdma.devices=mlx5_0,mlx5_1,mlx5_2", err)
        self.assertIn("transport rdma is not loaded here", err)
        self.refused(["--loopback", "--nic_priority_matrix=/nonexistent/matrix.json"],
                     "--nic_priority_matrix=/nonexistent/matrix.json: cannot read it")

    def test_mooncake_gpu_protocol_names_map_to_ferry_plugins(self):
        for mooncake, ferry in (("nvlink_intra", "cuda_ipc"), ("nvlink", "cuda_ipc"), ("hip", "hip_ipc")):
            rc, out, err = run("--loopback", "--protocol=" + mooncake, SHORT, BUF, env={"FERRY_PLUGINS": "tcp"})
            self.assertNotEqual(rc, 0, out)
            self.assertIn("--protocol=%s: Mooncake's %s" % (mooncake, mooncake), err)
            self.assertIn("transport %s is not loaded here" % ferry, err)

    def test_forced_transport_not_loaded(self):
        # --device_name alone means rdma (Mooncake's default protocol); with rdma.so not
        # loaded here the bench says so before submitting anything.
        rc, out, err = run("--loopback", "--device_name=erdma_0", SHORT, BUF, env={"FERRY_PLUGINS": "tcp"})
        self.assertNotEqual(rc, 0, out)
        self.assertIn("--device_name without --protocol: rdma", err)
        self.assertIn("transport rdma is not loaded here", err)


class UseVramWithoutGpu(unittest.TestCase):
    NO_CUDA = {"FERRY_LIBCUDA": "/nonexistent/libcuda.so.1"}

    def no_gpu(self, *args):
        rc, out, err = run(*args, SHORT, BUF, env=self.NO_CUDA)
        if rc == 0 or "no GPU runtime found" not in err:
            if "rocm:" in out + err:
                print("SKIPPED: this host has a HIP device, so --use_vram runs")
                return
        self.assertNotEqual(rc, 0, out)
        self.assertIn("--use_vram: no GPU runtime found (/nonexistent/libcuda.so.1", err)
        self.assertIn("run without --use_vram or install the driver", err)

    def test_use_vram_loopback(self):
        self.no_gpu("--loopback", "--use_vram", "--protocol=tcp")

    def test_gpu_id_alone_means_vram_as_in_mooncake_gpu_builds(self):
        self.no_gpu("--mode=target", "--gpu_id=0", "--protocol=tcp")

    def test_use_vram_initiator_gpu_all(self):
        self.no_gpu("--mode=initiator", "--use_vram=true", "--gpu_id", "-1", "--segment_id=127.0.0.1:1")


class UseVramOnAFakeDriver(unittest.TestCase):
    """--use_vram through a CUDA driver library that keeps "device" memory in host memory
    ($FERRY_TEST_FAKE_LIBCUDA, CI's tests/gpu_fake build): the bench and the engine both load it
    through FERRY_LIBCUDA. The real run is on a GPU host (tests/gpu)."""

    def setUp(self):
        fake = os.environ.get("FERRY_TEST_FAKE_LIBCUDA", "")
        if not fake:
            print("SKIPPED: FERRY_TEST_FAKE_LIBCUDA names no fake CUDA driver library")
            self.skipTest("SKIPPED: no fake CUDA driver")
        self.env = {"FERRY_LIBCUDA": fake}

    def test_gpu_initiator_host_target_verified(self):
        with Target("--mode=target", "--protocol=tcp", "--metadata_server=P2PHANDSHAKE", BUF,
                    "--local_server_name=127.0.0.1", env=self.env) as t:
            for op in ("read", "write"):
                rc, out, err = run("--mode=initiator", "--protocol=tcp", "--segment_id=" + t.segment, "--gpu_id=0",
                                   "--operation=" + op, SHORT, BUF, "--verify", "--json", env=self.env)
                self.assertEqual(rc, 0, err)
                r = json.loads(out)
                self.assertEqual((r["initiator_memory"], r["target_memory"], r["verified"]), ("cuda:0", "host", True))

    def test_gpu_target_served_or_refused_by_the_engine(self):
        # A target in GPU memory is served over tcp.so through the target's staging (both ends
        # in the fake driver's PROT_NONE device memory, every byte verified); with staging off
        # on the target its registration fails at once, naming why.
        with Target("--mode=target", "--protocol=tcp", "--use_vram", BUF, "--local_server_name=127.0.0.1",
                    env=self.env) as t:
            self.assertEqual(t.where, "cuda:0")
            rc, out, err = run("--mode=initiator", "--protocol=tcp", "--segment_id=" + t.segment, "--use_vram",
                               SHORT, BUF, "--verify", "--json", env=self.env)
            self.assertEqual(rc, 0, err)
            r = json.loads(out)
            self.assertEqual((r["initiator_memory"], r["target_memory"]), ("cuda:0", "cuda:0"))
        # With staging off no loaded transport can move the target's GPU memory: registering
        # it fails at once, naming the key that turned staging off.
        start = time.monotonic()
        rc, out, err = run("--mode=target", "--protocol=tcp", "--use_vram", BUF, "--local_server_name=127.0.0.1",
                           "--option", "gpu_staging_max_bytes=0", env=self.env)
        self.assertNotEqual(rc, 0, out)
        self.assertIn("gpu_staging_max_bytes = 0", err)
        self.assertLess(time.monotonic() - start, 30, err)

    def test_gpu_target_served_while_the_drivers_stream_workers_lag(self):
        # The fake driver's stream workers pause 2 ms after completing each event, as one
        # preempted there on a loaded host (where CI once stalled this case: the target's staging
        # thread destroyed an event its worker still used, the worker blocked for good, the
        # initiator's lanes saw no progress and the target never exited). Both ends go on, every
        # byte verified, and the target exits at once on SIGTERM.
        env = dict(self.env, FERRY_FAKE_CUDA_EVENT_LINGER_US="2000")
        t = Target("--mode=target", "--protocol=tcp", "--use_vram", BUF, "--local_server_name=127.0.0.1", env=env)
        try:
            rc, out, err = run("--mode=initiator", "--protocol=tcp", "--segment_id=" + t.segment, "--use_vram",
                               SHORT, BUF, "--verify", "--json", env=env)
            self.assertEqual(rc, 0, err)
            r = json.loads(out)
            self.assertEqual((r["initiator_memory"], r["target_memory"], r["verified"]), ("cuda:0", "cuda:0", True))
        finally:
            start = time.monotonic()
            rc = t.stop()
        self.assertEqual(rc, 0, "target exited %d after SIGTERM" % rc)
        self.assertLess(time.monotonic() - start, 30, "the target took this long to exit after SIGTERM")

class FileSegments(unittest.TestCase):
    """--segment_id=file:PATH with --protocol=file (and Mooncake's io_uring): WRITE lays the file
    out, then READ sequential and random, with one batch in flight and with several; each run
    keeps going for its --duration (batches after the first), every byte of the WRITE verified."""

    def test_write_then_read_at_depths_and_patterns(self):
        if "file" not in os.environ.get("FERRY_TEST_BUILT_PLUGINS", "file").split(","):
            print("SKIPPED: file.so is not built here (no liburing)")
            self.skipTest("SKIPPED: file.so is not built here")
        with tempfile.TemporaryDirectory(dir=os.path.dirname(os.path.abspath(BENCH))) as d:
            seg = "--segment_id=file:" + os.path.join(d, "kv.bin")
            rc, out, err = run("--protocol=file", seg, "--option", "file.create=true", "--operation=write",
                               "--block_size=1048576", "--batch_size=4", BUF, SHORT, "--verify")
            m = completed(self, rc, out, err)
            self.assertIn("write over file", out)
            self.assertIn("every byte verified", out)
            for extra in (["--inflight_batches=1"], ["--inflight_batches=4", "--pattern=random", "--block_size=4096"],
                          ["--protocol=io_uring"]):
                rc, out, err = run("--protocol=file", seg, "--operation=read", "--batch_size=4", BUF, SHORT,
                                   "--json", *extra)
                self.assertEqual(rc, 0, err)
                r = json.loads(out.strip().splitlines()[-1])
                self.assertEqual(r["transport"], "file", out)
                self.assertGreater(r["batches"], 1, "%s: one batch, then it stopped: %s" % (extra, out))
                self.assertGreaterEqual(r["duration_s"], 0.5, out)
            rc, out, err = run("--protocol=file", seg, "--pattern=zigzag", BUF)
            self.assertNotEqual(rc, 0)
            self.assertIn("--pattern must be sequential or random", err)


if __name__ == "__main__":
    BENCH = sys.argv.pop(1)
    unittest.main(verbosity=2)
