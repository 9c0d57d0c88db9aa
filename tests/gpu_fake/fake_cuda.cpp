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
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <mutex>
#include <set>
#include <thread>

#define FAKE_API extern "C" __attribute__((visibility("default")))

namespace {

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
} g;

int g_context_tag;
void *const kContext = &g_context_tag;
thread_local std::deque<void *> t_contexts;

thread_local bool t_in_host_fn = false;  // this thread runs a host function now

bool have_context() { return !t_contexts.empty() && t_contexts.back() == kContext; }

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
struct Stream;
Stream *stream_of(void *handle) {
    return reinterpret_cast<uintptr_t>(handle) <= 2 ? nullptr : static_cast<Stream *>(handle);
}

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

// The allocation holding [p, p+n), or false.
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

// Device addresses become the alias; anything else is host memory the caller owns.
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

// Drops one hold on e; the last one poisons it into the quarantine.
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

}  // namespace

FAKE_API CUresult cuInit(unsigned) {
    std::lock_guard lock(g.m);
    if (g.initialised) return kSuccess;
    g.heap = env_u64("FERRY_FAKE_CUDA_HEAP_MB", 2048) << 20;
    g.fail_copy = env_u64("FERRY_FAKE_CUDA_FAIL_COPY", 0);
    g.delay_us = static_cast<unsigned>(env_u64("FERRY_FAKE_CUDA_COPY_DELAY_US", 0));
    g.linger_us = static_cast<unsigned>(env_u64("FERRY_FAKE_CUDA_EVENT_LINGER_US", 0));
    g.fd = memfd_create("fake-cuda-heap", MFD_CLOEXEC);
    if (g.fd < 0 || ftruncate(g.fd, static_cast<off_t>(g.heap)) != 0) return kOutOfMemory;
    void *d = mmap(nullptr, g.heap, PROT_NONE, MAP_SHARED | MAP_NORESERVE, g.fd, 0);
    void *a = mmap(nullptr, g.heap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, g.fd, 0);
    if (d == MAP_FAILED || a == MAP_FAILED) return kOutOfMemory;
    g.device = static_cast<char *>(d);
    g.alias = static_cast<char *>(a);
    g.initialised = true;
    return kSuccess;
}

FAKE_API CUresult cuDriverGetVersion(int *v) {
    *v = 12040;
    return kSuccess;
}

FAKE_API CUresult cuGetErrorString(CUresult rc, const char **s) {
    switch (rc) {
        case kSuccess: *s = "no error"; break;
        case kInvalidValue: *s = "invalid argument"; break;
        case kOutOfMemory: *s = "out of memory"; break;
        case kNotInitialized: *s = "initialization error"; break;
        case kInvalidDevice: *s = "invalid device ordinal"; break;
        case kInvalidContext: *s = "invalid device context"; break;
        case kInvalidHandle: *s = "invalid resource handle"; break;
        case kNotReady: *s = "device not ready"; break;
        case kIllegalAddress: *s = "an illegal memory access was encountered"; break;
        case kNotPermitted: *s = "operation not permitted"; break;
        default: *s = nullptr; return kInvalidValue;
    }
    return kSuccess;
}

FAKE_API CUresult cuDeviceGetCount(int *n) {
    if (!g.initialised) return kNotInitialized;
    *n = 1;
    return kSuccess;
}

FAKE_API CUresult cuDeviceGet(int *dev, int ordinal) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (ordinal != 0) return kInvalidDevice;
    *dev = 0;
    return kSuccess;
}

FAKE_API CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (dev != 0) return kInvalidDevice;
    *ctx = kContext;
    return kSuccess;
}

FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(int) { return kSuccess; }

FAKE_API CUresult cuCtxPushCurrent_v2(void *ctx) {
    REFUSED_IN_HOST_FN();
    if (ctx != kContext) return kInvalidContext;
    t_contexts.push_back(ctx);
    return kSuccess;
}

FAKE_API CUresult cuCtxPopCurrent_v2(void **ctx) {
    REFUSED_IN_HOST_FN();
    if (t_contexts.empty()) return kInvalidContext;
    if (ctx) *ctx = t_contexts.back();
    t_contexts.pop_back();
    return kSuccess;
}

