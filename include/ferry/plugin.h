/*
 * Ferry transport plugin ABI, plain C.
 *
 * This header is all a plugin author needs: copy it into your plugin's source tree and build
 * against it alone. A plugin is a shared object (`<name>.so`) in one of Ferry's plugin
 * directories that exports exactly one symbol per ABI major it implements:
 *
 *     FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 = { ... };
 *
 * Rules of the ABI
 * - Nothing C++ crosses this boundary: plain structs, integers, pointers to bytes.
 * - Every function returns 0 (or a count, where documented) on success and a negative
 *   errno-style code (-EINVAL, -ENOMEM, -ECONNRESET, ...) on failure. On failure the function
 *   writes a human-readable message into `err->message` (NUL-terminated) when `err` is not NULL.
 * - Output parameters are written only on success.
 * - Fields are only ever appended to ferry_plugin_v1_t. A plugin sets `struct_size` to
 *   sizeof() of the struct it was compiled with; the host accepts any struct at least as large
 *   as the fields it uses and ignores fields it does not know. A change that breaks existing
 *   fields bumps FERRY_PLUGIN_ABI_MAJOR and the symbol name (ferry_plugin_v2).
 * - All functions taking a ferry_transport_t may be called from several threads at once,
 *   except `destroy`, which the host calls once, after every other call on that transport has
 *   returned.
 * - Compile with -fvisibility=hidden and export only the plugin symbol (FERRY_PLUGIN_EXPORT).
 * - Publish the options `create` accepts (ferry_plugin_v1_t.options, ABI 1.2): `ferry-info
 *   --options <name>` documents them from that table. Parse against the same table so the
 *   documentation cannot drift (plugins/example/example.c in C, plugins/common/option_table.hpp
 *   for C++).
 *
 * Transfer model
 * - The host registers local memory with `register_mem`; the plugin returns a handle and can
 *   describe the region's remote-access data (keys) with `export_mem`.
 * - The host publishes `export_endpoint` bytes and `export_mem` bytes in its segment
 *   descriptor. A peer's host passes them to `connect` and `import_mem`.
 * - `submit` posts a batch of one-sided READ/WRITE operations to one peer and never blocks on
 *   the network. Once submit returns 0 every op in the batch produces exactly one completion
 *   via `poll`; when submit fails, none of the ops was started and none will complete.
 * - A WRITE completes successfully only once its bytes are in the remote memory; a READ only
 *   once its bytes are in the local memory.
 * - The serving side must refuse any access outside memory registered with the matching
 *   FERRY_ACCESS_REMOTE_* right, without touching other memory.
 *
 * Storage plugins (ABI 1.4, FERRY_CAP_STORAGE)
 * - A storage plugin moves bytes between registered local memory and files instead of a peer's
 *   memory. The host opens a storage segment for `open_segment("file:<path>")`, never for a
 *   name a peer published: storage segments are local to the engine that opens them.
 * - `export_endpoint` returns no bytes (*len = 0); the host never publishes a storage plugin's
 *   endpoint or keys, and never routes a peer's memory segment to it.
 * - `connect(endpoint, len)`: `endpoint` is the segment's path spec (the text after "file:",
 *   not NUL-terminated). The plugin opens the file(s) with the caller's permissions, once per
 *   segment; the returned peer handle names the open file(s). A path that cannot be opened
 *   fails connect with the open's code and a message naming the path.
 * - `import_mem`: the host imports one region per segment, [0, FERRY_STORAGE_MAX_OFFSET), with
 *   read and write access; the handle it returns is passed back as remote_mem.
 * - `submit`: an op's remote_addr is the file offset. READ moves file -> local memory, WRITE
 *   local memory -> file; a WRITE completes once its bytes are in the file (the page cache, or
 *   the device for direct I/O), a READ once they are in local memory. A READ past the end of the
 *   file fails with -ENODATA; a failed op's message names the file and the offset.
 * - `disconnect` closes the segment's files once no op on them is in flight.
 * - The conformance suite's two-peer cases do not apply; a storage plugin is tested through the
 *   engine, as tests/file_segment_test.cpp and tests/file_failure_test.cpp test file.so.
 *
 * Writing a plugin
 * - Start from plugins/example/example.c (plain C, builds out of tree with one compiler line:
 *   plugins/example/README.md). In C++, use the kit in plugins/common/ instead: plugin_entry.hpp
 *   (the entry table, argument checks, exceptions into codes and messages) and plugin_util.hpp
 *   (logger, set_error, completion queue, byte order), as every bundled transport does.
 * - A plugin is done when it passes the conformance suite, tests/transport/conformance_test.cpp,
 *   which drives it through this header alone (add an instance in transport_params.cpp).
 */
