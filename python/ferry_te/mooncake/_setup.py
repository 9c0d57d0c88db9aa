"""Mooncake's initialize() arguments as Ferry engine configuration: the metadata forms, the
local host name, protocol names mapped to Ferry plugins, device_name to rdma.devices, and
MC_TRANSFER_TIMEOUT to the plugins' op_timeout_ms."""

import errno
import os
import socket

P2PHANDSHAKE = "P2PHANDSHAKE"


class SetupError(Exception):
    """A Mooncake argument Ferry cannot serve: .code (negative errno) and the message."""

    def __init__(self, code, message):
        super().__init__(message)
        self.code = code


# Mooncake protocol (and transport_hint) names -> the Ferry plugins that serve them.
PROTOCOLS = {
    "rdma": ("rdma",),
    "tcp": ("tcp",),
    "efa": ("efa",),
    "hip": ("hip_ipc",),           # Mooncake's HipTransport: intra-node AMD GPU IPC
    "nvlink_intra": ("cuda_ipc",),  # Mooncake's IntraNodeNvlinkTransport: CUDA IPC in one node
    "shm": ("shm",),               # Mooncake TENT's shared-memory transport
    # Ferry's own names, so a Ferry user can pick any plugin through the same argument.
    "cuda_ipc": ("cuda_ipc",),
    "hip_ipc": ("hip_ipc",),
    "ferry": (),                    # every plugin that loads, by Ferry's priority
    "auto": (),
}

# Mooncake names Ferry has no transport for, and what to use instead.
MISSING = {
    "nvlink": "multi-node NVLink (MNNVL fabric handles) has no Ferry transport; use "
              "'nvlink_intra' (cuda_ipc.so) inside one node or 'rdma' across nodes",
    "xgmi": "use 'hip' (hip_ipc.so), as Mooncake's own Python API also requires",
    "cxi": "Ferry has no HPE Slingshot CXI transport; use 'efa' (libfabric) or 'tcp'",
    "barex": "Ferry has no Barex transport; use 'rdma'",
    "nvmeof": "Ferry has no NVMe-oF transport",
    "ascend": "Ferry has no Ascend (HCCL) transport",
    "musa": "Ferry has no Moore Threads MUSA transport",
    "mnnvl": "multi-node NVLink has no Ferry transport; use 'nvlink_intra' or 'rdma'",
    "gds": "Ferry has no GPUDirect Storage transport",
    "io_uring": "Ferry has no io_uring file transport",
    "sunrise_link": "Ferry has no Sunrise Link transport",
}


def plugins_for(protocol):
    """Ferry plugin names for a Mooncake protocol ('rdma', 'tcp', ...; a comma list picks
    several, best first). () means every plugin. Raises SetupError for names Ferry lacks."""
    names = [p.strip().lower() for p in str(protocol or "").split(",") if p.strip()]
    if not names:
        raise SetupError(-errno.EINVAL, "protocol is empty; pass 'rdma', 'tcp', 'efa', 'shm', "
                                        "'hip', 'nvlink_intra' or 'ferry' (all plugins)")
    out = []
    for name in names:
        if name in MISSING:
            raise SetupError(-errno.EPROTONOSUPPORT, "protocol '%s': %s" % (name, MISSING[name]))
        if name not in PROTOCOLS:
            raise SetupError(-errno.EPROTONOSUPPORT, "protocol '%s' is unknown; Ferry serves %s"
                             % (name, ", ".join(sorted(PROTOCOLS))))
        if not PROTOCOLS[name]:
            return ()
        out.extend(p for p in PROTOCOLS[name] if p not in out)
    return tuple(out)


def transport_for_hint(hint):
    """The one Ferry transport a Mooncake transport_hint forces; None for no hint."""
    if not hint or str(hint).lower() == "unspec":
        return None
    plugins = plugins_for(hint)
    if len(plugins) != 1:
        raise SetupError(-errno.EINVAL, "transport_hint '%s' names no single transport" % hint)
    return plugins[0]


