// Batches ordered on a CUDA stream (Engine::submit_on_stream, ferry_submit_on_stream) without a
// GPU: the real engine and tcp.so against ferry_test_peer children, with (fake) device memory
// and streams from the strict fake CUDA driver, whose streams run copies and host functions in
// order on one worker thread each and refuse CUDA calls made inside a host function. The GPU
// WRITEs go through the engine's staging (pinned slices), as they do over tcp on a real GPU.
#include <dlfcn.h>
#include <fcntl.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cinttypes>
#include <condition_variable>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>

#include "ferry/engine.hpp"
#include "ferry/ferry.h"
#include "peer_pattern.hpp"
#include "peer_process.hpp"
#include "test_util.hpp"

using namespace ferry;
using ferry::test::PeerProcess;
using Clock = std::chrono::steady_clock;

namespace {

using HostFn = void (*)(void *);

// The fake driver, loaded by path as the core loads it ($FERRY_LIBCUDA): one instance per process.
struct FakeCuda {
    FakeCuda() {
        setenv("FERRY_LIBCUDA", FERRY_FAKE_CUDA_LIB, 1);
        lib = dlopen(FERRY_FAKE_CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
        if (!lib) return;
        auto sym = [&](auto &fn, const char *name) {
            fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(lib, name));
        };
        int (*init)(unsigned);
        int (*retain)(void **, int);
        sym(init, "cuInit");
        sym(retain, "cuDevicePrimaryCtxRetain");
        sym(push, "cuCtxPushCurrent_v2");
        sym(alloc_, "cuMemAlloc_v2");
        sym(htod_, "cuMemcpyHtoD_v2");
        sym(dtoh_, "cuMemcpyDtoH_v2");
        sym(htod_async_, "cuMemcpyHtoDAsync_v2");
        sym(stream_create, "cuStreamCreate");
        sym(stream_sync, "cuStreamSynchronize");
        sym(stream_destroy, "cuStreamDestroy_v2");
        sym(launch, "cuLaunchHostFunc");
        sym(delay_next_copy_us, "ferry_fake_cuda_delay_next_copy_us");
        sym(host_fn_violations, "ferry_fake_cuda_host_fn_violations");
        sym(host_fns, "ferry_fake_cuda_host_fns");
        ok = init && launch && delay_next_copy_us && init(0) == 0 && retain(&ctx, 0) == 0 &&
             push(ctx) == 0;  // current on the test thread
    }
    char *alloc(size_t n) {
        uintptr_t p = 0;
        return alloc_(&p, n) == 0 ? reinterpret_cast<char *>(p) : nullptr;
    }
    void put(char *dev, const void *src, size_t n) { ASSERT_EQ(htod_(reinterpret_cast<uintptr_t>(dev), src, n), 0); }
    int put_async(char *dev, const void *src, size_t n, void *stream) {
        return htod_async_(reinterpret_cast<uintptr_t>(dev), src, n, stream);
    }
    std::vector<uint8_t> get(const char *dev, size_t n) {
        std::vector<uint8_t> out(n);
        EXPECT_EQ(dtoh_(out.data(), reinterpret_cast<uintptr_t>(dev), n), 0);
        return out;
    }
    void *lib = nullptr;
    void *ctx = nullptr;
    bool ok = false;
    int (*push)(void *) = nullptr;
    int (*alloc_)(uintptr_t *, size_t) = nullptr;
    int (*htod_)(uintptr_t, const void *, size_t) = nullptr;
    int (*dtoh_)(void *, uintptr_t, size_t) = nullptr;
    int (*htod_async_)(uintptr_t, const void *, size_t, void *) = nullptr;
    int (*stream_create)(void **, unsigned) = nullptr;
    int (*stream_sync)(void *) = nullptr;
    int (*stream_destroy)(void *) = nullptr;
    int (*launch)(void *, HostFn, void *) = nullptr;
    void (*delay_next_copy_us)(unsigned) = nullptr;
    uint64_t (*host_fn_violations)() = nullptr;
    uint64_t (*host_fns)() = nullptr;
};

FakeCuda &cuda() {
    static FakeCuda c;
    return c;
}

// Waits for everything queued on the stream, within `limit`; false when it did not end by then
// (a host function blocked for good), leaving the wait behind instead of hanging the test.
bool sync_within(void *stream, std::chrono::milliseconds limit) {
    struct Done {
        std::mutex m;
        std::condition_variable cv;
        bool done = false;
    };
    auto state = std::make_shared<Done>();
    std::thread([state, stream] {
        cuda().stream_sync(stream);
        std::lock_guard lock(state->m);
        state->done = true;
        state->cv.notify_all();
    }).detach();
    std::unique_lock lock(state->m);
    return state->cv.wait_for(lock, limit, [&] { return state->done; });
}

// A non-blocking stream of the fake driver. Destroyed with the object once its work is done;
// left alone when a test found it blocked (its destruction would wait for ever).
struct Stream {
    Stream() { EXPECT_EQ(cuda().stream_create(&handle, 1), 0); }
    ~Stream() {
        if (handle && sync_within(handle, std::chrono::seconds(30))) cuda().stream_destroy(handle);
    }
    void *handle = nullptr;
};

// A host function of the test's own, queued on a stream after submit_on_stream: it records
// whether the batch had ended when the stream reached it. wait() with a timeout of 0 only looks
// (it drives no progress, so it makes no CUDA call).
struct Probe {
    Engine *engine = nullptr;
    BatchId batch = 0;
    std::atomic<bool> ran{false};
    int code = 1;
    static void run(void *p) {
        auto *probe = static_cast<Probe *>(p);
        auto r = probe->engine->wait(probe->batch, std::chrono::milliseconds(0));
        probe->code = r ? 0 : r.error().code;
        probe->ran.store(true);
    }
};

// stderr of this process into a file while it lives (the engine's log goes there).
class StderrCapture {
public:
    StderrCapture() {
        std::fflush(stderr);
        saved_ = dup(2);
        int fd = ::open((dir_ / "stderr").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
        dup2(fd, 2);
        close(fd);
    }
    ~StderrCapture() { restore(); }
    std::string text() {
        restore();
        std::ifstream in(dir_ / "stderr");
        std::stringstream s;
        s << in.rdbuf();
        return s.str();
    }

private:
    void restore() {
        if (saved_ < 0) return;
        std::fflush(stderr);
        std::clog.flush();
        dup2(saved_, 2);
        close(saved_);
        saved_ = -1;
    }
    ferry::test::TempDir dir_;
    int saved_ = -1;
};

size_t count(const std::string &text, const std::string &what) {
    size_t n = 0;
    for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
    return n;
}

std::string sum_line(const std::vector<uint8_t> &v) {
    char want[64];
    snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(v.data(), v.size()));
    return want;
}

std::vector<uint8_t> pattern(uint64_t n) {
    std::vector<uint8_t> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = test::peer_pattern(i);
    return v;
}

std::vector<uint8_t> bytes(uint64_t n, uint8_t seed) {
    std::vector<uint8_t> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = static_cast<uint8_t>(i * 7 + seed);
    return v;
}

double since(Clock::time_point t0) { return std::chrono::duration<double>(Clock::now() - t0).count(); }

constexpr uint64_t kSize = 1 << 20;

class StreamSubmitTest : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_TRUE(cuda().ok) << "the fake CUDA driver " << FERRY_FAKE_CUDA_LIB << " did not load: " << dlerror();
        violations_ = cuda().host_fn_violations();
    }
    void TearDown() override {
        EXPECT_EQ(cuda().host_fn_violations(), violations_) << "a host function made a CUDA call";
    }
    // The engine, a (fake) GPU buffer of kSize registered with it, and the peer's segment open
    // and connected (one WRITE of the buffer's first page went through).
    void start(const std::vector<std::string> &peer_args = {}, const Config &extra = {}) {
        std::vector<std::string> args = {"--size", std::to_string(kSize)};
        args.insert(args.end(), peer_args.begin(), peer_args.end());
        peer = std::make_unique<PeerProcess>(args);
        ASSERT_TRUE(peer->ok) << peer->error;
        Config config = {{"plugins", "tcp"},
                         {"gpu_staging_slice_bytes", std::to_string(256 << 10)},
                         {"gpu_staging_max_bytes", std::to_string(1 << 20)}};
        for (const auto &[k, v] : extra) config[k] = v;
        auto e = Engine::create(config);
        ASSERT_TRUE(e) << e.error().message;
        engine = std::move(*e);
        dev = cuda().alloc(kSize);
        ASSERT_NE(dev, nullptr);
        ASSERT_TRUE(engine->register_memory(dev, kSize, {MemoryKind::Cuda, 0}));
        auto s = engine->open_segment(peer->segment);
        ASSERT_TRUE(s) << s.error().message;
        seg = *s;
        if (std::find(peer_args.begin(), peer_args.end(), "r") != peer_args.end()) return;  // read-only
        cuda().put(dev, pattern(4096).data(), 4096);
        auto w = run({{Opcode::Write, dev, seg, peer->base, 4096, ""}});
        ASSERT_TRUE(w) << w.error().message;
    }
    Result<void> run(const std::vector<Request> &reqs) {
        auto b = engine->submit(reqs);
        if (!b) return std::unexpected(b.error());
        auto w = engine->wait(*b, std::chrono::seconds(60));
        (void)engine->free_batch(*b);
        return w;
    }
    std::vector<Request> write_all() { return {{Opcode::Write, dev, seg, peer->base, kSize, ""}}; }

    std::unique_ptr<PeerProcess> peer;
    std::unique_ptr<Engine> engine;
    char *dev = nullptr;
    SegmentId seg = 0;
    uint64_t violations_ = 0;
};

}  // namespace