#ifndef FERRY_PLUGIN_H
#define FERRY_PLUGIN_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_PLUGIN_ABI_MAJOR 1u
#define FERRY_PLUGIN_ABI_MINOR 7u
/* abi_version field: major in the high 16 bits, minor in the low 16 bits. */
#define FERRY_PLUGIN_ABI_VERSION ((FERRY_PLUGIN_ABI_MAJOR << 16) | FERRY_PLUGIN_ABI_MINOR)
/* Name of the exported symbol for ABI major 1. */
#define FERRY_PLUGIN_SYMBOL_V1 "ferry_plugin_v1"

#define FERRY_PLUGIN_EXPORT __attribute__((visibility("default")))

/* Size of every message buffer crossing the ABI, NUL included. */
#define FERRY_MESSAGE_MAX 256

/* Memory kinds. */
typedef enum ferry_mem_kind {
    FERRY_MEM_HOST = 0, /* ordinary host (CPU) memory */
    FERRY_MEM_CUDA = 1, /* NVIDIA device memory, device_id is the CUDA ordinal */
    FERRY_MEM_ROCM = 2  /* AMD device memory, device_id is the HIP ordinal */
} ferry_mem_kind_t;

/* Capability bits in ferry_plugin_v1_t.caps. */
#define FERRY_CAP_MEM_HOST (1ull << 0)   /* can move host memory */
#define FERRY_CAP_MEM_CUDA (1ull << 1)   /* can move CUDA device memory directly */
#define FERRY_CAP_MEM_ROCM (1ull << 2)   /* can move ROCm device memory directly */
#define FERRY_CAP_INTRA_NODE (1ull << 8) /* reaches peers on the same host */
#define FERRY_CAP_INTER_NODE (1ull << 9) /* reaches peers on other hosts */
/* Accepts the option auth_key (hex; the host derives it from the cluster secret, and passes it
 * only when there is one) and then serves only peers inside the cluster's trust: peers that
 * prove knowledge of the same key (tcp.so), or processes of the same user, which the kernel
 * lets read our memory anyway (shm.so). Without the bit, the host warns that the transport
 * serves whoever holds its descriptors. */
#define FERRY_CAP_AUTH_KEY (1ull << 16)
/* ABI 1.1: serves peers' access to device memory it cannot touch itself, through the host's
 * staging calls (ferry_host_api_t.stage_*): the host registers device regions with it when it
 * offers those calls, and the plugin moves each slice between the region and a pinned host
 * buffer the host lends. Such a plugin must never dereference a device region's address. */
#define FERRY_CAP_STAGED_DEVICE (1ull << 17)
/* ABI 1.4: a storage plugin (see "Storage plugins" above): serves no peer; the host uses it only
 * for storage segments ("file:<path>") it opened itself. A storage plugin sets neither
 * FERRY_CAP_INTRA_NODE nor FERRY_CAP_INTER_NODE, so a host older than 1.4 (which ignores the
 * bit) finds it reaches no peer and never routes an op to it. */
#define FERRY_CAP_STORAGE (1ull << 18)
/* The end of a storage segment's one region: the largest file offset + 1 an op may reach. */
#define FERRY_STORAGE_MAX_OFFSET (1ull << 62)

/* Access rights of a registered region, for remote peers. */
#define FERRY_ACCESS_REMOTE_READ 0x1u
#define FERRY_ACCESS_REMOTE_WRITE 0x2u

/* Operation codes. */
typedef enum ferry_opcode {
    FERRY_OP_READ = 0, /* remote -> local */
    FERRY_OP_WRITE = 1 /* local -> remote */
} ferry_opcode_t;

/* Log levels for ferry_host_api_t.log. */
typedef enum ferry_log_level {
    FERRY_LOG_ERROR = 0,
    FERRY_LOG_WARN = 1,
    FERRY_LOG_INFO = 2,
    FERRY_LOG_DEBUG = 3,
    FERRY_LOG_TRACE = 4
} ferry_log_level_t;

