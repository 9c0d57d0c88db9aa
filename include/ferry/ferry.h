/*
 * Ferry C API: what Python's cffi and other languages load.
 *
 * Conventions (cffi can parse this file after the preprocessor lines are removed):
 * - Handles are opaque pointers; plain structs and integers otherwise.
 * - Every function returns 0 on success or a negative errno-style code. The message that goes
 *   with the last failure on the calling thread is ferry_last_error().
 * - Output parameters are written only on success.
 */
#ifndef FERRY_FERRY_H
#define FERRY_FERRY_H

#include <stddef.h>
#include <stdint.h>

/* Version of this C API: 2 added ferry_wait_batch; 3 added ferry_wait_notifications,
 * ferry_notification_fd, ferry_submit_with_notification, ferry_staging_stats and
 * FERRY_MEMORY_AUTO; 4 added ferry_alloc_shared and ferry_free_shared; 5 added
 * ferry_register_batch, ferry_unregister_batch and ferry_memory_range_t; 6 added
 * ferry_submit_on_stream; 7 added ferry_stats, ferry_latency_bounds and ferry_metrics_address;
 * 8 added block tables (ferry_create_block_table, ferry_destroy_block_table, ferry_submit_blocks)
 * and ferry_rail_stats. Functions are only ever added. */
#define FERRY_C_API_VERSION 8

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__) && !defined(FERRY_CFFI)
#define FERRY_C_API __attribute__((visibility("default")))
#else
#define FERRY_C_API
#endif

typedef struct ferry_engine ferry_engine_t;
typedef uint64_t ferry_segment_id_t;
typedef uint64_t ferry_batch_id_t;

enum {
    FERRY_MEMORY_HOST = 0,
    FERRY_MEMORY_CUDA = 1,
    FERRY_MEMORY_ROCM = 2,
    /* ferry_register only: ask the loaded GPU runtimes (CUDA's cuPointerGetAttributes, HIP's
     * hipPointerGetAttributes) and register the memory as that GPU's, or as host memory. Pass
     * device -1 (or the ordinal it must be on, checked). For bare integer addresses (Mooncake's
     * register_memory(ptr, length)). */
    FERRY_MEMORY_AUTO = 255
};

enum {
    FERRY_READ = 0, /* remote -> local */
    FERRY_WRITE = 1 /* local -> remote */
};

enum {
    FERRY_REMOTE_READ = 1, /* peers may read the region */
    FERRY_REMOTE_WRITE = 2 /* peers may write the region */
};

enum { FERRY_OP_PENDING = 0, FERRY_OP_DONE = 1, FERRY_OP_FAILED = 2 };

typedef struct ferry_request {
    uint32_t opcode;            /* FERRY_READ or FERRY_WRITE */
    uint32_t reserved;          /* zero */
    void *local_addr;           /* inside a region registered with this engine */
    ferry_segment_id_t segment; /* from ferry_open_segment */
    uint64_t remote_addr;       /* address in the peer, inside a region it registered */
    uint64_t length;            /* bytes, > 0 */
    const char *transport;      /* NULL: choose by priority; else force this transport */
} ferry_request_t;

typedef struct ferry_op_status {
    uint32_t state;     /* FERRY_OP_* */
    int32_t error;      /* negative errno-style code when FAILED */
    char transport[32]; /* transport that carried the op */
    char message[256];  /* why it failed */
} ferry_op_status_t;

/* Create an engine from key/value pairs (see docs/OPTIONS.md). */
FERRY_C_API int ferry_engine_create(const char *const *keys, const char *const *values, size_t count,
                                    ferry_engine_t **engine);
/* Create an engine from a YAML file; keys/values (may be empty) override it. */
FERRY_C_API int ferry_engine_create_from_file(const char *yaml_path, const char *const *keys, const char *const *values,
                                              size_t count, ferry_engine_t **engine);
FERRY_C_API void ferry_engine_destroy(ferry_engine_t *engine);

/* Name peers use to open this engine's segment. Copies it, NUL-terminated, into buf. */
FERRY_C_API int ferry_engine_segment_name(ferry_engine_t *engine, char *buf, size_t len);

/* Register [addr, addr+length) with every transport that can move this memory kind.
 * access: FERRY_REMOTE_READ | FERRY_REMOTE_WRITE. device: GPU ordinal, -1 for host. */
