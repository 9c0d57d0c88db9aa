#!/usr/bin/python3
"""What a batch costs from Python, per op: the old path (one ferry.Request per op, ints or
numpy views) against Engine.submit_arrays (numpy arrays, lists of ints as Mooncake's callers
pass them, array('Q')), and Mooncake's batch_transfer_sync_write over it. Same run, same
engines, tcp.so (or --plugins) over loopback, small blocks so that Python's cost shows.

    bench/python_batch_bench.py [--plugins tcp] [--block 64] [--batch 256,1024] [--iters 200]

Prints per path and batch size: submit (µs per op spent in the submit call: building the
requests in Python plus ferry_submit; best and median), total (µs per op for submit + wait +
free, median) and ops/s. The paths take turns batch by batch, so machine noise hits them alike;
the row "C ferry_submit alone" is the floor: a request array built once, submitted from C.
--json prints the same as JSON. Run from a build tree with PYTHONPATH=python,
FERRY_LIBRARY=build/core/libferry.so.0 and FERRY_PLUGIN_PATH=build/plugins/tcp (tests/python
does so), or against an installed ferry_te."""

import argparse
import json
import sys
import time
from array import array

import ferry_te as ferry

try:
    import numpy as np
except ImportError:
    np = None


def measure(runs, iters, n):
    """Per path: (best submit µs/op, median submit µs/op, median total µs/op, ops/s). The
    paths take turns batch by batch, so that a noisy machine slows them alike; the best submit
    time is the path's own cost, the medians what a loaded machine gives."""
    for run in runs:
        run()  # warm: connections, caches
    subs = [[] for _ in runs]
    tots = [[] for _ in runs]
    for _ in range(iters):
        for i, run in enumerate(runs):
            t0 = time.perf_counter()
            batch = run.submit()
            t1 = time.perf_counter()
            batch.wait()
            batch.free()
            t2 = time.perf_counter()
            subs[i].append(t1 - t0)
            tots[i].append(t2 - t0)
    out = []
    for sub, tot in zip(subs, tots):
        sub.sort()
        tot.sort()
        mid = len(sub) // 2
        out.append((sub[0] / n * 1e6, sub[mid] / n * 1e6, tot[mid] / n * 1e6, n / tot[mid]))
    return out


class Path:
    def __init__(self, name, submit, sync=None):
        self.name = name
        self.submit = submit
        self.sync = sync

    def __call__(self):
        if self.sync is not None:
            return self.sync()
        b = self.submit()
        b.wait()
        b.free()


def paths(engine, seg, local, region, remote_addr, n, block):
    offs = [i * block for i in range(n)]
    laddr = [region.address + o for o in offs]
    raddr = [remote_addr + o for o in offs]
    out = [
        Path("requests, int addresses (old)", lambda: engine.submit(
            [ferry.Request(ferry.WRITE, a, seg, r, block) for a, r in zip(laddr, raddr)])),
        Path("requests, region views (old)", lambda: engine.submit(
            [ferry.Request(ferry.WRITE, region.view(o, block), seg, r)
             for o, r in zip(offs, raddr)])),
        Path("submit_arrays, lists of ints", lambda: engine.submit_arrays(
            ferry.WRITE, seg, laddr, raddr, [block] * n)),
        Path("submit_arrays, array('Q')", lambda: engine.submit_arrays(
            ferry.WRITE, seg, array("Q", laddr), array("Q", raddr), block)),
    ]
    # The floor: ferry_submit alone on a request array built once (what C costs, no Python).
    from ferry_te import _capi
    from ferry_te._arrays import build_requests
    ffi, lib = _capi.load()
    reqs, _, keep = build_requests(ferry.WRITE, int(seg), laddr, raddr, block)
    out.append(Path("C ferry_submit alone (floor)", lambda: _CBatch(engine, ffi, lib, reqs, n,
                                                                    keep)))
    if np is not None:
        loffs = np.arange(n, dtype=np.uint64) * np.uint64(block)
        rarr = loffs + np.uint64(remote_addr)
        out.append(Path("submit_arrays, numpy offsets", lambda: engine.submit_arrays(
            ferry.WRITE, seg, loffs, rarr, block, local_base=region)))
    return out