/* An error message written by a failing call. */
typedef struct ferry_error {
    char message[FERRY_MESSAGE_MAX];
} ferry_error_t;

/* One key/value option. Keys are the plugin's own (the host strips its "<plugin>." prefix). */
typedef struct ferry_kv {
    const char *key;
    const char *value;
} ferry_kv_t;

/* One part of a stage_copy_parts call (ABI 1.7). */
typedef struct ferry_stage_part {
    uint64_t device_addr; /* inside a region registered with this transport */
    uint64_t buf_offset;  /* where the part sits in the borrowed buffer */
    uint64_t length;
} ferry_stage_part_t;

/* Services the host offers a transport instance. Valid until `destroy` returns. */
typedef struct ferry_host_api {
    uint32_t struct_size; /* sizeof(ferry_host_api_t) as the host compiled it */
    uint32_t reserved;
    void *ctx; /* pass back as the first argument of the callbacks */
    /* Route a log line through the host's logger. May be called from any thread. */
    void (*log)(void *ctx, int level, const char *plugin_name, const char *message);
    /* Current log level: lines above it are dropped, so skip formatting them. */
    int log_level;

    /* ---- ABI 1.1: staging device memory (read only when struct_size covers them) ----
     * For plugins with FERRY_CAP_STAGED_DEVICE serving a region whose kind is not
     * FERRY_MEM_HOST. All NULL when the host offers no staging (no GPU runtime, or staging
     * disabled); the host then never registers device memory with such a plugin.
     * The pipeline: acquire a buffer, start a copy, send (or receive) the slice when `done`
     * fires, release; overlap slice k's copy with slice k-1's network transfer. The host bounds
     * the pinned memory lent out at once (engine key gpu_staging_max_bytes). */

    /* Largest buffer stage_acquire lends, bytes (a power of two). */
    uint64_t stage_slice_bytes;
    /* Borrow a pinned host buffer of at least `bytes` (<= stage_slice_bytes) for device memory of
     * (kind, device_id). Returns -EAGAIN when the bound is reached (release one and try again,
     * or fail the op with it), -ENOTSUP when no runtime for `kind` is loaded. Never blocks. */
    int (*stage_acquire)(void *ctx, uint32_t kind, int32_t device_id, uint64_t bytes, void **buf, ferry_error_t *err);
    /* Give a borrowed buffer back. No copy on it may still be running. */
    void (*stage_release)(void *ctx, void *buf);
    /* Start copying `bytes` between device memory at `device_addr` (inside a region registered
     * with this transport) and the borrowed buffer `buf`: to_device 1 copies buf -> device,
     * 0 device -> buf. Returns 0 and later calls done(arg, status, message) exactly once, from a
     * host thread, never from inside stage_copy; status 0 or a negative code with a message.
     * Copies started on one (kind, device_id) finish in the order they were started. On a
     * negative return `done` is never called. */
    int (*stage_copy)(void *ctx, uint32_t kind, int32_t device_id, uint64_t device_addr, void *buf, uint64_t bytes,
                      int to_device, void (*done)(void *arg, int status, const char *message), void *arg,
                      ferry_error_t *err);

    /* ---- ABI 1.7: many small requests in one borrowed buffer (read only when struct_size
     * covers it; NULL where stage_copy is) ----
     * As stage_copy, for `n` parts of one borrowed buffer: part i moves parts[i].length bytes
     * between device memory at parts[i].device_addr and buf + parts[i].buf_offset (parts do not
     * overlap in the buffer and end within stage_slice_bytes). One `done` for all of them, once
     * none can still write; its status is the first failure. A serving plugin packs small
     * requests of one region into one buffer with it: one copy call and one completion instead
     * of one per request. */
    int (*stage_copy_parts)(void *ctx, uint32_t kind, int32_t device_id, const ferry_stage_part_t *parts, size_t n,
                            void *buf, int to_device, void (*done)(void *arg, int status, const char *message),
                            void *arg, ferry_error_t *err);
} ferry_host_api_t;

/* Bytes of ferry_host_api_t up to and including `member`: a plugin reads a field only when
 * host->struct_size is at least this. */
#define FERRY_HOST_API_SIZE_UNTIL(member) (offsetof(ferry_host_api_t, member) + sizeof(((ferry_host_api_t *)0)->member))

