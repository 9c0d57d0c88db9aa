// The GPU IPC transport's submit and completion path (plugins/gpu_ipc/ipc_transport.cpp, shared
// by cuda_ipc.so and hip_ipc.so) driven through its runtime interface with a test runtime:
// "device" memory is host memory, each stream is a worker thread running its queue in order,
// events are markers in that queue. No GPU needed. It counts what a batch costs (events,
// runtime calls) and injects failures to hold the failure semantics: an op that fails is
// reported failed, and no op is reported before every byte of it has landed or can no longer.
#include <gtest/gtest.h>
#include <poll.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <thread>
#include <vector>

#include "gpu_runtime.hpp"
#include "ipc_transport.hpp"

using namespace ferry_gpu;

namespace {

// One in-order queue with its own thread, like a GPU stream.
class TestStream {
public:
    TestStream() : thread_([this] { loop(); }) {}
    ~TestStream() {
        {
            std::lock_guard l(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
    }
    void push(std::function<void()> fn) {
        {
            std::lock_guard l(mu_);
            q_.push_back(std::move(fn));
        }
        cv_.notify_all();
    }
    void drain() {
        std::unique_lock l(mu_);
        cv_.wait(l, [&] { return q_.empty() && !busy_; });
    }

private:
    void loop() {
        std::unique_lock l(mu_);
        for (;;) {
            cv_.wait(l, [&] { return stop_ || !q_.empty(); });
            if (q_.empty()) return;
            auto fn = std::move(q_.front());
            q_.pop_front();
            busy_ = true;
            l.unlock();
            fn();
            l.lock();
            busy_ = false;
            cv_.notify_all();
        }
    }
    std::mutex mu_;
    std::condition_variable cv_;
    std::deque<std::function<void()>> q_;
    bool busy_ = false, stop_ = false;
    std::thread thread_;
};

struct TestEvent {
    std::mutex mu;
    std::condition_variable cv;
    int state = 1;  // 0 pending, 1 done, < 0 failed (never recorded counts as done, as on CUDA)
};

struct Counters {
    std::atomic<int> copy_async{0}, copy_batch{0}, events_recorded{0}, stream_waits{0}, bytes_landed{0};
};

class TestRuntime final : public Runtime {
public:
    TestRuntime(Counters &c, bool batch) : c_(c), batch_(batch) {}
    std::atomic<int> fail_copy_async_at{-1};  // this copy_async call (0-based) fails synchronously
    std::atomic<bool> fail_batch{false};      // copy_batch queues half its copies, then fails
    std::atomic<bool> fail_event_record{false};
    std::atomic<bool> fail_async{false};  // copies queued from now on fail on the "GPU"
    std::atomic<int> copy_delay_ms{0};

    // While held, event_wait (the completion thread's) blocks before it looks at the event.
    void hold_event_waits(bool hold) {
        {
            std::lock_guard g(gate_mu_);
            hold_waits_ = hold;
        }
        gate_cv_.notify_all();
    }

    const char *name() const override { return "TEST"; }
    uint32_t memory_kind() const override { return FERRY_MEM_CUDA; }
    void probe(bool &available, std::string &) override { available = true; }
    int device_count(int &count, std::string &) override { return count = 1, 0; }
    int current_device(int &device, std::string &) override { return device = 0, 0; }
    int set_device(int, std::string &) override { return 0; }
    int pointer_device(const void *, int &device, bool &is_device, std::string &) override {
        device = 0;
        is_device = true;
        return 0;
    }
    int allocation_range(const void *ptr, uintptr_t &base, size_t &size, std::string &) override {
        base = reinterpret_cast<uintptr_t>(ptr);  // every region is its own allocation here
        size = 64 << 20;
        return 0;
    }
    int ipc_export(void *, IpcHandle &h, std::string &) override { return memset(h.bytes, 0, sizeof h.bytes), 0; }
    int ipc_open(const IpcHandle &, void *&, std::string &e) override { return e = "same process only", -ENOTSUP; }
    int ipc_close(void *, std::string &) override { return 0; }
    int enable_peer_access(int, int, std::string &) override { return 0; }
    int stream_create(Stream &s, std::string &) override { return s = new TestStream, 0; }
    void stream_destroy(Stream s) override { delete static_cast<TestStream *>(s); }
    int event_create(Event &e, std::string &) override { return e = new TestEvent, 0; }
    void event_destroy(Event e) override { delete static_cast<TestEvent *>(e); }
    int event_record(Event e, Stream s, std::string &error) override {
        if (fail_event_record) return error = "event record failed (injected)", -EIO;
        ++c_.events_recorded;
        auto *ev = static_cast<TestEvent *>(e);
        {
            std::lock_guard l(ev->mu);
            ev->state = 0;
        }
        bool failing = fail_async;
        static_cast<TestStream *>(s)->push([ev, failing] {
            std::lock_guard l(ev->mu);
            ev->state = failing ? -EIO : 1;
            ev->cv.notify_all();
        });
        return 0;
    }
    int event_query(Event e, std::string &) override {
        auto *ev = static_cast<TestEvent *>(e);
        std::lock_guard l(ev->mu);
        return ev->state;
    }
    int event_wait(Event e, std::string &error) override {
        {
            std::unique_lock g(gate_mu_);
            gate_cv_.wait(g, [&] { return !hold_waits_; });
        }
        auto *ev = static_cast<TestEvent *>(e);
        std::unique_lock l(ev->mu);
        ev->cv.wait(l, [&] { return ev->state != 0; });
        if (ev->state < 0) return error = "an illegal memory access was encountered (injected)", ev->state;
        return 0;
    }
    int copy_async(void *dst, const void *src, size_t bytes, Stream s, std::string &error) override {
        if (c_.copy_async++ == fail_copy_async_at) return error = "copy refused (injected)", -EINVAL;
        queue_copy(dst, src, bytes, s);
        return 0;
    }
    int stream_wait(Stream s, std::string &) override {
        ++c_.stream_waits;
        static_cast<TestStream *>(s)->drain();
        return 0;
    }
    bool has_copy_batch() override { return batch_; }
    int copy_batch(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t n, Stream s,
                   std::string &error) override {
        ++c_.copy_batch;
        size_t upto = fail_batch ? n / 2 : n;
        for (size_t i = 0; i < upto; ++i) queue_copy(dsts[i], srcs[i], sizes[i], s);
        if (fail_batch) return error = "batched copy failed (injected)", -EIO;
        return 0;
    }

private:
    void queue_copy(void *dst, const void *src, size_t bytes, Stream s) {
        bool failing = fail_async;
        int delay = copy_delay_ms;
        static_cast<TestStream *>(s)->push([=, this] {
            if (delay) std::this_thread::sleep_for(std::chrono::milliseconds(delay));
            if (failing) return;  // a faulting copy moves nothing here
            memcpy(dst, src, bytes);
            c_.bytes_landed += static_cast<int>(bytes);
        });
    }
    Counters &c_;
    bool batch_;
    std::mutex gate_mu_;
    std::condition_variable gate_cv_;
    bool hold_waits_ = false;
};

// One transport connected to itself (same process: the peer's memory is our own), a source and
// a destination region, and helpers to submit and collect.
class GpuIpcBatch : public ::testing::TestWithParam<bool> {
protected:
    static constexpr size_t kStreams = 4;
    void SetUp() override { make({}); }
    // The transport under test, with the given poll window (IpcTransport).
    void make(std::chrono::microseconds poll_window) {
        auto rt = std::make_unique<TestRuntime>(counters, GetParam());
        rt_ = rt.get();
        t_ = std::make_unique<IpcTransport>(std::move(rt), nullptr, "test_ipc", kStreams, poll_window);
        ferry_error_t err{};
        ASSERT_EQ(t_->start(&err), 0) << err.message;
        src.assign(16 << 20, 0);
        dst.assign(16 << 20, 0);
        for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
        ferry_mem_region_t rs{reinterpret_cast<uint64_t>(src.data()),
                              src.size(),
                              FERRY_MEM_CUDA,
                              0,
                              FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE,
                              0};
        ferry_mem_region_t rd = rs;
        rd.addr = reinterpret_cast<uint64_t>(dst.data());
        ASSERT_EQ(t_->register_mem(&rs, &src_h_, &err), 0) << err.message;
        ASSERT_EQ(t_->register_mem(&rd, &dst_local_h_, &err), 0) << err.message;
        uint8_t ep[64], key[256];
        size_t ep_len = sizeof ep, key_len = sizeof key;
        ASSERT_EQ(t_->export_endpoint(ep, &ep_len, &err), 0) << err.message;
        ASSERT_EQ(t_->connect(ep, ep_len, &peer_, &err), 0) << err.message;
        ASSERT_EQ(t_->export_mem(dst_local_h_, key, &key_len, &err), 0) << err.message;
        ASSERT_EQ(t_->import_mem(peer_, &rd, key, key_len, &dst_h_, &err), 0) << err.message;
    }
    void TearDown() override {
        if (t_) {
            rt_->hold_event_waits(false);
            ferry_error_t err{};
            t_->release_mem(peer_, dst_h_, &err);
        }
        t_.reset();
    }
    // n WRITEs of `len` bytes from src into dst, op i at offset i * len; user_data = first + i.
    int submit(size_t n, size_t len, uint64_t first = 0) {
        std::vector<ferry_xfer_op_t> ops(n);
        for (size_t i = 0; i < n; ++i)
            ops[i] = {FERRY_OP_WRITE,
                      0,
                      reinterpret_cast<uint64_t>(src.data()) + i * len,
                      src_h_,
                      reinterpret_cast<uint64_t>(dst.data()) + i * len,
                      dst_h_,
                      len,
                      first + i};
        ferry_error_t err{};
        return t_->submit(peer_, ops.data(), n, &err);
    }
    // Every completion of n ops, by user_data; fails the test after 30 s (a hang).
    std::map<uint64_t, ferry_completion_t> collect(size_t n, int *wakeups = nullptr) {
        std::map<uint64_t, ferry_completion_t> got;
        auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
        std::vector<ferry_completion_t> buf(512);
        while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
            pollfd p{t_->completion_fd(), POLLIN, 0};
            if (::poll(&p, 1, 100) <= 0) continue;
            if (wakeups) ++*wakeups;
            int k = t_->poll(buf.data(), buf.size());
            for (int i = 0; i < k; ++i) got[buf[i].user_data] = buf[i];
        }
        EXPECT_EQ(got.size(), n) << "every op completes";
        return got;
    }

    Counters counters;
    TestRuntime *rt_ = nullptr;
    std::unique_ptr<IpcTransport> t_;
    std::vector<uint8_t> src, dst;
    uint64_t src_h_ = 0, dst_local_h_ = 0, dst_h_ = 0, peer_ = 0;
};

}  // namespace

TEST_P(GpuIpcBatch, ABatchCostsOneEventPerStreamAndLandsEveryByte) {
    constexpr size_t kOps = 256, kLen = 4096;
    ASSERT_EQ(submit(kOps, kLen), 0);
    int wakeups = 0;
    auto got = collect(kOps, &wakeups);
    for (auto &[u, c] : got) EXPECT_EQ(c.status, 0) << "op " << u << ": " << c.message;
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), kOps * kLen));
    // 256 small ops: 4 runs of at most kMaxRunOps (64) ops on one stream, one event each.
    EXPECT_EQ(counters.events_recorded.load(), 4) << "one event per run, not per op";
    EXPECT_LE(wakeups, 4) << "the completion fd fires at most once per run";
    if (GetParam()) {
        EXPECT_EQ(counters.copy_batch.load(), 4) << "one batched copy per run";
        EXPECT_EQ(counters.copy_async.load(), 0);
    } else {
        EXPECT_EQ(counters.copy_async.load(), static_cast<int>(kOps));
    }
    // Three small ops: one run. Three large ones: one run per stream, each landing whole.
    counters.events_recorded = 0;
    ASSERT_EQ(submit(3, kLen), 0);
    collect(3);
    EXPECT_EQ(counters.events_recorded.load(), 1);
    counters.events_recorded = 0;
    ASSERT_EQ(submit(3, kSpreadOpBytes), 0);
    collect(3);
    EXPECT_EQ(counters.events_recorded.load(), 3);
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), 3 * kSpreadOpBytes));
}

