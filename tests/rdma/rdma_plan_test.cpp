// rdma.so's planning: registration chunking at max_mr_size, work requests split at both sides'
// registrations and striped over NICs (weighed by throughput and queue, around paused NICs),
// selective signalling and the send window.
#include "plan.hpp"
#include "rdma_test_util.hpp"
#include "verbs.hpp"

#include <ferry/plugin.h>
#include <gtest/gtest.h>

#include <map>

namespace ferry_rdma {
namespace {

using namespace ferry_rdma::test;

TEST(RdmaPlan, MrLimitIsTheSmallerOfDeviceAndOptionInWholePages) {
    EXPECT_EQ(effective_mr_limit(UINT64_MAX, 0), UINT64_MAX & ~4095ull);
    EXPECT_EQ(effective_mr_limit(1ull << 40, 0), 1ull << 40);
    EXPECT_EQ(effective_mr_limit(1ull << 40, 4 * kMiB), 4 * kMiB);
    EXPECT_EQ(effective_mr_limit(2 * kMiB, 4 * kMiB), 2 * kMiB);  // the option never raises the device's
    EXPECT_EQ(effective_mr_limit((1ull << 32) - 1, 0), (1ull << 32) - 4096);
    EXPECT_EQ(effective_mr_limit(100, 0), 4096u);
}

TEST(RdmaPlan, RegistrationChunksAtMaxMrSize) {
    EXPECT_EQ(plan_mr_chunks(0x1000, 3 * kMiB, 4 * kMiB), (std::vector<Span>{{0x1000, 3 * kMiB}}));
    EXPECT_EQ(plan_mr_chunks(0x1000, 8 * kMiB, 4 * kMiB),
              (std::vector<Span>{{0x1000, 4 * kMiB}, {0x1000 + 4 * kMiB, 4 * kMiB}}));
    auto c = plan_mr_chunks(0x1234, 10 * kMiB + 5, 4 * kMiB);
    ASSERT_EQ(c.size(), 3u);
    EXPECT_EQ(c[2].len, 2 * kMiB + 5);
    uint64_t at = 0x1234;
    for (const auto &s : c) {
        EXPECT_EQ(s.addr, at);
        EXPECT_LE(s.len, 4 * kMiB);
        at += s.len;
    }
    EXPECT_EQ(at, 0x1234 + 10 * kMiB + 5);
    EXPECT_TRUE(plan_mr_chunks(0x1000, 0, 4096).empty());
    EXPECT_EQ(chunk_index(c, 0x1234), 0u);
    EXPECT_EQ(chunk_index(c, 0x1234 + 4 * kMiB), 1u);
    EXPECT_EQ(chunk_index(c, 0x1234 + 4 * kMiB - 1), 0u);
    EXPECT_EQ(chunk_index(c, 0x1233), SIZE_MAX);
    EXPECT_EQ(chunk_index(c, 0x1234 + 10 * kMiB + 5), SIZE_MAX);
}

// Every piece lies in one chunk on each side, pieces tile the op in order.
void expect_tiles(const std::vector<WrPiece> &p, const WrPlanInput &in) {
    uint64_t off = 0;
    for (const auto &w : p) {
        EXPECT_EQ(w.local_addr, in.local_addr + off);
        EXPECT_EQ(w.remote_addr, in.remote_addr + off);
        const Span &l = (*in.local_chunks)[w.local_chunk], &r = (*in.remote_chunks)[w.remote_chunk];
        EXPECT_GE(w.local_addr, l.addr);
        EXPECT_LE(w.local_addr + w.len, l.addr + l.len);
        EXPECT_GE(w.remote_addr, r.addr);
        EXPECT_LE(w.remote_addr + w.len, r.addr + r.len);
        EXPECT_LE(w.len, in.max_wr_size);
        off += w.len;
    }
    EXPECT_EQ(off, in.len);
}

TEST(RdmaPlan, WorkRequestsSplitAtBothSidesRegistrations) {
    auto local = plan_mr_chunks(0x100000, 16 * kMiB, 4 * kMiB);
    auto remote = plan_mr_chunks(0x900000 + 12345, 16 * kMiB, 3 * kMiB);
    WrPlanInput in;
    in.local_addr = 0x100000 + 1000;
    in.remote_addr = 0x900000 + 12345 + 5000;
    in.len = 10 * kMiB;
    in.local_chunks = &local;
    in.remote_chunks = &remote;
    in.local_nics = {0};
    in.remote_nics = {0};
    auto p = plan_work_requests(in);
    expect_tiles(p, in);
    // Cuts at local 4 MiB boundaries (2 inside) and remote 3 MiB boundaries (3 inside).
    EXPECT_EQ(p.size(), 6u);
    in.max_wr_size = kMiB;
    p = plan_work_requests(in);
    expect_tiles(p, in);
    EXPECT_GE(p.size(), 10u);
}

TEST(RdmaPlan, LargeOpsStripeOverTheNearestNicsSmallOnesRotate) {
    auto local = plan_mr_chunks(0x100000, 64 * kMiB, 1ull << 40);
    auto remote = plan_mr_chunks(0x900000, 64 * kMiB, 1ull << 40);
    WrPlanInput in;
    in.local_addr = 0x100000;
    in.remote_addr = 0x900000;
    in.len = 8 * kMiB;
    in.local_chunks = &local;
    in.remote_chunks = &remote;
    in.local_nics = {2, 5};
    in.remote_nics = {1, 3};
    in.stripe_min = kMiB;
    auto p = plan_work_requests(in);
    expect_tiles(p, in);
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[0].len, 4 * kMiB);
    EXPECT_EQ(p[0].local_nic, 2);
    EXPECT_EQ(p[0].remote_nic, 1);
    EXPECT_EQ(p[1].local_nic, 5);
    EXPECT_EQ(p[1].remote_nic, 3);
    // Below 2 x stripe_min: one NIC, chosen by the rotation.
    in.len = 2 * kMiB - 1;
    in.rotation = 1;
    p = plan_work_requests(in);
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].local_nic, 5);
    EXPECT_EQ(p[0].remote_nic, 3);
    // Uneven sizes: stripes are page multiples, the last takes the rest.
    in.len = 5 * kMiB + 3;
    in.local_nics = {0, 1, 2};
    in.rotation = 0;
    p = plan_work_requests(in);
    expect_tiles(p, in);
    ASSERT_EQ(p.size(), 3u);
    EXPECT_EQ(p[0].len % 4096, 0u);
    EXPECT_EQ(p[2].local_nic, 2);
}