/* ---- ABI 1.2: options that document themselves ----
 * A plugin may publish the keys its `create` and `probe` accept (ferry_plugin_v1_t.options), so
 * `ferry-info --options` can list them, with default, range and help, without reading its source.
 * Publishing changes nothing about parsing: the plugin still checks every key and value itself
 * and fails `create` with -EINVAL and a message naming the key for anything it refuses. */
typedef enum ferry_option_type {
    FERRY_OPTION_UINT = 0,        /* unsigned decimal integer in [min, max] */
    FERRY_OPTION_SIZE = 1,        /* bytes in [min, max]; a k/m/g suffix (KiB, MiB, GiB) is allowed */
    FERRY_OPTION_DURATION_MS = 2, /* milliseconds in [min, max] */
    FERRY_OPTION_BOOL = 3,        /* true/false, 1/0, yes/no, on/off */
    FERRY_OPTION_STRING = 4,      /* free text; `accepted` says what passes */
    FERRY_OPTION_ENUM = 5,        /* one of the words in `values` */
    FERRY_OPTION_SECRET = 6       /* key material: hosts never print, log or echo its value */
} ferry_option_type_t;

/* The type's word as `ferry-info --options` prints it ("uint", "size", ...); "unknown" otherwise. */
static inline const char *ferry_option_type_name(uint32_t type) {
    switch (type) {
        case FERRY_OPTION_UINT: return "uint";
        case FERRY_OPTION_SIZE: return "size";
        case FERRY_OPTION_DURATION_MS: return "duration_ms";
        case FERRY_OPTION_BOOL: return "bool";
        case FERRY_OPTION_STRING: return "string";
        case FERRY_OPTION_ENUM: return "enum";
        case FERRY_OPTION_SECRET: return "secret";
    }
    return "unknown";
}

/* One option a plugin accepts. All strings are static, NUL-terminated and owned by the plugin. */
typedef struct ferry_option_desc {
    const char *name;         /* the key, without the host's "<plugin>." prefix, e.g. "lanes" */
    uint32_t type;            /* ferry_option_type_t */
    uint32_t flags;           /* zero (reserved) */
    const char *default_text; /* the default as a user writes it, or words ("auto: ..."); "" when none */
    uint64_t min;             /* UINT, SIZE, DURATION_MS: the accepted range, inclusive; else 0 */
    uint64_t max;
    const char *values;   /* ENUM: the accepted words separated by '|', e.g. "256|512|1024"; else NULL */
    const char *accepted; /* what passes, in words, where type and range do not say it all; may be NULL */
    const char *help;     /* one line: what the option does */
} ferry_option_desc_t;

/* Bytes of ferry_option_desc_t up to and including `member` (see option_desc_size). */
#define FERRY_OPTION_DESC_SIZE_UNTIL(member) \
    (offsetof(ferry_option_desc_t, member) + sizeof(((ferry_option_desc_t *)0)->member))

/* Result of `probe`. */
typedef struct ferry_probe_result {
    int available;                  /* 1: usable on this host, 0: not */
    char reason[FERRY_MESSAGE_MAX]; /* why not, or what was found, for ferry-info */
} ferry_probe_result_t;

/* A memory region, local (register_mem) or remote (import_mem). */
typedef struct ferry_mem_region {
    uint64_t addr;     /* virtual address in the owning process */
    uint64_t length;   /* bytes */
    uint32_t kind;     /* ferry_mem_kind_t */
    int32_t device_id; /* device ordinal for GPU memory, -1 for host memory */
    uint32_t access;   /* FERRY_ACCESS_* bits granted to remote peers */
    uint32_t reserved; /* zero */
} ferry_mem_region_t;

/* One one-sided operation. Both ranges lie inside a single registered region each. */
typedef struct ferry_xfer_op {
    uint32_t opcode;      /* ferry_opcode_t */
    uint32_t reserved;    /* zero */
    uint64_t local_addr;  /* address in this process */
    uint64_t local_mem;   /* handle from register_mem for the region holding local_addr */
    uint64_t remote_addr; /* address in the peer process */
    uint64_t remote_mem;  /* handle from import_mem for the region holding remote_addr */
    uint64_t length;      /* bytes, > 0 */
    uint64_t user_data;   /* returned unchanged in the completion */
} ferry_xfer_op_t;