TEST_F(StreamSubmitTest, TheWriteSendsWhatTheCopyBeforeItWroteAndTheCopyAfterItWaits) {
    start();
    auto old_bytes = bytes(kSize, 0xa1), copied = bytes(kSize, 0x3b), later = bytes(kSize, 0xc5);
    cuda().put(dev, old_bytes.data(), kSize);
    Probe probe;  // outlives the stream, which may still run it when an assertion ends the test
    Stream stream;

    // What the stream order is for: a plain submit right after a slow copy on the stream sends
    // the bytes the buffer held before the copy. The two race for the buffer on purpose, which
    // ThreadSanitizer rightly reports (as it would on a GPU if it could see one): not run there.
#if defined(__SANITIZE_THREAD__)
    std::printf("the plain-submit control is not run under ThreadSanitizer: it races on purpose\n");
#else
    cuda().delay_next_copy_us(600000);
    ASSERT_EQ(cuda().put_async(dev, copied.data(), kSize, stream.handle), 0);
    ASSERT_TRUE(run(write_all()));
    EXPECT_EQ(peer->command("sum"), sum_line(old_bytes)) << "the plain submit did not overtake the copy";
    ASSERT_TRUE(sync_within(stream.handle, std::chrono::seconds(30)));
#endif

    cuda().put(dev, old_bytes.data(), kSize);
    cuda().delay_next_copy_us(300000);
    ASSERT_EQ(cuda().put_async(dev, copied.data(), kSize, stream.handle), 0);
    auto t0 = Clock::now();
    auto batch = engine->submit_on_stream(write_all(), stream.handle);
    double submit_s = since(t0);
    ASSERT_TRUE(batch) << batch.error().message;
    probe.engine = engine.get();
    probe.batch = *batch;
    ASSERT_EQ(cuda().launch(stream.handle, &Probe::run, &probe), 0);
    ASSERT_EQ(cuda().put_async(dev, later.data(), kSize, stream.handle), 0);  // must not reach the peer

    auto w = engine->wait(*batch, std::chrono::seconds(60));
    double done_s = since(t0);
    ASSERT_TRUE(w) << w.error().message;
    EXPECT_EQ(peer->command("sum"), sum_line(copied)) << "the peer holds what the copy before the call wrote";
    ASSERT_TRUE(sync_within(stream.handle, std::chrono::seconds(30))) << "the stream went on";
    EXPECT_TRUE(probe.ran.load());
    EXPECT_EQ(probe.code, 0) << "work queued after submit_on_stream ran before its batch had ended";
    EXPECT_TRUE(cuda().get(dev, kSize) == later) << "the copy queued after the call ran once the batch ended";
    EXPECT_TRUE(engine->free_batch(*batch));
    EXPECT_LT(submit_s, 0.25) << "submit_on_stream waited for the stream";
    EXPECT_GE(done_s, 0.3) << "the batch ended before the copy ahead of it on the stream";
    std::printf("submit_on_stream returned in %.3f s; batch ended after %.3f s (copy ahead: 0.3 s)\n", submit_s,
                done_s);
}

