"""Mooncake's MC_* environment variables on Ferry: the ones honoured and the Ferry settings they
become, and the ones ignored with why. docs/MOONCAKE.md's table lists the same names (a test
checks that the two agree)."""

import errno
import os

from ._errors import SetupError

# name -> what it does on Ferry. Each is read by engine_keys() below or by _setup.
HONOURED = {
    "MC_FORCE_TCP": "tcp.so alone, whatever the protocol (any value, as in Mooncake)",
    "MC_FORCE_HCA": "rdma.so between nodes; initialize fails with rdma.so's reason where it cannot load",
    "MC_TRANSFER_TIMEOUT": "seconds (at least 5): each transport's `op_timeout_ms`",
    "MC_METADATA_SERVER": "used when initialize's metadata_server is empty (callers such as LMCache read it themselves)",
    "MC_LEGACY_RPC_PORT_BINDING": "with a metadata server, the control server binds local_hostname's port",
    "MC_MIN_RPC_PORT": "lowest control server port (default: any free port)",
    "MC_MAX_RPC_PORT": "highest control server port",
    "MC_TCP_BIND_ADDRESS": "with a metadata server, the address the control server and tcp.so bind",
    "MC_RDMA_BIND_ADDRESS": "`rdma.bind_ip`",
    "MC_REDIS_PASSWORD": "`redis_password` for a redis:// metadata server",
    "MC_REDIS_DB_INDEX": "`redis_db` (0..255) for a redis:// metadata server",
    "MC_LOG_LEVEL": "`log_level` (TRACE, INFO, WARNING, ERROR)",
    "MC_TE_FILTERS": "`rdma.devices` when initialize's device_name is empty",
    "MC_GID_INDEX": "`rdma.gid_index`",
    "MC_IB_PORT": "`rdma.ib_port`",
    "MC_IB_TC": "`rdma.traffic_class` (-1: the default)",
    "MC_IB_SL": "`rdma.service_level` (-1: the default)",
    "MC_MTU": "`rdma.mtu`",
    "MC_MAX_WR": "`rdma.max_wr`",
    "MC_TCP_SLICE_SIZE": "`tcp.slice_size` (bytes, at least 4096)",
    "MC_HANDSHAKE_CONNECT_TIMEOUT": "seconds: `handshake_timeout_ms`, `tcp.connect_timeout_ms`, `rdma.connect_timeout_ms`",
    "MC_INTRA_NVLINK": "nothing to switch on: cuda_ipc.so is loaded wherever it loads",
    "MC_INTRANODE_NVLINK": "as MC_INTRA_NVLINK",
}

_RDMA_TUNING = "RDMA verbs tuning of Mooncake's own queue pair and worker layout, which rdma.so does not share (docs/RDMA.md lists rdma.so's options)"
_STORE = "Mooncake Store (its master, client and cache), which Ferry does not replace"
_HARDWARE = "a transport Ferry does not have"
_TENT = "Mooncake's TENT engine and its configuration files"