def metadata_url(metadata_server, metadata_type="etcd"):
    """Ferry's `metadata` value for Mooncake's (metadata_server, metadata_type): P2PHANDSHAKE,
    etcd://..., or a bare host:port, which Mooncake reads as metadata_type://host:port."""
    server = str(metadata_server or "").strip()
    if not server:
        raise SetupError(-errno.EINVAL, "metadata_server is empty; pass 'P2PHANDSHAKE' or "
                                        "'etcd://host:2379'")
    if server == P2PHANDSHAKE:
        return P2PHANDSHAKE
    if "://" not in server:
        kind = str(metadata_type or "etcd").strip().lower() or "etcd"
        server = "%s://%s" % (kind, server)
    scheme = server.split("://", 1)[0].lower()
    if scheme in ("etcd", "etcds"):
        return server
    raise SetupError(-errno.EPROTONOSUPPORT,
                     "metadata server '%s': Ferry keeps metadata in etcd (etcd://host:2379) or "
                     "peer to peer (P2PHANDSHAKE), not in %s; run etcd or use P2PHANDSHAKE"
                     % (server, scheme))


def split_host(local_hostname):
    """('host', port or None) from 'host', 'host:port', '[v6]:port' or a bare IPv6 address."""
    name = str(local_hostname or "").strip()
    if not name:
        raise SetupError(-errno.EINVAL, "local_hostname is empty; pass this host's IP address")
    if name.startswith("["):
        host, _, rest = name[1:].partition("]")
        port = rest[1:] if rest.startswith(":") else ""
    elif name.count(":") == 1:
        host, port = name.split(":")
    else:
        host, port = name, ""
    if port:
        if not port.isdigit() or not 0 < int(port) < 65536:
            raise SetupError(-errno.EINVAL, "local_hostname '%s': the port must be 1..65535"
                             % name)
        return host, int(port)
    return host, None


def resolve_ip(host):
    """The address to bind for `host` (an IP stays as it is; a name is looked up)."""
    for family in (socket.AF_INET, socket.AF_INET6):
        try:
            socket.inet_pton(family, host)
            return host
        except OSError:
            pass
    try:
        infos = socket.getaddrinfo(host, None, type=socket.SOCK_STREAM)
    except socket.gaierror as e:
        raise SetupError(-errno.EHOSTUNREACH, "local_hostname '%s' does not resolve (%s); pass "
                         "this host's IP address" % (host, e)) from None
    return infos[0][4][0]


def transfer_timeout_ms():
    """MC_TRANSFER_TIMEOUT (seconds, at least 5, as Mooncake reads it) in ms; None if unset."""
    value = os.environ.get("MC_TRANSFER_TIMEOUT")
    if not value:
        return None
    try:
        seconds = int(value)
    except ValueError:
        raise SetupError(-errno.EINVAL, "MC_TRANSFER_TIMEOUT='%s' is not a number of seconds"
                         % value) from None
    return max(5, seconds) * 1000


def engine_config(local_hostname, metadata, protocol, device_name):
    """The Ferry key/values for an initialize() call."""
    cfg = {"metadata": metadata}
    host, port = split_host(local_hostname)
    ip = resolve_ip(host)
    if metadata == P2PHANDSHAKE:
        # The segment name is ip:port, which is Mooncake's session id f"{host}:{rpc_port}".
        cfg["local_ip"] = ip
        if port is not None:
            cfg["rpc_port"] = str(port)
    else:
        # With etcd Mooncake names the segment local_hostname itself.
        cfg["local_ip"] = ip
        cfg["local_server_name"] = str(local_hostname).strip()
        if port is not None:
            cfg["rpc_port"] = str(port)
    plugins = plugins_for(protocol)
    if plugins:
        cfg["plugins"] = ",".join(plugins)
        cfg["protocols"] = ",".join(plugins)
    if not plugins or "tcp" in plugins:
        # Mooncake moves tcp data over local_hostname's address; tcp.so binds 127.0.0.1 unless
        # told, which would leave peers on other nodes nothing to reach.
        cfg["tcp.bind_ip"] = ip
    devices = [d.strip() for d in str(device_name or "").split(",") if d.strip()]
    if devices:
        if plugins and "rdma" not in plugins:
            pass  # Mooncake ignores device_name for transports without NICs to pick
        else:
            cfg["rdma.devices"] = ",".join(devices)
    timeout = transfer_timeout_ms()
    if timeout is not None:
        for p in plugins or ("tcp", "shm", "rdma", "efa"):
            if p in ("tcp", "shm", "rdma", "efa"):
                cfg[p + ".op_timeout_ms"] = str(timeout)
    return cfg
