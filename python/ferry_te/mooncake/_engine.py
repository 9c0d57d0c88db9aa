"""Mooncake's TransferEngine (mooncake.engine, transfer_engine_py.cpp) over a Ferry Engine.

Same method names, argument names, defaults and return values: -1 from a sync call or
initialize that failed, batch id 0 from an async submit that failed, Mooncake's error.h codes
from the registration calls; no exceptions for failed transfers. Why a call failed, with
Ferry's own code: last_error(), last_error_code() and the 'ferry_te.mooncake' logger.
docs/MOONCAKE.md lists what differs."""

import ctypes
import errno
import logging
import threading

from .. import _capi
from .._batch import register_ranges
from .._config import flatten_config
from .._memory import parse_device
from ..engine import Engine, plugin_report
from ..errors import FerryError
from . import _setup
from ._errors import (ERR_METADATA, NOT_INITIALIZED, CallFailed, NotReady, code_of, describe,
                      mooncake_code)
from ._transfers import Transfers
from ._types import TransferOpcode

log = logging.getLogger("ferry_te.mooncake")

class _Managed:
    """One allocate_managed_buffer(): the engine's alloc_shared, a sealed memfd mapped shared and
    registered, which shm.so hands to authorised peers on this host (they copy into it with
    memcpy). Freed with ferry_free_shared: peers that mapped it fail their later ops and never
    write into memory this process reuses."""

    def __init__(self, engine, length):
        self.region = engine.alloc_shared(max(int(length), 1))
        self.address = self.region.address
        self.length = self.region.length

    def close(self):
        self.region.free()


