// Ferry C++ API. Results are std::expected: no exceptions cross this API.
#pragma once

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdint>
#include <expected>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "ferry/result.hpp"

#define FERRY_API __attribute__((visibility("default")))

namespace ferry {

// Engine::wait's error code when its timeout passed with ops still in flight (the batch stays
// valid: wait again, poll status, or free it once done). No op ever fails with this code, so
// it cannot be confused with an op's own failure, e.g. -ETIMEDOUT from a transport timeout.
inline constexpr int kWaitPending = -EINPROGRESS;

enum class Opcode : uint32_t { Read = 0, Write = 1 };
// Auto (register_memory only): ask the loaded GPU runtimes (CUDA's cuPointerGetAttributes,
// HIP's hipPointerGetAttributes) whether the address is device memory, and register it as that
// device's memory or as host memory accordingly; `device` is then ignored unless >= 0, when
// the memory must be that device's.
enum class MemoryKind : uint32_t { Host = 0, Cuda = 1, Rocm = 2, Auto = 255 };

inline constexpr uint32_t kRemoteRead = 1;
inline constexpr uint32_t kRemoteWrite = 2;

using SegmentId = uint64_t;
using BatchId = uint64_t;
using BlockTableId = uint64_t;
// create_block_table's segment for blocks of this engine's own registered memory.
inline constexpr SegmentId kLocalMemory = 0;

// Flat key/value configuration. YAML files flatten into it with dotted keys.
using Config = std::map<std::string, std::string>;

struct MemoryOptions {
    MemoryKind kind = MemoryKind::Host;
    int device = -1;
    uint32_t access = kRemoteRead | kRemoteWrite;
};

struct MemoryRange {
    void *addr = nullptr;
    uint64_t length = 0;
    std::optional<MemoryOptions> options = std::nullopt;  // register_memory_batch: this range's own, else the call's
};

struct Request {
    Opcode opcode = Opcode::Read;
    void *local = nullptr;
    SegmentId segment = 0;
    uint64_t remote = 0;
    uint64_t length = 0;
    std::string transport;  // empty: choose by priority
};

enum class OpState : uint32_t { Pending = 0, Done = 1, Failed = 2 };

struct OpStatus {
    OpState state = OpState::Pending;
    int code = 0;
    std::string transport;
    std::string message;
};

// submit_on_stream: the caller keeps the batch (waits for it, frees it), or the engine frees it
// itself once its ops ended (fire and forget, as Mooncake's transfer_*_on_cuda; a failure is
// then only logged, and the id answers -ENOENT from then on).
enum class StreamBatch : uint32_t { Keep = 0, Detach = 1 };

// A region another engine registered, as its descriptor tells it.
struct RemoteRegion {
    uint64_t addr = 0;
    uint64_t length = 0;
    MemoryKind kind = MemoryKind::Host;
    int device = -1;
    uint32_t access = 0;
};

// A message another engine sent with send_notification.
struct Notification {
    std::string from;              // the sender's segment name (its Engine::segment_name())
    std::vector<uint8_t> message;  // the bytes as sent (may be empty)
};
inline constexpr size_t kMaxNotificationBytes = 1u << 20;

// Pinned host memory the GPU staging lends out (to the plugins serving peers' access to our GPU
// memory, and to our own initiator-side pipeline), for tests and benches.
struct StagingStats {
    uint64_t max_bytes = 0;               // gpu_staging_max_bytes: the bound (0: staging disabled)
    uint64_t slice_bytes = 0;             // gpu_staging_slice_bytes: one slice
    uint64_t lent_bytes = 0;              // lent out now
    uint64_t peak_lent_bytes = 0;         // most lent out at once since the engine started
    uint64_t acquire_refused = 0;         // slices refused at the bound (the asker waits or fails)
    uint64_t copies = 0;                  // GPU <-> pinned copies started
    uint64_t copy_failures = 0;           // of those, failed
    uint64_t gathers = 0;                 // initiator slices shared by small ops: gathers and scatters
    uint64_t gathered_ops = 0;            // small ops moved through them
    uint64_t gathers_by_transport = 0;    // of the gathers and scatters, those a GPU transport ran
                                          // (copy_local: cuda_ipc.so's copy kernel)
    uint64_t served_packs = 0;            // serving: buffers shared by small requests of a peer (tcp.so)
    uint64_t served_packed_requests = 0;  // the requests moved through them
};

// Op latency (submit to completion) histogram bounds, in seconds: 10 µs to 10 s.
inline constexpr size_t kLatencyBuckets = 19;
inline constexpr double kLatencyBoundsSeconds[kLatencyBuckets] = {
    1e-5, 2.5e-5, 5e-5, 1e-4, 2.5e-4, 5e-4, 1e-3, 2.5e-3, 5e-3, 1e-2, 2.5e-2, 5e-2, 0.1, 0.25, 0.5, 1, 2.5, 5, 10};

// What one transport did for one operation (READ or WRITE) since the engine started.
struct OpStats {
    uint64_t done = 0;    // ops that succeeded
    uint64_t failed = 0;  // ops that failed
    uint64_t bytes = 0;   // bytes the succeeded ones moved
    double latency_sum_seconds = 0;
    // Ops by latency, not cumulative: [k] counts those in (bound k-1, bound k] of
    // kLatencyBoundsSeconds, the last one those above 10 s.
    std::array<uint64_t, kLatencyBuckets + 1> latency_buckets{};
};

// One local rail of a transport that spreads traffic over several (tcp.rails' addresses,
// rdma.so's NICs), summed over every peer: as many per transport as the host has rails.
struct RailStats {
    std::string rail;           // the local address ("10.0.1.2") or NIC and port ("mlx5_0:1")
    uint64_t read_bytes = 0;    // bytes of READs it carried
    uint64_t write_bytes = 0;   // bytes of WRITEs it carried
    uint64_t completed = 0;     // pieces it completed: tcp slices, rdma work requests
    uint64_t failures = 0;      // path failures on it (a connection that broke, timed out, was refused)
    uint64_t pauses = 0;        // times it was paused after one (for one peer, or for all)
    uint64_t paused_peers = 0;  // peers it is paused for now
    uint64_t queued_bytes = 0;  // given to it and not completed yet
    double throughput = 0;      // bytes/s it moved while busy, as the transport measured; 0: not measured
};

struct TransportStats {
    std::string transport;  // "tcp", ...; "none": ops that failed before a transport took them
    OpStats read, write;
    uint64_t peers = 0;  // segments this engine has a connection to over it
    // Failover (docs/FAILOVER.md): ops that failed on it and were posted again on another path
    // (not counted in `failed`), times one of its paths (to one segment) was paused, and its
    // paths paused now.
    uint64_t failovers = 0;
    uint64_t pauses = 0;
    uint64_t paused_paths = 0;
    std::vector<RailStats> rails;  // empty when the transport reports none (plugin ABI 1.5 rail_stats)
};

// Engine::stats(): counts only grow while the engine lives (Prometheus counters).
struct EngineStats {
    std::vector<TransportStats> transports;  // the loaded ones in priority order, then "none"
    StagingStats staging;
    uint64_t batches = 0;        // submitted
    uint64_t segments_open = 0;  // now
};

struct TransportInfo {
    std::string name;
    std::string plugin_path;
    std::string version;
    uint64_t caps = 0;
};

class FERRY_API Engine {
public:
    static Result<std::unique_ptr<Engine>> create(const Config &config);
    // YAML file, then `overrides` on top.
    static Result<std::unique_ptr<Engine>> create_from_file(const std::string &yaml_path, const Config &overrides = {});
    ~Engine();
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;

