// The GPU IPC transport's copy kernel path (plugins/gpu_ipc/ipc_submit.cpp) through the test
// runtime (test_gpu_runtime.hpp): which ops go to the kernel and which to the copy engines, the
// tables it builds (chunk numbering, one launch per kKernelTableOps ops, the block cap), byte
// exactness at odd addresses and lengths, the fallback to per-op copies when the kernel cannot
// be loaded or launched, and the failure semantics of a kernel that faults. The kernel itself
// (copy_kernel.cu) runs on a real GPU in tests/gpu/cuda_ipc_test.cpp.
#include "test_gpu_runtime.hpp"

using namespace ferry_gpu;
using namespace ferry_gpu_test;

namespace {

constexpr KernelPolicy kPolicy{1 << 20, 16};

class GpuIpcKernel : public GpuIpcFixture {
protected:
    void SetUp() override { make({}, kPolicy, true); }
    // Every op completed with status 0.
    void expect_all_ok(const std::map<uint64_t, ferry_completion_t> &got) {
        for (auto &[u, c] : got) EXPECT_EQ(c.status, 0) << "op " << u << ": " << c.message;
    }
    // Slow streams: six submits of 8 ops are queued before the first kernel runs; all land.
    void six_submits_behind_slow_streams_land() {
        rt_->copy_delay_ms = 20;
        constexpr size_t kOps = 8, kLen = 32 << 10;
        for (size_t k = 0; k < 6; ++k) {
            std::vector<ferry_xfer_op_t> ops;
            for (size_t i = 0; i < kOps; ++i) {
                size_t off = (k * kOps + i) * kLen;
                ops.push_back(op(FERRY_OP_WRITE, off, off, kLen, k * kOps + i));
            }
            ASSERT_EQ(submit_ops(ops), 0);
        }
        expect_all_ok(collect(6 * kOps));
        EXPECT_EQ(0, memcmp(dst.data(), src.data(), 6 * kOps * kLen));
    }
    // Lengths of 1, 3 and 4097 bytes, ops straddling 16-byte lines, a chunk boundary plus one,
    // source and destination misaligned alike and apart; READ and WRITE. Nothing outside the
    // ops may change.
    void odd_ops_land_exactly() {
        const size_t lens[] = {1, 3, 4097, 15, 16, 17, (64 << 10) + 1, 131071, 300000};
        const size_t shifts[][2] = {{0, 0}, {1, 1}, {3, 7}, {8, 0}, {13, 5}, {4, 12}};
        for (ferry_opcode_t opcode : {FERRY_OP_WRITE, FERRY_OP_READ}) {
            std::fill(dst.begin(), dst.end(), opcode == FERRY_OP_WRITE ? 0xee : 0x00);
            if (opcode == FERRY_OP_READ)
                for (size_t i = 0; i < dst.size(); ++i) dst[i] = static_cast<uint8_t>(i * 13 + 5);
            std::vector<uint8_t> before_src = src, before_dst = dst;
            std::vector<ferry_xfer_op_t> ops;
            size_t at = 0;
            for (auto len : lens)
                for (auto &sh : shifts) {
                    ops.push_back(op(opcode, at + sh[0], at + sh[1] + 64, len, ops.size()));
                    at += len + 256;
                }
            ASSERT_LT(at, src.size());
            counters.kernel_ops = 0;
            ASSERT_EQ(submit_ops(ops), 0);
            expect_all_ok(collect(ops.size()));
            EXPECT_EQ(counters.kernel_ops.load(), static_cast<int>(ops.size()));
            std::vector<uint8_t> want_src = before_src, want_dst = before_dst;
            for (auto &o : ops) {
                size_t s_off = o.local_addr - reinterpret_cast<uint64_t>(src.data());
                size_t d_off = o.remote_addr - reinterpret_cast<uint64_t>(dst.data());
                if (opcode == FERRY_OP_WRITE) memcpy(&want_dst[d_off], &before_src[s_off], o.length);
                else memcpy(&want_src[s_off], &before_dst[d_off], o.length);
            }
            EXPECT_TRUE(want_dst == dst) << (opcode == FERRY_OP_WRITE ? "WRITE" : "READ") << ": destination region";
            EXPECT_TRUE(want_src == src) << (opcode == FERRY_OP_WRITE ? "WRITE" : "READ") << ": source region";
            src = before_src;
        }
        EXPECT_EQ(counters.bad_tables.load(), 0);
    }
};

TEST_P(GpuIpcKernel, SmallOpsOfABatchGoToOneLaunch) {
    EXPECT_EQ(counters.kernel_loads.load(), 1) << "loaded once, at the first registration on the device";
    constexpr size_t kOps = 256, kLen = 64 << 10;
    ASSERT_EQ(submit(kOps, kLen), 0);
    expect_all_ok(collect(kOps));
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), kOps * kLen));
    EXPECT_EQ(counters.kernel_launches.load(), 1);
    EXPECT_EQ(counters.kernel_ops.load(), static_cast<int>(kOps));
    EXPECT_EQ(counters.copy_async.load(), 1) << "the table's copy, and no copy per op";
    EXPECT_EQ(counters.copy_batch.load(), 0);
    EXPECT_EQ(counters.events_recorded.load(), 1) << "one event behind the launch";
    EXPECT_EQ(counters.last_chunks.load(), kOps) << "one 64 KiB chunk per op";
    EXPECT_EQ(counters.last_blocks.load(), kPolicy.max_blocks) << "capped";
    EXPECT_EQ(counters.bad_tables.load(), 0);
    EXPECT_EQ(counters.kernel_loads.load(), 1);
}

