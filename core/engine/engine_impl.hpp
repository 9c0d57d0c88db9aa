// core/engine/: the engine (include/ferry/engine.hpp) and its settings (config.hpp): setup,
// registration and the region index, submitting and routing ops, the connector, batches,
// failover, notifications, stream-ordered batches, storage segments, shared buffers, the loaded
// transports (transport.hpp) and the initiator's GPU staging pipeline. It calls every folder but
// api/ and tools/, the two above it; none of the folders below calls it.
// May include: metadata/, control/, staging/, metrics/, loader/, util/
//
// Engine internals shared by engine.cpp (setup, memory, segments), submit.cpp and route.cpp
// (planning a batch), connector.cpp (what needs the network before an op can be posted),
// batch.cpp (progress, completion, wait) and stream_submit.cpp (batches ordered on CUDA streams).
#pragma once

#include <sys/eventfd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <list>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <variant>
#include <vector>

#include "control/control_client.hpp"
#include "control/control_server.hpp"
#include "engine/config.hpp"
#include "engine/region_index.hpp"
#include "engine/shared_memory.hpp"
#include "engine/stream_submit.hpp"
#include "engine/transport.hpp"
#include "ferry/engine.hpp"
#include "loader/plugin_loader.hpp"
#include "metadata/descriptor.hpp"
#include "metadata/metadata.hpp"
#include "metrics/metrics.hpp"
#include "metrics/transfer_stats.hpp"
#include "staging/gpu_staging.hpp"
#include "staging/stage_service.hpp"
#include "util/fd.hpp"

namespace ferry {

struct OpRecord;
struct Deferrals;
struct BlockTable;

// An op whose route needs the network first (its segment's descriptor re-read, a transport
// connected, a remote region imported): queued on its segment for the connector
// (connector.cpp), which does that off the submit path, then posts or fails the op.
struct DeferredOp {
    OpRecord *op = nullptr;
    size_t index = 0;  // in its batch, for messages
    Request request;
    bool failover = false;  // posted before, failed on a broken path: paused paths are not tried
};

// A path (one transport to one segment) that failed: no new op is routed to it until `until`,
// unless no other path can carry the op (then it is tried: the probe that brings it back).
struct PathPause {
    std::chrono::steady_clock::time_point until;
    std::string why;
};
// Failures of a path in a row, for the pause's exponential growth: a failure more than
// path_cooldown_max after the previous one starts again from path_cooldown.
struct PathStrikes {
    unsigned count = 0;
    std::chrono::steady_clock::time_point last;
};

struct RemoteSegment {
    SegmentId id = 0;
    std::string name;
    std::atomic<bool> stale{false};  // the metadata backend says the descriptor changed
    std::mutex mutex;                // guards everything below
    SegmentDescriptor descriptor;
    bool same_host = false;
    std::vector<std::optional<uint64_t>> peers;  // per transport index
    // Transports whose connect to this segment failed: skipped (falling back to the next one)
    // until the retry time passes.
    std::map<size_t, std::pair<std::chrono::steady_clock::time_point, std::string>> unusable;
    // Paths whose posted ops failed (failover.cpp), by transport index.
    std::map<size_t, PathPause> paused;
    std::map<size_t, PathStrikes> strikes;
    // (transport, region addr) -> handle: every import, released from here. Transports below
    // kRowHandles have theirs in `rows` too, which is what an op reads.
    struct ImportKeyHash {
        size_t operator()(const std::pair<size_t, uint64_t> &k) const noexcept {
            return std::hash<uint64_t>{}(k.second * 0x9e3779b97f4a7c15ull + k.first);
        }
    };
    std::unordered_map<std::pair<size_t, uint64_t>, uint64_t, ImportKeyHash> imported;
    // The descriptor's regions as rows (region_index.hpp) with their imports, and what route's
    // fast path needs of the segment as masks by transport index: reach_mask (the peer has the
    // transport's endpoint and the transport reaches it), moves_mask[kind] (the transport moves
    // that local memory kind). Rebuilt by reindex whenever the descriptor is replaced.
    RemoteRows rows;
    uint32_t reach_mask = 0;
    uint32_t moves_mask[3] = {};
    // `names`/`caps`: the local transports' by index.
    void reindex(std::span<const std::string_view> names, std::span<const uint64_t> caps);
    // An import made without the lock (mutex held again): kept as the region's import over
    // `transport` unless the segment closed, reconnected (another `peer`) or got one meanwhile;
    // false then, and the caller releases it.
    bool adopt_import(size_t transport, uint64_t region_addr, uint64_t peer, uint64_t handle) {
        auto key = std::make_pair(transport, region_addr);
        if (closed || peers[transport] != peer || imported.count(key)) return false;
        imported[key] = handle;
        rows.set_imported(descriptor, transport, region_addr, handle);
        return true;
    }
    std::deque<DeferredOp> deferred;  // ops waiting for the connector
    bool scheduled = false;           // queued for, or held by, a connector thread
    bool closed = false;              // close_segment ran: its ops fail, nothing new connects
    // A storage segment ("file:<path>", storage.cpp): routed only to storage transports, which
    // memory segments never are; its descriptor is made locally and never re-read.
    bool storage = false;

