#!/usr/bin/python3
"""What registering N regions costs through the Mooncake shim, as vLLM and SGLang call it:
batch_register_memory(addresses, capacities) and batch_unregister_memory(addresses) of N 64-byte
ranges of one numpy buffer, over P2PHANDSHAKE or etcd. Runs whichever ferry_te PYTHONPATH finds
(with FERRY_LIBRARY): a baseline tree whose shim registers one by one runs the same way.

    bench/python_registration_bench.py [--regions 10000,100000] [--etcd HOST:PORT] [--label L]

bench/etcd_registration.sh runs it (PYTHON_ROWS=1) next to registration_bench."""

import argparse
import os
import time

import numpy as np

from ferry_te.mooncake import TransferEngine


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--regions", default="10000,100000")
    ap.add_argument("--etcd", default="")
    ap.add_argument("--label", default="")
    a = ap.parse_args()
    for n in (int(x) for x in a.regions.split(",")):
        metadata = "P2PHANDSHAKE"
        if a.etcd:
            metadata = "etcd://%s/ferry-pybench-%d-%d" % (a.etcd, os.getpid(), n)
        engine = TransferEngine()
        if engine.initialize("127.0.0.1", metadata, "tcp", "") != 0:
            raise SystemExit("initialize: " + engine.last_error())
        buf = np.zeros(n * 64, np.uint8)
        addrs = [buf.ctypes.data + i * 64 for i in range(n)]
        t0 = time.perf_counter()
        if engine.batch_register_memory(addrs, [64] * n) != 0:
            raise SystemExit("batch_register_memory: " + engine.last_error())
        t1 = time.perf_counter()
        if engine.batch_unregister_memory(addrs) != 0:
            raise SystemExit("batch_unregister_memory: " + engine.last_error())
        t2 = time.perf_counter()
        engine.close()
        print("%s%7d regions%s: Mooncake shim batch_register_memory %.3f s, batch_unregister_memory %.3f s"
              % (a.label, n, " over etcd" if a.etcd else "", t1 - t0, t2 - t1), flush=True)


if __name__ == "__main__":
    main()
