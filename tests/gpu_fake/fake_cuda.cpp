// A strict stand-in for the subset of the CUDA driver API (libcuda.so.1) that libferry dlopens,
// for CI hosts without a GPU. Tests point the core at it with FERRY_LIBCUDA=<path of this .so>.
//
// "Device" memory lives in a memfd mapped twice: the addresses handed out come from a PROT_NONE
// mapping, so any code that dereferences device memory directly crashes (as it would on a real
// GPU), and the fake copies through a second, read-write alias of the same pages. Async copies
// and event records run on one worker thread per stream, in order, so code that reads a pinned
// buffer before its event completed sees stale bytes (or a race under TSan), as on a real GPU.
// Calls that need a context fail with CUDA_ERROR_INVALID_CONTEXT when none is current.
// Host functions (cuLaunchHostFunc) run on their stream's worker in stream order, as the real
// driver runs them; any CUDA call made from inside one fails with CUDA_ERROR_NOT_PERMITTED and is
// counted (ferry_fake_cuda_host_fn_violations), since CUDA forbids them there. The null stream,
// CU_STREAM_LEGACY and CU_STREAM_PER_THREAD are synchronous here: their copies and host
// functions run inside the call, on the calling thread.
//
// Fault injection (environment, read at cuInit):
//   FERRY_FAKE_CUDA_FAIL_COPY=n   the n-th async copy (from 1) copies nothing and the next event
//                                 recorded on its stream completes with CUDA_ERROR_ILLEGAL_ADDRESS
//   FERRY_FAKE_CUDA_COPY_DELAY_US=us  each async copy takes at least this long
//                                 (ferry_fake_cuda_delay_next_copy_us: only the next one, longer)
//   FERRY_FAKE_CUDA_HEAP_MB=mb    size of the device heap (default 2048, sparse)
//   FERRY_FAKE_CUDA_EVENT_LINGER_US=us  a stream's worker takes this long after completing an
//                                 event before it is done with it (a worker preempted there on a
//                                 loaded host: a caller that synchronised meanwhile may destroy
//                                 the event)
// A destroyed event's memory is overwritten at once (as a reuse of the block would) and kept out of
// the heap for the next 256 destroys, so any use of an event after cuEventDestroy, by the caller or
// by this fake, shows (a broadcast on those bytes blocks for good).
//
// This file: the heap, address translation, the streams' workers and events' lifetime, and the
// controls tests use; fake_cuda_context.cpp: initialisation, devices and contexts;
// fake_cuda_memory.cpp: allocations, copies and pointer attributes; fake_cuda_streams.cpp:
// streams, host functions and events.
#include "fake_cuda_state.hpp"

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <new>

