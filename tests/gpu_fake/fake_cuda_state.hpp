// What the fake CUDA driver's files share (fake_cuda.cpp says what the fake is and how strict):
// its state, the stream and event records, and the calls that check a context, translate device
// addresses and queue copies.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <map>
#include <mutex>
#include <thread>

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace fake_cuda {

using CUresult = int;
using CUdeviceptr = uintptr_t;
constexpr CUresult kSuccess = 0, kInvalidValue = 1, kOutOfMemory = 2, kNotInitialized = 3, kInvalidDevice = 101,
                   kInvalidContext = 201, kInvalidHandle = 400, kNotReady = 600, kIllegalAddress = 700,
                   kNotPermitted = 800;
using HostFn = void (*)(void *);
constexpr int kAttrContext = 1, kAttrMemoryType = 2, kAttrDevicePointer = 3, kAttrHostPointer = 4,
              kAttrDeviceOrdinal = 9;
constexpr unsigned kMemTypeHost = 1, kMemTypeDevice = 2;

struct Event;
struct Task {
    uintptr_t dst = 0, src = 0;  // translated (the alias for device memory)
    size_t bytes = 0;
    bool fail = false;
    Event *event = nullptr;    // set: an event record
    HostFn host_fn = nullptr;  // set: a host function, called with `user`
    void *user = nullptr;
    uint64_t generation = 0;
    unsigned extra_delay_us = 0;  // a copy's own delay on top of the global one
};

// Held by its handle and by every record still queued on a stream (the real driver lets an event
// be destroyed while pending, or right after a wait on it returned: the stream's worker may still
// be finishing with it then).
struct Event {
    std::mutex m;
    std::condition_variable cv;
    uint64_t recorded = 0, completed = 0;
    int status = kSuccess;
    std::atomic<unsigned> refs{1};
};

struct Stream {
    std::mutex m;
    std::condition_variable cv;
    std::deque<Task> tasks;
    bool stop = false;
    int pending_error = kSuccess;
    std::thread worker;
    void run();
};

struct State {
    std::mutex m;
    bool initialised = false;
    int fd = -1;
    char *device = nullptr;  // PROT_NONE: what callers get
    char *alias = nullptr;   // read-write: what the fake copies through
    size_t heap = 0, next = 0;
    std::map<uintptr_t, size_t> allocations;  // device address -> bytes
    std::map<uintptr_t, size_t> pinned;       // host address -> bytes
    std::atomic<uint64_t> copies{0};
    std::atomic<uint64_t> fail_copy{0};
    std::atomic<unsigned> delay_us{0};
    std::atomic<unsigned> next_copy_delay_us{0};
    std::atomic<unsigned> linger_us{0};
    std::atomic<uint64_t> host_fn_violations{0};
    std::atomic<uint64_t> host_fns{0};  // cuLaunchHostFunc calls that enqueued one
    std::mutex quarantine_m;
    // Destroyed events, poisoned. Never destroyed itself: stream workers may still retire events
    // while the process exits, and LeakSanitizer finds the quarantined events through it.
    std::deque<void *> *quarantine = new std::deque<void *>;
};
inline State g;

inline int g_context_tag;
inline void *const kContext = &g_context_tag;
inline thread_local std::deque<void *> t_contexts;

inline thread_local bool t_in_host_fn = false;  // this thread runs a host function now

inline bool have_context() { return !t_contexts.empty() && t_contexts.back() == kContext; }

// CUDA forbids CUDA calls inside a host function; the real driver may or may not catch them.
#define REFUSED_IN_HOST_FN()                   \
    do {                                       \
        if (t_in_host_fn) {                    \
            g.host_fn_violations.fetch_add(1); \
            return kNotPermitted;              \
        }                                      \
    } while (0)

// The legacy default stream (0, CU_STREAM_LEGACY) and the per-thread one (CU_STREAM_PER_THREAD)
// are special handles, no Stream: synchronous here.
inline Stream *stream_of(void *handle) {
    return reinterpret_cast<uintptr_t>(handle) <= 2 ? nullptr : static_cast<Stream *>(handle);
}

void run_host_fn(HostFn fn, void *user);
uint64_t env_u64(const char *name, uint64_t fallback);
bool in_device(uintptr_t p);
// The allocation holding [p, p+n), or false.
bool device_range(uintptr_t p, size_t n);
bool pinned_ptr(uintptr_t p);
// Device addresses become the alias; anything else is host memory the caller owns.
bool translate(uintptr_t p, size_t n, uintptr_t &out);
// Drops one hold on e; the last one poisons it into the quarantine.
void event_unref(Event *e);
// A copy on stream s in order, or at once on the default streams (s null).
CUresult enqueue_copy(uintptr_t dst, uintptr_t src, size_t bytes, Stream *s);

}  // namespace fake_cuda
