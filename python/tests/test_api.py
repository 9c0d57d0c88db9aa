"""Errors as exceptions, registration forms, batches, lifetimes and configuration."""

import gc
import mmap
import os
import re
import subprocess
import sys
import textwrap

import numpy as np
import pytest


def test_installed_package_not_source_tree(ferry_mod):
    ferry = ferry_mod
    root = ferry.package_root()
    assert root.startswith(os.path.realpath(sys.prefix)) or root.startswith(sys.prefix), root
    assert os.path.dirname(ferry.library_path()) == os.path.join(root, "lib")
    assert ferry.version() == ferry.__version__
    from ferry_te import _capi
    assert _capi.header_path() == os.path.join(root, "include", "ferry", "ferry.h")


def test_cdef_is_the_header(ferry_mod):
    """The declarations cffi uses come from the shipped ferry.h, which is the source tree's."""
    from ferry_te import _capi
    header = open(_capi.header_path()).read()
    src = os.environ.get("FERRY_SOURCE_ROOT")
    if src:
        assert header == open(os.path.join(src, "include", "ferry", "ferry.h")).read()
    names = re.findall(r"FERRY_C_API\s+[^;(]*?\b(ferry_\w+)\s*\(", header)
    assert len(names) >= 15, names
    ffi, lib = _capi.load()
    for name in names:
        assert hasattr(lib, name), name
    cdef = _capi.cdef_from_header(header)
    assert "extern" not in cdef and "#" not in cdef and "FERRY_C_API" not in cdef