class TransferEngine(Transfers):
    """Mooncake's TransferEngine. TransferEngine() then initialize(...); Ferry keys (e.g.
    auth_secret_file="...", tcp__lanes=4) may be passed here and override what initialize
    derives from Mooncake's arguments."""

    TransferOpcode = TransferOpcode

    def __init__(self, config=None, **ferry_keys):
        self._extra = (config, ferry_keys)
        self._engine = None
        self._lock = threading.RLock()
        self._segments = {}  # session id -> ferry Segment
        self._regions = {}  # address -> (Region, length) registered through this object
        self._managed = {}  # address -> _Managed
        self._batches = {}  # batch id -> Batch of the async calls
        self._on_cuda_batches = []  # (call, target, Batch) of the *_on_cuda calls, in order
        self._local = threading.local()

    # -- errors ---------------------------------------------------------------------------
    def _fail(self, code, message, level=logging.WARNING, result=-1):
        """Records and logs why a call failed, with Ferry's code, and returns what Mooncake's
        call returns then: -1 unless `result` says otherwise."""
        self._local.error = message
        self._local.code = code if code < 0 else -1
        log.log(level, "%s [%s]", message, describe(self._local.code))
        return result

    def _fail_code(self, code, message, level=logging.WARNING):
        """_fail for calls that return Mooncake's error.h codes (registration)."""
        return self._fail(code, message, level, mooncake_code(code))

    def last_error(self):
        """(Ferry) Why the last call on this thread failed; '' when none has."""
        return getattr(self._local, "error", "")

    def last_error_code(self):
        """(Ferry) Ferry's negative errno-style code of the last failure on this thread."""
        return getattr(self._local, "code", 0)

    # -- setup ----------------------------------------------------------------------------
    def initialize(self, local_hostname, metadata_server, protocol, device_name):
        """Mooncake's initialize: metadata_server is 'P2PHANDSHAKE', 'etcd://host:2379',
        'http://host:port/metadata', 'redis://host:6379' or a bare 'host:2379' (etcd);
        protocol 'rdma', 'efa' or 'tcp' between nodes (TCP where the named one cannot load, as
        Mooncake does), with the intra-node plugins that load beside it ('ferry': every
        plugin); device_name a comma list of RDMA NICs (rdma.devices). 0, or -1."""
        try:
            url = _setup.metadata_url(metadata_server, "etcd")
        except _setup.SetupError as e:
            return self._fail(e.code, "initialize: %s" % e, logging.ERROR)
        return self._start(local_hostname, url, protocol, device_name)

    def initialize_ext(self, local_hostname, metadata_server, protocol, device_name,
                       metadata_type):
        """Mooncake's initialize_ext: as initialize, with metadata_type ('etcd') naming how to
        read a metadata_server given without a scheme."""
        try:
            url = _setup.metadata_url(metadata_server, metadata_type)
        except _setup.SetupError as e:
            return self._fail(e.code, "initialize_ext: %s" % e, logging.ERROR)
        return self._start(local_hostname, url, protocol, device_name)

    def _start(self, local_hostname, url, protocol, device_name):
        with self._lock:
            if self._engine is not None:
                return self._fail(-errno.EALREADY, "initialize: this TransferEngine is already "
                                  "initialized; create another for a second engine",
                                  logging.ERROR)
            config, keys = self._extra
            overrides = flatten_config(config, keys)
            try:
                # Ferry keys given to TransferEngine() that pick plugins replace the selection.
                states = None if "plugins" in overrides else _setup.plugin_states(plugin_report())
                cfg, note = _setup.engine_config(local_hostname, url, protocol, device_name, states)
                if note:
                    log.warning("initialize: %s", note)
                ports = _setup.control_ports(dict(cfg, **overrides))
                for i, port in enumerate(ports):
                    try:
                        attempt = dict(cfg, rpc_port=port) if port != "0" else cfg
                        self._engine = Engine(dict(attempt, **overrides))
                        break
                    except FerryError as e:
                        # A port of MC_MIN/MAX_RPC_PORT's range that another process holds:
                        # the next one, as Mooncake's findAvailableTcpPort does.
                        if code_of(e) != -errno.EADDRINUSE or i + 1 == len(ports):
                            raise
            except _setup.SetupError as e:
                return self._fail(e.code, "initialize: %s" % e, logging.ERROR)
            except FerryError as e:
                return self._fail(code_of(e), "initialize (protocol %r): %s" % (protocol, e),
                                  logging.ERROR)
        return 0

    def _ready(self):
        engine = self._engine
        if engine is None or engine.closed:
            raise NotReady()
        return engine

    def get_rpc_port(self):
        """The port of this engine's session id: peers use f"{host}:{get_rpc_port()}"."""
        try:
            name = self._ready().segment_name
        except NotReady:
            return self._fail(-errno.EBADF, "get_rpc_port: " + NOT_INITIALIZED)
        _, _, port = name.rpartition(":")  # "ip:port", "[v6]:port" or "v6:port"
        port = int(port) if port.isdigit() and ":" in name else None
        if port is None:
            return self._fail(-errno.ENOENT, "get_rpc_port: segment '%s' (etcd) has no port; "
                              "peers use the name itself" % name)
        return port

    def get_session_id(self):
        """(Ferry) The name peers pass as target_hostname ("ip:port" with P2PHANDSHAKE)."""
        return self._ready().segment_name

    def get_engine(self):
        """The ferry_te.Engine underneath (Mooncake returns its C++ engine here)."""
        return self._engine

    def get_engine_ptr(self):
        """The C ferry_engine_t * as an int (0 before initialize)."""
        engine = self._engine
        if engine is None or engine.closed:
            return 0
        ffi, _ = _capi.load()
        return int(ffi.cast("uintptr_t", engine._state.handle))

    def close(self):
        """(Ferry) Destroys the engine now (Mooncake does it when the object is collected)."""
        with self._lock:
            engine, self._engine = self._engine, None
            self._managed = {}
            self._segments.clear()
            self._regions.clear()
            self._batches.clear()
            self._on_cuda_batches = []
        if engine is not None:
            # Unregisters everything and frees the managed buffers; *_on_cuda batches that no
            # stream reached yet are cancelled (their streams go on).
            engine.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- memory ---------------------------------------------------------------------------
    def register_memory(self, buffer_addr, capacity, location="*"):
        """Registers [buffer_addr, buffer_addr+capacity). location: '*' or 'cpu[:N]' host
        memory, 'cuda:N' / 'rocm:N' that GPU's memory."""
        try:
            engine = self._ready()
            addr, length = int(buffer_addr), int(capacity)
            device = _device_for(location)
        except NotReady:
            return self._fail_code(-errno.EBADF, "register_memory: " + NOT_INITIALIZED)
        except _setup.SetupError as e:
            return self._fail_code(e.code, "register_memory: %s" % e)
        if addr == 0 or length <= 0:
            return self._fail_code(-errno.EINVAL, "register_memory(%#x, %d): need a non-null "
                              "address and a capacity > 0" % (addr, length))
        try:
            if str(location or "*").strip() == "*" and _auto_kind() is not None:
                # Bare pointer: libferry asks the GPU runtimes what it is (FERRY_MEMORY_AUTO).
                region = _register_auto(engine, addr, length)
            else:
                region = engine.register((addr, length, device))
        except FerryError as e:
            return self._fail_code(code_of(e), "register_memory(%#x, %d): %s" % (addr, length, e))
        with self._lock:
            self._regions[addr] = (region, length)
        return 0

    def unregister_memory(self, buffer_addr):
        try:
            engine = self._ready()
        except NotReady:
            return self._fail_code(-errno.EBADF, "unregister_memory: " + NOT_INITIALIZED)
        addr = int(buffer_addr)
        with self._lock:
            entry = self._regions.pop(addr, None)
        try:
            if entry is not None and entry[0] is not None:
                entry[0].unregister()
            else:
                engine.unregister(addr)
        except FerryError as e:
            return self._fail_code(code_of(e), "unregister_memory(%#x): %s" % (addr, e))
        return 0

    def batch_register_memory(self, buffer_addresses, capacities, location="*"):
        """Registers every range, or none, in one C call (ferry_register_batch) that publishes
        them together: with etcd one transaction per ~100 chunks of 128 regions, not one per
        region. Unregistered by address (unregister_memory, batch_unregister_memory)."""
        addrs, caps = [int(a) for a in buffer_addresses], [int(c) for c in capacities]
        if len(addrs) != len(caps):
            return self._fail_code(-errno.EINVAL, "batch_register_memory: %d addresses but %d "
                              "capacities" % (len(addrs), len(caps)))
        try:
            engine = self._ready()
            device = _device_for(location)
        except NotReady:
            return self._fail_code(-errno.EBADF, "batch_register_memory: " + NOT_INITIALIZED)
        except _setup.SetupError as e:
            return self._fail_code(e.code, "batch_register_memory: %s" % e)
        if str(location or "*").strip() == "*" and _auto_kind() is not None:
            kind, ordinal = _auto_kind(), -1  # each range as the GPU runtimes say
        else:
            kind, ordinal = parse_device(device)
        from ..engine import REMOTE_READ, REMOTE_WRITE, _check, _handle
        ffi, lib = _capi.load()
        access = REMOTE_READ | REMOTE_WRITE
        try:
            _check(register_ranges(ffi, lib, _handle(engine._state), addrs, caps, kind, ordinal, access),
                   "ferry_register_batch")
        except FerryError as e:  # libferry names the range: "range 7 of 100 [0x..., +4096): ..."
            return self._fail_code(code_of(e), "batch_register_memory: %s" % e)
        except OverflowError as e:  # a negative or too large address or capacity
            return self._fail_code(-errno.EINVAL, "batch_register_memory: %s; nothing was registered" % e)
        with self._lock:
            for a, c in zip(addrs, caps):
                self._regions[a] = (None, c)
        return 0

    def batch_unregister_memory(self, buffer_addresses):
        """Unregisters every address in one C call (ferry_unregister_batch, published together);
        when that refuses (an address not registered: it changes nothing), each address on its
        own, returning the first failure's code after trying all."""
        addrs = [int(a) for a in buffer_addresses]
        try:
            engine = self._ready()
        except NotReady:
            return self._fail_code(-errno.EBADF, "batch_unregister_memory: " + NOT_INITIALIZED)
        try:
            engine.unregister_batch(addrs)
        except FerryError as e:
            log.debug("batch_unregister_memory: %s; unregistering one by one", e)
            rc = 0
            for a in addrs:
                r = self.unregister_memory(a)
                rc = rc or r
            return rc
        with self._lock:
            for a in addrs:
                self._regions.pop(a, None)
        return 0

    def allocate_managed_buffer(self, length):
        """Registered host memory of `length` bytes (page aligned); its address, 0 on failure."""
        try:
            engine = self._ready()
        except NotReady:
            self._fail(-errno.EBADF, "allocate_managed_buffer: " + NOT_INITIALIZED)
            return 0
        if int(length) <= 0:
            self._fail(-errno.EINVAL, "allocate_managed_buffer(%d): length must be > 0" % length)
            return 0
        try:
            m = _Managed(engine, length)
        except (OSError, ValueError, OverflowError) as e:
            self._fail(-errno.ENOMEM, "allocate_managed_buffer(%d): %s" % (length, e))
            return 0
        except FerryError as e:
            self._fail(code_of(e), "allocate_managed_buffer(%d): %s" % (length, e))
            return 0
        with self._lock:
            self._managed[m.address] = m
            self._regions[m.address] = (m.region, m.length)
        return m.address

    def free_managed_buffer(self, user_tensor, length):
        """Frees what allocate_managed_buffer returned."""
        addr = int(user_tensor)
        with self._lock:
            m = self._managed.pop(addr, None)
        if m is None:
            return self._fail(-errno.EINVAL, "free_managed_buffer(%#x): not an address "
                              "allocate_managed_buffer returned" % addr)
        with self._lock:
            self._regions.pop(addr, None)
        try:
            m.close()
        except FerryError as e:
            return self._fail(code_of(e), "free_managed_buffer(%#x): %s" % (addr, e))
        return 0

    def _local_range_ok(self, addr, length):
        with self._lock:
            for start, (_, size) in self._regions.items():
                if start <= addr and addr + length <= start + size:
                    return True
        return False

    def write_bytes_to_buffer(self, dest_address, src_ptr, length):
        """Copies length bytes of src_ptr (bytes) to dest_address, which must lie in memory
        registered (or allocated) through this engine."""
        data = bytes(src_ptr)
        dest, n = int(dest_address), int(length)
        if n < 0 or n > len(data):
            return self._fail(-errno.EINVAL, "write_bytes_to_buffer: length %d, but %d bytes "
                              "given" % (n, len(data)))
        if not self._local_range_ok(dest, n):
            return self._fail(-errno.EFAULT, "write_bytes_to_buffer: [%#x, %#x) is not inside "
                              "memory registered with this engine" % (dest, dest + n))
        ctypes.memmove(dest, data, n)
        return 0

    def read_bytes_from_buffer(self, source_address, length):
        """The length bytes at source_address (registered or allocated through this engine)."""
        src, n = int(source_address), int(length)
        if n < 0 or not self._local_range_ok(src, n):
            raise ValueError("read_bytes_from_buffer: [%#x, %#x) is not inside memory "
                             "registered with this engine" % (src, src + max(n, 0)))
        return ctypes.string_at(src, n)

    # -- peers ----------------------------------------------------------------------------
    def _segment(self, target_hostname, call):
        engine = self._ready()
        name = str(target_hostname)
        with self._lock:
            seg = self._segments.get(name)
            if seg is not None:
                return seg
            try:
                seg = engine.open_segment(name)
            except FerryError as e:
                raise CallFailed(code_of(e), "%s: cannot open segment '%s': %s" % (call, name, e))
            self._segments[name] = seg
            return seg

    def _forget(self, target_hostname, seg):
        """After a failure the next call opens the peer again (it may have restarted). The
        segment is not closed: other threads' batches may still use it (Ferry hands out one id
        per name, so reopening finds it)."""
        with self._lock:
            if self._segments.get(str(target_hostname)) is seg:
                del self._segments[str(target_hostname)]

    def get_first_buffer_address(self, segment_name):
        """Address of the peer's first region (Ferry lists regions by address, so: the lowest;
        Mooncake's first is the first registered, the same when the peer registered one);
        0 when it has none, or on failure."""
        try:
            regions = self._segment(segment_name, "get_first_buffer_address").regions()
        except NotReady:
            self._fail(-errno.EBADF, "get_first_buffer_address: " + NOT_INITIALIZED)
            return 0
        except (CallFailed, FerryError) as e:
            self._fail(code_of(e), str(e))
            return 0
        return regions[0].address if regions else 0

    def send_probe(self, peer_server_name):
        """0 when the peer answers (its descriptor is re-read), else a negative code."""
        # The cached segment: Ferry hands out one id per name, so closing a second open of
        # the same name would close the one transfers use.
        try:
            self._segment(peer_server_name, "send_probe").regions()
        except NotReady:
            return self._fail(-errno.EBADF, "send_probe: " + NOT_INITIALIZED)
        except CallFailed as e:  # the peer's descriptor could not be had: ERR_METADATA
            return self._fail(e.code, str(e), result=ERR_METADATA)
        except FerryError as e:
            return self._fail_code(code_of(e), "send_probe(%s): %s" % (peer_server_name, e))
        return 0

    def warmup_efa_segment(self, segment_name):
        """Opens the peer's segment ahead of the first transfer; 0 on success."""
        try:
            self._segment(segment_name, "warmup_efa_segment")
        except NotReady:
            return self._fail(-errno.EBADF, "warmup_efa_segment: " + NOT_INITIALIZED)
        except CallFailed as e:
            return self._fail(e.code, str(e))
        return 0

    def get_local_topology(self, device_name=None):
        """JSON in Mooncake's shape ({"cpu:0": {"preferred_hca": [...], "avail_hca": []}})
        listing this host's RDMA devices (device_name filters them)."""
        from ._types import local_topology
        return local_topology(device_name)