/* One block of a block list (ABI 1.5): `length` bytes at `addr`, inside the region `mem` (a
 * register_mem handle in a local list, an import_mem handle of the list's peer in a remote one). */
typedef struct ferry_block {
    uint64_t addr;
    uint64_t length;
    uint64_t mem;
} ferry_block_t;

/* Which memory a block list names (create_block_list). */
enum { FERRY_BLOCKS_LOCAL = 0, FERRY_BLOCKS_REMOTE = 1 };

/* ABI 1.5: one local path of a transport that spreads traffic over several (tcp.so's rails: its
 * local addresses; rdma.so's NICs), summed over every peer it carries traffic to: a host reports
 * as many entries as it has rails, however many peers it talks to. Counts only grow while the
 * transport lives; the other fields are what holds now. */
#define FERRY_RAIL_NAME_MAX 64
typedef struct ferry_rail_stats {
    /* The local address ("10.0.1.2") or device and port ("mlx5_0:1") it leaves through, NUL-
     * terminated; never a memory address, a key or a peer's name. */
    char name[FERRY_RAIL_NAME_MAX];
    uint64_t read_bytes;   /* bytes of READ ops it carried, counted as each piece completes */
    uint64_t write_bytes;  /* bytes of WRITE ops it carried */
    uint64_t completed;    /* pieces it completed: slices (tcp.so), work requests (rdma.so) */
    uint64_t failures;     /* path failures on it (a connection or queue pair broke, timed out or
                              could not be made: ferry_is_path_error) */
    uint64_t pauses;       /* times it was paused after a path failure (for one peer, or for all) */
    uint64_t paused_peers; /* peers it is paused for now (every peer, when the whole rail is) */
    uint64_t queued_bytes; /* bytes given to it that have not completed yet */
    double throughput;     /* bytes/s it moved while busy, as the plugin measured it to balance
                              work; 0 when not measured (one rail, or no work yet) */
    uint64_t reserved[4];  /* zero (room for later minors; a host reads them as unknown) */
} ferry_rail_stats_t;

/* One copy within this process (copy_local, ABI 1.6): `length` bytes from `src` to `dst`. */
typedef struct ferry_local_copy {
    uint64_t dst;
    uint64_t src;
    uint64_t length;
} ferry_local_copy_t;

/* Completion of one op. */
typedef struct ferry_completion {
    uint64_t user_data;
    int32_t status; /* 0 or a negative errno-style code */
    uint32_t reserved;
    char message[FERRY_MESSAGE_MAX]; /* set when status != 0 */
} ferry_completion_t;

/* Whether a failed status means the path broke (the connection or network under the op: reset,
 * refused, a stall that timed out, a network, host or device gone) rather than the op itself
 * (a bounds, access or authentication refusal, a protocol error, a cancellation, a peer process
 * that exited). The host posts an op that failed this way again on another path to the same peer
 * (docs/FAILOVER.md), and a plugin with several paths of its own (tcp.so's rails) may move it
 * first; a plugin reports a path's failure with one of these codes and anything else otherwise. */
static inline int ferry_is_path_error(int status) {
    switch (status < 0 ? -status : status) {
        case ECONNRESET:
        case ECONNREFUSED:
        case ECONNABORTED:
        case EPIPE:
        case ETIMEDOUT:
        case ENETDOWN:
        case ENETUNREACH:
        case ENETRESET:
        case EHOSTUNREACH:
        case EHOSTDOWN:
        case ENOTCONN:
        case ESHUTDOWN:
        case ENOLINK:
        case ENODEV:
        case EADDRNOTAVAIL: return 1;
        default: return 0;
    }
}

/* A transport instance; its layout is private to the plugin. */
typedef struct ferry_transport ferry_transport_t;