    const std::string &segment_name() const;
    std::vector<TransportInfo> transports() const;
    StagingStats staging_stats() const;
    // What the data path did: ops, failures, bytes and latency by transport and operation,
    // staging use (docs/METRICS.md). Cheap: a copy of counters.
    EngineStats stats() const;
    // Where the Prometheus endpoint listens ("127.0.0.1:9100"), or "" when metrics_port is not
    // set.
    std::string metrics_address() const;

    Result<void> register_memory(void *addr, uint64_t length, const MemoryOptions &options = {});
    // Registers each range as register_memory does (with its own options where it has them, else
    // `options`), all or none, and publishes them together (etcd: one transaction per ~100 chunks
    // of 128 regions instead of one per region). When one fails, none stays registered and the
    // error names it ("range 7 of 100 [0x..., +4096): ..."). Peers may see a prefix of the batch
    // while it is being published (docs/DESIGN.md, "etcd layout"), never a region of a failed one
    // (unless a concurrent register's publish carried it before the rollback).
    Result<void> register_memory_batch(std::span<const MemoryRange> ranges, const MemoryOptions &options = {});
    Result<void> unregister_memory(void *addr);
    // Unregisters every region starting at one of `addrs`, all or none (-ENOENT naming the first
    // address where no region starts, -EINVAL for an address given twice), published together.
    // A transport's failure to deregister is returned after every region went, as
    // unregister_memory does.
    Result<void> unregister_memory_batch(std::span<void *const> addrs);
    // Host memory the engine allocates to share: a sealed memfd mapped MAP_SHARED, registered
    // with `access`, which shm.so hands to authorised peers on the same host so they copy into
    // it with memcpy (docs/DESIGN.md, "managed buffers"). `length` is rounded up to pages; the
    // address is page-aligned. Free it with free_shared (never unregister_memory/munmap).
    Result<void *> alloc_shared(uint64_t length, uint32_t access = kRemoteRead | kRemoteWrite);
    // Unregisters and unmaps a buffer from alloc_shared. Peers that mapped it fail their later
    // ops on it with -EFAULT; what they still write lands in the orphaned memfd, never in
    // memory this process reuses.
    Result<void> free_shared(void *addr);

