// The fake CUDA driver's events keep the real driver's lifetime contract: cuEventDestroy may
// follow cuEventSynchronize at once, or come before the event completed, and the stream goes on.
// Each case runs in a child process that loads the fake (as the core does, by path) with a
// deadline: a stream worker stuck on a destroyed event hangs the child, which the parent reports.
// (CI saw it once on a loaded host: the core's staging thread synchronised an event whose worker
// was preempted between publishing its completion and notifying; the worker then blocked forever
// in the broadcast on the freed block's bytes, every later GPU copy of that process waited
// behind it, the tcp target stopped answering and never exited.)
#include <dlfcn.h>
#include <gtest/gtest.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdint>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace {

constexpr int kNotReady = 600;

// The fake's entry points, resolved in the child.
struct Fake {
    int (*init)(unsigned);
    int (*retain)(void **, int);
    int (*push)(void *);
    int (*mem_alloc)(uintptr_t *, size_t);
    int (*copy_async)(uintptr_t, uintptr_t, size_t, void *);
    int (*dtoh)(void *, uintptr_t, size_t);
    int (*stream_create)(void **, unsigned);
    int (*stream_sync)(void *);
    int (*stream_destroy)(void *);
    int (*event_create)(void **, unsigned);
    int (*event_record)(void *, void *);
    int (*event_query)(void *);
    int (*event_sync)(void *);
    int (*event_destroy)(void *);
    void (*copy_delay_us)(unsigned);
    void (*event_linger_us)(unsigned);
};

// Child side: 0 when every step held, else the step that failed (its exit code).
int in_child(const std::function<int(Fake &, void *stream, uintptr_t dev)> &body) {
    void *lib = dlopen(FERRY_FAKE_CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return 90;
    Fake f{};
    bool all = true;
    auto sym = [&](auto &fn, const char *name) {
        fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(lib, name));
        all = all && fn != nullptr;
    };
    sym(f.init, "cuInit");
    sym(f.retain, "cuDevicePrimaryCtxRetain");
    sym(f.push, "cuCtxPushCurrent_v2");
    sym(f.mem_alloc, "cuMemAlloc_v2");
    sym(f.copy_async, "cuMemcpyAsync");
    sym(f.dtoh, "cuMemcpyDtoH_v2");
    sym(f.stream_create, "cuStreamCreate");
    sym(f.stream_sync, "cuStreamSynchronize");
    sym(f.stream_destroy, "cuStreamDestroy_v2");
    sym(f.event_create, "cuEventCreate");
    sym(f.event_record, "cuEventRecord");
    sym(f.event_query, "cuEventQuery");
    sym(f.event_sync, "cuEventSynchronize");
    sym(f.event_destroy, "cuEventDestroy_v2");
    sym(f.copy_delay_us, "ferry_fake_cuda_copy_delay_us");
    sym(f.event_linger_us, "ferry_fake_cuda_event_linger_us");
    if (!all) return 91;
    void *ctx = nullptr;
    void *stream = nullptr;
    uintptr_t dev = 0;
    if (f.init(0) != 0 || f.retain(&ctx, 0) != 0 || f.push(ctx) != 0) return 92;
    if (f.stream_create(&stream, 1) != 0 || f.mem_alloc(&dev, 1 << 20) != 0) return 93;
    int rc = body(f, stream, dev);
    if (rc != 0) return rc;
    return f.stream_destroy(stream) == 0 ? 0 : 94;
}