TEST_P(GpuIpcKernel, OddAddressesAndLengthsLandExactlyAndNothingBeside) { odd_ops_land_exactly(); }

TEST_P(GpuIpcKernel, LargeOpsKeepTheCopyEnginesBesideTheKernel) {
    std::vector<ferry_xfer_op_t> ops;
    for (size_t i = 0; i < 8; ++i) ops.push_back(op(FERRY_OP_WRITE, i << 16, i << 16, 64 << 10, i));
    ops.push_back(op(FERRY_OP_WRITE, 4 << 20, 4 << 20, 4 << 20, 8));        // above kernel_max_op_bytes
    ops.push_back(op(FERRY_OP_WRITE, 8 << 20, 8 << 20, (1 << 20) + 1, 9));  // one byte above
    ops.push_back(op(FERRY_OP_WRITE, 12 << 20, 12 << 20, 1 << 20, 10));     // exactly at it
    ASSERT_EQ(submit_ops(ops), 0);
    expect_all_ok(collect(ops.size()));
    EXPECT_EQ(counters.kernel_launches.load(), 1);
    EXPECT_EQ(counters.kernel_ops.load(), 9);
    EXPECT_EQ(counters.last_chunks.load(), 8u + 16u);
    for (auto &o : ops)
        EXPECT_EQ(0, memcmp(reinterpret_cast<void *>(o.remote_addr), reinterpret_cast<void *>(o.local_addr), o.length))
            << "op " << o.user_data;
    // The two large ones went the copy engines' way: batched or one by one.
    EXPECT_GE(counters.copy_async.load() + counters.copy_batch.load(), 1 + 1);
}

TEST_P(GpuIpcKernel, OneSmallOpAloneTakesACopy) {
    ASSERT_EQ(submit(1, 4096), 0);
    expect_all_ok(collect(1));
    EXPECT_EQ(counters.kernel_launches.load(), 0);
    EXPECT_EQ(counters.copy_async.load(), 1);
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), 4096));
}

TEST_P(GpuIpcKernel, ManyOpsTakeOneLaunchPerTableAndTablesAreReused) {
    constexpr size_t kOps = kKernelTableOps + 904, kLen = 1024;
    ASSERT_EQ(submit(kOps, kLen), 0);
    expect_all_ok(collect(kOps));
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), kOps * kLen));
    EXPECT_EQ(counters.kernel_launches.load(), 2);
    EXPECT_EQ(counters.kernel_ops.load(), static_cast<int>(kOps));
    EXPECT_EQ(counters.last_chunks.load(), 904u);
    const int tables = counters.tables.load();
    EXPECT_EQ(tables, 2);
    for (int round = 0; round < 3; ++round) {
        ASSERT_EQ(submit(kOps, kLen, 100000), 0);
        collect(kOps);
    }
    EXPECT_EQ(counters.tables.load(), tables) << "finished runs hand their tables back";
    EXPECT_EQ(counters.bad_tables.load(), 0);
}