    // Fetches the segment's descriptor (the network: bounded by handshake_timeout_ms).
    Result<SegmentId> open_segment(std::string_view name);
    Result<void> close_segment(SegmentId segment);
    // The regions the segment's engine has registered (re-read from its metadata).
    Result<std::vector<RemoteRegion>> segment_regions(SegmentId segment);

    // Never waits on the network. Refused here: what this engine knows is wrong (opcode, length,
    // a local range outside the registered memory, a segment not open, a forced transport not
    // loaded) and what the cached descriptor of the segment already answers (no access right,
    // no transport that can carry the op). Ops whose segment needs the network first (a
    // descriptor re-read for a range it does not list, a connect, an import) wait inside the
    // engine and are posted once that is done, or fail with its error (wait()/status()), within
    // its timeout. close_segment and destroying the engine fail such ops with -ECANCELED.
    Result<BatchId> submit(std::span<const Request> requests);
    Result<OpStatus> status(BatchId batch, size_t index);
    // Ok when every op succeeded; otherwise the first failed op's code (e.g. -ETIMEDOUT when
    // that op timed out) with a message naming how many failed and the first three ("3 of
    // 128 ops failed: op 4 failed (WRITE 65536 bytes): ...; op 9 failed ..."), bounded in
    // length (status() gives every op's); kWaitPending (-EINPROGRESS) when `timeout` (< 0:
    // forever) passed first, with the batch still valid.
    Result<void> wait(BatchId batch, std::chrono::milliseconds timeout = std::chrono::milliseconds(-1));
    Result<void> free_batch(BatchId batch);

    // Block tables: KV-cache pages named once and then moved by index, as a paged cache does.
    // A table is `addrs.size()` blocks of `lengths[i]` bytes (one length for all when `lengths`
    // has one entry) in this engine's registered memory (segment kLocalMemory) or in an open
    // segment, each inside one region; they are checked here, once.
    Result<BlockTableId> create_block_table(SegmentId segment, std::span<const uint64_t> addrs,
                                            std::span<const uint64_t> lengths);
    // Transfers already submitted from it go on.
    Result<void> destroy_block_table(BlockTableId table);
    // Moves pair i: local block local_index[i] <-> remote block remote_index[i] (equal lengths,
    // non-overlapping), READ or WRITE, as one batch of local_index.size() ops: wait() and
    // status(batch, i) as for submit. Where the path has block lists (cuda_ipc, hip_ipc: one
    // copy kernel launch for the whole transfer) it is posted whole, with no per-pair work in the
    // engine, and every pair's status is the transfer's; elsewhere its pairs are posted as ops.
    Result<BatchId> submit_blocks(Opcode opcode, BlockTableId local, std::span<const uint32_t> local_index,
                                  BlockTableId remote, std::span<const uint32_t> remote_index);

    // Notifications over the engines' control channel (authenticated when a cluster secret is
    // set). send_notification returns once the receiving engine has queued the message, so a
    // notification sent after a WRITE batch completed is taken there after the written bytes
    // are visible. From one thread to one receiver, messages are taken in send order.
    // -EMSGSIZE beyond kMaxNotificationBytes; -ENOBUFS when the receiver's queue is full.
    Result<void> send_notification(SegmentId segment, std::span<const uint8_t> message);
    // Drains what peers sent so far, oldest first; empty when nothing arrived.
    std::vector<Notification> take_notifications();
    // As take_notifications, but blocks until at least one is queued (it returns as soon as
    // one is) or `timeout` (< 0: forever) passes: then kWaitPending (-EINPROGRESS). A wait
    // blocked when another thread destroys the engine returns -ECANCELED first.
    Result<std::vector<Notification>> wait_notifications(std::chrono::milliseconds timeout);
    // A descriptor for poll/epoll/select that is readable exactly while notifications are
    // queued (level-triggered; each arrival also signals it anew, so edge-triggered epoll
    // works too). Take them with take_notifications, which makes it unreadable again. Owned
    // by the engine: never read, write or close it. Valid until the engine is destroyed.
    int notification_fd() const;

