// Serving device memory without touching it (FERRY_CAP_STAGED_DEVICE, plugin.h ABI 1.1): the
// transport-independent half of the staging pipeline, shared by tcp.so, shm.so and efa.so.
// - Stager: one per transport instance. Says whether the host offers staging, checks device
//   regions at register_mem, and counts the buffers the instance borrowed (destroy waits for
//   every copy to end and every buffer to come back).
// - StageWindow: one owner's pipeline (a served connection, one op): at most `depth` borrowed
//   buffers; each slice's copy is started with stage_copy and reported by the host's done
//   callback, which wakes the owner (its notify function, and a condition variable for owners
//   that wait in place). A slice released while its copy still runs is given back when the copy
//   ends, so an owner can drop everything at once (peer gone, failure) and never blocks.
// - stage_run: the whole pipeline of one op for owners that copy synchronously (shm.so's
//   workers): device -> buffer -> `io` (READ), or `io` -> buffer -> device (WRITE).
// Builds against plugin.h and the C++ library alone (no other plugins/common file).
#pragma once

#include <ferry/plugin.h>

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <string>

namespace ferry_staged {

// Slices in flight per owner: the copy of slice k+1 (and k+2, k+3) runs while slice k is on the
// wire; more buys nothing once the copy is faster than the network, and costs pinned memory.
inline constexpr unsigned kDefaultDepth = 4;

class Stager;
struct WindowCore;

// One borrowed buffer and the copy running on it. Fields are read by the owner only after
// copied() (done() was called).
class Slice {
public:
    void *buf() const { return buf_; }
    uint64_t offset() const { return off_; }  // in the owner's op (or stream)
    uint64_t length() const { return len_; }
    bool copied() const;          // the copy finished (with status())
    int status() const;           // 0 or the copy's negative code
    std::string message() const;  // the host's message when status() != 0
    uint64_t tag = 0;             // the owner's (request id, ...)
    // Called once the buffer is back with the host (no copy runs on the device range any
    // more): owners drop their reference on the registered region here. Any thread.
    std::function<void()> on_release;

private:
    friend class StageWindow;
    friend void on_copy_done(void *, int, const char *);
    std::shared_ptr<WindowCore> core_;
    std::shared_ptr<Slice> self_;  // keeps the slice alive while its copy runs
    void *buf_ = nullptr;
    uint32_t kind_ = 0;
    int32_t device_id_ = -1;
    uint64_t off_ = 0;
    uint64_t len_ = 0;
    enum class Phase { Held, Copying, Copied, Released } phase_ = Phase::Held;
    bool release_when_copied_ = false;
    unsigned holders_ = 1;  // owners that each release it once (a buffer of packed parts)
    int status_ = 0;
    std::string message_;
};
using SlicePtr = std::shared_ptr<Slice>;

class Stager {
public:
    Stager(const ferry_host_api_t *host, const char *plugin);
    ~Stager();  // waits like wait_idle()
    Stager(const Stager &) = delete;
    Stager &operator=(const Stager &) = delete;

    // The host lends buffers (struct_size covers the stage_* fields, all non-NULL, slice > 0).
    bool offered() const { return offered_; }
    uint64_t slice_bytes() const { return offered_ ? host_->stage_slice_bytes : 0; }
    // register_mem: 0 for host memory or a device region the host can stage; else a negative code
    // and the reason (old host, staging disabled, unknown kind).
    int check_region(const ferry_mem_region_t &r, std::string *why) const;
    uint64_t held() const;  // buffers this instance has borrowed now
    // Sync owners whose acquire found the bound reached while holding nothing themselves: waits
    // up to `ms` for any buffer of this instance to come back. False when it holds none.
    bool wait_release(unsigned ms);
    void wait_idle();  // every copy ended, every buffer released

private:
    friend class StageWindow;
    friend void on_copy_done(void *, int, const char *);
    void released();  // one buffer came back