TEST_F(StreamSubmitTest, BatchesOnOneStreamEachSendWhatTheCopyJustBeforeItWrote) {
    start();
    constexpr uint64_t kChunk = 256 << 10;
    std::vector<std::vector<uint8_t>> sources;
    Stream stream;
    std::vector<BatchId> batches;
    auto want = pattern(kSize);
    for (uint64_t k = 0; k < 4; ++k) {
        sources.push_back(bytes(kChunk, static_cast<uint8_t>(0x10 + 17 * k)));
        cuda().delay_next_copy_us(50000);
        // Every batch reads the same device bytes, which the next copy overwrites.
        ASSERT_EQ(cuda().put_async(dev, sources.back().data(), kChunk, stream.handle), 0);
        std::vector<Request> w = {{Opcode::Write, dev, seg, peer->base + k * kChunk, kChunk, ""}};
        auto b = engine->submit_on_stream(w, stream.handle);
        ASSERT_TRUE(b) << b.error().message;
        batches.push_back(*b);
        memcpy(want.data() + k * kChunk, sources.back().data(), kChunk);
    }
    for (auto b : batches) {
        auto w = engine->wait(b, std::chrono::seconds(60));
        ASSERT_TRUE(w) << w.error().message;
        EXPECT_TRUE(engine->free_batch(b));
    }
    EXPECT_EQ(peer->command("sum"), sum_line(want)) << "each chunk holds the copy made just before its batch";
    EXPECT_EQ(engine->staging_stats().lent_bytes, 0u);
}

