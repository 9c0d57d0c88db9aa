// Block lists of small blocks where the copy kernel's launches carry their tables
// (plugins/gpu_ipc/ipc_blocks.cpp's direct entries, ipc_submit.cpp's launch_inline), through the
// test runtime: pairs byte-exact in launches of their own, bad pairs refused whole before any
// launch, a refused launch handing the rest to table-copying launches, a fault, and lists that
// take the planned path.
#include "gpu_ipc_blocks_fixture.hpp"

using namespace ferry_gpu;
using namespace ferry_gpu_test;

namespace {

// Lists of small blocks where launches carry their tables: each pair becomes its launch entry
// in submit_blocks itself, a launch per kInlineTableOps pairs.
class GpuIpcBlocksInLaunch : public GpuIpcBlocks {
protected:
    void SetUp() override { remake({}, kPolicy, true, true); }
};

TEST_P(GpuIpcBlocksInLaunch, PairsLandWhereTheirIndicesSayInLaunchesOfTheirOwnAndOneCompletion) {
    for (size_t blocks_n : {size_t{2}, size_t{256}, size_t{kInlineTableOps} + 1, kKernelTableOps + 904}) {
        counters.reset();
        const size_t len = blocks_n > 256 ? 1024 : 64 << 10;
        for (ferry_opcode_t opcode : {FERRY_OP_WRITE, FERRY_OP_READ}) move_permuted_exactly(opcode, blocks_n, len);
        size_t launches = 0;  // runs of up to kKernelTableOps pairs, a launch per kInlineTableOps of a run
        for (size_t a = 0; a < blocks_n; a += kKernelTableOps)
            launches += (std::min(kKernelTableOps, blocks_n - a) + kInlineTableOps - 1) / kInlineTableOps;
        EXPECT_EQ(counters.inline_launches.load(), static_cast<int>(2 * launches)) << blocks_n << " pairs";
        EXPECT_EQ(counters.kernel_launches.load(), counters.inline_launches.load()) << "no table-copying launch";
        EXPECT_EQ(counters.copy_async.load() + counters.copy_batch.load(), 0) << "no table copy, no copy per pair";
        EXPECT_EQ(counters.tables.load(), 0);
        EXPECT_EQ(counters.events_recorded.load(),
                  static_cast<int>(2 * ((blocks_n + kKernelTableOps - 1) / kKernelTableOps)))
            << "an event per kKernelTableOps pairs";
        EXPECT_EQ(counters.bad_tables.load(), 0);
    }
}

TEST_P(GpuIpcBlocksInLaunch, OddAddressesAndLengthsLandExactly) {
    std::vector<Block> lb, rb;
    size_t at = 0;
    for (size_t len : {size_t{1}, size_t{3}, size_t{4097}, size_t{17}, size_t{65537}, size_t{300000}})
        for (size_t sh = 0; sh < 5; ++sh) {
            lb.push_back({at + sh * 3 + 1, len});
            rb.push_back({at + sh * 5 + 64, len});
            at += len + 256;
        }
    std::vector<uint32_t> li(lb.size());
    for (size_t i = 0; i < li.size(); ++i) li[i] = static_cast<uint32_t>(i);
    const uint64_t l = local_list(lb), r = remote_list(rb);
    for (ferry_opcode_t opcode : {FERRY_OP_WRITE, FERRY_OP_READ}) {
        const auto src_was = src, dst_was = dst;
        ferry_error_t err{};
        ASSERT_EQ(move(opcode, l, li, r, li, &err), 0) << err.message;
        expect_ok();
        auto want_src = src_was, want_dst = dst_was;
        for (size_t i = 0; i < li.size(); ++i) {
            if (opcode == FERRY_OP_WRITE) memcpy(&want_dst[rb[i].off], &src_was[lb[i].off], lb[i].len);
            else memcpy(&want_src[lb[i].off], &dst_was[rb[i].off], lb[i].len);
        }
        EXPECT_TRUE(want_dst == dst) << "remote region";
        EXPECT_TRUE(want_src == src) << "local region";
    }
    EXPECT_EQ(counters.inline_launches.load(), 2);
    EXPECT_EQ(counters.bad_tables.load(), 0);
}

TEST_P(GpuIpcBlocksInLaunch, ABadPairPastTheFirstLaunchIsRefusedWithNothingStarted) {
    constexpr size_t kBlocks = 3000;
    auto blocks = uniform(kBlocks, 1024);
    auto odd = blocks;
    odd[2500].len = 1000;
    const uint64_t l = local_list(blocks), l_odd = local_list(odd), r = remote_list(blocks);
    std::vector<uint32_t> all(kBlocks);
    for (size_t i = 0; i < kBlocks; ++i) all[i] = static_cast<uint32_t>(i);
    auto past = all;
    past[2999] = kBlocks;
    const auto dst_was = dst, src_was = src;
    ferry_error_t err{};
    EXPECT_EQ(move(FERRY_OP_WRITE, l, past, r, all, &err), -EINVAL);
    EXPECT_NE(std::string(err.message).find("pair 2999"), std::string::npos) << err.message;
    EXPECT_EQ(move(FERRY_OP_READ, l_odd, all, r, all, &err), -EINVAL);
    EXPECT_NE(std::string(err.message).find("pair 2500"), std::string::npos) << err.message;
    expect_nothing_started();
    EXPECT_TRUE(dst == dst_was && src == src_was) << "no byte moved";
}

TEST_P(GpuIpcBlocksInLaunch, ARefusedLaunchHandsTheRestToTableCopiesWithOneCompletion) {
    rt_->fail_kernel_launch_at = 2;  // the third of five launches
    constexpr size_t kBlocks = kKernelTableOps + 904;
    move_permuted_exactly(FERRY_OP_WRITE, kBlocks, 1024);
    EXPECT_EQ(counters.inline_launches.load(), 2);
    EXPECT_EQ(counters.kernel_launches.load(), 5)
        << "two carrying their tables, the refused one, then a table-copying launch per run";
    EXPECT_GE(counters.tables.load(), 1);
    EXPECT_EQ(counters.kernel_ops.load(), static_cast<int>(kBlocks));
    EXPECT_EQ(counters.bad_tables.load(), 0);
}

TEST_P(GpuIpcBlocksInLaunch, AFaultFailsTheTransferWithOneCompletionAndNothingLanded) {
    auto blocks = uniform(256, 4096);
    const uint64_t l = local_list(blocks), r = remote_list(blocks);
    rt_->fail_async = true;
    rt_->copy_delay_ms = 1;
    ferry_error_t err{};
    ASSERT_EQ(move(FERRY_OP_WRITE, l, reversed(256), r, strided(256, 3), &err), 0) << err.message;
    auto c = one_completion();
    EXPECT_LT(c.status, 0);
    EXPECT_EQ(counters.inline_launches.load(), 1);
    EXPECT_EQ(counters.bytes_landed.load(), 0);
}

TEST_P(GpuIpcBlocksInLaunch, AListWithABlockAboveTheKernelsLimitTakesThePlannedPath) {
    std::vector<Block> lb = uniform(8, 64 << 10);
    lb.push_back({1 << 20, (1 << 20) + 1});
    const uint64_t l = local_list(lb), r = remote_list(lb);
    std::vector<uint32_t> li(lb.size());
    for (size_t i = 0; i < li.size(); ++i) li[i] = static_cast<uint32_t>(i);
    const auto was = src;
    ferry_error_t err{};
    ASSERT_EQ(move(FERRY_OP_WRITE, l, li, r, li, &err), 0) << err.message;
    expect_ok();
    expect_pairs(FERRY_OP_WRITE, lb, li, lb, li, was);
    EXPECT_EQ(counters.inline_launches.load(), 1) << "the small ones, in a launch carrying their table";
    EXPECT_GE(counters.copy_async.load() + counters.copy_batch.load(), 1) << "the large one";
}

INSTANTIATE_TEST_SUITE_P(BatchedCopy, GpuIpcBlocksInLaunch, ::testing::Bool(),
                         [](const auto &info) { return info.param ? "batched" : "per_op"; });

}  // namespace
