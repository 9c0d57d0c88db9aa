// Block lists on the GPU IPC transport (plugins/gpu_ipc/ipc_blocks.cpp, the group completion in
// ipc_submit.cpp and ipc_completions.cpp) through the test runtime (test_gpu_runtime.hpp): a
// transfer of many blocks by index lands every pair where its indices say and is reported by
// exactly one completion, after its last run ended, whether the copy kernel or the copy
// engines (several runs, several streams) carried it; bad input is refused whole with nothing
// started; lists whose memory went are stale.
#include "gpu_ipc_blocks_fixture.hpp"

using namespace ferry_gpu;
using namespace ferry_gpu_test;

namespace {

TEST_P(GpuIpcBlocks, PermutedPairsLandWhereTheirIndicesSayWithOneLaunchAndOneCompletion) {
    constexpr size_t kBlocks = 256, kLen = 64 << 10;
    auto blocks = uniform(kBlocks, kLen);
    const uint64_t l = local_list(blocks), r = remote_list(blocks);
    const auto li = reversed(kBlocks), ri = strided(kBlocks, 37);
    const auto was = src;
    ferry_error_t err{};
    ASSERT_EQ(move(FERRY_OP_WRITE, l, li, r, ri, &err), 0) << err.message;
    expect_ok();
    expect_pairs(FERRY_OP_WRITE, blocks, li, blocks, ri, was);
    EXPECT_TRUE(src == was) << "a WRITE leaves the local blocks alone";
    EXPECT_EQ(counters.kernel_launches.load(), 1);
    EXPECT_EQ(counters.kernel_ops.load(), static_cast<int>(kBlocks));
    EXPECT_EQ(counters.copy_async.load(), 1) << "the table's copy, and no copy per pair";
    EXPECT_EQ(counters.copy_batch.load(), 0);
    EXPECT_EQ(counters.events_recorded.load(), 1);
    EXPECT_EQ(counters.bad_tables.load(), 0);
}

TEST_P(GpuIpcBlocks, OddAddressesAndLengthsLandExactlyAndNothingBeside) {
    const size_t lens[] = {1, 3, 4097, 17, 65537};
    const size_t shifts[][2] = {{1, 2}, {3, 7}, {8, 15}, {13, 5}, {4, 12}, {15, 1}};
    std::vector<Block> lb, rb;
    size_t at = 0;
    for (auto len : lens)
        for (auto &sh : shifts) {
            lb.push_back({at + sh[0], len});
            rb.push_back({at + sh[1] + 64, len});
            at += len + 256;
        }
    // The remote list names the same blocks backwards: pair i is local i, remote n-1-i.
    std::reverse(rb.begin(), rb.end());
    std::vector<uint32_t> li(lb.size());
    for (size_t i = 0; i < li.size(); ++i) li[i] = static_cast<uint32_t>(i);
    const auto ri = reversed(lb.size());
    const uint64_t l = local_list(lb), r = remote_list(rb);
    for (ferry_opcode_t opcode : {FERRY_OP_WRITE, FERRY_OP_READ}) {
        const auto src_was = src, dst_was = dst;
        counters.kernel_ops = 0;
        ferry_error_t err{};
        ASSERT_EQ(move(opcode, l, li, r, ri, &err), 0) << err.message;
        expect_ok();
        EXPECT_EQ(counters.kernel_ops.load(), static_cast<int>(li.size()));
        auto want_src = src_was, want_dst = dst_was;
        for (size_t i = 0; i < li.size(); ++i) {
            const Block &a = lb[li[i]], &b = rb[ri[i]];
            if (opcode == FERRY_OP_WRITE) memcpy(&want_dst[b.off], &src_was[a.off], a.len);
            else memcpy(&want_src[a.off], &dst_was[b.off], a.len);
        }
        const char *name = opcode == FERRY_OP_WRITE ? "WRITE" : "READ";
        EXPECT_TRUE(want_dst == dst) << name << ": remote region";
        EXPECT_TRUE(want_src == src) << name << ": local region";
    }
    EXPECT_EQ(counters.bad_tables.load(), 0);
}

TEST_P(GpuIpcBlocks, BadInputIsRefusedWholeWithNothingStarted) {
    auto blocks = uniform(8, 4096);
    const uint64_t l = local_list(blocks), r = remote_list(blocks);
    std::vector<Block> odd = blocks;
    odd[7].len = 4095;
    const uint64_t l_odd = local_list(odd);
    // The same memory through a second connection, and read-only through the first.
    uint64_t peer2 = 0, ro_h = 0, other_h = 0;
    ferry_error_t err{};
    uint8_t ep[64], key[256];
    size_t ep_len = sizeof ep, key_len = sizeof key;
    ASSERT_EQ(t_->export_endpoint(ep, &ep_len, &err), 0) << err.message;
    ASSERT_EQ(t_->connect(ep, ep_len, &peer2, &err), 0) << err.message;
    ASSERT_EQ(t_->export_mem(dst_local_h_, key, &key_len, &err), 0) << err.message;
    ferry_mem_region_t rd{reinterpret_cast<uint64_t>(dst.data()),
                          dst.size(),
                          FERRY_MEM_CUDA,
                          0,
                          FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE,
                          0};
    ASSERT_EQ(t_->import_mem(peer2, &rd, key, key_len, &other_h, &err), 0) << err.message;
    rd.access = FERRY_ACCESS_REMOTE_READ;
    ASSERT_EQ(t_->import_mem(peer_, &rd, key, key_len, &ro_h, &err), 0) << err.message;
    uint64_t r_other = 0;
    ASSERT_EQ(try_list(FERRY_BLOCKS_REMOTE, blocks, other_h, &r_other, &err, peer2), 0) << err.message;
    const uint64_t r_ro = list(FERRY_BLOCKS_REMOTE, blocks, ro_h);

    const std::vector<uint32_t> ok = {0, 1, 2, 3, 4, 5, 6, 7};
    auto past_local = ok, past_remote = ok;
    past_local[3] = 8;
    past_remote[5] = 9;
    const auto dst_was = dst, src_was = src;
    auto refused = [&](int want, const char *what, ferry_opcode_t opcode, uint64_t ll, const std::vector<uint32_t> &li,
                       uint64_t rl, const std::vector<uint32_t> &ri, std::vector<const char *> words = {},
                       uint64_t peer = 0) {
        ferry_error_t e{};
        EXPECT_EQ(move(opcode, ll, li, rl, ri, &e, peer), want) << what << ": " << e.message;
        for (auto *w : words) EXPECT_NE(std::string(e.message).find(w), std::string::npos) << what << ": " << e.message;
    };
    refused(-EINVAL, "local index past the end", FERRY_OP_WRITE, l, past_local, r, ok, {"pair 3", "local", "8"});
    refused(-EINVAL, "remote index past the end", FERRY_OP_READ, l, ok, r, past_remote, {"pair 5", "remote", "9"});
    refused(-EINVAL, "unequal lengths", FERRY_OP_WRITE, l_odd, ok, r, ok, {"pair 7"});
    refused(-EINVAL, "unknown local list", FERRY_OP_WRITE, 999999, ok, r, ok);
    refused(-EINVAL, "unknown remote list", FERRY_OP_WRITE, l, ok, 999999, ok);
    refused(-EINVAL, "local list as remote", FERRY_OP_WRITE, l, ok, l, ok);
    refused(-EINVAL, "remote list as local", FERRY_OP_WRITE, r, ok, r, ok);
    refused(-EINVAL, "remote list of another peer", FERRY_OP_WRITE, l, ok, r_other, ok);
    refused(-EINVAL, "this peer's list with another peer", FERRY_OP_WRITE, l, ok, r, ok, {}, peer2);
    refused(-ENOENT, "unknown peer", FERRY_OP_WRITE, l, ok, r, ok, {}, 424242);
    refused(-EACCES, "WRITE without remote write access", FERRY_OP_WRITE, l, ok, r_ro, ok);
    expect_nothing_started();
    EXPECT_TRUE(dst == dst_was && src == src_was) << "no byte moved";

    // The lists themselves were fine: each refusal was its own fault.
    ASSERT_EQ(move(FERRY_OP_READ, l, ok, r_ro, ok, &err), 0) << err.message;
    expect_ok();
    EXPECT_EQ(0, memcmp(src.data(), dst_was.data(), 8 * 4096));
    const auto back = reversed(8);
    ASSERT_EQ(move(FERRY_OP_WRITE, l, ok, r_other, back, &err, peer2), 0) << err.message;
    expect_ok();
    for (size_t i = 0; i < 8; ++i)
        EXPECT_EQ(0, memcmp(&dst[back[i] * 4096], &dst_was[i * 4096], 4096)) << "pair " << i << " over peer2";
    t_->release_mem(peer_, ro_h, &err);
    t_->release_mem(peer2, other_h, &err);
}

TEST_P(GpuIpcBlocks, CreateRefusesBlocksOutsideTheirRegionAndUnknownHandles) {
    ferry_error_t err{};
    uint64_t out = 0;
    const size_t end = src.size();
    std::vector<Block> fine = uniform(4, 4096);
    auto refused = [&](int want, const char *what, uint32_t side, std::vector<Block> blocks, uint64_t mem,
                       uint64_t peer = 0) {
        ferry_error_t e{};
        EXPECT_EQ(try_list(side, blocks, mem, &out, &e, peer), want) << what << ": " << e.message;
        return std::string(e.message);
    };
    auto past_end = fine;
    past_end[2] = {end - 100, 4096};
    auto msg = refused(-EFAULT, "local block past its region's end", FERRY_BLOCKS_LOCAL, past_end, src_h_);
    EXPECT_NE(msg.find("block 2"), std::string::npos) << msg;
    msg = refused(-EFAULT, "remote block past its region's end", FERRY_BLOCKS_REMOTE, past_end, dst_h_);
    EXPECT_NE(msg.find("block 2"), std::string::npos) << msg;
    std::vector<ferry_block_t> b = {{reinterpret_cast<uint64_t>(src.data()) - 1, 16, src_h_}};
    EXPECT_EQ(t_->create_block_list(FERRY_BLOCKS_LOCAL, 0, b.data(), 1, &out, &err), -EFAULT) << "before the region";
    auto zero = fine;
    zero[3].len = 0;
    msg = refused(-EFAULT, "zero-length block", FERRY_BLOCKS_LOCAL, zero, src_h_);
    EXPECT_NE(msg.find("block 3"), std::string::npos) << msg;
    refused(-EINVAL, "unknown local handle", FERRY_BLOCKS_LOCAL, fine, 777777);
    refused(-EINVAL, "an import handle in a local list", FERRY_BLOCKS_LOCAL, fine, dst_h_);
    refused(-EINVAL, "a register handle in a remote list", FERRY_BLOCKS_REMOTE, fine, dst_local_h_);
    refused(-ENOENT, "unknown peer", FERRY_BLOCKS_REMOTE, fine, dst_h_, 424242);
    // The same blocks in their regions are taken.
    EXPECT_NE(local_list(fine), 0u);
    EXPECT_NE(remote_list(fine), 0u);
}

TEST_P(GpuIpcBlocks, ListsWhoseMemoryWentAreStaleAndNewOnesWork) {
    auto blocks = uniform(16, 4096);
    const auto all = reversed(16);
    ferry_error_t err{};
    const uint64_t l = local_list(blocks), r = remote_list(blocks);
    ASSERT_EQ(move(FERRY_OP_WRITE, l, all, r, all, &err), 0) << err.message;
    expect_ok();

    // The peer's region released: the remote list is stale, the local one is not.
    ASSERT_EQ(t_->release_mem(peer_, dst_h_, &err), 0) << err.message;
    counters.reset();
    EXPECT_EQ(move(FERRY_OP_WRITE, l, all, r, all, &err), -ESTALE) << err.message;
    EXPECT_NE(std::string(err.message).find("remote"), std::string::npos) << err.message;
    expect_nothing_started();
    uint8_t key[256];
    size_t key_len = sizeof key;
    ASSERT_EQ(t_->export_mem(dst_local_h_, key, &key_len, &err), 0) << err.message;
    ferry_mem_region_t rd{reinterpret_cast<uint64_t>(dst.data()),
                          dst.size(),
                          FERRY_MEM_CUDA,
                          0,
                          FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE,
                          0};
    ASSERT_EQ(t_->import_mem(peer_, &rd, key, key_len, &dst_h_, &err), 0) << err.message;
    EXPECT_EQ(move(FERRY_OP_WRITE, l, all, r, all, &err), -ESTALE) << "a list stays stale";
    const uint64_t r2 = remote_list(blocks);
    std::fill(dst.begin(), dst.end(), 0);
    auto was = src;
    ASSERT_EQ(move(FERRY_OP_WRITE, l, all, r2, all, &err), 0) << err.message;
    expect_ok();
    expect_pairs(FERRY_OP_WRITE, blocks, all, blocks, all, was);

    // The local region deregistered: the local list is stale.
    ASSERT_EQ(t_->deregister_mem(src_h_, &err), 0) << err.message;
    counters.reset();
    EXPECT_EQ(move(FERRY_OP_READ, l, all, r2, all, &err), -ESTALE) << err.message;
    EXPECT_NE(std::string(err.message).find("local"), std::string::npos) << err.message;
    expect_nothing_started();
    ferry_mem_region_t rs = rd;
    rs.addr = reinterpret_cast<uint64_t>(src.data());
    ASSERT_EQ(t_->register_mem(&rs, &src_h_, &err), 0) << err.message;
    const uint64_t l2 = local_list(blocks);
    std::fill(src.begin(), src.end(), 0);
    was = dst;
    ASSERT_EQ(move(FERRY_OP_READ, l2, all, r2, all, &err), 0) << err.message;
    expect_ok();
    expect_pairs(FERRY_OP_READ, blocks, all, blocks, all, was);
}

TEST_P(GpuIpcBlocks, WithoutTheKernelTheCopyEnginesCarryItInRunsAndOneCompletionComesAfterAll) {
    // Without a poll window the completion thread reports; within one, poll() reaps runs too.
    for (auto window : {std::chrono::microseconds(0), std::chrono::microseconds(5000000)}) {
        remake(window, kPolicy, false);
        rt_->copy_delay_ms = 1;
        constexpr size_t kBlocks = 256, kLen = 4096;
        auto blocks = uniform(kBlocks, kLen);
        const uint64_t l = local_list(blocks), r = remote_list(blocks);
        for (int round = 0; round < 3; ++round) {
            const auto li = strided(kBlocks, 5 + 2 * round), ri = reversed(kBlocks);
            const auto was = src;
            counters.bytes_landed = 0;
            ferry_error_t err{};
            ASSERT_EQ(move(FERRY_OP_WRITE, l, li, r, ri, &err), 0) << err.message;
            expect_ok();
            EXPECT_EQ(counters.bytes_landed.load(), static_cast<int>(kBlocks * kLen)) << "every run ended before";
            expect_pairs(FERRY_OP_WRITE, blocks, li, blocks, ri, was);
        }
        EXPECT_EQ(counters.kernel_launches.load(), 0);
        EXPECT_EQ(counters.events_recorded.load(), 3 * 4) << "runs of kMaxRunOps pairs";
        if (GetParam()) EXPECT_EQ(counters.copy_batch.load(), 3 * 4);
        else EXPECT_EQ(counters.copy_async.load(), static_cast<int>(3 * kBlocks));
    }
}

TEST_P(GpuIpcBlocks, BlocksAboveTheKernelsLimitGoToTheCopyEnginesOnSeveralStreams) {
    rt_->copy_delay_ms = 5;
    constexpr size_t kBlocks = 4, kLen = 4 << 20;  // each above max_op_bytes, spread over streams
    auto blocks = uniform(kBlocks, kLen);
    const uint64_t l = local_list(blocks), r = remote_list(blocks);
    const auto li = reversed(kBlocks), ri = strided(kBlocks, 3);
    const auto was = src;
    ferry_error_t err{};
    ASSERT_EQ(move(FERRY_OP_WRITE, l, li, r, ri, &err), 0) << err.message;
    expect_ok();
    EXPECT_EQ(counters.bytes_landed.load(), static_cast<int>(kBlocks * kLen)) << "every run ended before";
    expect_pairs(FERRY_OP_WRITE, blocks, li, blocks, ri, was);
    EXPECT_EQ(counters.kernel_launches.load(), 0);
    EXPECT_EQ(counters.events_recorded.load(), static_cast<int>(kBlocks)) << "one run per stream";
}

TEST_P(GpuIpcBlocks, SmallAndLargeBlocksInOneTransferTakeKernelAndCopiesAndOneCompletion) {
    // 8 blocks of 64 KiB, one at the kernel's limit, two above it; the remote list in another order.
    std::vector<Block> lb = uniform(8, 64 << 10);
    lb.push_back({1 << 20, 1 << 20});
    lb.push_back({2 << 20, 2 << 20});
    lb.push_back({5 << 20, (2 << 20) + 1});
    std::vector<Block> rb(lb.size());
    const auto order = reversed(lb.size());
    for (size_t i = 0; i < lb.size(); ++i) rb[order[i]] = {lb[i].off + (3 << 20) + 7, lb[i].len};
    const uint64_t l = local_list(lb), r = remote_list(rb);
    std::vector<uint32_t> li(lb.size());
    for (size_t i = 0; i < li.size(); ++i) li[i] = static_cast<uint32_t>(i);
    const auto was = dst;
    ferry_error_t err{};
    ASSERT_EQ(move(FERRY_OP_READ, l, li, r, order, &err), 0) << err.message;
    expect_ok();
    expect_pairs(FERRY_OP_READ, lb, li, rb, order, was);
    EXPECT_EQ(counters.kernel_launches.load(), 1);
    EXPECT_EQ(counters.kernel_ops.load(), 9);
    EXPECT_GE(counters.copy_async.load() + counters.copy_batch.load(), 1 + 1) << "the table, and the large ones";
    EXPECT_EQ(counters.events_recorded.load(), 2);
}

TEST_P(GpuIpcBlocks, AFaultFailsTheTransferWithOneCompletion) {
    for (bool kernel : {true, false}) {
        remake({}, kPolicy, kernel);
        auto blocks = uniform(256, 4096);
        const uint64_t l = local_list(blocks), r = remote_list(blocks);
        rt_->fail_async = true;
        rt_->copy_delay_ms = 1;
        ferry_error_t err{};
        ASSERT_EQ(move(FERRY_OP_WRITE, l, reversed(256), r, strided(256, 3), &err), 0) << err.message;
        auto c = one_completion();
        EXPECT_LT(c.status, 0) << (kernel ? "kernel" : "copies");
        EXPECT_NE(std::string(c.message).find("illegal memory access"), std::string::npos) << c.message;
        EXPECT_EQ(counters.kernel_launches.load(), kernel ? 1 : 0);
    }
}

TEST_P(GpuIpcBlocks, ACopyRefusedFailsTheTransferOnceAfterTheOthersEnded) {
    remake({}, kPolicy, false);
    if (GetParam()) rt_->fail_batch = true;  // op by op from then on
    rt_->fail_copy_async_at = 70;            // in the second of four runs
    auto blocks = uniform(256, 4096);
    const uint64_t l = local_list(blocks), r = remote_list(blocks);
    ferry_error_t err{};
    const auto all = reversed(256);
    const auto was = src, dst_was = dst;
    ASSERT_EQ(move(FERRY_OP_WRITE, l, all, r, all, &err), 0) << err.message;
    auto c = one_completion();
    EXPECT_EQ(c.status, -EINVAL);
    EXPECT_STREQ(c.message, "copy refused (injected)");
    EXPECT_EQ(counters.events_recorded.load(), 4) << "the other pairs' runs were queued";
    EXPECT_GE(counters.bytes_landed.load(), 255 * 4096) << "reported after every other pair landed";
    for (size_t i = 0; i < all.size(); ++i) {
        const size_t off = all[i] * 4096;
        if (i != 70) {
            EXPECT_EQ(0, memcmp(&dst[off], &was[off], 4096)) << "pair " << i;
        } else if (!GetParam()) {
            EXPECT_EQ(0, memcmp(&dst[off], &dst_was[off], 4096)) << "the refused pair moved nothing";
        }
    }
}

TEST_P(GpuIpcBlocks, AnEventThatCannotBeRecordedFailsTheTransferOnce) {
    rt_->fail_event_record = true;
    auto blocks = uniform(32, 4096);
    const uint64_t l = local_list(blocks), r = remote_list(blocks);
    ferry_error_t err{};
    ASSERT_EQ(move(FERRY_OP_WRITE, l, reversed(32), r, reversed(32), &err), 0) << err.message;
    auto c = one_completion();
    EXPECT_EQ(c.status, -EIO);
    EXPECT_NE(std::string(c.message).find("event record failed"), std::string::npos) << c.message;
}

TEST_P(GpuIpcBlocks, ListsDestroyedWhileTheirTransferIsInFlightLeaveItToComplete) {
    auto blocks = uniform(64, 8192);
    const uint64_t l = local_list(blocks), r = remote_list(blocks);
    const auto li = strided(64, 7), ri = reversed(64);
    const auto was = src;
    rt_->hold_copies(true);
    ferry_error_t err{};
    ASSERT_EQ(move(FERRY_OP_WRITE, l, li, r, ri, &err), 0) << err.message;
    EXPECT_EQ(t_->destroy_block_list(l, &err), 0) << err.message;
    EXPECT_EQ(t_->destroy_block_list(r, &err), 0) << err.message;
    EXPECT_EQ(t_->destroy_block_list(r, &err), -ENOENT) << "destroyed once";
    EXPECT_EQ(move(FERRY_OP_WRITE, l, li, r, ri, &err), -EINVAL) << "a destroyed list is unknown";
    // Lists made meanwhile (their storage may reuse the old lists') change nothing in flight.
    const uint64_t other = local_list(uniform(64, 4096));
    EXPECT_NE(other, 0u);
    pollfd p{t_->completion_fd(), POLLIN, 0};
    EXPECT_EQ(::poll(&p, 1, 50), 0) << "nothing is reported while its copies are held";
    EXPECT_EQ(counters.bytes_landed.load(), 0) << "still in flight";
    rt_->hold_copies(false);
    expect_ok();
    expect_pairs(FERRY_OP_WRITE, blocks, li, blocks, ri, was);
}

TEST_P(GpuIpcBlocks, MorePairsThanATableHoldsTakeSeveralLaunchesAndOneCompletion) {
    constexpr size_t kBlocks = kKernelTableOps + 904;
    move_permuted_exactly(FERRY_OP_WRITE, kBlocks, 1024);
    EXPECT_EQ(counters.kernel_launches.load(), 2);
    EXPECT_EQ(counters.kernel_ops.load(), static_cast<int>(kBlocks));
    EXPECT_EQ(counters.events_recorded.load(), 2);
    EXPECT_EQ(counters.bad_tables.load(), 0);
}

INSTANTIATE_TEST_SUITE_P(BatchedCopy, GpuIpcBlocks, ::testing::Bool(),
                         [](const auto &info) { return info.param ? "batched" : "per_op"; });

}  // namespace
