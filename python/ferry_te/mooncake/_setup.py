"""Mooncake's initialize() arguments as Ferry engine configuration: the metadata forms, the
local host name, Mooncake's transport selection over the plugins this host loads (_env has the
MC_* variables), device_name to rdma.devices."""

import errno
import os
import random
import socket

from . import _env
from ._errors import SetupError

P2PHANDSHAKE = "P2PHANDSHAKE"


# Mooncake protocol (and transport_hint) names -> the Ferry plugins that serve them.
PROTOCOLS = {
    "rdma": ("rdma",),
    "tcp": ("tcp",),
    "efa": ("efa",),
    "hip": ("hip_ipc",),           # Mooncake's HipTransport: intra-node AMD GPU IPC
    "nvlink_intra": ("cuda_ipc",),  # Mooncake's IntraNodeNvlinkTransport: CUDA IPC in one node
    "shm": ("shm",),               # Mooncake TENT's shared-memory transport
    "io_uring": ("file",),         # Mooncake's file segments over io_uring: file.so
    "gds": ("gds",),               # GPUDirect Storage (cuFile): gds.so
    # Ferry's own names, so a Ferry user can pick any plugin through the same argument.
    "cuda_ipc": ("cuda_ipc",),
    "hip_ipc": ("hip_ipc",),
    "file": ("file",),
    "ferry": (),                    # every plugin that loads, by Ferry's priority
    "auto": (),
}

# Transports between nodes, one of which an initialize() installs, and the transports inside
# one node that are loaded beside it wherever they load (Ferry's priority then sends a
# same-host GPU pair over IPC and a same-host host pair over shm).
INTER_NODE = ("rdma", "efa", "tcp")
INTRA_NODE = ("cuda_ipc", "hip_ipc", "shm")
# Storage plugins, loaded beside them wherever they load: they carry only "file:<path>"
# segments this engine opens (gds.so GPU memory, file.so host memory and, staged, GPU memory
# where gds.so does not load), never a peer's.
STORAGE = ("gds", "file")

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


def plugin_states(report):
    """{plugin name: (loaded?, why not)} from a plugin report (ferry_te.plugin_report()). A
    name with several files (variant directories) is loaded when one of them is; otherwise
    its reason is that of the file that got furthest (probed, not skipped for its variant)."""
    rank = {"loaded": 0, "unavailable": 1, "failed": 2, "variant-skipped": 4, "shadowed": 5}
    best = {}
    for rec in report.get("plugins", []):
        name, state = rec.get("name"), rec.get("state", "")
        r = rank.get(state, 3)
        if name and (name not in best or r < best[name][0]):
            best[name] = (r, state == "loaded", "%s.so %s: %s" % (name, state, rec.get("reason", "")))
    return {name: (ok, why) for name, (_, ok, why) in best.items()}


def _why_not(states, name):
    if name in states:
        return states[name][1]
    return "%s.so is not on the plugin path (ferry-info lists where Ferry looks)" % name


def select_plugins(protocol, states, environ=None):
    """Mooncake's transport selection over Ferry's plugins: (plugins, note). `plugins` is the
    allow list for the engine (() = every plugin); `note` is one line saying what was asked,
    what was chosen and why, when they differ (None otherwise). `states` comes from
    plugin_states().

    As Mooncake's default build does: the transport between nodes is RDMA when this host can
    load it, else TCP, whatever an intra-node protocol name asked; 'tcp', 'rdma' and 'efa' ask
    for that one and fall back to TCP when it cannot load here. MC_FORCE_TCP (any value) means
    TCP alone; MC_FORCE_HCA means RDMA, failing when it cannot load. The intra-node plugins
    (cuda_ipc, hip_ipc, shm) and the storage plugins (gds, file) that load are always added,
    so a same-host GPU pair goes over IPC, a same-host host pair over shm, and "file:<path>"
    segments open. 'io_uring' and 'gds' ask for file.so and gds.so beside the default
    inter-node transport. A comma list or 'ferry'/'auto' is Ferry's own
    form: exactly those plugins / every plugin, no fallback."""
    env = os.environ if environ is None else environ
    wanted = plugins_for(protocol)  # refuses unknown names and Mooncake's missing transports
    names = [p.strip().lower() for p in str(protocol).split(",") if p.strip()]
    loaded = lambda name: states.get(name, (False, ""))[0]  # noqa: E731
    if "MC_FORCE_TCP" in env:
        if not loaded("tcp"):
            raise SetupError(-errno.ENOENT, "MC_FORCE_TCP is set but %s" % _why_not(states, "tcp"))
        note = None
        if tuple(wanted) != ("tcp",):
            note = "protocol '%s' asked; MC_FORCE_TCP is set, so tcp alone" % protocol
        return ("tcp",), note
    if len(names) > 1 or not wanted:
        return tuple(wanted), None
    name = names[0]
    note = None
    if "MC_FORCE_HCA" in env:
        if not loaded("rdma"):
            raise SetupError(-errno.ENODEV, "MC_FORCE_HCA is set but %s" % _why_not(states, "rdma"))
        inter = "rdma"
        if wanted != ("rdma",):
            note = "protocol '%s' asked; MC_FORCE_HCA is set, so rdma" % protocol
    elif wanted[0] in INTER_NODE:
        inter = wanted[0]
        if not loaded(inter):
            if not loaded("tcp"):
                raise SetupError(-errno.ENOENT, "protocol '%s': %s, and %s" % (
                    name, _why_not(states, inter), _why_not(states, "tcp")))
            note = "protocol '%s' asked, tcp chosen: %s" % (name, _why_not(states, inter))
            inter = "tcp"
    else:
        # An intra-node name: Mooncake installs its default inter-node transport beside it.
        inter = "rdma" if loaded("rdma") else "tcp"
        if not loaded(inter):
            raise SetupError(-errno.ENOENT, "protocol '%s': %s" % (name, _why_not(states, inter)))
        if not loaded(wanted[0]):
            carrier = inter
            if wanted[0] in STORAGE:
                carrier = ("file.so (GPU memory staged through pinned host memory)" if loaded("file")
                           else "nothing: file segments will not open")
            note = "protocol '%s' asked, but %s; %s carries what it would have" % (
                name, _why_not(states, wanted[0]), carrier)
    return (inter,) + tuple(p for p in INTRA_NODE + STORAGE if loaded(p)), note


