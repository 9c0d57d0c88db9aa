"""TransferOpcode, and get_local_topology's JSON."""

import enum
import json
import os


class TransferOpcode(enum.IntEnum):
    """Mooncake's TransferOpcode (a pybind11 arithmetic enum): Read = 0, Write = 1, the same
    numbers as ferry_te.READ and ferry_te.WRITE."""

    Read = 0
    Write = 1


def local_topology(device_name=None, sysfs="/sys/class/infiniband"):
    """Mooncake's topology JSON shape with this host's RDMA devices (device_name, a comma
    list, keeps only those). Ferry does not rank NICs per CPU/GPU location: every device is
    listed as preferred for "cpu:0"."""
    try:
        devices = sorted(os.listdir(sysfs))
    except OSError:
        devices = []
    wanted = [d.strip() for d in str(device_name or "").split(",") if d.strip()]
    if wanted:
        devices = [d for d in devices if d in wanted]
    return json.dumps({"cpu:0": {"preferred_hca": devices, "avail_hca": []}})