# name -> why Ferry ignores it.
IGNORED = {
    "MC_NUM_CQ_PER_CTX": _RDMA_TUNING,
    "MC_NUM_COMP_CHANNELS_PER_CTX": _RDMA_TUNING,
    "MC_MAX_CQE_PER_CTX": _RDMA_TUNING,
    "MC_MAX_EP_PER_CTX": _RDMA_TUNING,
    "MC_NUM_QP_PER_EP": _RDMA_TUNING,
    "MC_MAX_SGE": _RDMA_TUNING,
    "MC_MAX_INLINE": _RDMA_TUNING,
    "MC_WORKERS_PER_CTX": _RDMA_TUNING,
    "MC_SLICE_SIZE": _RDMA_TUNING + "; rdma.so stripes ops of at least twice `rdma.stripe_min`",
    "MC_FRAGMENT_RATIO": _RDMA_TUNING,
    "MC_PATH_ROUNDROBIN": _RDMA_TUNING,
    "MC_ENDPOINT_STORE_TYPE": _RDMA_TUNING,
    "MC_AUTO_GID_MAX_RETRIES": _RDMA_TUNING + "; `rdma.gid_index` picks the GID",
    "MC_ENABLE_DEST_DEVICE_AFFINITY": _RDMA_TUNING + "; rdma.so pairs NICs by topology",
    "MC_ENABLE_PARALLEL_REG_MR": _RDMA_TUNING,
    "MC_MAX_CONCURRENT_REG_MR": _RDMA_TUNING,
    "MC_TRACK_RDMA_POSTED_SLICES": _RDMA_TUNING + "; an op that times out names its peer and NIC",
    "MC_PKEY_INDEX": "rdma.so uses partition key index 0; no option for another yet",
    "MC_IB_PCI_RELAXED_ORDERING": "rdma.so registers memory without relaxed ordering; no option yet",
    "MC_MLX5_QP_UDP_SPORTS": "mlx5-specific queue pair settings rdma.so does not make",
    "MC_MLX5_QP_LAG_PORT_BALANCE": "mlx5-specific queue pair settings rdma.so does not make",
    "MC_TE_FILTERS_EXCLUDE": "`rdma.devices` is an allow list: name the devices to keep",
    "MC_RETRY_CNT": "Mooncake's software retries of failed slices; Ferry fails the op within its timeout (`rdma.retry_count` is the queue pair's)",
    "MC_EFA_CQ_THREADS": "efa.so has one progress thread per instance (`efa.spin_us` decides spinning)",
    "MC_EFA_NIC_SELECTION": "efa.so registers on the NICs `efa.devices` names",
    "MC_TCP_ENABLE_CONNECTION_POOL": "tcp.so always keeps `tcp.lanes` connections per peer",
    "MC_TCP_PROTO": "tcp.so completes a WRITE only once its bytes are in remote memory, always",
    "MC_HANDSHAKE_LISTEN_BACKLOG": "the control server's backlog is fixed; `control_max_connections` bounds it",
    "MC_HANDSHAKE_MAX_LENGTH": "Ferry's descriptors are binary and fetched whole, whatever their size",
    "MC_DISABLE_METACACHE": "a peer that registers again is re-read before its next op",
    "MC_TE_METADATA_REFRESH_INTERVAL_SECONDS": "a peer that registers again is re-read before its next op",
    "MC_METADATA_CLUSTER_ID": "Ferry's keys live under `ferry/`, apart from Mooncake's; etcd takes a prefix in its URL",
    "MC_LOG_DIR": "Ferry logs to stderr and to Python's `ferry_te` loggers",
    "MC_YLT_LOG_LEVEL": _STORE,
    "MC_TE_METRIC": "Ferry has no metrics reporter yet",
    "MC_TE_METRIC_INTERVAL_SECONDS": "Ferry has no metrics reporter yet",
    "MC_USE_TENT": _TENT,
    "MC_USE_TEV1": _TENT,
    "MC_TENT_CONF": _TENT,
    "MC_CUSTOM_TOPO_JSON": "Ferry reads the NIC topology from sysfs (`rdma.sysfs_root`)",
    "MC_FORCE_MNNVL": _HARDWARE + " (multi-node NVLink)",
    "MC_FORCE_MUSA": _HARDWARE + " (MUSA)",
    "MC_MUSA_IPC_OPEN_DEVICE": _HARDWARE + " (MUSA)",
    "MC_MUSA_COPY_API": _HARDWARE + " (MUSA)",
    "MC_MUSA_TRANSFER_BATCH_MIN_BYTES": _HARDWARE + " (MUSA)",
    "MC_TANGRT_ROOT": _HARDWARE + " (Sunrise Link)",
    "MC_TANGRT_LIB_DIR": _HARDWARE + " (Sunrise Link)",
    "MC_TANGRT_LIB_ARCH": _HARDWARE + " (Sunrise Link)",
    "MC_TPU_PJRT_LIB": _HARDWARE + " (TPU)",
    "MC_CXL_DEV_SIZE": _HARDWARE + " (CXL)",
    "MC_LOCAL_SERVER_NAME": _HARDWARE + " (Kunpeng UB)",
    "MC_NOF_WORKERS": _HARDWARE + " (NVMe-oF)",
    "MC_NOF_SUBMIT_CHUNK_BYTES": _HARDWARE + " (NVMe-oF)",
    "MC_NOF_INFLIGHT_BYTES_LIMIT": _HARDWARE + " (NVMe-oF)",
    "MC_RPC_PROTOCOL": _STORE,
    "MC_RPC_TIMEOUT_MS": _STORE,
    "MC_RPC_CONNECT_TIMEOUT_MS": _STORE,
    "MC_RPC_CLIENT_IO_THREADS": _STORE,
    "MC_TE_RPC_CLIENT_IO_THREADS": _STORE,
    "MC_STORE_RPC_CLIENT_IO_THREADS": _STORE,
    "MC_MS_AUTO_DISC": _STORE,
    "MC_MS_FILTERS": _STORE,
    "MC_MMAP_ARENA_POOL_SIZE": _STORE,
    "MC_DISABLE_MMAP_ARENA": _STORE,
    "MC_STORE_CLIENT_MAX_PORT": _STORE,
    "MC_STORE_CLIENT_MIN_PORT": _STORE,
    "MC_STORE_CLIENT_METRIC": _STORE,
    "MC_STORE_CLIENT_METRIC_INTERVAL": _STORE,
    "MC_STORE_CLIENT_SETUP_RETRIES": _STORE,
    "MC_STORE_CLUSTER_ID": _STORE,
    "MC_STORE_HUGEPAGE_SIZE": _STORE,
    "MC_STORE_USE_HUGEPAGE": _STORE,
    "MC_STORE_LOCAL_HOT_ADMISSION_THRESHOLD": _STORE,
    "MC_STORE_LOCAL_HOT_BLOCK_SIZE": _STORE,
    "MC_STORE_LOCAL_HOT_CACHE_SIZE": _STORE,
    "MC_STORE_LOCAL_HOT_CACHE_USE_SHM": _STORE,
    "MC_STORE_MEMCPY": _STORE,
    "MC_STORE_PINNED_RESTORE_ARENA_SIZE_BYTES": _STORE,
    "MC_STORE_PIN_MEMORY_MAX_BYTES": _STORE,
}