// Runs body in a child; fails the test when the child fails a step, dies, or outlives `deadline`.
void run_in_child(const std::function<int(Fake &, void *, uintptr_t)> &body, std::chrono::seconds deadline) {
    pid_t pid = fork();
    ASSERT_GE(pid, 0) << strerror(errno);
    if (pid == 0) _exit(in_child(body));
    const auto end = std::chrono::steady_clock::now() + deadline;
    int status = 0;
    pid_t got = 0;
    while ((got = waitpid(pid, &status, WNOHANG)) == 0 && std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));  // polling a child's exit, not synchronising
    if (got == 0) {
        kill(pid, SIGKILL);
        waitpid(pid, &status, 0);
        FAIL() << "the child was still running after " << deadline.count()
               << " s: a stream worker is stuck on a destroyed event, so no later copy completes";
    }
    ASSERT_TRUE(WIFEXITED(status)) << "the child died of signal " << (WIFSIGNALED(status) ? WTERMSIG(status) : 0);
    EXPECT_EQ(WEXITSTATUS(status), 0) << "step " << WEXITSTATUS(status) << " failed in the child";
}

// Copies 64 KiB of `fill` to the device and reads it back: the stream still works.
int round_trip(Fake &f, void *stream, uintptr_t dev, uint8_t fill, int step) {
    std::vector<uint8_t> src(64 << 10, fill), back(64 << 10, 0);
    void *ev = nullptr;
    if (f.copy_async(dev, reinterpret_cast<uintptr_t>(src.data()), src.size(), stream) != 0) return step;
    if (f.event_create(&ev, 2) != 0 || f.event_record(ev, stream) != 0) return step + 1;
    if (f.event_sync(ev) != 0 || f.event_destroy(ev) != 0) return step + 2;
    if (f.dtoh(back.data(), dev, back.size()) != 0 || back != src) return step + 3;
    return 0;
}

}  // namespace

// The core's staging thread waits on events in start order; when it is behind, the event it
// synchronises may have completed already while the stream's worker is still busy with it.
TEST(FakeCudaEvents, AnEventDestroyedAsSoonAsItsSyncReturnsLeavesTheStreamWorking) {
    run_in_child(
        [](Fake &f, void *stream, uintptr_t dev) {
            f.event_linger_us(300 * 1000);  // the worker preempted right after publishing completion
            std::vector<uint8_t> src(64 << 10, 0x11);
            void *ev = nullptr;
            if (f.copy_async(dev, reinterpret_cast<uintptr_t>(src.data()), src.size(), stream) != 0) return 1;
            if (f.event_create(&ev, 2) != 0 || f.event_record(ev, stream) != 0) return 2;
            int q;
            while ((q = f.event_query(ev)) == kNotReady) std::this_thread::yield();  // completed, worker lingers
            if (q != 0 || f.event_sync(ev) != 0) return 3;
            if (f.event_destroy(ev) != 0) return 4;  // what the core does once its wait returned
            f.event_linger_us(0);
            for (int i = 0; i < 8; ++i)
                if (int rc = round_trip(f, stream, dev, static_cast<uint8_t>(0x20 + i), 10)) return rc;
            return 0;
        },
        std::chrono::seconds(30));
}

// The real driver lets an event be destroyed before it completes (its resources go once it
// does): the stream must neither crash nor stall on it.
TEST(FakeCudaEvents, AnEventDestroyedBeforeItCompletesIsReleasedByItsStream) {
    run_in_child(
        [](Fake &f, void *stream, uintptr_t dev) {
            f.copy_delay_us(200 * 1000);
            std::vector<uint8_t> src(64 << 10, 0x33);
            void *ev = nullptr;
            if (f.copy_async(dev, reinterpret_cast<uintptr_t>(src.data()), src.size(), stream) != 0) return 1;
            if (f.event_create(&ev, 2) != 0 || f.event_record(ev, stream) != 0) return 2;
            if (f.event_destroy(ev) != 0) return 3;  // still pending behind the slow copy
            if (f.stream_sync(stream) != 0) return 4;
            f.copy_delay_us(0);
            for (int i = 0; i < 8; ++i)
                if (int rc = round_trip(f, stream, dev, static_cast<uint8_t>(0x40 + i), 10)) return rc;
            return 0;
        },
        std::chrono::seconds(30));
}
