// core/staging/: GPU memory moved through pinned host memory for transports that move host memory
// only: the service that lends pinned slices and runs the copies (this file), for the plugins'
// staged serving and the engine's own pipeline (engine/staging.cpp), and the GPU runtimes' copy
// calls, loaded at run time (gpu_staging.hpp).
// May include: loader/, util/
//
// Pinned host memory and asynchronous GPU copies for staging device memory through host-only
// transports, shared by both ends: the plugins serving a peer's access to our device memory
// (ABI 1.1 ferry_host_api_t.stage_*) and the engine's own initiator-side pipeline (staging.cpp).
//
// - Pinned slices of `slice_bytes` are lent out; at most `max_bytes` at once (acquire says
//   -EAGAIN at the bound). Slices are allocated on first need and reused until the engine ends.
// - Copies go on one non-blocking stream per (kind, device) with an event each; one completion
//   thread per (kind, device) waits on the events in order and calls `done`, never from inside
//   copy().
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <thread>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "ferry/engine.hpp"
#include "ferry/plugin.h"
#include "staging/gpu_staging.hpp"

namespace ferry {

class StagingService {
public:
    using Done = std::function<void(int status, const std::string &message)>;

    // max_bytes 0: staging disabled (runtimes still open, for check and auto-detection).
    StagingService(uint64_t max_bytes, uint64_t slice_bytes);
    ~StagingService();
    StagingService(const StagingService &) = delete;
    StagingService &operator=(const StagingService &) = delete;

    // The runtime for `kind`, opened once; nullptr with `why` when it is missing.
    GpuStager *stager(uint32_t kind, std::string &why);
    // Staging for `kind` is enabled and its runtime loads; `why` says why not.
    bool offers(uint32_t kind, std::string &why);
    uint64_t slice_bytes() const { return slice_bytes_; }

    // A pinned slice for device memory of (kind, device); -EAGAIN at the bound.
    Result<void *> acquire(uint32_t kind, int device);
    // Gives a slice back. `inline_retry`: run on_release on this thread; plugins' releases
    // (which may hold the plugin's own locks) hand it to the service's retry thread instead.
    void release(void *buf, bool inline_retry = true);
    // Called (outside every lock of the service) after each release, so waiters can retry.
    // Set once, before any slice is lent.
    void set_on_release(std::function<void()> fn) { on_release_ = std::move(fn); }

    // Starts a copy of `bytes` from src to dst (one of them device memory of (kind, device), the
    // other pinned); `done` runs later on the device's completion thread, in start order.
    Result<void> copy(uint32_t kind, int device, void *dst, const void *src, uint64_t bytes, Done done);
    // Starts several copies behind one completion: `done` runs once, after the last.
    Result<void> copy(uint32_t kind, int device, std::span<const GpuStager::CopyRange> copies, Done done);
    // Counts a pack's gather or scatter of `ops` small ops through one slice (the engine's own).
    void count_gather(size_t ops, bool by_transport) {
        std::lock_guard lock(mutex_);
        ++gathers_;
        gathered_ops_ += ops;
        gathers_by_transport_ += by_transport;
    }

    // Counts a serving plugin's buffer shared by `parts` small requests (stage_copy_parts).
    void count_served_pack(size_t parts) {
        std::lock_guard lock(mutex_);
        ++served_packs_;
        served_packed_requests_ += parts;
    }

    StagingStats stats();
    // Refuses new copies and slices, waits for the started copies (their `done` runs), joins
    // the completion threads. Slices stay valid until the destructor.
    void stop();

    // Fills the ABI 1.1 stage_* members when staging is enabled and some GPU runtime loads.
    void fill_host_api(ferry_host_api_t &host);
    // Every pinned slice, for deregistering them from transports.
    std::vector<void *> slices();

private:
    struct Lane;
    struct Slice {
        uint32_t kind;
        int device;
        bool lent;
    };
    Lane *lane(uint32_t kind, int device, GpuStager *s);

    const uint64_t max_bytes_, slice_bytes_;
    std::mutex mutex_;  // guards everything below, and stagers
    std::map<uint32_t, std::unique_ptr<GpuStager>> stagers_;
    std::map<uint32_t, std::string> stager_errors_;
    std::unordered_map<void *, Slice> slices_;
    std::map<std::pair<uint32_t, int>, std::vector<void *>> free_;
    std::map<std::pair<uint32_t, int>, std::unique_ptr<Lane>> lanes_;
    uint64_t lent_ = 0, peak_ = 0, acquire_refused_ = 0, copies_ = 0, copy_failures_ = 0, gathers_ = 0,
             gathered_ops_ = 0, gathers_by_transport_ = 0, served_packs_ = 0, served_packed_requests_ = 0;
    bool stopping_ = false;
    std::function<void()> on_release_;
    // Runs on_release for plugins' releases, off their threads.
    std::thread retry_thread_;
    std::condition_variable retry_cv_;
    bool retry_pending_ = false, retry_stop_ = false;
    void retry_loop();
};

}  // namespace ferry