FAKE_API CUresult cuCtxSetCurrent(void *ctx) {
    if (!t_contexts.empty()) t_contexts.pop_back();
    if (ctx) t_contexts.push_back(ctx);
    return kSuccess;
}

FAKE_API CUresult cuCtxGetCurrent(void **ctx) {
    *ctx = t_contexts.empty() ? nullptr : t_contexts.back();
    return kSuccess;
}

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!have_context()) return kInvalidContext;
    std::lock_guard lock(g.m);
    size_t rounded = (bytes + 0xfffff) & ~size_t(0xfffff);  // 1 MiB granules, like cudaMalloc's
    if (bytes == 0 || g.next + rounded > g.heap) return kOutOfMemory;
    *p = reinterpret_cast<uintptr_t>(g.device) + g.next;
    g.allocations[*p] = bytes;
    g.next += rounded;
    return kSuccess;
}

FAKE_API CUresult cuMemFree_v2(CUdeviceptr p) {
    REFUSED_IN_HOST_FN();
    std::lock_guard lock(g.m);
    auto it = g.allocations.find(p);
    if (it == g.allocations.end()) return kInvalidValue;
    off_t off = static_cast<off_t>(p - reinterpret_cast<uintptr_t>(g.device));
    fallocate(g.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, static_cast<off_t>(it->second));
    g.allocations.erase(it);
    return kSuccess;
}

FAKE_API CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!have_context()) return kInvalidContext;
    void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return kOutOfMemory;
    std::lock_guard lock(g.m);
    g.pinned[reinterpret_cast<uintptr_t>(m)] = bytes;
    *p = m;
    return kSuccess;
}

FAKE_API CUresult cuMemAllocHost_v2(void **p, size_t bytes) { return cuMemHostAlloc(p, bytes, 0); }

FAKE_API CUresult cuMemFreeHost(void *p) {
    REFUSED_IN_HOST_FN();
    std::lock_guard lock(g.m);
    auto it = g.pinned.find(reinterpret_cast<uintptr_t>(p));
    if (it == g.pinned.end()) return kInvalidValue;
    munmap(p, it->second);
    g.pinned.erase(it);
    return kSuccess;
}

FAKE_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    return enqueue_copy(dst, src, bytes, nullptr);
}
FAKE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    return enqueue_copy(dst, reinterpret_cast<uintptr_t>(src), bytes, nullptr);
}
FAKE_API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    return enqueue_copy(reinterpret_cast<uintptr_t>(dst), src, bytes, nullptr);
}
FAKE_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, void *stream) {
    return enqueue_copy(dst, src, bytes, stream_of(stream));
}
FAKE_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, void *stream) {
    return enqueue_copy(dst, reinterpret_cast<uintptr_t>(src), bytes, stream_of(stream));
}
FAKE_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, void *stream) {
    return enqueue_copy(reinterpret_cast<uintptr_t>(dst), src, bytes, stream_of(stream));
}

FAKE_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t bytes) {
    REFUSED_IN_HOST_FN();
    if (!have_context()) return kInvalidContext;
    uintptr_t p;
    if (!in_device(dst) || !translate(dst, bytes, p)) return kInvalidValue;
    std::memset(reinterpret_cast<void *>(p), value, bytes);
    return kSuccess;
}

FAKE_API CUresult cuStreamCreate(void **stream, unsigned) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!have_context()) return kInvalidContext;
    auto *s = new Stream;
    s->worker = std::thread([s] { s->run(); });
    *stream = s;
    return kSuccess;
}

FAKE_API CUresult cuStreamSynchronize(void *stream) {
    REFUSED_IN_HOST_FN();
    auto *s = stream_of(stream);
    if (!s) return kSuccess;
    std::unique_lock lock(s->m);
    s->cv.wait(lock, [&] { return s->tasks.empty(); });
    int e = s->pending_error;
    s->pending_error = kSuccess;
    return e;
}

FAKE_API CUresult cuStreamDestroy_v2(void *stream) {
    REFUSED_IN_HOST_FN();
    auto *s = static_cast<Stream *>(stream);
    if (!s) return kInvalidHandle;
    {
        std::lock_guard lock(s->m);
        s->stop = true;
    }
    s->cv.notify_all();
    s->worker.join();
    delete s;
    return kSuccess;
}