def _auto_kind():
    """FERRY_MEMORY_AUTO when this libferry recognises GPU pointers by itself, else None:
    then a bare pointer is registered as host memory."""
    _, lib = _capi.load()
    return getattr(lib, "FERRY_MEMORY_AUTO", None)


def _register_auto(engine, addr, length):
    """ferry_register(addr, length, FERRY_MEMORY_AUTO, -1): host or GPU memory, as the
    runtimes say. No Region: unregister_memory goes by address."""
    from ..engine import REMOTE_READ, REMOTE_WRITE, _check, _handle
    ffi, lib = _capi.load()
    _check(lib.ferry_register(_handle(engine._state), ffi.cast("void *", addr), length,
                              _auto_kind(), -1, REMOTE_READ | REMOTE_WRITE), "ferry_register")
    return None


def _device_for(location):
    loc = str(location or "*").strip().lower()
    if loc in ("*", "", "cpu") or loc.startswith("cpu:"):
        return -1
    kind, _, ordinal = loc.partition(":")
    if kind in ("cuda", "rocm", "hip") and ordinal.isdigit():
        return "%s:%s" % ("rocm" if kind == "hip" else kind, ordinal)
    raise _setup.SetupError(-errno.EINVAL, "location '%s': Ferry registers '*', 'cpu:N', "
                            "'cuda:N' or 'rocm:N' memory" % location)