// Bytes per local NIC, and the remote NIC each local NIC was paired with.
std::map<uint16_t, uint64_t> bytes_on(const std::vector<WrPiece> &p) {
    std::map<uint16_t, uint64_t> out;
    for (const auto &w : p) out[w.local_nic] += w.len;
    return out;
}
std::map<uint16_t, uint16_t> pairing(const std::vector<WrPiece> &p) {
    std::map<uint16_t, uint16_t> out;
    for (const auto &w : p) out[w.local_nic] = w.remote_nic;
    return out;
}

struct TwoNics {
    std::vector<Span> local = plan_mr_chunks(0x100000, 256 * kMiB, 1ull << 40);
    std::vector<Span> remote = plan_mr_chunks(0x900000, 256 * kMiB, 1ull << 40);
    std::vector<RailLoad> load;
    WrPlanInput in;
    TwoNics() {
        in.local_addr = 0x100000;
        in.remote_addr = 0x900000;
        in.len = 8 * kMiB;
        in.local_chunks = &local;
        in.remote_chunks = &remote;
        in.local_nics = {0, 1};
        in.remote_nics = {0, 1};
        in.stripe_min = kMiB;
        in.nic_load = &load;
    }
};

TEST(RdmaPlan, EqualNicsStillGetEqualStripes) {
    TwoNics t;
    // Measured and equal, idle: as if nothing were known.
    t.load = {{0, 12e9, true}, {0, 12e9, true}};
    auto p = plan_work_requests(t.in);
    expect_tiles(p, t.in);
    EXPECT_EQ(bytes_on(p), (std::map<uint16_t, uint64_t>{{0, 4 * kMiB}, {1, 4 * kMiB}}));
    EXPECT_EQ(pairing(p), (std::map<uint16_t, uint16_t>{{0, 0}, {1, 1}}));
    // Equal queues too.
    t.load = {{3 * kMiB, 12e9, true}, {3 * kMiB, 12e9, true}};
    EXPECT_EQ(bytes_on(plan_work_requests(t.in)), (std::map<uint16_t, uint64_t>{{0, 4 * kMiB}, {1, 4 * kMiB}}));
    // Three equal NICs, uneven size: whole pages, the last takes the rest.
    t.in.local_nics = {0, 1, 2};
    t.load.assign(3, RailLoad{0, 12e9, true});
    t.in.len = 5 * kMiB + 3;
    p = plan_work_requests(t.in);
    expect_tiles(p, t.in);
    ASSERT_EQ(p.size(), 3u);
    EXPECT_EQ(p[0].len, p[1].len);
    EXPECT_EQ(p[0].len % 4096, 0u);
    EXPECT_EQ(p[2].len, t.in.len - 2 * p[0].len);
}

