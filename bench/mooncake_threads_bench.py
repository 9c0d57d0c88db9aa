#!/usr/bin/python3
"""Mooncake's batch_transfer_sync_write from many Python threads to one peer, as SGLang sends
per-token slices from a thread pool (vLLM from 10 workers), against one thread in the same run.

    bench/mooncake_threads_bench.py [--threads 1,4,16] [--calls 2000] [--slices 4] [--size 64]
                                    [--protocol tcp] [--rounds 3] [--json]

A target process (this script with --serve) registers one buffer; this process sends, per
thread, --calls sync batch calls of --slices slices of --size bytes, each to its own place.
Per thread count it prints calls/s of all threads together and µs per call as each thread
sees it (median over rounds), and the ratio of that per-call time to one thread's. Rows also
show ferry_te's own Engine.submit_arrays + wait from the same threads, so the Mooncake shim's
share is visible. --protocol tcp sets MC_FORCE_TCP (a same-host pair would go over shm);
--protocol shm leaves Mooncake's selection to pick shm. Run from a build tree with
PYTHONPATH=python, FERRY_LIBRARY=build/core/libferry.so.0 and
FERRY_PLUGIN_PATH=build/core/ferry/plugins, or against an installed ferry_te."""

import argparse
import json
import os
import subprocess
import sys
import threading
import time


def serve(nbytes):
    import ctypes
    from ferry_te.mooncake import TransferEngine
    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", os.environ["BENCH_PROTOCOL"], "") != 0:
        print(json.dumps({"error": engine.last_error()}), flush=True)
        return 1
    buf = ctypes.create_string_buffer(nbytes)
    if engine.register_memory(ctypes.addressof(buf), nbytes) != 0:
        print(json.dumps({"error": engine.last_error()}), flush=True)
        return 1
    print(json.dumps({"session": "127.0.0.1:%d" % engine.get_rpc_port(),
                      "address": ctypes.addressof(buf)}), flush=True)
    sys.stdin.read()  # until the sender closes the pipe
    engine.close()
    return 0


def run_threads(n, body):
    """Runs body(t) in n threads; returns the wall time of all."""
    ready = threading.Barrier(n + 1)
    out = [None] * n

    def work(t):
        ready.wait()
        out[t] = body(t)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(n)]
    for th in pool:
        th.start()
    ready.wait()
    t0 = time.perf_counter()
    for th in pool:
        th.join()
    wall = time.perf_counter() - t0
    if any(r is None for r in out):
        raise SystemExit("a thread failed")
    return wall, out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--threads", default="1,4,16")
    ap.add_argument("--calls", type=int, default=2000)
    ap.add_argument("--slices", type=int, default=4)
    ap.add_argument("--size", type=int, default=64)
    ap.add_argument("--protocol", default="tcp", choices=("tcp", "shm"))
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    os.environ["BENCH_PROTOCOL"] = args.protocol
    if args.protocol == "tcp":
        os.environ["MC_FORCE_TCP"] = "1"
    else:
        os.environ.pop("MC_FORCE_TCP", None)
    if args.serve:
        return serve(args.serve)

    import ferry_te as ferry
    from ferry_te.mooncake import TransferEngine
    counts = [int(x) for x in args.threads.split(",")]
    span = args.calls * args.slices * args.size
    nbytes = max(counts) * span
    target = subprocess.Popen([sys.executable, __file__, "--serve", str(nbytes),
                               "--protocol", args.protocol],
                              stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    info = json.loads(target.stdout.readline() or '{"error": "the target exited"}')
    if "error" in info:
        raise SystemExit("target: " + info["error"])
    engine = TransferEngine()
    if engine.initialize("127.0.0.1", "P2PHANDSHAKE", args.protocol, "") != 0:
        raise SystemExit(engine.last_error())
    import ctypes
    src = ctypes.create_string_buffer(nbytes)
    base = ctypes.addressof(src)
    if engine.register_memory(base, nbytes) != 0:
        raise SystemExit(engine.last_error())
    session, remote = info["session"], info["address"]
    fe = engine.get_engine()
    seg = fe.open_segment(session)

    def offsets(t, c):
        return [t * span + (c * args.slices + s) * args.size for s in range(args.slices)]

    def mooncake_body(t):
        for c in range(args.calls):
            offs = offsets(t, c)
            if engine.batch_transfer_sync_write(session, [base + o for o in offs],
                                                [remote + o for o in offs],
                                                [args.size] * args.slices) != 0:
                raise SystemExit(engine.last_error())
        return True

    def ferry_body(t):
        for c in range(args.calls):
            offs = offsets(t, c)
            batch = fe.submit_arrays(ferry.WRITE, seg, [base + o for o in offs],
                                     [remote + o for o in offs], args.size)
            batch.wait()
            batch.free()
        return True

    mooncake_body(0)  # warm: connections
    rows = []
    for name, body in (("mooncake batch_transfer_sync_write", mooncake_body),
                       ("ferry_te submit_arrays + wait", ferry_body)):
        one = None
        for n in counts:
            walls = sorted(run_threads(n, body)[0] for _ in range(args.rounds))
            wall = walls[len(walls) // 2]
            per_call_us = wall / args.calls * 1e6  # what each thread waits per call
            one = per_call_us if n == counts[0] else one
            rows.append({"path": name, "threads": n, "calls_per_s": n * args.calls / wall,
                         "us_per_call": per_call_us, "vs_first": per_call_us / one})
    target.stdin.close()
    target.wait(60)
    engine.close()
    if args.json:
        print(json.dumps(rows, indent=1))
        return 0
    print("%s, %d slices of %d B per call, %d calls per thread, median of %d rounds"
          % (args.protocol, args.slices, args.size, args.calls, args.rounds))
    print("| path | threads | calls/s (all threads) | µs per call (each thread) | vs %d thread(s) |"
          % counts[0])
    print("|---|---|---|---|---|")
    for r in rows:
        print("| %s | %d | %.0f | %.1f | %.2fx |" % (r["path"], r["threads"], r["calls_per_s"],
                                                   r["us_per_call"], r["vs_first"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