FERRY_C_API int ferry_register(ferry_engine_t *engine, void *addr, uint64_t length, uint32_t memory_kind,
                               int32_t device, uint32_t access);
FERRY_C_API int ferry_unregister(ferry_engine_t *engine, void *addr);

/* One range of ferry_register_batch: what ferry_register takes. */
typedef struct ferry_memory_range {
    void *addr;
    uint64_t length;
    uint32_t memory_kind; /* FERRY_MEMORY_* (FERRY_MEMORY_AUTO: asked for this range) */
    int32_t device;       /* GPU ordinal, -1 for host */
    uint32_t access;      /* FERRY_REMOTE_READ | FERRY_REMOTE_WRITE */
    uint32_t reserved;    /* zero */
} ferry_memory_range_t;

/* Register `count` ranges as ferry_register does, all or none, and publish them together: with
 * etcd one transaction per ~100 chunks of 128 regions instead of one per region (KV caches of
 * many blocks; docs/API.md, "Registering many regions"). When one range is invalid or fails, none
 * stays registered and ferry_last_error names it ("range 7 of 100 [0x..., +4096): ..."). A
 * count of 0 does nothing. (C API version 5.) */
FERRY_C_API int ferry_register_batch(ferry_engine_t *engine, const ferry_memory_range_t *ranges, size_t count);
/* Unregister the regions starting at addrs[0..count), all or none: -ENOENT naming the first
 * address where no region starts, -EINVAL for an address given twice, and nothing is
 * unregistered then. Published together. A transport's failure to deregister is returned after
 * every region went, as ferry_unregister does. (C API version 5.) */
FERRY_C_API int ferry_unregister_batch(ferry_engine_t *engine, void *const *addrs, size_t count);

/* Allocate `length` bytes (rounded up to pages) of host memory to share and register it with
 * `access`: a sealed memfd mapped shared, which shm.so hands to authorised peers on this host
 * so their transfers are one memcpy (docs/API.md, "Managed buffers"). *addr (page-aligned) is set
 * only on success. Free it with ferry_free_shared, never with ferry_unregister or munmap; it is
 * unmapped when the engine is destroyed. */
FERRY_C_API int ferry_alloc_shared(ferry_engine_t *engine, uint64_t length, uint32_t access, void **addr);
/* Unregister and unmap a buffer from ferry_alloc_shared. Peers' later ops on it fail. */
FERRY_C_API int ferry_free_shared(ferry_engine_t *engine, void *addr);

/* Pinned host memory the GPU staging lends out (engine keys gpu_staging_max_bytes and
 * gpu_staging_slice_bytes), both ends together. */
typedef struct ferry_staging_stats {
    uint64_t max_bytes;       /* the bound; 0: staging disabled */
    uint64_t slice_bytes;     /* one slice */
    uint64_t lent_bytes;      /* lent out now */
    uint64_t peak_lent_bytes; /* most lent out at once since the engine started */
    uint64_t acquire_refused; /* slices refused at the bound */
    uint64_t copies;          /* GPU <-> pinned copies started */
    uint64_t copy_failures;   /* of those, failed */
} ferry_staging_stats_t;
FERRY_C_API int ferry_staging_stats(ferry_engine_t *engine, ferry_staging_stats_t *out);

/* What the data path did since the engine started (docs/METRICS.md); counts only grow. */
#define FERRY_LATENCY_BUCKETS 19
typedef struct ferry_op_stats {
    uint64_t done;   /* ops that succeeded */
    uint64_t failed; /* ops that failed */
    uint64_t bytes;  /* bytes the succeeded ones moved */
    double latency_sum_seconds;
    /* Ops by latency from submit to completion, not cumulative: [k] counts those in
     * (bound k-1, bound k] of ferry_latency_bounds(), the last one those above the last bound. */
    uint64_t latency_buckets[20]; /* FERRY_LATENCY_BUCKETS + 1 */
} ferry_op_stats_t;
typedef struct ferry_transport_stats {
    char transport[32]; /* "tcp", ...; "none": ops that failed before a transport took them */
    ferry_op_stats_t read;
    ferry_op_stats_t write;
    uint64_t peers; /* segments this engine has a connection to over it */
    /* Failover (docs/FAILOVER.md): ops that failed on it and were posted again on another path
     * (not counted as failed), times one of its paths was paused, and its paths paused now. */
    uint64_t failovers;
    uint64_t pauses;
    uint64_t paused_paths;
} ferry_transport_stats_t;
typedef struct ferry_engine_stats {
    uint64_t batches;       /* submitted */
    uint64_t segments_open; /* now */
    ferry_staging_stats_t staging;
} ferry_engine_stats_t;
/* Fills *out and up to *n transports (the loaded ones in priority order, then "none"), and sets
 * *n to how many there are; -ENOSPC (nothing written) when *n was too small. */