TEST(RdmaPlan, StripesFollowMeasuredThroughputAndQueues) {
    TwoNics t;
    // 1 and 3 GB/s: a quarter and three quarters, each with its own remote NIC.
    t.load = {{0, 1e9, true}, {0, 3e9, true}};
    auto p = plan_work_requests(t.in);
    expect_tiles(p, t.in);
    EXPECT_EQ(bytes_on(p), (std::map<uint16_t, uint64_t>{{0, 2 * kMiB}, {1, 6 * kMiB}}));
    EXPECT_EQ(pairing(p), (std::map<uint16_t, uint16_t>{{0, 0}, {1, 1}}));
    // The rotation orders the stripes, not their sizes.
    t.in.rotation = 1;
    p = plan_work_requests(t.in);
    expect_tiles(p, t.in);
    EXPECT_EQ(p.front().local_nic, 1);
    EXPECT_EQ(bytes_on(p), (std::map<uint16_t, uint64_t>{{0, 2 * kMiB}, {1, 6 * kMiB}}));
    EXPECT_EQ(pairing(p), (std::map<uint16_t, uint16_t>{{0, 0}, {1, 1}}));
    // Equal speeds, 2 MiB already queued on NIC 0: both finish together.
    t.in.rotation = 0;
    t.load = {{2 * kMiB, 5e9, true}, {0, 5e9, true}};
    EXPECT_EQ(bytes_on(plan_work_requests(t.in)), (std::map<uint16_t, uint64_t>{{0, 3 * kMiB}, {1, 5 * kMiB}}));
    // NIC 0 busy past the time NIC 1 would finish the whole op: one stripe.
    t.load = {{64 * kMiB, 5e9, true}, {0, 5e9, true}};
    p = plan_work_requests(t.in);
    EXPECT_EQ(bytes_on(p), (std::map<uint16_t, uint64_t>{{1, 8 * kMiB}}));
    EXPECT_EQ(p.front().remote_nic, 1);
    // A stripe that would fall below stripe_min is not made.
    t.load = {{0, 1e9, true}, {0, 20e9, true}};
    EXPECT_EQ(bytes_on(plan_work_requests(t.in)), (std::map<uint16_t, uint64_t>{{1, 8 * kMiB}}));
    // Weighted stripes are still split at registrations and at max_wr_size.
    auto chunks = plan_mr_chunks(0x100000, 256 * kMiB, 3 * kMiB);
    t.in.local_chunks = &chunks;
    t.in.max_wr_size = kMiB;
    t.load = {{0, 1e9, true}, {0, 3e9, true}};
    t.in.len = 16 * kMiB + 5;
    p = plan_work_requests(t.in);
    expect_tiles(p, t.in);
}

TEST(RdmaPlan, SmallOpsGoToTheNicThatFinishesFirst) {
    TwoNics t;
    t.in.len = 64 * 1024;
    t.load = {{4 * kMiB, 5e9, true}, {0, 5e9, true}};
    auto p = plan_work_requests(t.in);
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].local_nic, 1) << "NIC 0 has 4 MiB to move first";
    EXPECT_EQ(p[0].remote_nic, 1) << "paired as round robin would have";
    // A batch of small ops, each adding to the queue it goes to (as submit does): they spread
    // 1:3 over NICs of 1 and 3 GB/s.
    t.load = {{0, 1e9, true}, {0, 3e9, true}};
    for (uint32_t k = 0; k < 400; ++k) {
        t.in.rotation = k;
        for (const auto &w : plan_work_requests(t.in)) t.load[w.local_nic].queued += w.len;
    }
    EXPECT_EQ(t.load[0].queued, 100 * t.in.len);
    EXPECT_EQ(t.load[1].queued, 300 * t.in.len);
}