TEST_P(GpuIpcKernel, ATableIsNotRewrittenBeforeItsKernelRan) {
    // Slow streams: several submits are queued before the first kernel runs. Each needs a
    // table of its own; a table rewritten early would copy the wrong ranges.
    six_submits_behind_slow_streams_land();
    EXPECT_GE(counters.tables.load(), 2);
    EXPECT_EQ(counters.bad_tables.load(), 0);
}

TEST_P(GpuIpcKernel, UncappedLaunchesTakeABlockPerChunk) {
    make({}, KernelPolicy{1 << 20, 0}, true);
    std::vector<ferry_xfer_op_t> ops;
    for (size_t i = 0; i < 10; ++i) ops.push_back(op(FERRY_OP_WRITE, i * (200 << 10), i * (200 << 10), 200 << 10, i));
    ASSERT_EQ(submit_ops(ops), 0);
    expect_all_ok(collect(ops.size()));
    EXPECT_EQ(counters.last_chunks.load(), 40u) << "200 KiB is 4 chunks of 64 KiB";
    EXPECT_EQ(counters.last_blocks.load(), 40u);
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), 10 * (200 << 10)));
}

TEST_P(GpuIpcKernel, NoKernelInTheRuntimeMeansCopiesAndOneLoadAttempt) {
    make({}, kPolicy, false);
    for (int round = 0; round < 3; ++round) {
        ASSERT_EQ(submit(64, 4096, round * 64), 0);
        expect_all_ok(collect(64));
    }
    EXPECT_EQ(counters.kernel_loads.load(), 1) << "the failure is remembered, not retried per submit";
    EXPECT_EQ(counters.kernel_launches.load(), 0);
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), 64 * 4096));
}

TEST_P(GpuIpcKernel, KernelOffByPolicyIsNeverLoaded) {
    make({}, KernelPolicy{0, 16}, true);
    ASSERT_EQ(submit(64, 4096), 0);
    expect_all_ok(collect(64));
    EXPECT_EQ(counters.kernel_loads.load(), 0);
    EXPECT_EQ(counters.kernel_launches.load(), 0);
}

TEST_P(GpuIpcKernel, ALaunchRefusedHandsItsOpsToTheCopyEnginesForGood) {
    rt_->fail_kernel_launch_at = 0;
    ASSERT_EQ(submit(64, 4096), 0);
    expect_all_ok(collect(64));
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), 64 * 4096));
    EXPECT_EQ(counters.kernel_launches.load(), 1);
    EXPECT_GE(counters.stream_waits.load(), 1) << "the table's queued copy ended before the table was reused";
    std::fill(dst.begin(), dst.end(), 0);
    ASSERT_EQ(submit(64, 4096, 64), 0);
    expect_all_ok(collect(64));
    EXPECT_EQ(counters.kernel_launches.load(), 1) << "no further launch on that device";
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), 64 * 4096));
}

TEST_P(GpuIpcKernel, AKernelThatFaultsFailsEveryOpOfItsRunOnlyOnceItEnded) {
    rt_->fail_async = true;
    rt_->copy_delay_ms = 50;
    constexpr size_t kOps = 32;
    ASSERT_EQ(submit(kOps, 8192), 0);
    auto got = collect(kOps);
    for (auto &[u, c] : got) {
        EXPECT_LT(c.status, 0) << "op " << u;
        EXPECT_NE(std::string(c.message).find("illegal memory access"), std::string::npos) << c.message;
    }
    EXPECT_EQ(counters.kernel_launches.load(), 1);
    EXPECT_EQ(counters.bytes_landed.load(), 0);
}