TEST_P(GpuIpcBatch, AnOpTheRuntimeRefusesFailsAloneAndTheOthersLand) {
    if (GetParam()) rt_->fail_batch = true;  // the batched copy fails: op by op from then on
    rt_->fail_copy_async_at = 5;
    ASSERT_EQ(submit(16, 4096), 0);
    auto got = collect(16);
    for (auto &[u, c] : got) {
        if (u == 5) {
            EXPECT_EQ(c.status, -EINVAL) << "op " << u;
            EXPECT_STREQ(c.message, "copy refused (injected)");
        } else {
            EXPECT_EQ(c.status, 0) << "op " << u << ": " << c.message;
            EXPECT_EQ(0, memcmp(dst.data() + u * 4096, src.data() + u * 4096, 4096)) << "op " << u;
        }
    }
    if (!GetParam()) {
        for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(dst[5 * 4096 + i], 0) << "nothing of the refused op landed";
    } else {
        // The failed batched copy may have queued op 5 already: it was let end before op 5 was
        // reported, so nothing of it lands after the report.
        EXPECT_GT(counters.stream_waits.load(), 0);
    }
}

TEST_P(GpuIpcBatch, AFaultOnTheGpuFailsEveryOpOfItsRunOnlyOnceItsCopiesEnded) {
    rt_->copy_delay_ms = 5;
    rt_->fail_async = true;
    ASSERT_EQ(submit(64, 4096), 0);
    auto got = collect(64);
    for (auto &[u, c] : got) {
        EXPECT_EQ(c.status, -EIO) << "op " << u;
        EXPECT_NE(std::string(c.message).find("illegal memory access"), std::string::npos) << c.message;
    }
    rt_->fail_async = false;
    rt_->copy_delay_ms = 0;
    ASSERT_EQ(submit(8, 4096), 0);
    for (auto &[u, c] : collect(8)) EXPECT_EQ(c.status, 0) << "op " << u << " after the fault: " << c.message;
}

