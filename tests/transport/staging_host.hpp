// A test host for FERRY_CAP_STAGED_DEVICE plugins (plugin.h ABI 1.1 staging calls), without a
// GPU: "device" memory is a PROT_NONE mapping of a memfd, so a plugin that dereferences a device
// address crashes the test; the host's copies go through a second, read-write alias of the same
// memfd, on one copy thread of the test (in the order they were started, done() from that
// thread). Counts every buffer lent and given back, bounds the bytes lent (-EAGAIN past it),
// fails the n-th copy on request, and records misuse (release during a copy, unknown buffers,
// copies outside a device region) for the tests to assert on.
#pragma once

#include <ferry/plugin.h>

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <mutex>
#include <set>
#include <string>
#include <thread>
#include <vector>

namespace ferry_test {

class DeviceMemory {
public:
    explicit DeviceMemory(size_t len);  // throws std::runtime_error
    ~DeviceMemory();
    DeviceMemory(const DeviceMemory &) = delete;
    DeviceMemory &operator=(const DeviceMemory &) = delete;
    uint64_t addr() const { return reinterpret_cast<uint64_t>(dev_); }  // PROT_NONE
    uint8_t *alias() const { return alias_; }                           // the test's view
    size_t size() const { return len_; }

private:
    size_t len_;
    int fd_ = -1;
    uint8_t *dev_ = nullptr;
    uint8_t *alias_ = nullptr;
};

struct StagingStats {
    uint64_t acquired = 0, released = 0, eagain = 0, copies = 0, failed_copies = 0;
    uint64_t part_copies = 0, parts = 0;  // stage_copy_parts calls (counted in copies too), their parts
    uint64_t held = 0, peak_held_bytes = 0;
    std::vector<std::string> misuse;
};

class StagingHost {
public:
    StagingHost(uint64_t slice_bytes, uint64_t max_bytes);
    ~StagingHost();  // joins the copy thread (after the queued copies)
    StagingHost(const StagingHost &) = delete;
    StagingHost &operator=(const StagingHost &) = delete;

    const ferry_host_api_t *api() const { return &api_; }
    void add_device(const DeviceMemory &m);
    // Whether stage_copy_parts is offered (ABI 1.7; default yes): off, the host is an ABI 1.6 one.
    void offer_parts(bool on);
    // The copy numbered n (0 = the next one started) completes with `status` and a message.
    void fail_copy(uint64_t n, int status = -EIO);
    void set_copy_delay(std::chrono::milliseconds d);  // each copy takes at least this long
    // Each release returns to the plugin this long after the buffer was given back (a plugin
    // thread preempted there): widens the gap between two slices, where "nothing lent" does not
    // yet mean "done with that peer".
    void set_release_delay(std::chrono::milliseconds d);
    // Runs in the copy thread just before each copy's bytes move (to_device, device addr, len).
    void on_copy(std::function<void(bool, uint64_t, uint64_t)> fn);
    StagingStats stats() const;
    // Until nothing is lent and no copy is queued; false after `limit`.
    bool wait_idle(std::chrono::milliseconds limit);
    static constexpr const char *kFailText = "injected staging copy failure";

private:
    struct Copy {
        uint64_t dev;
        void *buf;
        uint64_t len;
        bool to_device;
        void (*done)(void *, int, const char *);
        void *arg;
        uint64_t seq;
        std::vector<ferry_stage_part_t> parts;  // a stage_copy_parts call (dev, len unused)
    };
    static int acquire_cb(void *ctx, uint32_t kind, int32_t dev, uint64_t bytes, void **buf, ferry_error_t *err);
    static void release_cb(void *ctx, void *buf);
    static int copy_cb(void *ctx, uint32_t kind, int32_t dev, uint64_t addr, void *buf, uint64_t bytes, int to_device,
                       void (*done)(void *, int, const char *), void *arg, ferry_error_t *err);
    static int copy_parts_cb(void *ctx, uint32_t kind, int32_t dev, const ferry_stage_part_t *parts, size_t n,
                             void *buf, int to_device, void (*done)(void *, int, const char *), void *arg,
                             ferry_error_t *err);
    void loop();
    uint8_t *translate(uint64_t dev, uint64_t len);  // nullptr: not inside a device region

    ferry_host_api_t api_{};
    const uint64_t slice_, max_;
    mutable std::mutex mu_;
    std::condition_variable cv_;
    std::deque<Copy> queue_;
    bool stop_ = false;
    std::set<void *> lent_;
    std::set<void *> copying_;
    std::vector<const DeviceMemory *> devs_;
    std::set<uint64_t> fail_at_;
    int fail_status_ = -EIO;
    uint64_t next_seq_ = 0;
    std::chrono::milliseconds delay_{0};
    std::chrono::milliseconds release_delay_{0};
    std::function<void(bool, uint64_t, uint64_t)> on_copy_;
    StagingStats st_;
    std::thread thread_;
};

}  // namespace ferry_test