_LOG_LEVELS = {"trace": "trace", "debug": "debug", "info": "info", "warning": "warn",
               "warn": "warn", "error": "error", "fatal": "error"}


def _get(env, name):
    value = env.get(name)
    return None if value is None or not str(value).strip() else str(value).strip()


def _int(env, name, low, high, unit=""):
    value = _get(env, name)
    if value is None:
        return None
    try:
        n = int(value, 0)
    except ValueError:
        raise SetupError(-errno.EINVAL, "%s='%s' is not a whole number%s" % (name, value, unit)) from None
    if not low <= n <= high:
        raise SetupError(-errno.EINVAL, "%s=%d is outside %d..%d%s" % (name, n, low, high, unit))
    return n


def is_set(name, environ=None):
    """Mooncake tests these with getenv() != NULL: set at all, even empty, counts."""
    return name in (os.environ if environ is None else environ)


def transfer_timeout_ms(environ=None):
    """MC_TRANSFER_TIMEOUT (seconds, at least 5, as Mooncake reads it) in ms; None if unset."""
    env = os.environ if environ is None else environ
    value = _get(env, "MC_TRANSFER_TIMEOUT")
    if value is None:
        return None
    try:
        seconds = int(value)
    except ValueError:
        raise SetupError(-errno.EINVAL, "MC_TRANSFER_TIMEOUT='%s' is not a number of seconds"
                         % value) from None
    return max(5, seconds) * 1000