    // Control connection for notifications; its own lock, so a slow peer never holds up
    // submits to this segment.
    std::mutex control_mutex;
    std::optional<ControlClient> control;  // guarded by control_mutex
};

// One GPU op on a host-only transport, moved through pinned slices (staging.cpp): WRITE copies
// slice k from the GPU while slice k-1 is on the wire; READ receives slice k into pinned memory
// while slice k-1 is copied to the GPU. The op completes once every slice did, or once a failed
// one and every other started one are done (no byte lands after the failure is reported).
struct StagedSlice {
    std::shared_ptr<struct StagedOp> op;  // keeps the op alive while the slice is in flight
    void *buf = nullptr;
    uint64_t handle = 0;  // the slice's registration with the op's transport
    uint64_t offset = 0;
    uint64_t length = 0;
    // Set when the pinned buffer is shared by the small ops of a pack: `buf` is this op's part
    // of it, and the pack's buffer goes back once its last slice ended.
    std::shared_ptr<struct StagedPack> pack;
};

struct StagedOp {
    OpRecord *record = nullptr;
    size_t transport = 0;
    uint64_t peer = 0, remote_addr = 0, remote_mem = 0;
    uint32_t kind = 0;
    int device = -1;
    char *gpu = nullptr;
    uint64_t length = 0;
    bool read = false;

    std::mutex mutex;             // guards everything below
    uint64_t next = 0, done = 0;  // bytes started, bytes finished
    unsigned in_flight = 0;       // slices holding a pinned buffer
    bool waiting = false;         // queued for a pinned buffer
    bool finished = false;
    int code = 0;
    std::string message;            // the first failure
    std::list<StagedSlice> slices;  // in flight; a slice's address (low bit set) is its user_data
};

// Small GPU ops of one submit to one (transport, peer), in one direction, sharing one pinned
// slice (staging_gather.cpp): a WRITE pack is gathered out of the GPU with one copy (one
// copy-kernel launch where a GPU transport offers copy_local), then put on the wire as one
// submit; a READ pack is read off the wire as one submit, then scattered with one copy. Each op
// keeps its own StagedOp and completes on its own; the buffer goes back after the last.
struct StagedPack {
    std::vector<std::shared_ptr<StagedOp>> ops;
    std::vector<uint64_t> offsets;  // of each op in the buffer
    size_t transport = 0;
    uint64_t peer = 0;
    uint32_t kind = 0;
    int device = -1;
    bool read = false;
    void *buf = nullptr;
    uint64_t handle = 0;
    std::atomic<size_t> live{0};                   // slices still holding part of buf
    std::vector<StagedSlice *> slices;             // one per op, once the buffer is lent
    std::function<void(int, std::string)> copied;  // the gather or scatter under way ended