// The ops are checked again when the stream reaches the batch: memory unregistered meanwhile
// fails them, and nothing moves.
TEST_F(StreamSubmitTest, MemoryUnregisteredBeforeTheStreamReachedTheBatchFailsItsOps) {
    start();
    auto copied = bytes(kSize, 0x4c);
    Stream stream;
    cuda().delay_next_copy_us(300000);
    ASSERT_EQ(cuda().put_async(dev, copied.data(), kSize, stream.handle), 0);
    auto b = engine->submit_on_stream(write_all(), stream.handle);
    ASSERT_TRUE(b) << b.error().message;
    ASSERT_TRUE(engine->unregister_memory(dev));
    auto r = engine->wait(*b, std::chrono::seconds(60));
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -EFAULT) << r.error().message;
    EXPECT_NE(r.error().message.find("refused when its CUDA stream reached the batch"), std::string::npos)
        << r.error().message;
    EXPECT_NE(r.error().message.find("register the buffer first"), std::string::npos) << r.error().message;
    ASSERT_TRUE(sync_within(stream.handle, std::chrono::seconds(30)));
    EXPECT_EQ(peer->command("sum"), sum_line(pattern(kSize))) << "nothing moved";
    EXPECT_TRUE(engine->free_batch(*b));
}

// Fire and forget (Mooncake's calls return nothing): the engine frees the batch once it ended.
TEST_F(StreamSubmitTest, ADetachedBatchIsFreedByTheEngineOnceItEnded) {
    start();
    auto copied = bytes(kSize, 0x6e);
    Stream stream;
    cuda().delay_next_copy_us(200000);
    ASSERT_EQ(cuda().put_async(dev, copied.data(), kSize, stream.handle), 0);
    auto b = engine->submit_on_stream(write_all(), stream.handle, StreamBatch::Detach);
    ASSERT_TRUE(b) << b.error().message;
    auto busy = engine->free_batch(*b);
    ASSERT_FALSE(busy);
    EXPECT_EQ(busy.error().code, -EBUSY) << "in flight until its stream reached it and it ended";
    ASSERT_TRUE(sync_within(stream.handle, std::chrono::seconds(30)));
    EXPECT_EQ(peer->command("sum"), sum_line(copied));
    auto gone = engine->wait(*b, std::chrono::milliseconds(0));
    ASSERT_FALSE(gone);
    EXPECT_EQ(gone.error().code, -ENOENT) << "the engine freed it when it ended: " << gone.error().message;
}