TEST(RdmaPlan, PausedNicsGetNoWorkUntilTheirCooldownEnds) {
    // NICs 0 and 1 nearest the memory, NIC 2 farther; each remote NIC answers.
    TwoNics t;
    t.in.other_nics = {2};
    RailBalancer nics(3);
    auto t0 = Clock::time_point{} + std::chrono::hours(1);
    auto plan_at = [&](Clock::duration since) {
        t.load = nics.loads(t0 + since);
        auto p = plan_work_requests(t.in);
        expect_tiles(p, t.in);
        return bytes_on(p);
    };
    using std::chrono::milliseconds;
    using Bytes = std::map<uint16_t, uint64_t>;
    EXPECT_EQ(plan_at(milliseconds(0)), (Bytes{{0, 4 * kMiB}, {1, 4 * kMiB}}));
    // A path error on NIC 1: 1 s without new work.
    EXPECT_EQ(nics.fail(1, t0), milliseconds(1000));
    EXPECT_EQ(plan_at(milliseconds(500)), (Bytes{{0, 8 * kMiB}}));
    t.in.len = 4096;
    t.in.rotation = 1;  // its turn, were it not paused
    EXPECT_EQ(plan_at(milliseconds(500)), (Bytes{{0, 4096}}));
    t.in.len = 8 * kMiB;
    t.in.rotation = 0;
    // NIC 0 too: the farther NIC takes the work.
    nics.fail(0, t0 + milliseconds(500));
    EXPECT_EQ(plan_at(milliseconds(600)), (Bytes{{2, 8 * kMiB}}));
    // Every NIC paused: the nearest are tried, as if none were.
    nics.fail(2, t0 + milliseconds(600));
    EXPECT_EQ(plan_at(milliseconds(700)), (Bytes{{0, 4 * kMiB}, {1, 4 * kMiB}}));
    // NIC 1's cooldown ends first: it alone is probed; then all are back.
    EXPECT_EQ(plan_at(milliseconds(1000)), (Bytes{{1, 8 * kMiB}}));
    EXPECT_EQ(plan_at(milliseconds(1600)), (Bytes{{0, 4 * kMiB}, {1, 4 * kMiB}}));
    // NIC 1 fails again within 30 s of its last failure: twice the pause.
    EXPECT_EQ(nics.fail(1, t0 + milliseconds(1600)), milliseconds(2000));
    EXPECT_EQ(plan_at(milliseconds(3599)), (Bytes{{0, 8 * kMiB}}));
    EXPECT_EQ(plan_at(milliseconds(3600)), (Bytes{{0, 4 * kMiB}, {1, 4 * kMiB}}));
}

TEST(RdmaPlan, PathErrorsPauseTheNicOtherErrorsDoNot) {
    EXPECT_TRUE(wc_path_error(IBV_WC_RETRY_EXC_ERR));
    EXPECT_TRUE(wc_path_error(IBV_WC_RNR_RETRY_EXC_ERR));
    for (auto s : {IBV_WC_SUCCESS, IBV_WC_REM_ACCESS_ERR, IBV_WC_LOC_PROT_ERR, IBV_WC_LOC_ACCESS_ERR,
                   IBV_WC_LOC_LEN_ERR, IBV_WC_REM_INV_REQ_ERR, IBV_WC_WR_FLUSH_ERR})
        EXPECT_FALSE(wc_path_error(s)) << ibv_wc_status_str(s);
}

TEST(RdmaPlan, SelectiveSignallingEveryIntervalAndAtTheEndOfEachOp) {
    SendWindow w(64, 4);
    std::vector<bool> signalled;
    for (int i = 0; i < 10; ++i) {
        bool s = w.must_signal(i == 9);
        signalled.push_back(s);
        w.post(s);
    }
    EXPECT_EQ(signalled, (std::vector<bool>{false, false, false, true, false, false, false, true, false, true}));
    EXPECT_EQ(w.in_flight(), 10u);
    EXPECT_EQ(w.complete(2), 0u) << "an unsignalled request never completes";
    EXPECT_EQ(w.complete(4), 4u) << "a signalled completion retires everything before it";
    EXPECT_EQ(w.complete(10), 6u);
    EXPECT_EQ(w.in_flight(), 0u);
    EXPECT_EQ(w.complete(10), 0u) << "a stale completion retires nothing";
}

TEST(RdmaPlan, SendWindowNeverFillsWithoutASignal) {
    SendWindow w(4, 1000);  // interval clamped to depth / 2
    int posted = 0;
    while (w.can_post()) {
        w.post(w.must_signal(false));
        ++posted;
    }
    EXPECT_EQ(posted, 4);
    // Something in flight is signalled, so a completion will free the queue.
    EXPECT_EQ(w.complete(2), 2u);
    EXPECT_TRUE(w.can_post());
}

TEST(RdmaPlan, SendWindowErrorsRollbackAndDrain) {
    SendWindow w(16, 8);
    for (int i = 0; i < 6; ++i) w.post(false);
    uint32_t before = 0;
    EXPECT_TRUE(w.fail(3, &before));
    EXPECT_EQ(before, 2u) << "requests before the failed one succeeded";
    EXPECT_EQ(w.drain(), (std::vector<uint64_t>{4, 5, 6})) << "the rest were flushed";
    EXPECT_FALSE(w.fail(5, &before)) << "flush completions after the drain are ignored";
    w.post(false);
    w.post(true);
    w.post(false);
    w.rollback(2);
    EXPECT_EQ(w.in_flight(), 1u);
    EXPECT_EQ(w.post(true), 8u) << "rolled-back sequence numbers are reused";
}

}  // namespace
}  // namespace ferry_rdma