class _CBatch:
    """A batch submitted straight through cffi, for the floor row."""

    def __init__(self, engine, ffi, lib, reqs, n, keep):
        self.lib, self.handle, self.keep = lib, engine._state.handle, keep
        out = ffi.new("ferry_batch_id_t *")
        if lib.ferry_submit(self.handle, reqs, n, out) != 0:
            sys.exit("python_batch_bench: ferry_submit failed")
        self.id = out[0]

    def wait(self):
        if self.lib.ferry_wait_batch(self.handle, self.id, -1) != 0:
            sys.exit("python_batch_bench: a batch failed")

    def free(self):
        self.lib.ferry_free_batch(self.handle, self.id)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--plugins", default="tcp")
    ap.add_argument("--block", type=int, default=64, help="bytes per op")
    ap.add_argument("--batch", default="256,1024", help="ops per batch, comma list")
    ap.add_argument("--iters", type=int, default=200, help="batches per path and size")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    sizes = [int(s) for s in args.batch.split(",")]
    results = []
    with ferry.Engine(local_ip="127.0.0.1", plugins=args.plugins) as target, \
            ferry.Engine(local_ip="127.0.0.1", plugins=args.plugins) as engine:
        span = max(sizes) * args.block
        remote = bytearray(span)
        target.register(remote)
        remote_addr = target.regions[0].address
        local = bytearray(b"\x5a" * span)
        region = engine.register(local)
        seg = engine.open_segment(target.segment_name)
        for n in sizes:
            runs = paths(engine, seg, local, region, remote_addr, n, args.block)
            for p, (best, sub, tot, rate) in zip(runs, measure(runs, args.iters, n)):
                results.append({"path": p.name, "ops": n, "block": args.block,
                                "submit_best_us_per_op": round(best, 3),
                                "submit_us_per_op": round(sub, 3),
                                "total_us_per_op": round(tot, 3), "ops_per_s": round(rate)})
            # Mooncake's call, as vLLM's and SGLang's connectors make it (lists of ints).
            from ferry_te.mooncake import TransferEngine
            results.append(mooncake_row(TransferEngine, target.segment_name, local, remote_addr,
                                        n, args))
        if remote != local:
            sys.exit("python_batch_bench: the target's bytes differ from what was written")
    if args.json:
        print(json.dumps(results, indent=1))
        return
    print("%-34s %5s %5s %11s %11s %11s %9s" % ("path", "ops", "block", "submit best",
                                                "submit med", "total med", "ops/s"))
    for r in results:
        print("%-34s %5d %5d %11.3f %11.3f %11.3f %9d" % (
            r["path"], r["ops"], r["block"], r["submit_best_us_per_op"], r["submit_us_per_op"],
            r["total_us_per_op"], r["ops_per_s"]))
    print("(µs per op; submit: building the requests in Python plus ferry_submit)")


def mooncake_row(TransferEngine, session, local, remote_addr, n, args):
    te = TransferEngine()
    if te.initialize("127.0.0.1", "P2PHANDSHAKE", args.plugins.split(",")[0], "") != 0:
        sys.exit("python_batch_bench: mooncake initialize failed: " + te.last_error())
    buf = bytearray(b"\x5a" * (n * args.block))
    anchor = (ctypes_char() * len(buf)).from_buffer(buf)
    base = ctypes_addressof(anchor)
    te.register_memory(base, len(buf))
    src = [base + i * args.block for i in range(n)]
    dst = [remote_addr + i * args.block for i in range(n)]
    lens = [args.block] * n
    rc = te.batch_transfer_sync_write(session, src, dst, lens)
    if rc != 0:
        sys.exit("python_batch_bench: batch_transfer_sync_write: %d %s" % (rc, te.last_error()))
    times = []
    for _ in range(args.iters):
        t0 = time.perf_counter()
        te.batch_transfer_sync_write(session, src, dst, lens)
        times.append(time.perf_counter() - t0)
    times.sort()
    tot = times[len(times) // 2]
    del anchor
    te.close()
    return {"path": "mooncake batch_transfer_sync_write", "ops": n, "block": args.block,
            "submit_best_us_per_op": float("nan"), "submit_us_per_op": float("nan"),
            "total_us_per_op": round(tot / n * 1e6, 3),
            "ops_per_s": round(n / tot)}


def ctypes_char():
    import ctypes
    return ctypes.c_char


def ctypes_addressof(obj):
    import ctypes
    return ctypes.addressof(obj)


if __name__ == "__main__":
    main()
