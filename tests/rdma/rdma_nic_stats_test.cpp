// rdma.so's per-NIC report (rail_stats, nic_stats.hpp) driven through the calls its datapath
// makes, on a simulated clock: work requests that finish on each NIC, path errors that pause one,
// the balancer's queue and measured throughput; and the ABI's capacity convention.
#include "nic_stats.hpp"
#include "rdma_test_util.hpp"

#include <ferry/plugin.h>
#include <gtest/gtest.h>

namespace ferry_rdma {
namespace {

using namespace ferry_rdma::test;
using ferry_plugin::RailBalancer;
using std::chrono::milliseconds;

Clock::time_point at(Clock::duration d) { return Clock::time_point{} + std::chrono::hours(1) + d; }

const std::vector<std::string> kNames = {"mlx5_0:1", "mlx5_1:1"};

TEST(RdmaNicStats, CountsWhatEachNicCompletedByOperation) {
    RailBalancer bal(2);
    NicStats stats(2);
    bal.queue(0, 3 * kMiB);
    bal.queue(1, kMiB);
    stats.finished(bal, 0, FERRY_OP_READ, kMiB, true);
    stats.finished(bal, 0, FERRY_OP_WRITE, kMiB, true);
    stats.finished(bal, 0, FERRY_OP_WRITE, kMiB, false);  // failed or flushed: no bytes
    auto r = stats.report(kNames, bal, at(milliseconds(0)), 3);
    ASSERT_EQ(r.size(), 2u);
    EXPECT_STREQ(r[0].name, "mlx5_0:1");
    EXPECT_STREQ(r[1].name, "mlx5_1:1");
    EXPECT_EQ(r[0].read_bytes, kMiB);
    EXPECT_EQ(r[0].write_bytes, kMiB);
    EXPECT_EQ(r[0].completed, 2u);
    EXPECT_EQ(r[0].queued_bytes, 0u) << "every work request left the queue, the failed one too";
    EXPECT_EQ(r[1].queued_bytes, kMiB) << "still queued on NIC 1";
    EXPECT_EQ(r[1].read_bytes + r[1].write_bytes + r[1].completed, 0u);
    EXPECT_EQ(r[0].failures + r[0].pauses + r[0].paused_peers, 0u);
}

TEST(RdmaNicStats, APathErrorPausesTheNicForEveryPeerUntilItsCooldownEnds) {
    RailBalancer bal(2);
    NicStats stats(2);
    const auto t0 = at(milliseconds(0));
    EXPECT_EQ(stats.path_error(bal, 1, t0), milliseconds(1000));
    // Its other queue pairs' errors of the same outage: failures, not a new pause.
    EXPECT_EQ(stats.path_error(bal, 1, t0 + milliseconds(5)), Clock::duration::zero());
    auto r = stats.report(kNames, bal, t0 + milliseconds(999), 3);
    EXPECT_EQ(r[1].failures, 2u);
    EXPECT_EQ(r[1].pauses, 1u);
    EXPECT_EQ(r[1].paused_peers, 3u) << "a NIC pauses for all peers connected";
    EXPECT_EQ(r[0].paused_peers, 0u);
    EXPECT_EQ(r[0].failures, 0u);
    r = stats.report(kNames, bal, t0 + milliseconds(1000), 3);
    EXPECT_EQ(r[1].paused_peers, 0u) << "the cooldown is over";
    EXPECT_EQ(r[1].pauses, 1u) << "counts only grow";
    // Failing again when probed: a second pause, twice as long.
    EXPECT_EQ(stats.path_error(bal, 1, t0 + milliseconds(1000)), milliseconds(2000));
    EXPECT_EQ(stats.report(kNames, bal, t0 + milliseconds(2999), 1)[1].paused_peers, 1u);
    EXPECT_EQ(stats.report(kNames, bal, t0 + milliseconds(2999), 1)[1].pauses, 2u);
}

TEST(RdmaNicStats, ThroughputIsWhatTheBalancerMeasuredWhileBusy) {
    RailBalancer bal(2);
    NicStats stats(2);
    EXPECT_EQ(stats.report(kNames, bal, at(milliseconds(0)), 1)[0].throughput, 0) << "not measured yet";
    bal.queue(0, 8 * kMiB);
    ASSERT_TRUE(bal.sample(at(milliseconds(0))));  // the starting point
    ASSERT_TRUE(bal.sample(at(milliseconds(2))));  // busy from here on
    for (int i = 0; i < 4; ++i) stats.finished(bal, 0, FERRY_OP_WRITE, kMiB, true);
    ASSERT_TRUE(bal.sample(at(milliseconds(6))));  // 4 MiB in 4 ms
    auto r = stats.report(kNames, bal, at(milliseconds(6)), 1);
    EXPECT_DOUBLE_EQ(r[0].throughput, 4.0 * kMiB / 0.004);
    EXPECT_EQ(r[1].throughput, 0) << "NIC 1 carried nothing";
    EXPECT_EQ(r[0].queued_bytes, 4 * kMiB);
}

TEST(RdmaNicStats, ReportFollowsTheCapacityConvention) {
    RailBalancer bal(2);
    NicStats stats(2);
    stats.finished(bal, 1, FERRY_OP_READ, 4096, true);
    const auto rails = stats.report(kNames, bal, at(milliseconds(0)), 0);
    ferry_rail_stats_t out[2] = {};
    out[0].read_bytes = 77;
    size_t n = 1;
    ferry_error_t err{};
    EXPECT_EQ(ferry_plugin::copy_rail_stats(rails, out, &n, &err, "rdma"), -ENOSPC);
    EXPECT_EQ(n, 2u) << "the count needed";
    EXPECT_TRUE(contains(err.message, "rail_stats")) << err.message;
    EXPECT_EQ(out[0].read_bytes, 77u) << "nothing written on failure";
    n = 2;
    ASSERT_EQ(ferry_plugin::copy_rail_stats(rails, out, &n, &err, "rdma"), 0);
    EXPECT_EQ(n, 2u);
    EXPECT_STREQ(out[1].name, "mlx5_1:1");
    EXPECT_EQ(out[1].read_bytes, 4096u);
    EXPECT_EQ(out[0].read_bytes, 0u);
    // A name longer than the field is cut, still NUL-terminated.
    const auto long_name = ferry_plugin::rail_entry(std::string(200, 'x'), {});
    EXPECT_EQ(std::string(long_name.name).size(), sizeof long_name.name - 1);
}

}  // namespace
}  // namespace ferry_rdma