FERRY_C_API int ferry_stats(ferry_engine_t *engine, ferry_engine_stats_t *out, ferry_transport_stats_t *transports,
                            size_t *n);
/* One local rail of a transport that spreads traffic over several (tcp.rails' addresses, rdma.so's
 * NICs), summed over every peer, so there are as many as the host has rails, however many peers
 * (docs/METRICS.md). Counts only grow; paused_peers, queued_bytes and throughput hold now. */
typedef struct ferry_engine_rail_stats {
    char transport[32]; /* "tcp", "rdma" */
    char rail[64];      /* the local address ("10.0.1.2") or NIC and port ("mlx5_0:1") */
    uint64_t read_bytes;
    uint64_t write_bytes;
    uint64_t completed;    /* pieces it completed: tcp slices, rdma work requests */
    uint64_t failures;     /* path failures on it */
    uint64_t pauses;       /* times it was paused after one (for one peer, or for all) */
    uint64_t paused_peers; /* peers it is paused for now */
    uint64_t queued_bytes; /* given to it and not completed yet */
    double throughput;     /* bytes/s it moved while busy, as the transport measured; 0: not measured */
} ferry_engine_rail_stats_t;
/* Fills up to *n rails of every loaded transport (priority order; transports without rails add
 * none) and sets *n to how many there are; -ENOSPC (nothing written) when *n was too small.
 * (C API version 8.) */
FERRY_C_API int ferry_rail_stats(ferry_engine_t *engine, ferry_engine_rail_stats_t *out, size_t *n);
/* The FERRY_LATENCY_BUCKETS upper bounds of the latency histogram, in seconds. */
FERRY_C_API const double *ferry_latency_bounds(void);
/* Where the Prometheus endpoint (engine key metrics_port) listens, "127.0.0.1:9100", or "" when
 * it is off. Valid until the engine is destroyed. */
FERRY_C_API const char *ferry_metrics_address(ferry_engine_t *engine);

FERRY_C_API int ferry_open_segment(ferry_engine_t *engine, const char *name, ferry_segment_id_t *segment);
FERRY_C_API int ferry_close_segment(ferry_engine_t *engine, ferry_segment_id_t segment);

/* Submit a batch; never blocks on the network. Fails at once for what is known locally (bad
 * opcode, length 0, local range outside the registered memory, segment not open, forced
 * transport not loaded) or from the segment's cached descriptor (no access right, no transport
 * that can carry an op). An op whose segment needs the network first (a descriptor re-read, a
 * connect) waits inside the engine and is posted once that is done, or fails with its error
 * (ferry_wait_batch, ferry_get_status) within its timeout. */
FERRY_C_API int ferry_submit(ferry_engine_t *engine, const ferry_request_t *requests, size_t count,
                             ferry_batch_id_t *batch);
/* Status of op `index` of a batch; drives progress without blocking. */
FERRY_C_API int ferry_get_status(ferry_engine_t *engine, ferry_batch_id_t batch, size_t index,
                                 ferry_op_status_t *status);
/* Wait until every op of the batch is done or failed, or timeout_ms (< 0: forever) passes.
 * Returns 0 when every op succeeded; the first failed op's own error when one failed (e.g.
 * -ETIMEDOUT: that op timed out in its transport; the batch is finished), ferry_last_error
 * then naming how many failed and the first three, bounded in length; -EINPROGRESS when
 * timeout_ms passed first with ops still in flight (the batch stays valid: wait again). No op
 * ever fails with -EINPROGRESS, so the two cases cannot be confused. (C API version 2.) */
FERRY_C_API int ferry_wait_batch(ferry_engine_t *engine, ferry_batch_id_t batch, int64_t timeout_ms);
/* Deprecated: as ferry_wait_batch, but reports a wait that timed out as -ETIMEDOUT, which an
 * op that failed with -ETIMEDOUT also returns; use ferry_wait_batch (or ferry_get_status to
 * tell the two apart). Kept unchanged for callers built against version 1. */