    const ferry_host_api_t *host_;
    const char *plugin_;
    bool offered_ = false;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    uint64_t held_ = 0;
    uint64_t releases_ = 0;  // buffers given back so far: tells a lost race from a full bound
};

struct WindowCore {
    Stager *stager = nullptr;
    std::mutex mu;
    std::condition_variable cv;    // a copy ended or a buffer came back
    std::function<void()> notify;  // the owner's wake-up (cleared on detach), called under mu
    unsigned held = 0;             // buffers of this window
};

class StageWindow {
public:
    // notify: called from the host's thread (under the window's lock: it must not call back
    // into the window) whenever one of the window's copies ends; may be empty.
    StageWindow(Stager &s, unsigned depth, std::function<void()> notify = {});
    ~StageWindow();  // detach(): every slice is given back (those still copying, when they end)
    StageWindow(const StageWindow &) = delete;
    StageWindow &operator=(const StageWindow &) = delete;

    enum class Got { Slice, Wait, Fail };
    // Borrows a buffer for `len` (<= slice_bytes) bytes at `offset` of the owner's op, for device
    // memory of (kind, device_id).
    // Wait: depth reached, or the host's bound reached while this window holds buffers (retry
    // once one of them is released); or the bound is reached and the instance holds buffers of
    // other owners (retry after Stager::wait_release / a timer). Fail: *code, *why (the bound
    // reached with no buffer of this instance out: naming gpu_staging_max_bytes).
    Got acquire(uint32_t kind, int32_t device_id, uint64_t offset, uint64_t len, SlicePtr *out, int *code,
                std::string *why);
    // Starts the copy of the slice's bytes to (to_device) or from device_addr. On failure the
    // slice stays held (release it) and *why says why.
    int copy(const SlicePtr &s, uint64_t device_addr, bool to_device, std::string *why);
    // Whether the host takes many parts in one copy (ABI 1.7 stage_copy_parts).
    bool parts_offered() const;
    // Starts one copy of n parts of the slice's buffer (stage_copy_parts); as copy otherwise.
    int copy_parts(const SlicePtr &s, const ferry_stage_part_t *parts, size_t n, bool to_device, std::string *why);
    // The slice is held by `holders` owners from now on (one per packed request), each of whom
    // releases it once; the buffer goes back with the last release.
    void share(const SlicePtr &s, unsigned holders);
    // Gives the buffer back (at once, or when its running copy ends).
    void release(const SlicePtr &s);
    // Sync owners: blocks until s->copied().
    void wait_copied(const SlicePtr &s);
    unsigned held() const;
    unsigned depth() const { return depth_; }
    uint64_t slice_bytes() const { return stager_.slice_bytes(); }
    void detach();  // stop notifying the owner
    // Sync owners told Wait while holding nothing: the bound is held by other owners of this
    // instance; waits a little for one of their buffers to come back.
    void stager_wait_release() { stager_.wait_release(50); }

private:
    void release_locked(Slice &s);
    int start_copy(const SlicePtr &s, bool to_device, std::string *why,
                   const std::function<int(ferry_error_t *)> &call);
    Stager &stager_;
    const unsigned depth_;
    std::shared_ptr<WindowCore> core_;
};

// The pipeline of one op, run in the calling thread: READ (to_device false) copies each slice
// device -> buffer and then hands it to io(buf, offset, len); WRITE fills each slice with io and
// copies it buffer -> device. Up to window.depth() slices overlap. Returns 0 once every slice is
// where it belongs, or the first failure's code with *why; either way no copy runs any more and
// every buffer is back when it returns.
int stage_run(StageWindow &w, uint32_t kind, int32_t device_id, uint64_t device_addr, uint64_t len, bool to_device,
              const std::function<int(void *buf, uint64_t off, uint64_t len, std::string *why)> &io, std::string *why);

const char *kind_name(uint32_t kind);

}  // namespace ferry_staged