TEST_P(GpuIpcBatch, WithoutAnEventTheOpsAreReportedOnlyAfterTheirStreamDrained) {
    // Copies queued, then no event can be recorded behind them: before, each op was reported
    // failed at once while its copy was still queued, so its bytes landed after the report.
    rt_->copy_delay_ms = 50;
    rt_->fail_event_record = true;
    ASSERT_EQ(submit(8, 4096), 0);
    auto got = collect(8);
    int landed = counters.bytes_landed.load();
    for (auto &[u, c] : got) EXPECT_EQ(c.status, -EIO) << "op " << u;
    EXPECT_EQ(landed, 8 * 4096) << "every queued copy ended before its op was reported";
    EXPECT_GT(counters.stream_waits.load(), 0);
}

// Calls poll() (never sleeping on the fd) until it returned n completions or 30 s passed;
// `each` runs after every call that returned none.
std::vector<ferry_completion_t> poll_for(
    IpcTransport &t, size_t n, const std::function<void()> &each = [] {}) {
    std::vector<ferry_completion_t> got, buf(256);
    auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (got.size() < n && std::chrono::steady_clock::now() < deadline) {
        int k = t.poll(buf.data(), buf.size());
        got.insert(got.end(), buf.begin(), buf.begin() + k);
        if (k == 0) {
            each();
            std::this_thread::sleep_for(std::chrono::milliseconds(1));
        }
    }
    return got;
}