// copy_local (ABI 1.6), a staging slice's gather: many small copies within the process, one
// launch, one completion after all, bytes exact at odd offsets and lengths.
TEST_P(GpuIpcKernel, CopyLocalGathersSmallCopiesInOneLaunchWithOneCompletion) {
    std::vector<ferry_local_copy_t> copies;
    std::vector<std::pair<size_t, size_t>> parts;  // (src offset, length); packed into dst from 0
    size_t packed = 0;
    for (size_t k = 0; k < 300; ++k) {
        size_t off = k * 40000 + k % 17, len = 1 + (k * 7919) % 32768;
        copies.push_back(
            {reinterpret_cast<uint64_t>(dst.data()) + packed, reinterpret_cast<uint64_t>(src.data()) + off, len});
        parts.emplace_back(off, len);
        packed += (len + 255) & ~size_t{255};
    }
    std::fill(dst.begin(), dst.end(), 0xee);
    ferry_error_t err{};
    ASSERT_EQ(t_->copy_local(0, copies.data(), copies.size(), 77, &err), 0) << err.message;
    auto got = collect(1);
    ASSERT_EQ(got.count(77), 1u) << "one completion, with the caller's user_data";
    EXPECT_EQ(got[77].status, 0) << got[77].message;
    packed = 0;
    for (auto [off, len] : parts) {
        ASSERT_EQ(0, memcmp(dst.data() + packed, src.data() + off, len)) << "part at " << packed;
        if (len % 256) EXPECT_EQ(dst[packed + len], 0xee) << "nothing past the part";
        packed += (len + 255) & ~size_t{255};
    }
    EXPECT_EQ(counters.kernel_launches.load(), 1);
    EXPECT_EQ(counters.kernel_ops.load(), 300);
    EXPECT_EQ(counters.events_recorded.load(), 1);
}

TEST_P(GpuIpcKernel, CopyLocalRefusesBadCopiesWithNothingStartedAndReportsAFaultOnce) {
    ferry_local_copy_t bad[] = {{reinterpret_cast<uint64_t>(dst.data()), reinterpret_cast<uint64_t>(src.data()), 64},
                                {reinterpret_cast<uint64_t>(dst.data()) + 64, 0, 64}};
    ferry_error_t err{};
    EXPECT_EQ(t_->copy_local(0, bad, 2, 5, &err), -EINVAL);
    EXPECT_NE(std::string(err.message).find("copy 1"), std::string::npos) << err.message;
    EXPECT_EQ(counters.kernel_launches.load() + counters.copy_async.load(), 0) << "nothing started";

    rt_->fail_async = true;
    rt_->copy_delay_ms = 20;
    std::vector<ferry_local_copy_t> copies;
    for (size_t k = 0; k < 8; ++k)
        copies.push_back({reinterpret_cast<uint64_t>(dst.data()) + k * 4096,
                          reinterpret_cast<uint64_t>(src.data()) + k * 4096, 4096});
    ASSERT_EQ(t_->copy_local(0, copies.data(), copies.size(), 9, &err), 0) << err.message;
    auto got = collect(1);
    ASSERT_EQ(got.count(9), 1u);
    EXPECT_LT(got[9].status, 0) << "the fault is reported, once";
    EXPECT_EQ(counters.bytes_landed.load(), 0);
}

// The kernel that takes its table in the launch's parameters (cuda_ipc.so on Volta and newer
// with a CUDA 12.1 driver): no table to copy or keep, a launch per kInlineTableOps ops.
class GpuIpcKernelTableInLaunch : public GpuIpcKernel {
protected:
    void SetUp() override { make({}, kPolicy, true, true); }
};

TEST_P(GpuIpcKernelTableInLaunch, SmallOpsOfABatchGoToOneLaunchWithNoTableCopy) {
    constexpr size_t kOps = 256, kLen = 64 << 10;
    ASSERT_EQ(submit(kOps, kLen), 0);
    expect_all_ok(collect(kOps));
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), kOps * kLen));
    EXPECT_EQ(counters.inline_launches.load(), 1);
    EXPECT_EQ(counters.kernel_launches.load(), 1);
    EXPECT_EQ(counters.last_inline_ops.load(), kOps);
    EXPECT_EQ(counters.copy_async.load(), 0) << "no table copy, and no copy per op";
    EXPECT_EQ(counters.tables.load(), 0) << "no table memory";
    EXPECT_EQ(counters.events_recorded.load(), 1);
    EXPECT_EQ(counters.last_chunks.load(), kOps);
    EXPECT_EQ(counters.last_blocks.load(), kPolicy.max_blocks);
    EXPECT_EQ(counters.bad_tables.load(), 0);
}

