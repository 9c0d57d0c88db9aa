"""The target process of the Mooncake tests, set up as SGLang's and vLLM's decode side sets
up its Mooncake engine: TransferEngine(), initialize(host, "P2PHANDSHAKE", protocol, ""),
KV buffers registered (batch_register_memory, as vLLM does), the session id
f"{host}:{get_rpc_port()}" given to the other side.

    mooncake_peer.py --protocol tcp --buffers 2 --size N --seed S [--host-id ID]

(--host-id makes the peer another host as far as Ferry's same-host check goes.)

Prints one JSON line {"session", "addresses", "size", "pid"}; then answers stdin lines:
"sha256 I" (of buffer I), "fill I SEED" (refill buffer I with a pattern), "unregister I",
"notifies" (JSON list of [name, msg] taken by get_notifies), "quit"."""

import argparse
import hashlib
import json
import os
import sys

import numpy as np

from ferry_te.mooncake import TransferEngine


def pattern(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--protocol", required=True)
    ap.add_argument("--buffers", type=int, default=1)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--host-id", default=None)
    args = ap.parse_args()
    engine = TransferEngine(**({"host_id": args.host_id} if args.host_id else {}))
    host = "127.0.0.1"
    if engine.initialize(host, "P2PHANDSHAKE", args.protocol, "") != 0:
        print(json.dumps({"error": engine.last_error()}), flush=True)
        return 1
    bufs = [pattern(args.size, args.seed + i) for i in range(args.buffers)]
    addrs = [b.ctypes.data for b in bufs]
    if engine.batch_register_memory(addrs, [b.nbytes for b in bufs]) != 0:
        print(json.dumps({"error": engine.last_error()}), flush=True)
        return 1
    print(json.dumps({"session": "%s:%d" % (host, engine.get_rpc_port()), "addresses": addrs,
                      "size": args.size, "pid": os.getpid()}), flush=True)
    live = set(addrs)
    for line in sys.stdin:
        cmd = line.split()
        if not cmd:
            continue
        if cmd[0] == "sha256":
            print(hashlib.sha256(bufs[int(cmd[1])].tobytes()).hexdigest(), flush=True)
        elif cmd[0] == "fill":
            bufs[int(cmd[1])][:] = pattern(args.size, int(cmd[2]))
            print("ok", flush=True)
        elif cmd[0] == "unregister":
            live.discard(addrs[int(cmd[1])])
            print(engine.unregister_memory(addrs[int(cmd[1])]), flush=True)
        elif cmd[0] == "notifies":
            print(json.dumps([[n.name, n.msg] for n in engine.get_notifies()]), flush=True)
        elif cmd[0] == "quit":
            break
    rc = engine.batch_unregister_memory([a for a in addrs if a in live])
    engine.close()
    print("bye %d" % rc, flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