def transport_for_hint(hint):
    """The one Ferry transport a Mooncake transport_hint forces; None for no hint."""
    if not hint or str(hint).lower() == "unspec":
        return None
    plugins = plugins_for(hint)
    if len(plugins) != 1:
        raise SetupError(-errno.EINVAL, "transport_hint '%s' names no single transport" % hint)
    return plugins[0]


METADATA_SCHEMES = ("etcd", "etcds", "http", "https", "redis")


def metadata_url(metadata_server, metadata_type="etcd", environ=None):
    """Ferry's `metadata` value for Mooncake's (metadata_server, metadata_type): P2PHANDSHAKE,
    etcd://..., http(s)://host:port/path, redis://host:port, or a bare host:port, which
    Mooncake reads as metadata_type://host:port. An empty metadata_server takes
    MC_METADATA_SERVER."""
    env = os.environ if environ is None else environ
    server = str(metadata_server or "").strip() or env.get("MC_METADATA_SERVER", "").strip()
    if not server:
        raise SetupError(-errno.EINVAL, "metadata_server is empty (and MC_METADATA_SERVER is not "
                                        "set); pass 'P2PHANDSHAKE', 'etcd://host:2379', "
                                        "'http://host:8080/metadata' or 'redis://host:6379'")
    if server == P2PHANDSHAKE:
        return P2PHANDSHAKE
    if "://" not in server:
        kind = str(metadata_type or "etcd").strip().lower() or "etcd"
        server = "%s://%s" % (kind, server)
    scheme = server.split("://", 1)[0].lower()
    if scheme in METADATA_SCHEMES:
        return server
    raise SetupError(-errno.EPROTONOSUPPORT,
                     "metadata server '%s': Ferry keeps metadata peer to peer (P2PHANDSHAKE), in "
                     "etcd (etcd://host:2379), behind Mooncake's HTTP metadata server "
                     "(http://host:8080/metadata) or in Redis (redis://host:6379), not in %s"
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


def engine_config(local_hostname, metadata, protocol, device_name, states, environ=None):
    """(Ferry key/values for an initialize() call, the selection note or None). `states`:
    plugin_states() of this host's plugin report; None when the caller picks the plugins."""
    env = os.environ if environ is None else environ
    cfg = {"metadata": metadata}
    host, port = split_host(local_hostname)
    if metadata == P2PHANDSHAKE:
        # The segment name is ip:port, Mooncake's session id f"{host}:{get_rpc_port()}". As in
        # Mooncake, the port is one this engine picks: a port in local_hostname is not used.
        cfg["local_ip"] = resolve_ip(host)
    else:
        # With a metadata server Mooncake names the segment local_hostname itself, and binds
        # MC_TCP_BIND_ADDRESS (else a LAN address) on a port it picks, unless
        # MC_LEGACY_RPC_PORT_BINDING asks for local_hostname's.
        cfg["local_ip"] = env.get("MC_TCP_BIND_ADDRESS", "").strip() or resolve_ip(host)
        cfg["local_server_name"] = str(local_hostname).strip()
        if port is not None and _env.is_set("MC_LEGACY_RPC_PORT_BINDING", env):
            cfg["rpc_port"] = str(port)
        if metadata.split("://", 1)[0].lower() == "redis":
            cfg.update(_env.redis_keys(env))
    plugins, note = ((), None) if states is None else select_plugins(protocol, states, env)
    if plugins:
        cfg["plugins"] = ",".join(plugins)
    if not plugins or "tcp" in plugins:
        # Mooncake moves tcp data over local_hostname's address; tcp.so binds 127.0.0.1 unless
        # told, which would leave peers on other nodes nothing to reach.
        cfg["tcp.bind_ip"] = cfg["local_ip"]
    devices = [d.strip() for d in str(device_name or "").split(",") if d.strip()]
    if devices and (not plugins or "rdma" in plugins):
        cfg["rdma.devices"] = ",".join(devices)  # Mooncake ignores it for transports without NICs
    cfg.update(_env.engine_keys(plugins, device_name, env))
    return cfg, note


def control_ports(cfg, environ=None, attempts=64):
    """The rpc_port values to try in turn: the one cfg fixes, else random ports of
    MC_MIN_RPC_PORT..MC_MAX_RPC_PORT (as Mooncake picks them), else 0 (any free port)."""
    if "rpc_port" in cfg:
        return [cfg["rpc_port"]]
    span = _env.rpc_port_range(environ)
    if span is None:
        return ["0"]
    low, high = span
    ports = list(range(low, high + 1))
    random.shuffle(ports)
    return [str(p) for p in ports[:attempts]]