    std::mutex mutex;                   // READ: guards the two below
    size_t wire_left = 0;               // wire transfers not yet ended
    std::vector<StagedSlice *> landed;  // slices whose bytes arrived, for the scatter
};

// Waits for a pinned slice: a staged op, or a pack.
using StagingWaiter = std::variant<std::shared_ptr<StagedOp>, std::shared_ptr<StagedPack>>;

struct Batch;

inline constexpr uint16_t kNoTransport = UINT16_MAX;

struct OpRecord {
    Batch *batch = nullptr;
    std::atomic<uint32_t> state{static_cast<uint32_t>(OpState::Pending)};
    int code = 0;
    // The transport carrying it; kNoTransport while the connector still routes it (status()
    // may read it meanwhile).
    std::atomic<uint16_t> transport{kNoTransport};
    std::string message;               // written before state is released as Failed
    std::shared_ptr<StagedOp> staged;  // set for GPU ops staged through pinned slices
    Opcode opcode = Opcode::Read;      // what the op was, for wait()'s message
    uint64_t length = 0;
    // What failover (failover.cpp) needs to post the op again: the rest of its request, and
    // its earlier attempts ("tcp: <why>; shm: <why>"), which its final error names.
    bool forced = false;   // the request named a transport: it never moves to another
    uint8_t attempts = 0;  // failovers so far
    int path_code = 0;     // the first attempt's error: the op's, when no other path took it
    void *local = nullptr;
    uint64_t remote = 0;
    SegmentId segment = 0;
    std::string history;
};

// submit_with_notification: sent to `segment` once every op of its batch succeeded. It holds
// one share of the batch's `remaining` until it was delivered or dropped, so wait() and
// free_batch see the batch in flight until then.
struct PendingNotification {
    std::shared_ptr<RemoteSegment> segment;
    std::vector<uint8_t> message;
    int code = 0;  // the outcome; written before the last share is released
    std::string error;
};

struct Batch {
    BatchId id = 0;
    size_t size = 0;
    // A block transfer posted whole (blocks.cpp): its one op stands for `pairs` pairs, and
    // status() of any of them reads it.
    size_t pairs = 0;
    std::chrono::steady_clock::time_point submitted;  // for the ops' latency (transfer_stats.hpp)
    std::unique_ptr<OpRecord[]> ops;
    std::atomic<size_t> remaining{0};  // ops in flight, plus one while `notification` is unsent
    std::unique_ptr<PendingNotification> notification;
    bool on_stream = false;  // submit_on_stream's: posted only once its stream reached it
};

// Where one op goes, as route() found it without touching the network; `need` says what the
// connector must do first (re-read the descriptor, connect `transport`, import the region).
struct Route {
    enum class Need { Nothing, Refresh, Connect, Import };
    Need need = Need::Nothing;
    size_t transport = 0;
    uint64_t peer = 0, remote_mem = 0;
    bool staged = false;                       // GPU memory moved through pinned slices
    const RegionDescriptor *region = nullptr;  // valid while the segment's mutex is held
    const RemoteRow *row = nullptr;            // the region's row, where the segment has rows; same
};

// route()'s common case from the rows and masks alone (no string, hash or descriptor region
// read): the op's remote row `remote`, no transport forced, none failed or marked unusable.
// Picks what route() would pick, or returns false where route() must decide itself (no access,
// no transport, local GPU memory that might be staged, a transport past the rows' handles).
inline bool route_fast(const RemoteSegment &seg, std::span<const size_t> priority, const LocalRow &lr,
                       const RemoteRow &rr, Opcode op, Route &out) {
    uint32_t need = op == Opcode::Read ? kRemoteRead : kRemoteWrite;
    if (!(rr.access & need) || !seg.unusable.empty() || !seg.paused.empty() || lr.kind > 2) return false;
    uint32_t usable = seg.reach_mask & rr.key_mask;
    uint32_t local = lr.handle_mask & seg.moves_mask[lr.kind];
    for (size_t t : priority) {
        if (t >= kRowHandles) return false;
        uint32_t bit = uint32_t{1} << t;
        if (!(usable & bit)) continue;
        if (!(local & bit)) {
            if (lr.kind != FERRY_MEM_HOST) return false;  // staged through pinned slices, maybe
            continue;
        }
        out = Route{};
        out.transport = t;
        out.region = &seg.descriptor.regions[rr.index];  // not read here
        out.row = &rr;
        if (!seg.peers[t]) {
            out.need = Route::Need::Connect;
        } else {
            out.peer = *seg.peers[t];
            if (rr.imported_mask & bit) out.remote_mem = rr.imported[t];
            else out.need = Route::Need::Import;
        }
        return true;
    }
    return false;
}

// What routing an op already tried: the connector's transports that failed to connect or
// import for it (skipped with their error), and whether a missing region may still be looked
// for by re-reading the descriptor.
struct RouteAttempts {
    bool may_refresh = true;
    bool failover = false;  // the op failed on a path: paused paths are skipped, never probed
    std::vector<std::pair<size_t, std::string>> failed;
};

// Ops ready to post: grouped by transport and peer, and the staged GPU ops.
struct Posting {
    struct Group {
        size_t transport;
        uint64_t peer;
        std::vector<ferry_xfer_op_t> ops;
    };
    std::vector<Group> groups;
    std::vector<std::shared_ptr<StagedOp>> staged;
    // Ops the batch may still add: a new group reserves room for them (most batches go to one
    // peer on one transport), so no op pays for the vector's growth.
    size_t expected = 0;
    size_t last = 0;  // the group the previous op joined
};

inline const char *op_name(Opcode op) { return op == Opcode::Read ? "READ" : "WRITE"; }

struct Engine::Impl {
    EngineSettings settings;
    std::string host_id;
    PluginReport plugin_report;
    SharedBuffers shared_buffers;  // before transports: unmapped only after they are destroyed
    std::vector<std::unique_ptr<Transport>> transports;
    std::vector<std::vector<uint8_t>> endpoints;  // per transport
    std::vector<size_t> priority;                 // transport indices, best first
    std::unique_ptr<ControlServer> control;       // descriptors (P2PHANDSHAKE) and notifications
    std::unique_ptr<MetadataBackend> metadata;
    // metadata->segment_name(), kept here: the control server's thread reads it (through
    // descriptor_locked) until control stops, which is after metadata is destroyed.
    std::string segment_name;