namespace fake_cuda {

void run_host_fn(HostFn fn, void *user) {
    t_in_host_fn = true;
    fn(user);
    t_in_host_fn = false;
}

uint64_t env_u64(const char *name, uint64_t fallback) {
    const char *v = std::getenv(name);
    return v && *v ? std::strtoull(v, nullptr, 0) : fallback;
}

bool in_device(uintptr_t p) {
    auto d = reinterpret_cast<uintptr_t>(g.device);
    return g.device && p >= d && p < d + g.heap;
}

bool device_range(uintptr_t p, size_t n) {
    std::lock_guard lock(g.m);
    auto it = g.allocations.upper_bound(p);
    if (it == g.allocations.begin()) return false;
    --it;
    return p >= it->first && p + n <= it->first + it->second;
}

bool pinned_ptr(uintptr_t p) {
    std::lock_guard lock(g.m);
    auto it = g.pinned.upper_bound(p);
    if (it == g.pinned.begin()) return false;
    --it;
    return p < it->first + it->second;
}

bool translate(uintptr_t p, size_t n, uintptr_t &out) {
    if (in_device(p)) {
        if (!device_range(p, n)) return false;
        out = reinterpret_cast<uintptr_t>(g.alias) + (p - reinterpret_cast<uintptr_t>(g.device));
        return true;
    }
    if (in_device(p + n - 1)) return false;
    out = p;
    return true;
}

void event_unref(Event *e) {
    if (e->refs.fetch_sub(1) != 1) return;
    e->~Event();
    std::memset(static_cast<void *>(e), 0xa5, sizeof *e);
    void *evicted = nullptr;
    {
        std::lock_guard lock(g.quarantine_m);
        g.quarantine->push_back(e);
        if (g.quarantine->size() > 256) {
            evicted = g.quarantine->front();
            g.quarantine->pop_front();
        }
    }
    ::operator delete(evicted);
}

void Stream::run() {
    std::unique_lock lock(m);
    for (;;) {
        cv.wait(lock, [&] { return stop || !tasks.empty(); });
        if (tasks.empty()) return;
        Task t = tasks.front();
        lock.unlock();
        int error = kSuccess;
        if (t.host_fn) {
            run_host_fn(t.host_fn, t.user);
        } else if (!t.event) {
            if (unsigned us = g.delay_us + t.extra_delay_us) std::this_thread::sleep_for(std::chrono::microseconds(us));
            if (t.fail) error = kIllegalAddress;
            else std::memcpy(reinterpret_cast<void *>(t.dst), reinterpret_cast<const void *>(t.src), t.bytes);
        }
        lock.lock();
        tasks.pop_front();
        if (error) pending_error = error;
        if (t.event) {
            int status = pending_error;
            pending_error = kSuccess;
            lock.unlock();
            {
                std::lock_guard el(t.event->m);
                if (t.generation > t.event->completed) t.event->completed = t.generation;
                t.event->status = status;
            }
            if (g.linger_us) std::this_thread::sleep_for(std::chrono::microseconds(g.linger_us.load()));
            t.event->cv.notify_all();
            event_unref(t.event);  // the record's hold: its handle may be gone already
            lock.lock();
        }
        cv.notify_all();
    }
}

CUresult enqueue_copy(uintptr_t dst, uintptr_t src, size_t bytes, Stream *s) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!have_context()) return kInvalidContext;
    Task t;
    if (bytes == 0) return kSuccess;
    if (!translate(dst, bytes, t.dst) || !translate(src, bytes, t.src)) return kInvalidValue;
    t.bytes = bytes;
    uint64_t n = g.copies.fetch_add(1) + 1;
    uint64_t fail_at = g.fail_copy.load();
    t.fail = fail_at != 0 && n == fail_at;
    t.extra_delay_us = g.next_copy_delay_us.exchange(0);
    if (!s) {  // the legacy default stream: synchronous here
        if (unsigned us = g.delay_us + t.extra_delay_us) std::this_thread::sleep_for(std::chrono::microseconds(us));
        if (t.fail) return kIllegalAddress;
        std::memcpy(reinterpret_cast<void *>(t.dst), reinterpret_cast<const void *>(t.src), bytes);
        return kSuccess;
    }
    std::lock_guard lock(s->m);
    s->tasks.push_back(t);
    s->cv.notify_all();
    return kSuccess;
}

}  // namespace fake_cuda

using namespace fake_cuda;

// For tests: how many copies were started. Not part of CUDA.
FAKE_API uint64_t ferry_fake_cuda_copies() { return g.copies.load(); }
// For tests in one process: fail the n-th async copy from now (1: the next one), as
// FERRY_FAKE_CUDA_FAIL_COPY does from the start.
FAKE_API void ferry_fake_cuda_fail_copy(uint64_t n) { g.fail_copy = n ? g.copies.load() + n : 0; }
// As FERRY_FAKE_CUDA_COPY_DELAY_US, from now on (0: no delay).
FAKE_API void ferry_fake_cuda_copy_delay_us(unsigned us) { g.delay_us = us; }
// As FERRY_FAKE_CUDA_EVENT_LINGER_US, from now on (0: none).
FAKE_API void ferry_fake_cuda_event_linger_us(unsigned us) { g.linger_us = us; }
// The next async copy started (on any stream) takes `us` longer than the others; 0 clears it.
FAKE_API void ferry_fake_cuda_delay_next_copy_us(unsigned us) { g.next_copy_delay_us = us; }
// For tests: CUDA calls refused because they were made inside a host function.
FAKE_API uint64_t ferry_fake_cuda_host_fn_violations() { return g.host_fn_violations.load(); }
// For tests: host functions enqueued so far (cuLaunchHostFunc calls that succeeded).
FAKE_API uint64_t ferry_fake_cuda_host_fns() { return g.host_fns.load(); }