def test_first_engine_parses_no_header_and_runs_no_ldconfig():
    """The installed package carries ferry.h pre-parsed (_ffi_abi.py, tools/gen_ffi.py), so the
    first Engine() neither runs pycparser (150-600 ms) nor ctypes.util.find_library (ldconfig and
    the compiler, ~150 ms): a fresh interpreter, then what it imported."""
    code = textwrap.dedent("""
        import sys, ferry_te
        ferry_te.Engine(local_ip="127.0.0.1").close()
        print(sorted(m for m in ("pycparser", "cffi.cparser", "ctypes.util") if m in sys.modules))
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd="/", timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]", out.stdout + out.stderr


def test_cdef_from_header_strips_cplusplus_blocks():
    from ferry_te._capi import cdef_from_header
    text = """#ifndef G
#define G
#ifdef __cplusplus
extern "C" {
#if 1
int not_c;
#endif
#endif
#if defined(X)
#define FERRY_C_API
#endif
typedef struct s s_t;
FERRY_C_API int f(s_t *x);
#ifdef __cplusplus
}
#endif
#endif
"""
    out = cdef_from_header(text)
    assert "extern" not in out and "not_c" not in out and "#" not in out
    assert "typedef struct s s_t;" in out and "int f(s_t *x);" in out.replace("  ", " ")


def test_errors_carry_the_c_message(ferry_mod):
    ferry = ferry_mod
    with pytest.raises(ferry.InvalidArgument) as e:
        ferry.Engine(rpc_port="abc")
    assert e.value.code == -22
    assert "rpc_port" in e.value.message and "abc" in e.value.message
    assert e.value.message in str(e.value)
    with pytest.raises(ferry.NotFound) as e:
        ferry.Engine(plugins="nosuchtransport")
    assert "nosuchtransport" in e.value.message
    assert isinstance(e.value, ferry.FerryError) and isinstance(e.value, LookupError)
    with ferry.Engine(plugins="tcp") as engine:
        with pytest.raises(ferry.ConnectionFailed) as e:
            engine.open_segment("127.0.0.1:1")
        assert e.value.code < 0 and "127.0.0.1:1" in e.value.message
        assert isinstance(e.value, ConnectionError)


def test_transfer_errors(ferry_mod):
    ferry = ferry_mod
    with ferry.Engine(local_ip="127.0.0.1", plugins="tcp") as target, \
            ferry.Engine(plugins="tcp") as engine:
        remote = np.ones(1 << 16, dtype=np.uint8)
        target.register(remote, access=ferry.REMOTE_READ)
        local = np.zeros(1 << 16, dtype=np.uint8)
        engine.register(local)
        seg = engine.open_segment(target.segment_name)
        with pytest.raises(ferry.FerryError) as e:
            engine.read(local, seg, 4096)  # not an address the peer registered
        assert e.value.code < 0 and "not inside" in e.value.message, e.value.message
        # EFAULT: not in the cached descriptor, so found once it was re-read (off the submit
        # path), by the op
        with pytest.raises(ferry.BadAddress) as e:
            engine.submit([(ferry.READ, local, seg, 4096)]).wait(30)
        assert e.value.code == -14 and e.value.errno_name == "EFAULT"
        assert not isinstance(e.value, ferry.InvalidArgument)
        with pytest.raises(ferry.PermissionDenied) as e:  # the peer allows reads only
            engine.submit([(ferry.WRITE, local, seg, remote.ctypes.data)])
        assert "remote write" in e.value.message
        unregistered = np.zeros(4096, dtype=np.uint8)
        with pytest.raises(ferry.FerryError) as e:
            engine.read(unregistered, seg, remote.ctypes.data)
        assert e.value.message
        engine.read(local, seg, remote.ctypes.data)
        assert (local == 1).all()
        # A failure the peer finds (it unregistered after we read its descriptor) comes back
        # in the op's status and from wait(), with the transport's own words.
        target.unregister(remote)
        batch = engine.submit([(ferry.READ, local, seg, remote.ctypes.data)])
        with pytest.raises(ferry.FerryError) as e:
            batch.wait(30)
        st = batch.statuses[0]
        assert st.state == "failed" and st.error == e.value.code and st.transport == "tcp"
        assert st.message and st.message in e.value.message, (st, e.value.message)
        batch.free()
        # A with-block waits on exit and raises a failure nobody looked at...
        with pytest.raises(ferry.FerryError):
            with engine.submit([(ferry.READ, local, seg, remote.ctypes.data)]):
                pass
        # ...but not one already seen inside it.
        with engine.submit([(ferry.READ, local, seg, remote.ctypes.data)]) as b:
            with pytest.raises(ferry.FerryError):
                b.wait(30)
        assert b._freed


def test_notifications(ferry_mod):
    ferry = ferry_mod
    with ferry.Engine(plugins="tcp") as target, ferry.Engine(plugins="tcp") as engine:
        assert target.take_notifications() == []
        seg = engine.open_segment(target.segment_name)
        engine.send_notification(seg, b"first")
        engine.send_notification(int(seg), bytearray(b"second"))
        engine.send_notification(seg, b"")
        got = target.take_notifications()
        assert got == [ferry.Notification(engine.segment_name, b"first"),
                       ferry.Notification(engine.segment_name, b"second"),
                       ferry.Notification(engine.segment_name, b"")], got
        assert target.take_notifications() == []
        with pytest.raises(ferry.FerryError) as e:
            engine.send_notification(seg, bytes((1 << 20) + 1))
        assert e.value.errno_name == "EMSGSIZE" and "limit" in e.value.message, e.value.message


def test_cluster_secret(ferry_mod):
    ferry = ferry_mod
    secret = "a cluster secret of some length"
    with ferry.Engine(plugins="tcp", auth_secret=secret) as target, \
            ferry.Engine(plugins="tcp", auth_secret=secret) as member, \
            ferry.Engine(plugins="tcp") as stranger:
        seg = member.open_segment(target.segment_name)
        member.send_notification(seg, b"member")
        assert target.take_notifications() == [ferry.Notification(member.segment_name, b"member")]
        with pytest.raises(ferry.PermissionDenied) as e:
            stranger.open_segment(target.segment_name)
        assert "authentication failed" in e.value.message and "auth_secret" in e.value.message
        assert secret not in e.value.message


def test_register_forms(ferry_mod, tmp_path):
    ferry = ferry_mod
    with ferry.Engine(plugins="tcp") as engine:
        arr = np.zeros((64, 64), dtype=np.float32)
        r = engine.register(arr)
        assert (r.address, r.length, r.kind, r.device) == (arr.ctypes.data, arr.nbytes, "host", -1)
        assert r.access == ferry.REMOTE_READ | ferry.REMOTE_WRITE
        ba = bytearray(8192)
        engine.register(ba)
        with pytest.raises(BufferError):
            ba.extend(b"x")  # the registration holds the buffer: it cannot move
        ro = engine.register(b"y" * 4096)
        assert ro.access == ferry.REMOTE_READ
        with pytest.raises(ferry.InvalidArgument):
            engine.register(b"z" * 4096, access=ferry.REMOTE_WRITE)
        with pytest.raises(ValueError):
            engine.register(np.zeros((64, 64))[:, ::2])  # not contiguous
        with pytest.raises(TypeError):
            engine.register(object())
        path = tmp_path / "f"
        path.write_bytes(b"\0" * 65536)
        with open(path, "r+b") as f:
            m = mmap.mmap(f.fileno(), 65536)
            mr = engine.register(m)
            assert mr.length == 65536
            mr.unregister()
            m.close()
        raw = np.zeros(4096, dtype=np.uint8)
        rr = engine.register((raw.ctypes.data, raw.nbytes, -1))
        assert rr.obj is None and rr.kind == "host"
        rr.unregister()
        rr.unregister()  # twice is fine

        class TensorLike:  # what register() uses of a torch tensor
            def __init__(self, a):
                self.a = a
                self.device = type("device", (), {"type": "cpu", "index": None})()
            def data_ptr(self):
                return self.a.ctypes.data
            def element_size(self):
                return self.a.itemsize
            def numel(self):
                return self.a.size
            def is_contiguous(self):
                return True
        t = TensorLike(np.zeros(1000, dtype=np.int64))
        tr = engine.register(t)
        assert tr.length == 8000 and tr.kind == "host" and tr.obj is t
        engine.unregister(t)
        assert not tr.registered
        with engine.register(np.zeros(100)) as scoped:
            assert scoped in engine.regions
        assert scoped not in engine.regions

        class CudaArray:  # __cuda_array_interface__: kind and device from the object
            __cuda_array_interface__ = {"data": (0x7F0000000000, False), "shape": (256,),
                                        "typestr": "<f4", "version": 3, "strides": None}
            device = type("dev", (), {"id": 1})()
        from ferry_te import _memory
        span = _memory.resolve(None, CudaArray())
        assert (span.kind, span.device, span.length) == (ferry.MEMORY_CUDA, 1, 1024)
        assert _memory.parse_device("rocm:2") == (ferry.MEMORY_ROCM, 2)
        # No transport here moves CUDA memory: the C library says so, and names ferry-info.
        with pytest.raises(ferry.FerryError) as e:
            engine.register((0x7F0000000000, 4096, "cuda:0"))
        assert "cuda" in e.value.message


def test_batch_lifecycle(ferry_mod):
    ferry = ferry_mod
    with ferry.Engine(local_ip="127.0.0.1", plugins="tcp") as target, \
            ferry.Engine(plugins="tcp") as engine:
        remote = np.arange(1 << 20, dtype=np.uint8)
        target.register(remote)
        local = np.zeros(1 << 20, dtype=np.uint8)
        region = engine.register(local)
        seg = engine.open_segment(target.segment_name)
        reqs = [(ferry.READ, region.view(i << 16, 1 << 16), seg, remote.ctypes.data + (i << 16))
                for i in range(16)]
        batch = engine.submit(reqs)
        assert len(batch) == 16
        batch.wait()
        assert batch.poll()
        assert all(s.state == "done" and s.transport == "tcp" for s in batch.statuses)
        batch.free()
        batch.free()
        with pytest.raises(ferry.InvalidArgument):
            batch.wait()
        assert np.array_equal(local, remote)
        with engine.submit(reqs[:2]) as b:  # waits and frees on exit
            pass
        assert b._freed
        with pytest.raises(ferry.InvalidArgument):
            engine.submit([])
        with pytest.raises(ferry.InvalidArgument):
            engine.submit([("copy", local, seg, remote.ctypes.data)])


def test_engine_lifetime(ferry_mod):
    ferry = ferry_mod
    with ferry.Engine(plugins="tcp") as engine:
        name = engine.segment_name
        assert re.match(r"127\.0\.0\.1:\d+$", name)
        engine.register(np.zeros(4096, dtype=np.uint8))
    assert engine.closed and "closed" in repr(engine)
    with pytest.raises(ferry.FerryError):
        engine.segment_name
    engine.close()  # twice is fine
    e = ferry.Engine(plugins="tcp")
    fin = e._finalizer
    del e
    gc.collect()
    assert not fin.alive  # garbage collection destroyed it


def test_interpreter_exit_cleans_up(ferry_mod, tmp_path):
    """Engines, registrations and batches left open are released at exit, without hanging."""
    script = textwrap.dedent("""
        import numpy as np, ferry_te as ferry
        t = ferry.Engine(local_ip="127.0.0.1", plugins="tcp")
        remote = np.ones(1 << 20, dtype=np.uint8); t.register(remote)
        e = ferry.Engine(plugins="tcp")
        local = np.zeros(1 << 20, dtype=np.uint8); e.register(local)
        seg = e.open_segment(t.segment_name)
        b = e.submit([(ferry.READ, local, seg, remote.ctypes.data)])
        print("submitted", flush=True)
    """)
    p = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stderr
    assert "submitted" in p.stdout
    assert "Traceback" not in p.stderr and "Exception ignored" not in p.stderr, p.stderr


def test_config_forms(ferry_mod, tmp_path):
    ferry = ferry_mod
    from ferry_te._config import flatten_config
    assert flatten_config({"tcp": {"lanes": 2}, "plugins": ["tcp", "shm"]}, {"tcp__io_threads": 1,
                          "log_level": None}) == \
        {"tcp.lanes": "2", "plugins": "tcp,shm", "tcp.io_threads": "1"}
    assert flatten_config({"transports": {"tcp": {"lanes": 3}}, "plugin_path": ["/a", "/b"],
                           "x": True}) == {"tcp.lanes": "3", "plugin_path": "/a:/b", "x": "true"}
    with ferry.Engine({"tcp": {"lanes": 2}}, plugins=["tcp"]) as e:
        assert e.config == {"tcp.lanes": "2", "plugins": "tcp"}
    with pytest.raises(ferry.InvalidArgument) as err:
        ferry.Engine(plugins="tcp", tcp__lanes=0)
    assert "lanes" in err.value.message
    cfg = tmp_path / "ferry.yaml"
    cfg.write_text("local_ip: 127.0.0.1\nplugins: tcp\ntransports:\n  tcp:\n    lanes: 2\n")
    with ferry.Engine.from_file(cfg, log_level="warn") as e:
        assert e.segment_name.startswith("127.0.0.1:")
    with pytest.raises(ferry.FerryError):
        ferry.Engine.from_file(tmp_path / "missing.yaml")


def test_plugin_report(ferry_mod, plugin_dir):
    report = ferry_mod.plugin_report()
    tcp = [p for p in report["plugins"] if p["name"] == "tcp"]
    assert tcp and tcp[0]["state"] == "loaded"
    assert tcp[0]["path"] == os.path.join(plugin_dir, "tcp.so")
