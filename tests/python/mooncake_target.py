"""The target side of Mooncake's own Python transfer-engine test (mooncake-wheel/tests/
transfer_engine_target.py), as a Mooncake program run unchanged would do it: `from
mooncake.engine import TransferEngine` (through `python3 -m ferry_te.mooncake`), initialize
with TARGET_SERVER_NAME, MC_METADATA_SERVER and PROTOCOL from the environment, a managed
buffer when it has registered nothing. It prints one JSON line {"name", "address"} once ready
(Mooncake's prints a sentence and spins; this one waits on stdin, so CI's two cores stay free)
and exits when stdin closes."""

import json
import os
import sys

from mooncake.engine import TransferEngine

name = os.getenv("TARGET_SERVER_NAME", "127.0.0.1:12345")
metadata_server = os.getenv("MC_METADATA_SERVER", "127.0.0.1:2379")
protocol = os.getenv("PROTOCOL", "tcp")
CAPACITY = int(os.getenv("TARGET_CAPACITY", 64 * 1024 * 1024))

target = TransferEngine()
if target.initialize(name, metadata_server, protocol, "") != 0:
    print(json.dumps({"error": target.last_error()}), flush=True)
    sys.exit(1)
address = target.get_first_buffer_address(name)
if address == 0:
    address = target.allocate_managed_buffer(CAPACITY)
    if address == 0:
        print(json.dumps({"error": target.last_error()}), flush=True)
        sys.exit(1)
print(json.dumps({"name": name, "address": address}), flush=True)
sys.stdin.read()
target.close()
