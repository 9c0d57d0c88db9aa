// The GPU IPC transport's submit and completion path (plugins/gpu_ipc/ipc_submit.cpp and
// ipc_completions.cpp, shared by cuda_ipc.so and hip_ipc.so) driven through its runtime
// interface with a test runtime: "device" memory is host memory, each stream is a worker thread
// running its queue in order, events are markers in that queue. No GPU needed. It counts what
// a batch costs (events, runtime calls) and injects failures to hold the failure semantics: an
// op that fails is reported failed, and no op is reported before every byte of it has landed or
// can no longer.
#include "test_gpu_runtime.hpp"

using namespace ferry_gpu;
using namespace ferry_gpu_test;

namespace {

class GpuIpcBatch : public GpuIpcFixture {};

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

TEST_P(GpuIpcBatch, WithinThePollWindowTheCompletionThreadStandsBackAndReportsOnceTheWindowEnded) {
    make(std::chrono::milliseconds(1500));
    ASSERT_EQ(submit(4, 4096), 0);
    // The copies end within milliseconds; nobody polls.
    std::this_thread::sleep_for(std::chrono::milliseconds(100));
    EXPECT_EQ(counters.event_waits.load(), 0) << "within the window the run is left to poll()";
    // A host that stopped polling still hears of the run, from the completion thread, once the
    // window ended.
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (counters.event_waits.load() == 0 && std::chrono::steady_clock::now() < deadline)
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
    EXPECT_GE(counters.event_waits.load(), 1) << "the completion thread took the run after the window";
    EXPECT_EQ(poll_for(*t_, 4).size(), 4u);
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), 4 * 4096));
    std::vector<ferry_completion_t> more(8);
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    EXPECT_EQ(t_->poll(more.data(), more.size()), 0) << "reported once";
}

INSTANTIATE_TEST_SUITE_P(CopyPath, GpuIpcBatch, ::testing::Values(false, true),
                         [](const auto &info) { return info.param ? "BatchedCopy" : "CopyByCopy"; });