typedef struct ferry_plugin_v1 {
    /* ---- header: identical in every ABI major ---- */
    uint32_t abi_version; /* FERRY_PLUGIN_ABI_VERSION the plugin was built with */
    uint32_t struct_size; /* sizeof(ferry_plugin_v1_t) the plugin was built with */
    const char *name;     /* transport name, e.g. "tcp"; matches the file name */
    const char *version;  /* plugin version string, e.g. "1.0.0" */

    /* ---- ABI 1.0 ---- */
    uint64_t caps; /* FERRY_CAP_* */

    /* Is the transport usable here (driver loaded, device present)? Cheap and side-effect
     * free; called before create and by ferry-info. Fills `result` and returns 0; returns a
     * negative code only when the probe itself could not run. */
    int (*probe)(const ferry_kv_t *options, size_t n_options, ferry_probe_result_t *result);

    /* Create a transport instance from key/value options. `host` stays valid until destroy.
     * Serving (answering peers' requests) starts here. */
    int (*create)(const ferry_kv_t *options, size_t n_options, const ferry_host_api_t *host, ferry_transport_t **out,
                  ferry_error_t *err);

    /* Stop serving, fail in-flight ops, free everything. Called once. */
    void (*destroy)(ferry_transport_t *transport);

    /* Bytes a peer needs to reach this instance (address, port, queue numbers, ...).
     * `*len` holds the capacity of `buf` on entry and the size written on return. When the
     * buffer is too small, returns -ENOSPC and sets `*len` to the size needed. */
    int (*export_endpoint)(ferry_transport_t *transport, void *buf, size_t *len, ferry_error_t *err);

    /* Register a local region for transfers (and for remote access per region->access). */
    int (*register_mem)(ferry_transport_t *transport, const ferry_mem_region_t *region, uint64_t *mem_handle,
                        ferry_error_t *err);

    /* Deregister. Returns once no transfer touches the region any more; later remote requests
     * for it are refused. */
    int (*deregister_mem)(ferry_transport_t *transport, uint64_t mem_handle, ferry_error_t *err);

    /* Remote-access bytes for a registered region (keys, IPC handles); may be empty (*len = 0).
     * Same buffer convention as export_endpoint. */
    int (*export_mem)(ferry_transport_t *transport, uint64_t mem_handle, void *buf, size_t *len, ferry_error_t *err);

    /* Connect to a peer from its exported endpoint bytes. May block for the connection
     * set-up (bounded by the plugin's timeout), never for transfers. */
    int (*connect)(ferry_transport_t *transport, const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err);

    /* Drop a peer. In-flight ops to it complete with -ECANCELED. */
    int (*disconnect)(ferry_transport_t *transport, uint64_t peer, ferry_error_t *err);

    /* Make a peer's region usable as remote_mem in ops: `region` from the peer's descriptor,
     * `desc` its export_mem bytes. */
    int (*import_mem)(ferry_transport_t *transport, uint64_t peer, const ferry_mem_region_t *region, const void *desc,
                      size_t len, uint64_t *remote_mem, ferry_error_t *err);

    /* Forget an imported region. */
    int (*release_mem)(ferry_transport_t *transport, uint64_t peer, uint64_t remote_mem, ferry_error_t *err);

    /* Post `n_ops` ops to `peer`. Never blocks on the network. All-or-nothing: on failure no
     * op was started. */
    int (*submit)(ferry_transport_t *transport, uint64_t peer, const ferry_xfer_op_t *ops, size_t n_ops,
                  ferry_error_t *err);

    /* Move up to `max` finished ops into `out`. Returns how many (0 when none), or a negative
     * code. Never blocks. */
    int (*poll)(ferry_transport_t *transport, ferry_completion_t *out, size_t max, ferry_error_t *err);

    /* A file descriptor that becomes readable while completions are waiting, so hosts can
     * sleep in poll(2)/epoll instead of spinning. Owned by the plugin; the host never reads
     * or closes it. Returns -ENOTSUP when the plugin has none. */
    int (*completion_fd)(ferry_transport_t *transport, int *fd, ferry_error_t *err);

    /* ---- ABI 1.2 (read only when struct_size covers them; a 1.0/1.1 plugin has none) ---- */
    /* The options this plugin accepts, `n_options` of them, or NULL and 0 when it does not say.
     * `option_desc_size` is sizeof(ferry_option_desc_t) as the plugin was compiled: the host
     * steps through the array by it and reads only the fields it covers. */
    const ferry_option_desc_t *options;
    uint32_t n_options;
    uint32_t option_desc_size;
    /* ---- ABI 1.3 (read only when struct_size covers it; may be NULL) ---- */
    /* Like register_mem, for host memory the host allocated to share (ferry_alloc_shared):
     * [region->addr, +region->length) is a MAP_SHARED mapping of the memfd `fd` at offset
     * `fd_offset` (page-aligned). The memfd is sealed with F_SEAL_SHRINK | F_SEAL_GROW |
     * F_SEAL_SEAL, fully allocated, and has one page after the region's last page (at fd_offset
     * + the length rounded up to pages) that the host never touches: the plugin's, for state
     * its peers see (shm.so: whether the region is still registered). The host keeps `fd` open
     * until deregister_mem returns; a plugin that needs it longer dup()s it. A plugin may hand
     * the memfd to peers that are authorised to access the region, so they map it. NULL: the
     * host calls register_mem instead. */
    int (*register_mem_fd)(ferry_transport_t *transport, const ferry_mem_region_t *region, int fd, uint64_t fd_offset,
                           uint64_t *mem_handle, ferry_error_t *err);
    /* ---- ABI 1.5 (read only when struct_size covers them; all three NULL or none) ---- */
    /* Block lists: KV-cache pages named once, then moved by index, so a transfer of many small
     * blocks costs the plugin no per-op lookup and the host one completion. NULL: the host posts
     * block transfers as ordinary ops. */
    /* Check `n` blocks once and keep them: side FERRY_BLOCKS_LOCAL (`peer` ignored; every `mem`
     * a register_mem handle, the block inside that region) or FERRY_BLOCKS_REMOTE (`mem` import
     * handles of `peer`). */
    int (*create_block_list)(ferry_transport_t *transport, uint32_t side, uint64_t peer, const ferry_block_t *blocks,
                             size_t n, uint64_t *list, ferry_error_t *err);
    /* Forget a list. Transfers already submitted from it complete as usual. */
    int (*destroy_block_list)(ferry_transport_t *transport, uint64_t list, ferry_error_t *err);
    /* Post `n` copies (opcode for all): pair i moves local block local_index[i] of `local_list`
     * and remote block remote_index[i] of `remote_list` (a list of `peer`), whose lengths must be
     * equal; the pairs never overlap each other. All-or-nothing like submit, then exactly ONE
     * completion with `user_data` for all pairs: status 0 only when every pair arrived, and a
     * failure reported only once no byte of any pair can still land. A list whose memory was
     * deregistered or released since it was made fails with -ESTALE (make it again). */
    int (*submit_blocks)(ferry_transport_t *transport, uint64_t peer, uint32_t opcode, uint64_t local_list,
                         const uint32_t *local_index, uint64_t remote_list, const uint32_t *remote_index, size_t n,
                         uint64_t user_data, ferry_error_t *err);
    /* ---- ABI 1.5, optional (read only when struct_size covers it; may be NULL) ---- */
    /* Per-rail counters (ferry_rail_stats_t), one entry per local rail. `*n` holds the capacity
     * of `out` on entry and the count written on return; when it is too small, returns -ENOSPC
     * and sets `*n` to the count needed. NULL: the transport has no rails to report. Cheap
     * enough for every scrape of a metrics endpoint; never blocks on the network. */
    int (*rail_stats)(ferry_transport_t *transport, ferry_rail_stats_t *out, size_t *n, ferry_error_t *err);
    /* ---- ABI 1.6, optional (read only when struct_size covers it; may be NULL) ---- */
    /* Run `n` copies within this process, each between device memory of `device` and either
     * pinned host memory the device can address (cuMemHostAlloc, hipHostMalloc) or more device
     * memory of `device`, in as few launches as the plugin can (the GPU IPC transports: one
     * copy-kernel launch for the small ones). No two copies overlap. All-or-nothing like submit,
     * then exactly ONE completion with `user_data` through poll: status 0 only once every copy
     * is done, and a failure only once none can still write. The host uses it to gather many
     * small GPU ops into one pinned staging slice (and scatter them out of one) for transports
     * that move host memory only. NULL: the host copies them itself, one runtime call each. */
    int (*copy_local)(ferry_transport_t *transport, int32_t device, const ferry_local_copy_t *copies, size_t n,
                      uint64_t user_data, ferry_error_t *err);
} ferry_plugin_v1_t;

/* Bytes of ferry_plugin_v1_t up to and including the field `member`: a host that uses a
 * field requires struct_size to be at least this. */
#define FERRY_PLUGIN_V1_SIZE_UNTIL(member) \
    (offsetof(ferry_plugin_v1_t, member) + sizeof(((ferry_plugin_v1_t *)0)->member))

#ifdef __cplusplus
}
#endif

#endif /* FERRY_PLUGIN_H */