    std::shared_mutex regions_mutex;
    RegionIndex regions;  // by start address; its lookup is flat (region_index.hpp)
    uint64_t generation = 0;
    // P2PHANDSHAKE serves the descriptor on request (encoded_descriptor), so registering is
    // O(log n); other backends get every change published.
    bool on_demand = false;
    // Other backends (etcd) get each change: queued under regions_mutex (exclusive) in the
    // order the changes happened, then written by publish_queued after that lock is released,
    // so submits never wait behind the store's network I/O. One publisher at a time drains the
    // queue in order (a later change is never overwritten by an earlier one); each register
    // returns once its own change was written, often with others' in the same transaction.
    std::mutex publish_mutex;    // held across the write; never taken with regions_mutex held
    uint64_t published_seq = 0;  // guarded by publish_mutex
    std::mutex queue_mutex;      // guards the three below; taken under regions_mutex (exclusive)
    std::vector<RegionChange> queued;
    uint64_t queued_seq = 0;
    uint64_t queued_generation = 0;
    std::mutex encoded_mutex;  // guards the two below; taken under regions_mutex (shared)
    std::shared_ptr<const std::vector<uint8_t>> encoded;
    uint64_t encoded_generation = 0;

    std::mutex segments_mutex;
    std::unordered_map<SegmentId, std::shared_ptr<RemoteSegment>> segments;
    std::unordered_map<std::string, SegmentId> segment_ids;
    SegmentId next_segment = 1;

    // Block tables (blocks.cpp): KV pages named once, moved by index.
    std::mutex block_tables_mutex;
    std::unordered_map<BlockTableId, std::shared_ptr<BlockTable>> block_tables;
    BlockTableId next_block_table = 1;