TEST_F(StreamSubmitTest, AFailureFoundAtThePeerIsReportedOnTheBatchAndLoggedOnceAndTheStreamGoesOn) {
    start();
    auto later = bytes(kSize, 0x5d);
    Probe probes[2];  // outlive the stream (as the source buffers do)
    Stream stream;
    struct Case {
        const char *what;
        uint64_t remote;
    };
    // Past the end of the peer's buffer: the cached descriptor does not list it, so the engine
    // re-reads the peer's (no such region there either). Then the peer unregisters its buffer,
    // which the cached descriptor still lists: only the peer refuses that one.
    for (Case c : {Case{"a remote range the peer never registered", peer->base + kSize + 4096},
                   Case{"a remote buffer the peer unregistered", peer->base}}) {
        SCOPED_TRACE(c.what);
        if (c.remote == peer->base) {
            ASSERT_EQ(peer->command("unreg"), "OK");
        }
        StderrCapture capture;
        std::vector<Request> w = {{Opcode::Write, dev, seg, c.remote, 64 << 10, ""}};
        auto b = engine->submit_on_stream(w, stream.handle);
        ASSERT_TRUE(b) << "refused at the call, but only the peer knows: " << b.error().message;
        Probe &probe = probes[c.remote == peer->base];
        probe.engine = engine.get();
        probe.batch = *b;
        ASSERT_EQ(cuda().launch(stream.handle, &Probe::run, &probe), 0);
        ASSERT_EQ(cuda().put_async(dev, later.data(), kSize, stream.handle), 0);
        auto r = engine->wait(*b, std::chrono::seconds(60));
        ASSERT_FALSE(r);
        EXPECT_NE(r.error().code, kWaitPending);
        EXPECT_FALSE(r.error().message.empty());
        auto st = engine->status(*b, 0);
        ASSERT_TRUE(st);
        EXPECT_EQ(st->state, OpState::Failed);
        EXPECT_EQ(st->code, r.error().code);
        EXPECT_NE(r.error().message.find(st->message), std::string::npos) << r.error().message;
        ASSERT_TRUE(sync_within(stream.handle, std::chrono::seconds(30))) << "the stream went on after the failure";
        EXPECT_EQ(probe.code, r.error().code) << "the stream reached what follows once the batch had failed";
        EXPECT_TRUE(cuda().get(dev, kSize) == later);
        std::string log = capture.text();
        EXPECT_EQ(count(log, "ordered on a CUDA stream) failed"), 1u) << log;
        EXPECT_EQ(count(log, "batch " + std::to_string(*b) + " (ordered on a CUDA stream) failed"), 1u) << log;
        EXPECT_NE(log.find(st->message), std::string::npos) << "the log names the reason: " << log;
        std::printf("%s: %d %s\n", c.what, st->code, st->message.c_str());
        EXPECT_TRUE(engine->free_batch(*b));
    }
}

TEST_F(StreamSubmitTest, RefusedAtTheCallWithNothingEnqueued) {
    start({"--access", "r"});
    Stream stream;
    std::vector<uint8_t> host(4096);
    uint64_t enqueued = cuda().host_fns();
    auto refused = [&](std::vector<Request> reqs, void *s = nullptr) {
        auto b = engine->submit_on_stream(reqs, s ? s : stream.handle);
        EXPECT_FALSE(b);
        return b ? Error{0, "accepted"} : b.error();
    };
    auto e = refused({{Opcode::Read, host.data(), seg, peer->base, 4096, ""}});
    EXPECT_EQ(e.code, -EFAULT) << e.message;
    EXPECT_NE(e.message.find("register the buffer first"), std::string::npos) << e.message;
    EXPECT_EQ(refused({{Opcode::Read, dev, seg, peer->base, 0, ""}}).code, -EINVAL);
    EXPECT_EQ(refused({{Opcode::Read, dev, seg, peer->base, kSize + 1, ""}}).code, -EFAULT) << "past the region";
    EXPECT_EQ(refused({{Opcode::Read, dev, seg + 100, peer->base, 4096, ""}}).code, -ENOENT);
    EXPECT_EQ(refused({}).code, -EINVAL);
    e = refused({{Opcode::Write, dev, seg, peer->base, 4096, ""}});
    EXPECT_EQ(e.code, -EACCES) << "the peer registered its buffer read-only: " << e.message;
    // The default stream belongs to the calling thread's current context; this thread has none.
    std::vector<Request> read = {{Opcode::Read, dev, seg, peer->base, 4096, ""}};
    std::thread([&] {
        auto b = engine->submit_on_stream(read, nullptr);
        ASSERT_FALSE(b);
        EXPECT_EQ(b.error().code, -EINVAL);
        EXPECT_NE(b.error().message.find("current"), std::string::npos) << b.error().message;
        EXPECT_NE(b.error().message.find("nothing was enqueued"), std::string::npos) << b.error().message;
    }).join();
    EXPECT_EQ(cuda().host_fns(), enqueued) << "a refused call enqueued a host function";
    // The same READ goes through from the right stream.
    auto b = engine->submit_on_stream(read, stream.handle);
    ASSERT_TRUE(b) << b.error().message;
    EXPECT_EQ(cuda().host_fns(), enqueued + 1);
    ASSERT_TRUE(engine->wait(*b, std::chrono::seconds(60)));
    EXPECT_TRUE(cuda().get(dev, 4096) == pattern(4096));
}