def rpc_port_range(environ=None):
    """(low, high) from MC_MIN_RPC_PORT / MC_MAX_RPC_PORT (Mooncake also reads the misspelt
    MC_MIN_PRC_PORT / MC_MAX_PRC_PORT); None when neither is set. Mooncake's defaults (15000,
    17000) fill the side left unset; a lowest port above 17000 alone reaches up to 65535."""
    env = os.environ if environ is None else environ
    low = _int(env, "MC_MIN_RPC_PORT", 1024, 65535)
    if low is None:
        low = _int(env, "MC_MIN_PRC_PORT", 1024, 65535)
    high = _int(env, "MC_MAX_RPC_PORT", 1024, 65535)
    if high is None:
        high = _int(env, "MC_MAX_PRC_PORT", 1024, 65535)
    if low is None and high is None:
        return None
    low = 15000 if low is None else low
    high = (17000 if low <= 17000 else 65535) if high is None else high
    if low > high:
        raise SetupError(-errno.EINVAL, "MC_MIN_RPC_PORT=%d is above MC_MAX_RPC_PORT=%d" % (low, high))
    return low, high


def redis_keys(environ=None):
    """Engine keys for a redis:// metadata server from MC_REDIS_USERNAME, MC_REDIS_PASSWORD and
    MC_REDIS_DB_INDEX."""
    env = os.environ if environ is None else environ
    keys = {}
    if _get(env, "MC_REDIS_USERNAME"):
        keys["redis_user"] = _get(env, "MC_REDIS_USERNAME")
    if env.get("MC_REDIS_PASSWORD"):
        keys["redis_password"] = env["MC_REDIS_PASSWORD"]
    db = _int(env, "MC_REDIS_DB_INDEX", 0, 255)
    if db is not None:
        keys["redis_db"] = str(db)
    return keys


def engine_keys(plugins, device_name, environ=None):
    """The Ferry keys the honoured tuning variables give, for an engine loading `plugins`
    (() = every plugin)."""
    env = os.environ if environ is None else environ
    has = lambda p: not plugins or p in plugins  # noqa: E731
    keys = {}
    level = _get(env, "MC_LOG_LEVEL")
    if level is not None:
        if level.lower() not in _LOG_LEVELS:
            raise SetupError(-errno.EINVAL, "MC_LOG_LEVEL='%s': use TRACE, INFO, WARNING or ERROR" % level)
        keys["log_level"] = _LOG_LEVELS[level.lower()]
    timeout = transfer_timeout_ms(env)
    if timeout is not None:
        for p in ("tcp", "shm", "rdma", "efa"):
            if has(p):
                keys[p + ".op_timeout_ms"] = str(timeout)
    connect_s = _int(env, "MC_HANDSHAKE_CONNECT_TIMEOUT", 1, 3600, " seconds")
    if connect_s is not None:
        keys["handshake_timeout_ms"] = str(connect_s * 1000)
        for p in ("tcp", "rdma"):
            if has(p):
                keys[p + ".connect_timeout_ms"] = str(connect_s * 1000)
    if has("tcp"):
        slice_size = _int(env, "MC_TCP_SLICE_SIZE", 4096, 64 << 20, " bytes")
        if slice_size is not None:
            keys["tcp.slice_size"] = str(slice_size)
    if has("rdma"):
        if not str(device_name or "").strip() and _get(env, "MC_TE_FILTERS"):
            keys["rdma.devices"] = ",".join(d.strip() for d in env["MC_TE_FILTERS"].split(",") if d.strip())
        if _get(env, "MC_RDMA_BIND_ADDRESS"):
            keys["rdma.bind_ip"] = _get(env, "MC_RDMA_BIND_ADDRESS")
        for name, key, low, high in (("MC_GID_INDEX", "gid_index", 0, 1023), ("MC_IB_PORT", "ib_port", 1, 255),
                                     ("MC_IB_TC", "traffic_class", -1, 255), ("MC_IB_SL", "service_level", -1, 15),
                                     ("MC_MTU", "mtu", 256, 4096), ("MC_MAX_WR", "max_wr", 2, 65536)):
            n = _int(env, name, low, high)
            if n is not None and n >= 0:
                keys["rdma." + key] = str(n)
    return keys