FERRY_C_API int ferry_wait(ferry_engine_t *engine, ferry_batch_id_t batch, int64_t timeout_ms);
/* Release a finished batch; -EBUSY while ops are in flight. */
FERRY_C_API int ferry_free_batch(ferry_engine_t *engine, ferry_batch_id_t batch);

/* A region a peer registered, as its descriptor tells it. */
typedef struct ferry_remote_region {
    uint64_t addr;        /* address in the peer */
    uint64_t length;      /* bytes */
    uint32_t memory_kind; /* FERRY_MEMORY_* */
    int32_t device;       /* GPU ordinal, -1 for host memory */
    uint32_t access;      /* FERRY_REMOTE_READ | FERRY_REMOTE_WRITE */
    uint32_t reserved;    /* zero */
} ferry_remote_region_t;

/* The regions the segment's engine has registered (re-read from its metadata). On entry
 * *count is how many entries `regions` holds; on success it is how many were written. When
 * there are more than fit, returns -ENOSPC and sets *count to the number needed. */
FERRY_C_API int ferry_segment_regions(ferry_engine_t *engine, ferry_segment_id_t segment,
                                      ferry_remote_region_t *regions, size_t *count);

/* A notification another engine sent (ferry_send_notification). */
typedef struct ferry_notification {
    const char *from;    /* the sender's segment name, NUL-terminated */
    const uint8_t *data; /* the message bytes; NULL when length is 0 */
    size_t length;       /* bytes */
} ferry_notification_t;

/* Send length bytes (at most 1 MiB) to the engine of an open segment over the control channel
 * (authenticated when a cluster secret is set). Returns 0 once that engine has queued them, so
 * a notification sent after a WRITE batch completed arrives after the written bytes are
 * visible. -EMSGSIZE when too long, -ENOBUFS when the receiver's queue is full. */
FERRY_C_API int ferry_send_notification(ferry_engine_t *engine, ferry_segment_id_t segment, const void *data,
                                        size_t length);
/* Drain the notifications received so far, oldest first: *notifications is an array of *count
 * entries the caller frees with ferry_free_notifications (NULL and 0 when none arrived). */
FERRY_C_API int ferry_take_notifications(ferry_engine_t *engine, ferry_notification_t **notifications, size_t *count);
/* Free what ferry_take_notifications returned; NULL is fine. */
FERRY_C_API void ferry_free_notifications(ferry_notification_t *notifications, size_t count);
/* As ferry_take_notifications, but blocks until at least one is queued (returning as soon as
 * one is, *count >= 1) or timeout_ms (< 0: forever) passes: then -EINPROGRESS, with the output
 * parameters untouched; -ECANCELED when another thread destroys the engine meanwhile (the call
 * returns before the engine is gone). Free the array with ferry_free_notifications. (C API
 * version 3.) */
FERRY_C_API int ferry_wait_notifications(ferry_engine_t *engine, int64_t timeout_ms,
                                         ferry_notification_t **notifications, size_t *count);
/* A descriptor for poll/epoll/select, readable exactly while notifications are queued
 * (level-triggered; each arrival signals it anew, so edge-triggered epoll works too). Take
 * them with ferry_take_notifications, which makes it unreadable again. The engine owns it:
 * never read, write or close it; valid until ferry_engine_destroy. (C API version 3.) */
FERRY_C_API int ferry_notification_fd(ferry_engine_t *engine, int *fd);
/* ferry_submit, plus `length` bytes (at most 1 MiB) the engine sends as a notification to the
 * engine of the open segment `target` once every op of the batch succeeded, so it arrives after
 * every WRITE's bytes are in the target's memory. When any op fails it is not sent.
 * ferry_wait_batch returns only once it was delivered: 0; the ops' failure when one failed
 * (ferry_last_error ends "the batch's notification was not sent"); or, when every op succeeded
 * but delivering it failed (e.g. -ENOBUFS: the target's queue is full), that error ("all N ops
 * of batch B succeeded, but its notification ... was not delivered: ..."). Until then the batch
 * is in flight (ferry_free_batch: -EBUSY). (C API version 3.) */