// The legacy default stream runs its work inside the call in the fake driver, so the host
// function runs (and blocks) before cuLaunchHostFunc returns: submit_on_stream holds no lock
// across the launch.
TEST_F(StreamSubmitTest, TheDefaultStreamOfTheCurrentContextWorks) {
    start();
    auto copied = bytes(kSize, 0x77);
    cuda().put(dev, copied.data(), kSize);
    auto b = engine->submit_on_stream(write_all(), nullptr);
    ASSERT_TRUE(b) << b.error().message;
    auto st = engine->status(*b, 0);
    ASSERT_TRUE(st);
    EXPECT_EQ(st->state, OpState::Done) << "the default stream here ran the batch inside the call";
    ASSERT_TRUE(engine->wait(*b, std::chrono::seconds(60)));
    EXPECT_EQ(peer->command("sum"), sum_line(copied));
}

TEST_F(StreamSubmitTest, DestroyingTheEngineCancelsWhatNoStreamReachedWithoutHangingOrCrashing) {
    start();
    auto copied = bytes(kSize, 0x42);
    Stream stream;
    cuda().delay_next_copy_us(3000000);  // the stream reaches the batch 3 s from now
    ASSERT_EQ(cuda().put_async(dev, copied.data(), kSize, stream.handle), 0);
    std::vector<BatchId> batches;
    for (int i = 0; i < 3; ++i) {
        auto b = engine->submit_on_stream(write_all(), stream.handle);
        ASSERT_TRUE(b) << b.error().message;
        batches.push_back(*b);
    }
    auto busy = engine->free_batch(batches[0]);
    ASSERT_FALSE(busy);
    EXPECT_EQ(busy.error().code, -EBUSY);
    EXPECT_NE(busy.error().message.find("CUDA stream"), std::string::npos) << busy.error().message;
    auto t0 = Clock::now();
    engine.reset();
    double destroy_s = since(t0);
    EXPECT_LT(destroy_s, 2.0) << "destroying the engine waited for the stream";
    // The host functions run after the engine is gone: each finds its call cancelled.
    ASSERT_TRUE(sync_within(stream.handle, std::chrono::seconds(30)));
    EXPECT_EQ(peer->command("sum"), sum_line(pattern(kSize))) << "a cancelled batch moved bytes";
    std::printf("engine destroyed in %.3f s with 3 batches pending on a stream\n", destroy_s);
}

// The transports end their ops within op_timeout_ms at teardown too (a peer that stopped
// answering holds tcp.so's teardown that long); the stream goes on once they are down.
TEST_F(StreamSubmitTest, DestroyingTheEngineWithABatchInFlightLetsItsStreamGoOn) {
    start({}, {{"tcp.op_timeout_ms", "2000"}});
    Stream stream;
    ASSERT_TRUE(test::stop_process(peer->pid())) << "the peer stops answering";
    auto b = engine->submit_on_stream(write_all(), stream.handle);
    ASSERT_TRUE(b) << b.error().message;
    // Posted once the worker routed it: its transport shows.
    auto until = Clock::now() + std::chrono::seconds(10);
    std::string transport;
    while (transport.empty() && Clock::now() < until) {
        auto st = engine->status(*b, 0);
        ASSERT_TRUE(st);
        transport = st->transport;
        if (transport.empty()) std::this_thread::sleep_for(std::chrono::milliseconds(5));  // polling status
    }
    ASSERT_EQ(transport, "tcp") << "the stream reached the batch and the worker posted it";
    EXPECT_FALSE(sync_within(stream.handle, std::chrono::milliseconds(200))) << "the stream waits for the batch";
    auto t0 = Clock::now();
    engine.reset();
    double destroy_s = since(t0);
    EXPECT_LT(destroy_s, 8.0) << "beyond tcp's op timeout (2 s)";
    ASSERT_TRUE(sync_within(stream.handle, std::chrono::seconds(10))) << "the stream went on once the engine was gone";
    std::printf("engine destroyed in %.3f s with a batch in flight\n", destroy_s);
    kill(peer->pid(), SIGCONT);
}

