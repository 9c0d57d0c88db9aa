// rdma.so's planning: registration chunking at max_mr_size, work requests split at both sides'
// registrations and striped over NICs, selective signalling and the send window.
#include "plan.hpp"
#include "rdma_test_util.hpp"
#include "verbs.hpp"

#include <ferry/plugin.h>
#include <gtest/gtest.h>

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
