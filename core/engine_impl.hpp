// Engine internals shared by engine.cpp (setup, memory, segments) and batch.cpp (submit,
// progress, wait).
#pragma once

#include <sys/eventfd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "config.hpp"
#include "control_client.hpp"
#include "control_server.hpp"
#include "descriptor.hpp"
#include "fd.hpp"
#include "gpu_staging.hpp"
#include "ferry/engine.hpp"
#include "metadata.hpp"
#include "plugin_loader.hpp"
#include "transport.hpp"

namespace ferry {

struct LocalRegion {
    uint64_t addr = 0;
    uint64_t length = 0;
    uint32_t kind = 0;
    int32_t device = -1;
    uint32_t access = 0;
    // Registration handle per transport index; nullopt where that transport cannot move it.
    std::vector<std::optional<uint64_t>> handles;
    std::vector<std::vector<uint8_t>> keys;

    uint64_t end() const { return addr + length; }
};

struct RemoteSegment {
    SegmentId id = 0;
    std::string name;
    std::atomic<bool> stale{false}; // the metadata backend says the descriptor changed
    std::mutex mutex; // guards everything below
    SegmentDescriptor descriptor;
    bool same_host = false;
    std::vector<std::optional<uint64_t>> peers;                 // per transport index
    // Transports whose connect to this segment failed: skipped (falling back to the next one)
    // until the retry time passes.
    std::map<size_t, std::pair<std::chrono::steady_clock::time_point, std::string>> unusable;
    std::map<std::pair<size_t, uint64_t>, uint64_t> imported;   // (transport, region addr) -> handle

    // Control connection for notifications; its own lock, so a slow peer never holds up
    // submits to this segment.
    std::mutex control_mutex;
    std::optional<ControlClient> control; // guarded by control_mutex
};

// A pinned host buffer registered with one transport, standing in for GPU memory that
// transport cannot touch.
struct StagingBuffer {
    void *ptr = nullptr;
    uint64_t size = 0;
    uint32_t kind = 0;
    int device = -1;
    size_t transport = 0;
    uint64_t handle = 0;
};

struct Staging {
    StagingBuffer buffer;
    void *gpu = nullptr; // the op's GPU address
    uint64_t length = 0;
    bool read = false;   // READ: copy to the GPU once the transport is done
};

struct Batch;

struct OpRecord {
    Batch *batch = nullptr;
    std::atomic<uint32_t> state{static_cast<uint32_t>(OpState::Pending)};
    int code = 0;
    uint16_t transport = 0;
    std::string message; // written before state is released as Failed
    std::optional<Staging> staging;
    Opcode opcode = Opcode::Read; // what the op was, for wait()'s message
    uint64_t length = 0;
};

// submit_with_notification: sent to `segment` once every op of its batch succeeded. It holds
// one share of the batch's `remaining` until it was delivered or dropped, so wait() and
// free_batch see the batch in flight until then.
struct PendingNotification {
    std::shared_ptr<RemoteSegment> segment;
    std::vector<uint8_t> message;
    int code = 0;      // the outcome; written before the last share is released
    std::string error;
};

struct Batch {
    BatchId id = 0;
    size_t size = 0;
    std::unique_ptr<OpRecord[]> ops;
    std::atomic<size_t> remaining{0}; // ops in flight, plus one while `notification` is unsent
    std::unique_ptr<PendingNotification> notification;
};

struct Engine::Impl {
    EngineSettings settings;
    std::string host_id;
    PluginReport plugin_report;
    std::vector<std::unique_ptr<Transport>> transports;
    std::vector<std::vector<uint8_t>> endpoints; // per transport
    std::vector<size_t> priority;                // transport indices, best first
    std::unique_ptr<ControlServer> control; // descriptors (P2PHANDSHAKE) and notifications
    std::unique_ptr<MetadataBackend> metadata;

    std::shared_mutex regions_mutex;
    std::map<uint64_t, LocalRegion> regions; // by start address
    uint64_t generation = 0;

    std::mutex segments_mutex;
    std::unordered_map<SegmentId, std::shared_ptr<RemoteSegment>> segments;
    std::unordered_map<std::string, SegmentId> segment_ids;
    SegmentId next_segment = 1;

    std::mutex batches_mutex;
    std::unordered_map<BatchId, std::shared_ptr<Batch>> batches;
    std::atomic<BatchId> next_batch{1};

    // Progress: one thread at a time sleeps on the transports' completion fds and dispatches;
    // the others wait on `progress_cv` for their batches.
    std::vector<std::unique_ptr<std::mutex>> poll_mutexes; // per transport
    std::mutex progress_mutex;
    std::condition_variable progress_cv;
    bool progress_driver = false;
    Fd wake_fd{::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)}; // wakes the driver when another thread finishes a batch

    // GPU staging (gpu_staging.hpp), opened on first use per memory kind.
    std::mutex staging_mutex;
    std::map<uint32_t, std::unique_ptr<GpuStager>> stagers;
    std::map<uint32_t, std::string> stager_errors;
    std::multimap<std::tuple<size_t, uint32_t, int, uint64_t>, StagingBuffer> staging_free;
    std::vector<StagingBuffer> staging_all;

    // Batch notifications go out on their own thread (notify.cpp), so that a slow receiver
    // never holds up the progress of other batches.
    std::mutex notifier_mutex;
    std::condition_variable notifier_cv;
    std::deque<Batch *> notifier_queue; // batches whose ops all succeeded, oldest first
    bool notifier_stopped = false;
    std::thread notifier;

    ~Impl();

    // engine.cpp
    Result<void> publish_locked();
    std::optional<size_t> transport_index(std::string_view name) const;
    std::shared_ptr<RemoteSegment> segment(SegmentId id);
    Result<void> refresh_segment(RemoteSegment &seg);
    Result<uint64_t> peer_for(RemoteSegment &seg, size_t transport);
    Result<uint64_t> import_for(RemoteSegment &seg, size_t transport, const RegionDescriptor &region);

    // staging.cpp
    GpuStager *stager(uint32_t kind, std::string &why);
    Result<StagingBuffer> take_staging(size_t transport, uint32_t kind, int device, uint64_t length);
    void give_staging(const StagingBuffer &buffer);
    // Deregisters every staging buffer; the caller frees them once the transports are gone.
    std::vector<StagingBuffer> release_staging();

    // batch.cpp
    Result<BatchId> submit(std::span<const Request> requests,
                           std::unique_ptr<PendingNotification> notification = nullptr);
    void progress(int timeout_ms);
    size_t drain(size_t transport);
    void complete(OpRecord &op, int code, std::string_view message);
    // Releases one share of batch.remaining (an op's or the notification's); wakes waiters on
    // the last one.
    void release_share(Batch &batch);

    // notify.cpp
    Result<void> send_notification(RemoteSegment &seg, std::span<const uint8_t> message);
    // Every op of a batch with a notification finished: queue it for the notifier, or drop it
    // when an op failed.
    void batch_ops_finished(Batch &batch);
    void notifier_loop();
    void stop_notifier(); // drops what is queued; the first thing ~Impl does
    Result<void> wait(BatchId batch, std::chrono::milliseconds timeout);
    std::shared_ptr<Batch> find_batch(BatchId id);
};

} // namespace ferry