    // submit, plus a notification the engine sends to `target` (an open segment) once every
    // op of the batch succeeded: it arrives after all the batch's WRITEs are in the target's
    // memory. When any op fails it is not sent. wait() returns only after it was delivered;
    // its error then is the ops' (the message ends "the batch's notification was not sent"),
    // or, when every op succeeded but delivering failed (e.g. -ENOBUFS: the target's queue is
    // full), that failure ("all N ops of batch B succeeded, but its notification ... was not
    // delivered: ..."). Until then the batch counts as in flight (free_batch: -EBUSY).
    // -EMSGSIZE beyond kMaxNotificationBytes, -ENOENT when `target` is not open.
    Result<BatchId> submit_with_notification(std::span<const Request> requests, SegmentId target,
                                             std::span<const uint8_t> message);

    // submit, ordered on a CUDA stream (`stream`: a CUstream / cudaStream_t of this process; 0,
    // the legacy default stream, and the per-thread default stream need a CUDA context current
    // on the calling thread). Returns at once, refusing what submit refuses (then nothing is
    // enqueued), else with the batch's id. A host function enqueued with cuLaunchHostFunc runs
    // once the work queued on the stream before this call is done: it hands the batch to the
    // engine's stream worker thread (CUDA forbids CUDA calls inside a host function, and posting
    // may make them), which posts it and drives it until every op ended, each within its
    // timeout; work queued on the stream after this call waits until then. Failures are
    // reported on the batch (wait(), status(): each op's own error), logged once, and the stream
    // goes on. The ops are checked again when the stream reaches them (memory unregistered or a
    // segment closed meanwhile fails them). free_batch says -EBUSY until the stream reached the
    // batch and its ops ended (StreamBatch::Detach: the engine frees it itself then, and the id
    // answers -ENOENT). Destroying the engine cancels the batches no stream reached yet
    // (their host functions return at once whenever they run) and lets the streams of those in
    // flight go on once the transports are down. -ENODEV without the CUDA driver (libcuda.so.1).
    Result<BatchId> submit_on_stream(std::span<const Request> requests, void *stream,
                                     StreamBatch batch = StreamBatch::Keep);

    struct Impl;

private:
    explicit Engine(std::unique_ptr<Impl> impl);
    // register_memory; with shared_fd >= 0 the region is that memfd's mapping at offset 0.
    Result<void> register_region(void *addr, uint64_t length, const MemoryOptions &options, int shared_fd);
    std::unique_ptr<Impl> impl_;
};

// Config helpers shared by the C API, the bench and Python. A file that other users could change
// (it, or a directory above it) is refused (-EACCES), as a plugin they could change is.
FERRY_API Result<Config> load_yaml_config(const std::string &path);

// What ferry-info prints: the plugin search path, every plugin file found, its ABI, version,
// probe result and the reason for each failure. `plugin_path`, `plugins` and `plugin_trust` keys
// of `config` apply as in an engine. `requested_ok` is false when a plugin named in the allow list
// (FERRY_PLUGINS or `plugins`) is missing or unavailable.
struct PluginReportOutput {
    std::string text;
    std::string json;
    bool requested_ok = true;
};
FERRY_API PluginReportOutput describe_plugins(const Config &config = {});

// What `ferry-info --options [plugin]` prints: the options each loaded plugin publishes (plugin
// ABI 1.2) with default, what is accepted and help, and the engine's own keys. `only`: one
// plugin's name, "engine", or empty for all; `format`: "text", "json" or "markdown" (the rows of
// docs/OPTIONS.md's option tables). `ok` is false when `only` names no loaded plugin (`text` says why).
struct OptionReportOutput {
    std::string text;
    bool ok = true;
};
FERRY_API OptionReportOutput describe_options(const Config &config, const std::string &only = {},
                                              const std::string &format = "text");

}  // namespace ferry