FAKE_API CUresult cuStreamGetCtx(void *stream, void **ctx) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!stream_of(stream)) {  // the default streams belong to the current context
        if (!have_context()) return kInvalidContext;
        *ctx = t_contexts.back();
        return kSuccess;
    }
    *ctx = kContext;
    return kSuccess;
}

// In stream order, on the stream's worker; the default streams run it here and now.
FAKE_API CUresult cuLaunchHostFunc(void *stream, HostFn fn, void *user) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!fn) return kInvalidValue;
    Stream *s = stream_of(stream);
    if (!s) {
        if (!have_context()) return kInvalidContext;
        g.host_fns.fetch_add(1);
        run_host_fn(fn, user);
        return kSuccess;
    }
    g.host_fns.fetch_add(1);
    Task t;
    t.host_fn = fn;
    t.user = user;
    std::lock_guard lock(s->m);
    s->tasks.push_back(t);
    s->cv.notify_all();
    return kSuccess;
}

FAKE_API CUresult cuEventCreate(void **event, unsigned) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!have_context()) return kInvalidContext;
    *event = new Event;
    return kSuccess;
}

FAKE_API CUresult cuEventRecord(void *event, void *stream) {
    REFUSED_IN_HOST_FN();
    auto *e = static_cast<Event *>(event);
    auto *s = stream_of(stream);
    if (!e || !s) return kInvalidHandle;
    if (!have_context()) return kInvalidContext;
    Task t;
    t.event = e;
    e->refs.fetch_add(1);  // the queued record's hold
    {
        std::lock_guard el(e->m);
        t.generation = ++e->recorded;
    }
    std::lock_guard lock(s->m);
    s->tasks.push_back(t);
    s->cv.notify_all();
    return kSuccess;
}

FAKE_API CUresult cuEventQuery(void *event) {
    REFUSED_IN_HOST_FN();
    auto *e = static_cast<Event *>(event);
    std::lock_guard lock(e->m);
    if (e->completed < e->recorded) return kNotReady;
    return e->status;
}

FAKE_API CUresult cuEventSynchronize(void *event) {
    REFUSED_IN_HOST_FN();
    auto *e = static_cast<Event *>(event);
    if (!e) return kInvalidHandle;
    std::unique_lock lock(e->m);
    e->cv.wait(lock, [&] { return e->completed >= e->recorded; });
    return e->status;
}

FAKE_API CUresult cuEventDestroy_v2(void *event) {
    REFUSED_IN_HOST_FN();
    if (!event) return kInvalidHandle;
    event_unref(static_cast<Event *>(event));  // a pending record still holds it
    return kSuccess;
}

// Unlike cuPointerGetAttribute, the plural call succeeds on memory CUDA does not know, leaving
// zeros (as the real driver documents): how a caller tells host memory apart.
static CUresult attribute(void *data, int attr, CUdeviceptr p, bool strict) {
    bool dev = in_device(p) && device_range(p, 1);
    bool host = !dev && pinned_ptr(p);
    if (!dev && !host) {
        if (strict) return kInvalidValue;
        switch (attr) {
            case kAttrContext:
            case kAttrDevicePointer:
            case kAttrHostPointer: *static_cast<void **>(data) = nullptr; break;
            case kAttrDeviceOrdinal: *static_cast<int *>(data) = -2; break;
            default: *static_cast<unsigned *>(data) = 0;
        }
        return kSuccess;
    }
    switch (attr) {
        case kAttrContext: *static_cast<void **>(data) = kContext; break;
        case kAttrMemoryType: *static_cast<unsigned *>(data) = dev ? kMemTypeDevice : kMemTypeHost; break;
        case kAttrDevicePointer: *static_cast<uintptr_t *>(data) = p; break;
        case kAttrHostPointer: *static_cast<uintptr_t *>(data) = dev ? 0 : p; break;
        case kAttrDeviceOrdinal: *static_cast<int *>(data) = 0; break;
        default: return kInvalidValue;
    }
    return kSuccess;
}

FAKE_API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    return attribute(data, attr, p, true);
}

FAKE_API CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    for (unsigned i = 0; i < n; ++i)
        if (CUresult rc = attribute(data[i], attrs[i], p, false); rc != kSuccess) return rc;
    return kSuccess;
}

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
