"""The other process of the two-process tests: serves one registered numpy buffer.

    peer.py --plugins tcp --size N --seed S

Prints one JSON line {"segment", "address", "size", "pid"}; then answers stdin lines:
"sha256" (of the buffer), "fill SEED" (refill with another pattern), "quit"."""

import argparse
import hashlib
import json
import sys

import numpy as np

import ferry_te as ferry


def pattern(size, seed):
    return np.random.default_rng(seed).integers(0, 256, size=size, dtype=np.uint8)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--plugins", required=True)
    ap.add_argument("--size", type=int, required=True)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    with ferry.Engine(local_ip="127.0.0.1", plugins=args.plugins) as engine:
        buf = pattern(args.size, args.seed)
        engine.register(buf)
        print(json.dumps({"segment": engine.segment_name, "address": buf.ctypes.data,
                          "size": buf.nbytes, "pid": __import__("os").getpid()}), flush=True)
        for line in sys.stdin:
            cmd = line.split()
            if not cmd:
                continue
            if cmd[0] == "sha256":
                print(hashlib.sha256(buf.tobytes()).hexdigest(), flush=True)
            elif cmd[0] == "fill":
                buf[:] = pattern(args.size, int(cmd[1]))
                print("ok", flush=True)
            elif cmd[0] == "quit":
                break
    print("bye", flush=True)


if __name__ == "__main__":
    main()