TEST_F(StreamSubmitTest, TheCApiOrdersABatchOnAStream) {
    start();
    const char *keys[] = {"plugins"};
    const char *values[] = {"tcp"};
    ferry_engine_t *e = nullptr;
    ASSERT_EQ(ferry_engine_create(keys, values, 1, &e), 0) << ferry_last_error();
    ASSERT_EQ(ferry_register(e, dev, kSize, FERRY_MEMORY_AUTO, -1, FERRY_REMOTE_READ | FERRY_REMOTE_WRITE), 0)
        << ferry_last_error();
    ferry_segment_id_t s = 0;
    ASSERT_EQ(ferry_open_segment(e, peer->segment.c_str(), &s), 0) << ferry_last_error();
    auto copied = bytes(kSize, 0x19), again = bytes(kSize, 0x2f);
    Stream stream;
    cuda().delay_next_copy_us(300000);
    ASSERT_EQ(cuda().put_async(dev, copied.data(), kSize, stream.handle), 0);
    ferry_request_t rq{FERRY_WRITE, 0, dev, s, peer->base, kSize, nullptr};
    ferry_batch_id_t batch = 0;
    ASSERT_EQ(ferry_submit_on_stream(e, &rq, 1, stream.handle, &batch), 0) << ferry_last_error();
    ferry_op_status_t st{};
    ASSERT_EQ(ferry_get_status(e, batch, 0, &st), 0);
    EXPECT_EQ(st.state, static_cast<uint32_t>(FERRY_OP_PENDING));
    EXPECT_EQ(ferry_free_batch(e, batch), -EBUSY) << "freed before its stream reached it";
    EXPECT_EQ(ferry_wait_batch(e, batch, 60000), 0) << ferry_last_error();
    ASSERT_EQ(ferry_get_status(e, batch, 0, &st), 0);
    EXPECT_EQ(st.state, static_cast<uint32_t>(FERRY_OP_DONE));
    EXPECT_STREQ(st.transport, "tcp");
    EXPECT_EQ(ferry_free_batch(e, batch), 0);
    EXPECT_EQ(peer->command("sum"), sum_line(copied));
    ferry_batch_id_t untouched = 77;
    EXPECT_EQ(ferry_submit_on_stream(e, &rq, 0, stream.handle, &untouched), -EINVAL);
    EXPECT_EQ(untouched, 77u) << "out-parameters are set only on success";
    // No batch pointer: detached, freed by the engine once it ended.
    ASSERT_EQ(cuda().put_async(dev, again.data(), kSize, stream.handle), 0);
    ASSERT_EQ(ferry_submit_on_stream(e, &rq, 1, stream.handle, nullptr), 0) << ferry_last_error();
    ASSERT_TRUE(sync_within(stream.handle, std::chrono::seconds(30)));
    EXPECT_EQ(peer->command("sum"), sum_line(again));
    ferry_engine_destroy(e);
}

TEST(StreamSubmitNoDriver, WithoutTheCudaDriverTheCallSaysWhatItNeeds) {
    const char *saved = std::getenv("FERRY_LIBCUDA");
    std::string restore = saved ? saved : "";
    setenv("FERRY_LIBCUDA", "/nonexistent/libcuda.so.1", 1);
    auto e = Engine::create({{"plugins", "tcp"}});
    ASSERT_TRUE(e) << e.error().message;
    std::vector<uint8_t> host(4096);
    ASSERT_TRUE((*e)->register_memory(host.data(), host.size()));
    std::vector<Request> write = {{Opcode::Write, host.data(), 1, 0, 4096, ""}};
    auto b = (*e)->submit_on_stream(write, nullptr);
    if (restore.empty()) unsetenv("FERRY_LIBCUDA");
    else setenv("FERRY_LIBCUDA", restore.c_str(), 1);
    ASSERT_FALSE(b);
    EXPECT_EQ(b.error().code, -ENODEV);
    EXPECT_NE(b.error().message.find("needs the CUDA driver (libcuda.so.1)"), std::string::npos) << b.error().message;
    EXPECT_NE(b.error().message.find("/nonexistent/libcuda.so.1"), std::string::npos) << b.error().message;
}