FERRY_C_API int ferry_submit_with_notification(ferry_engine_t *engine, const ferry_request_t *requests, size_t count,
                                               ferry_segment_id_t target, const void *data, size_t length,
                                               ferry_batch_id_t *batch);

/* ferry_submit ordered on a CUDA stream (Mooncake's transfer_*_on_cuda): the batch starts once
 * the work queued on `stream` before this call is done, and work queued on it after this call
 * waits until every op of the batch ended. `stream` is a CUstream / cudaStream_t of this process
 * (torch.cuda.current_stream().cuda_stream); 0 (the legacy default stream) and the per-thread
 * default stream need a CUDA context current on the calling thread. Returns at once: the
 * requests are checked as ferry_submit checks them (nothing is enqueued when one is refused),
 * then a host function is enqueued on the stream (cuLaunchHostFunc). When the stream reaches
 * it, the host function hands the batch to the engine's stream worker thread, which posts it
 * (CUDA forbids CUDA calls inside a host function; posting may make them) and drives it until
 * every op ended, each within its timeout; the stream waits meanwhile. A failure is reported on
 * the batch (ferry_wait_batch, ferry_get_status: each op's own error), logged once, and the
 * stream goes on. The batch id is valid at once and waitable like any other; ferry_free_batch
 * says -EBUSY until the stream reached it and its ops ended. `batch` NULL: the engine frees the
 * batch itself once its ops ended (fire and forget; a failure is then only logged). ferry_engine_destroy cancels the
 * batches their streams have not reached yet (their host functions return at once when they
 * run, after the engine is gone too) and releases the streams of those in flight once the
 * transports are down. -ENODEV when the CUDA driver (libcuda.so.1) cannot be loaded. (C API
 * version 6.) */
FERRY_C_API int ferry_submit_on_stream(ferry_engine_t *engine, const ferry_request_t *requests, size_t count,
                                       void *stream, ferry_batch_id_t *batch);

/* Block tables (C API version 8): KV-cache pages named once, then moved by index, as a paged
 * KV cache addresses them. A table holds `count` blocks: block i is lengths[i] bytes at addrs[i]
 * (lengths of 1 entry: one length for all, pass count_lengths 1), each inside one region of this
 * engine's registered memory (segment FERRY_LOCAL_MEMORY) or of an open segment; all are checked
 * here, once. */
typedef uint64_t ferry_block_table_t;
#define FERRY_LOCAL_MEMORY ((ferry_segment_id_t)0)
FERRY_C_API int ferry_create_block_table(ferry_engine_t *engine, ferry_segment_id_t segment, const uint64_t *addrs,
                                         size_t count, const uint64_t *lengths, size_t count_lengths,
                                         ferry_block_table_t *table);
/* Transfers already submitted from the table go on. */
FERRY_C_API int ferry_destroy_block_table(ferry_engine_t *engine, ferry_block_table_t table);
/* Moves `count` pairs, FERRY_READ or FERRY_WRITE: pair i is local block local_index[i] of `local`
 * and remote block remote_index[i] of `remote` (equal lengths; pairs never overlap). One batch of
 * `count` ops, waited for and freed as any (ferry_wait_batch, ferry_get_status(batch, i)). Where
 * the path has block lists (cuda_ipc, hip_ipc: one copy kernel launch for the whole transfer)
 * the transfer is posted whole, with no per-pair work in the engine, and every pair's status is
 * the transfer's; elsewhere its pairs are posted as ops. The first transfer between two tables
 * takes the ordinary route (which connects) and prepares that path for the next. */
FERRY_C_API int ferry_submit_blocks(ferry_engine_t *engine, uint32_t opcode, ferry_block_table_t local,
                                    const uint32_t *local_index, ferry_block_table_t remote,
                                    const uint32_t *remote_index, size_t count, ferry_batch_id_t *batch);

/* Message for the last failure on this thread ("" when none). */
FERRY_C_API const char *ferry_last_error(void);
/* Library version string. */
FERRY_C_API const char *ferry_version(void);

/* Plugin report as JSON (what `ferry-info --json` prints). Copies into buf; when it does not
 * fit returns -ENOSPC and sets *len to the size needed, NUL included. */
FERRY_C_API int ferry_plugin_report_json(char *buf, size_t *len);

#ifdef __cplusplus
}
#endif

#endif /* FERRY_FERRY_H */