TEST_P(GpuIpcKernelTableInLaunch, OddAddressesAndLengthsLandExactlyAndNothingBeside) {
    odd_ops_land_exactly();
    EXPECT_EQ(counters.inline_launches.load(), 2) << "one for the WRITE batch, one for the READ one";
    EXPECT_EQ(counters.tables.load(), 0);
}

TEST_P(GpuIpcKernelTableInLaunch, ManyOpsTakeALaunchPerInlineTableBehindOneEventPerRun) {
    constexpr size_t kOps = kKernelTableOps + 904, kLen = 1024;
    ASSERT_EQ(submit(kOps, kLen), 0);
    expect_all_ok(collect(kOps));
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), kOps * kLen));
    EXPECT_EQ(counters.inline_launches.load(), static_cast<int>(kKernelTableOps / kInlineTableOps + 1));
    EXPECT_EQ(counters.last_inline_ops.load(), 904u);
    EXPECT_EQ(counters.kernel_ops.load(), static_cast<int>(kOps));
    EXPECT_EQ(counters.events_recorded.load(), 2) << "one per kKernelTableOps ops, as with tables";
    EXPECT_EQ(counters.bad_tables.load(), 0);
}

TEST_P(GpuIpcKernelTableInLaunch, LaunchesQueuedBehindSlowStreamsKeepTheirOwnTables) {
    // The transport builds every launch's entries in one buffer: each launch must have taken
    // its own copy, or the kernels that run late copy the last submit's ranges.
    six_submits_behind_slow_streams_land();
    EXPECT_EQ(counters.inline_launches.load(), 6);
    EXPECT_EQ(counters.bad_tables.load(), 0);
}

TEST_P(GpuIpcKernelTableInLaunch, ARefusedLaunchHandsTheRestToTableCopiesForGood) {
    rt_->fail_kernel_launch_at = 1;  // the second launch of the first submit
    constexpr size_t kOps = 3000, kLen = 2048;
    ASSERT_EQ(submit(kOps, kLen), 0);
    expect_all_ok(collect(kOps));
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), kOps * kLen));
    EXPECT_EQ(counters.inline_launches.load(), 1) << "the first went, the second was refused";
    EXPECT_EQ(counters.tables.load(), 1) << "the other ops went in one table-copy launch";
    EXPECT_EQ(counters.kernel_ops.load(), static_cast<int>(kOps));
    std::fill(dst.begin(), dst.end(), 0);
    ASSERT_EQ(submit(64, 4096, kOps), 0);
    expect_all_ok(collect(64));
    EXPECT_EQ(counters.inline_launches.load(), 1) << "no inline launch on that device from then on";
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), 64 * 4096));
    EXPECT_EQ(counters.bad_tables.load(), 0);
}

TEST_P(GpuIpcKernelTableInLaunch, AKernelThatFaultsFailsEveryOpOfItsRunOnlyOnceItEnded) {
    rt_->fail_async = true;
    rt_->copy_delay_ms = 50;
    constexpr size_t kOps = 32;
    ASSERT_EQ(submit(kOps, 8192), 0);
    auto got = collect(kOps);
    ASSERT_EQ(got.size(), kOps);
    for (auto &[u, c] : got) EXPECT_LT(c.status, 0) << "op " << u;
    EXPECT_EQ(counters.inline_launches.load(), 1);
    EXPECT_EQ(counters.bytes_landed.load(), 0);
}

TEST_P(GpuIpcKernelTableInLaunch, OffByPolicyTheTableIsCopied) {
    make({}, KernelPolicy{1 << 20, 16, false}, true, true);
    ASSERT_EQ(submit(64, 4096), 0);
    expect_all_ok(collect(64));
    EXPECT_EQ(counters.inline_launches.load(), 0);
    EXPECT_EQ(counters.kernel_launches.load(), 1);
    EXPECT_EQ(counters.tables.load(), 1);
    EXPECT_EQ(0, memcmp(dst.data(), src.data(), 64 * 4096));
}

INSTANTIATE_TEST_SUITE_P(BatchedCopy, GpuIpcKernelTableInLaunch, ::testing::Bool(),
                         [](const auto &info) { return info.param ? "batched" : "per_op"; });

INSTANTIATE_TEST_SUITE_P(BatchedCopy, GpuIpcKernel, ::testing::Bool(),
                         [](const auto &info) { return info.param ? "batched" : "per_op"; });

}  // namespace