    std::mutex batches_mutex;
    std::unordered_map<BatchId, std::shared_ptr<Batch>> batches;
    std::atomic<BatchId> next_batch{1};
    // Per transport index, and one more for ops that failed before a transport took them.
    std::vector<std::unique_ptr<TransportCounters>> counters;
    TransportCounters &counters_of(uint16_t transport) {
        return *counters[transport == kNoTransport ? counters.size() - 1 : transport];
    }
    std::unique_ptr<MetricsExporter> metrics;  // metrics_port: the Prometheus endpoint

    // Progress: one thread at a time sleeps on the transports' completion fds and dispatches;
    // the others wait on `progress_cv` for their batches.
    std::vector<std::unique_ptr<std::mutex>> poll_mutexes;  // per transport
    std::mutex progress_mutex;
    std::condition_variable progress_cv;
    bool progress_driver = false;
    Fd wake_fd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)};  // wakes the driver when another thread finishes a batch

    // GPU staging (stage_service.hpp): pinned slices and async copies for both ends.
    std::unique_ptr<StagingService> staging;
    std::mutex slice_handles_mutex;
    std::map<std::pair<void *, size_t>, uint64_t> slice_handles;  // (slice, transport) -> registration
    std::mutex staging_waiters_mutex;
    std::deque<StagingWaiter> staging_waiters;  // ops and packs waiting for a pinned slice
    // Per memory kind: the transport whose copy_local gathers and scatters packs (nullopt: the
    // staging runtime copies them, one call each), looked up once.
    std::mutex gather_mutex;
    std::map<uint32_t, std::optional<size_t>> gather_transport;
    std::atomic<bool> stopping{false};

    // Batch notifications go out on their own thread (notify.cpp), so that a slow receiver
    // never holds up the progress of other batches.
    std::mutex notifier_mutex;
    std::condition_variable notifier_cv;
    std::deque<Batch *> notifier_queue;  // batches whose ops all succeeded, oldest first
    bool notifier_stopped = false;
    std::thread notifier;

    // Batches ordered on CUDA streams (stream_submit.cpp): the host functions on callers'
    // streams hand them to one worker thread, which posts them and drives them to their end.
    std::shared_ptr<StreamHub> stream_hub = std::make_shared<StreamHub>();
    std::thread stream_worker;  // started by the first submit_on_stream, under stream_hub->mutex

    // The connector (connector.cpp): threads that fetch descriptors, connect and import for
    // deferred ops, one segment per thread at a time, so one slow peer holds up only itself.
    std::mutex connector_mutex;
    std::condition_variable connector_cv;
    std::deque<std::shared_ptr<RemoteSegment>> connector_queue;  // segments with deferred ops
    std::vector<std::thread> connector_threads;
    size_t connector_idle = 0;
    bool connector_stopped = false;  // guarded by connector_mutex
    std::atomic<bool> connector_stopping{false};

    ~Impl();

    // registration.cpp
    Result<void> publish_locked();  // the whole descriptor, at engine creation (regions_mutex held)
    // A region changed (regions_mutex held exclusively): bumps the generation; for a backend that
    // is published to, queues the change and returns its number for publish_queued (else 0).
    uint64_t queue_change_locked(RegionChange change);
    Result<void> publish_queued(uint64_t seq);  // without regions_mutex: writes up to `seq`
    RegionDescriptor region_descriptor(const LocalRegion &region) const;
    SegmentDescriptor descriptor_locked() const;
    std::shared_ptr<const std::vector<uint8_t>> encoded_descriptor();
    // engine.cpp
    std::optional<size_t> transport_index(std::string_view name) const;
    std::shared_ptr<RemoteSegment> segment(SegmentId id);
    // Re-reads the descriptor (the network; call without seg.mutex), then applies it under it.
    Result<void> refresh_segment(RemoteSegment &seg);

    // staging.cpp
    GpuStager *stager(uint32_t kind, std::string &why);
    // A slice's registration with the transport that carries it, made once per (slice, transport).
    Result<uint64_t> slice_handle(void *buf, size_t transport);
    // Starts moving a staged op's slices; never blocks on a GPU copy.
    // True when it took a slice or queued itself for one (so a slice given back was used).
    bool stage_start(const std::shared_ptr<StagedOp> &op);
    void release_staged_ops();  // teardown, once no transport can complete a slice
    void stage_retry_waiters();
    // A transport completion of one slice (user_data with the low bit set).
    void stage_wire_done(StagedSlice &slice, int code, std::string_view message);
    // Deregisters every slice from the transports and stops the copies (engine teardown).
    void stop_staging();

    // staging_gather.cpp
    // Starts the staged ops of one submit: small ones to one (transport, peer) share slices.
    void stage_post(std::vector<std::shared_ptr<StagedOp>> &ops);
    // Lends a pack its slice and starts it; true when it took a slice or queued for one.
    bool pack_start(const std::shared_ptr<StagedPack> &pack);
    // A pack's gather (WRITE) ended: its ops go on the wire.
    void pack_gathered(const std::shared_ptr<StagedPack> &pack, int status, const std::string &message);
    // A packed READ slice's wire transfer ended; the last one starts the scatter.
    void pack_wire_done(StagedSlice &slice, int code, std::string_view message);
    // The transport whose copy_local copies packs of memory `kind`, if any.
    std::optional<size_t> gather_transport_for(uint32_t kind);
    // A pack's gather or scatter ended (user_data with bit 1 set, or the staging runtime's).
    static void pack_copied(StagedPack &pack, int status, const std::string &message);
    // Copies a pack's parts (gather or scatter) and calls pack.copied once.
    void pack_copy(const std::shared_ptr<StagedPack> &pack, std::vector<ferry_local_copy_t> copies);
    // A slice ended: its op takes the outcome, the buffer goes back, the op moves on.
    void stage_slice_over(StagedSlice &slice, int status, std::string_view why);

    // submit.cpp: checks what is known locally, posts what is routable now, defers the rest.
    // Never waits on the network.
    Result<BatchId> submit(std::span<const Request> requests,
                           std::unique_ptr<PendingNotification> notification = nullptr);
    // submit_on_stream's two halves: the checks submit makes, on a batch created and listed
    // (waitable) but with nothing posted; then, when its stream reached it, planning and posting
    // it anew, or failing every op with what refuses it now.
    Result<std::shared_ptr<Batch>> prepare_batch(std::span<const Request> requests);
    void start_batch(Batch &batch, std::span<const Request> requests);
    // Routes every op of the batch into `ready` (post now) or `deferred` (the connector first),
    // or refuses the batch at its first op that is refused; takes nothing.
    Result<void> plan(Batch &batch, std::span<const Request> requests, Posting &ready, Deferrals &deferred);

    // storage.cpp
    Result<SegmentId> open_storage_segment(const std::string &name);

    // route.cpp
    // The op's local region, after the checks that need nothing remote (regions_mutex held).
    // `found`: what regions.find answered for it already (find_many), else it looks.
    Result<const LocalRow *> local_region(const Request &rq, size_t index,
                                          std::optional<const LocalRow *> found = std::nullopt) const;
    // Picks the op's transport from what is cached (seg.mutex held); never touches the network.
    // `row`: what seg.rows.find answered for the remote range already, else it looks.
    Result<Route> route(RemoteSegment &seg, const Request &rq, size_t index, const LocalRow &lr,
                        const RouteAttempts &attempts, std::optional<size_t> row = std::nullopt);
    void add_ready(Posting &posting, OpRecord &op, const Request &rq, const LocalRow &lr, const Route &r);
    void reindex(RemoteSegment &seg) const;  // seg.reindex with this engine's transports
    void post(Posting &posting);

    // connector.cpp: descriptor fetches, connects and imports, on connector threads.
    void defer(const std::shared_ptr<RemoteSegment> &seg, std::vector<DeferredOp> ops);
    void connector_loop();
    void serve_segment(RemoteSegment &seg);
    void stop_connector();  // fails what waits, joins (a connect in a plugin ends by its own timeout)

    // batch.cpp
    void progress(int timeout_ms);
    // Drives progress (or waits for the thread that does) until done() or the deadline; false
    // at the deadline. done() runs under progress_mutex: whatever makes it true without
    // completing an op calls wake_progress() afterwards.
    bool progress_until(const std::function<bool()> &done, std::chrono::steady_clock::time_point deadline);
    void wake_progress();
    size_t drain(size_t transport);
    EngineStats stats();  // engine.cpp, from the counters (transfer_stats.hpp)
    void complete(OpRecord &op, int code, std::string_view message);
    // complete() without releasing the op's share of its batch: the caller releases the shares
    // of a run of ops of one batch at once (release_share with a count).
    bool finish(OpRecord &op, int code, std::string_view message);
    // Releases `n` shares of batch.remaining (ops' or the notification's); wakes waiters on the
    // last one.
    void release_share(Batch &batch, size_t n = 1);

    // failover.cpp
    // An op of `transport` failed with `code`: when that is a broken path and the op may move,
    // pauses the path, notes the attempt and hands the op to the connector to be posted on
    // another path; true when it took the op (the caller neither finishes nor counts it).
    bool fail_over(OpRecord &op, size_t transport, int code, std::string_view message);
    // Pauses the path (seg.mutex held); the pause doubles for each failure within path_cooldown_max of the previous one.
    void pause_path(RemoteSegment &seg, size_t transport, std::string why);

    // notify.cpp
    Result<void> send_notification(RemoteSegment &seg, std::span<const uint8_t> message);
    // Every op of a batch with a notification finished: queue it for the notifier, or drop it
    // when an op failed.
    void batch_ops_finished(Batch &batch);
    void notifier_loop();
    void stop_notifier();  // drops what is queued; the first thing ~Impl does
    Result<void> wait(BatchId batch, std::chrono::milliseconds timeout);
    std::shared_ptr<Batch> find_batch(BatchId id);

    // blocks.cpp
    Result<BlockTableId> create_block_table(SegmentId segment, std::span<const uint64_t> addrs,
                                            std::span<const uint64_t> lengths);
    Result<void> destroy_block_table(BlockTableId id);
    Result<BatchId> submit_blocks(Opcode opcode, BlockTableId local, std::span<const uint32_t> local_index,
                                  BlockTableId remote, std::span<const uint32_t> remote_index);
    // The plugin's lists of both tables on the path the transfer's first pair took (an import of
    // every region the remote table names first, where missing); false where there is none.
    bool prepare_block_path(BlockTable &local, BlockTable &remote, RemoteSegment &seg, size_t transport);
    // Posts the transfer whole on the tables' prepared path; nullopt where it has none now.
    std::optional<Result<BatchId>> post_blocks(Opcode opcode, BlockTable &local, std::span<const uint32_t> local_index,
                                               BlockTable &remote, std::span<const uint32_t> remote_index,
                                               uint64_t bytes);

    // stream_submit.cpp
    Result<BatchId> submit_on_stream(std::span<const Request> requests, void *stream, bool detach);
    void stream_loop();
    // Teardown, first: cancels the calls no stream posted yet and joins the worker. Last, once
    // the transports are gone (no byte of theirs can move): lets the posted ones' streams go on.
    void stop_stream_calls();
    void release_stream_calls();
};

// A peer's region as the plugin ABI passes it to import_mem.
inline ferry_mem_region_t to_abi(const RegionDescriptor &r) {
    return ferry_mem_region_t{r.addr, r.length, r.kind, r.device, r.access, 0};
}

// "file:<path>": a storage segment (storage.cpp).
inline bool is_storage_segment(std::string_view name) { return name.starts_with("file:"); }

// wait()'s error for a finished batch: how many ops failed and the first few; ok when none did.
Result<void> batch_failures(const Batch &batch);

}  // namespace ferry
