// tcp.so against a target that stops (SIGSTOP) and comes back: an op
// submitted while the initiator was idle ends within op_timeout_ms, and a READ reported
// failed never writes its buffer afterwards, when the target resumes and answers.
#include "../transport/harness.hpp"
#include "../transport/peer_process.hpp"
#include "tcp_flood_util.hpp"

#include <gtest/gtest.h>

#include <chrono>
#include <cstring>
#include <iostream>

#ifdef FERRY_TEST_TCP_PLUGIN

using namespace ferry_test;
using namespace ferry_fault;
using Ms = std::chrono::milliseconds;

namespace {

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
constexpr uint8_t kCanary = 0xC5;
constexpr unsigned kOpTimeoutMs = 500;

// The initiator was idle (no op in flight, its I/O threads asleep) when the target stopped:
// the next ops must still end within op_timeout_ms.
TEST(TcpStop, OpsSubmittedWhileIdleToAStoppedTargetEndWithinOpTimeout) {
    Plugin plugin(flood_plugin_path());
    ASSERT_TRUE(plugin.ok()) << plugin.error();
    ChildPeer target(flood_plugin_path(), 1 << 20, kRW, {});
    ASSERT_TRUE(target.ok()) << target.error();
    Instance a(plugin, {{"op_timeout_ms", std::to_string(kOpTimeoutMs)}});
    ASSERT_EQ(a.create_rc(), 0) << a.last_error();
    Buffer loc(1 << 20);
    uint64_t hl, peer, rmem;
    ASSERT_EQ(a.register_mem(loc.data(), loc.size(), 0, &hl), 0);
    ASSERT_EQ(a.connect(target.endpoint(), &peer), 0) << a.last_error();
    ASSERT_EQ(a.import_mem(peer, target.addr(), 1 << 20, kRW, &rmem), 0);
    // One op first, so the lanes are up and then idle.
    ASSERT_EQ(a.submit(peer, {make_op(FERRY_OP_READ, loc.addr(), hl, target.addr(), rmem, 4096, 0)}), 0);
    auto c = a.wait(1);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_EQ(c[0].status, 0) << c[0].message;
    target.stop();
    auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(a.submit(peer, {make_op(FERRY_OP_READ, loc.addr(), hl, target.addr(), rmem, 4096, 1),
                              make_op(FERRY_OP_WRITE, loc.addr() + 4096, hl, target.addr() + 4096, rmem, 4096, 2)}),
              0);
    c = a.wait(2, std::chrono::seconds(30));
    auto took = std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now() - start).count();
    ASSERT_EQ(c.size(), 2u) << "ops to a stopped target still pending after 30 s";
    for (const auto &x : c) EXPECT_EQ(x.status, -ETIMEDOUT) << x.message;
    std::cout << "ops to a stopped target ended after " << took << " ms (op_timeout_ms " << kOpTimeoutMs << ")\n";
    EXPECT_GE(took, kOpTimeoutMs * 9 / 10) << "failed before op_timeout_ms";
    EXPECT_LT(took, kOpTimeoutMs + 5000) << "ended long after op_timeout_ms";
    target.resume();
    EXPECT_TRUE(target.exit_cleanly());
}

// READs to a stopped target time out; the target resumes and sends its answers: not one byte
// reaches the buffers of the failed READs, and the next READ succeeds on a new connection.
TEST(TcpStop, ReadsReportedFailedNeverWriteTheirBuffersAfterwards) {
    Plugin plugin(flood_plugin_path());
    ASSERT_TRUE(plugin.ok()) << plugin.error();
    constexpr size_t kOps = 64, kOp = 256 << 10, kSize = kOps * kOp;
    ChildPeer target(flood_plugin_path(), kSize, kRW, {});
    ASSERT_TRUE(target.ok()) << target.error();
    ASSERT_TRUE(target.fill(0, kSize, 5));
    const size_t target_fds = fd_count(target.pid());
    Instance a(plugin, {{"op_timeout_ms", std::to_string(kOpTimeoutMs)}, {"lanes", "2"}});
    ASSERT_EQ(a.create_rc(), 0) << a.last_error();
    Buffer dst(kSize), fresh(kOp);
    memset(dst.data(), kCanary, kSize);
    uint64_t hd, hf, peer, rmem;
    ASSERT_EQ(a.register_mem(dst.data(), kSize, 0, &hd), 0);
    ASSERT_EQ(a.register_mem(fresh.data(), kOp, 0, &hf), 0);
    ASSERT_EQ(a.connect(target.endpoint(), &peer), 0) << a.last_error();
    ASSERT_EQ(a.import_mem(peer, target.addr(), kSize, kRW, &rmem), 0);
    target.stop();
    std::vector<ferry_xfer_op_t> ops;
    for (size_t i = 0; i < kOps; ++i)
        ops.push_back(make_op(FERRY_OP_READ, dst.addr() + i * kOp, hd, target.addr() + i * kOp, rmem, kOp, i));
    ASSERT_EQ(a.submit(peer, ops), 0) << a.last_error();
    auto c = a.wait(kOps, std::chrono::seconds(30));
    ASSERT_EQ(c.size(), kOps);
    for (const auto &x : c) ASSERT_EQ(x.status, -ETIMEDOUT) << x.message;
    // Every READ was reported failed: the target now resumes and answers the requests it holds.
    // Once it has closed the connections they came on (its descriptors are back to what they
    // were), it has sent all it ever will.
    target.resume();
    auto guard = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (fd_count(target.pid()) > target_fds && std::chrono::steady_clock::now() < guard)
        std::this_thread::sleep_for(Ms(20));
    ASSERT_LE(fd_count(target.pid()), target_fds) << "the target kept the old connections";
    // One more READ, on a new connection, after which anything in flight has arrived.
    ASSERT_EQ(a.submit(peer, {make_op(FERRY_OP_READ, fresh.addr(), hf, target.addr(), rmem, kOp, 99)}), 0);
    c = a.wait(1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, 0) << c[0].message;
    EXPECT_EQ(find_mismatch(fresh.data(), kOp, 5), SIZE_MAX);
    size_t changed = 0;
    for (size_t i = 0; i < kSize; ++i) changed += dst.data()[i] != kCanary;
    std::cout << changed << " of " << kSize << " bytes of failed READs' buffers changed after the "
              << "target resumed\n";
    EXPECT_EQ(changed, 0u) << "bytes landed in buffers of READs reported failed";
    EXPECT_TRUE(target.exit_cleanly());
}

}  // namespace

#endif  // FERRY_TEST_TCP_PLUGIN