bool readable(int fd) {
    pollfd p{fd, POLLIN, 0};
    return ::poll(&p, 1, 0) == 1;
}

TEST_P(GpuIpcBatch, PollReportsAFinishedRunItselfAndTheCompletionThreadNeverReportsItAgain) {
    // Before: only the completion thread reported a run, so a host that polled saw nothing until
    // that thread woke and handed it over (a thread wakeup per batch on the critical path).
    rt_->hold_event_waits(true);  // the completion thread cannot report anything meanwhile
    ASSERT_EQ(submit(64, 4096), 0);
    auto first = poll_for(*t_, 64);
    ASSERT_EQ(first.size(), 64u) << "poll() queries the run's event and reports it";
    for (auto &c : first) EXPECT_EQ(c.status, 0) << c.message;
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), 64 * 4096));
    std::vector<ferry_completion_t> buf(128);
    // The completion thread wakes on the event it was waiting for: that run is gone, so it must
    // report only the next one, exactly once.
    rt_->hold_event_waits(false);
    ASSERT_EQ(submit(8, 4096, 1000), 0);
    auto got = collect(8);
    for (auto &[u, c] : got) EXPECT_GE(u, 1000u) << "op " << u << " of the first run reported twice";
    EXPECT_EQ(t_->poll(buf.data(), buf.size()), 0) << "nothing reported twice";
}

TEST_P(GpuIpcBatch, WithinThePollWindowTheFdStaysReadableUntilTheRunIsReported) {
    // Without a window, the fd is readable only once a completion is queued (none is: the
    // completion thread is held, and only poll() reports).
    rt_->hold_event_waits(true);
    ASSERT_EQ(submit(4, 4096), 0);
    EXPECT_FALSE(readable(t_->completion_fd())) << "window 0: the host may sleep";
    EXPECT_EQ(poll_for(*t_, 4, [&] { EXPECT_FALSE(readable(t_->completion_fd())); }).size(), 4u);
    // With one, the host keeps polling while the copies are in flight, and stops once reported.
    rt_->hold_event_waits(false);
    ferry_error_t err{};
    t_->release_mem(peer_, dst_h_, &err);
    t_.reset();
    make(std::chrono::seconds(60));
    rt_->hold_event_waits(true);
    rt_->copy_delay_ms = 100;
    ASSERT_EQ(submit(4, 4096), 0);
    EXPECT_TRUE(readable(t_->completion_fd())) << "readable from the submit on";
    int empty_polls = 0;
    auto got = poll_for(*t_, 4, [&] {
        ++empty_polls;
        EXPECT_TRUE(readable(t_->completion_fd())) << "still readable after a poll() that found nothing";
    });
    EXPECT_EQ(got.size(), 4u) << "reported by poll(), not by the held completion thread";
    EXPECT_GT(empty_polls, 0) << "100 ms copies: some poll() found them in flight";
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), 4 * 4096));
    EXPECT_FALSE(readable(t_->completion_fd())) << "nothing in flight: the host may sleep again";
}

INSTANTIATE_TEST_SUITE_P(CopyPath, GpuIpcBatch, ::testing::Values(false, true),
                         [](const auto &info) { return info.param ? "BatchedCopy" : "CopyByCopy"; });
