// tcp.so's path for batches of small ops (plugins/tcp/lane.hpp, "waiter mode"): the submitting
// thread sends a small batch itself and the thread in poll() parses the responses itself. With
// real sockets: connections cut while batches are in flight on that path (every op completes
// exactly once; a READ reported failed never has a byte written into its buffer afterwards),
// many threads submitting and polling one transport at once, a host that does not poll for
// longer than op_timeout_ms (its ops must not time out), and a target that stops.
#include "../transport/harness.hpp"
#include "../transport/peer_process.hpp"
#include "cutting_proxy.hpp"
#include "tcp_flood_util.hpp"

#include <gtest/gtest.h>

#include <poll.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <iostream>
#include <thread>
#include <vector>

#ifdef FERRY_TEST_TCP_PLUGIN

using namespace ferry_test;
using namespace ferry_fault;
using Ms = std::chrono::milliseconds;

namespace {

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
constexpr uint8_t kCanaryByte = 0xC5;
constexpr size_t kCanary = 4096;

std::vector<uint8_t> via_port(std::vector<uint8_t> ep, uint16_t port) {
    ep[8] = static_cast<uint8_t>(port);  // tcp endpoint bytes: port, little-endian, at offset 8
    ep[9] = static_cast<uint8_t>(port >> 8);
    return ep;
}

// Two instances of this process, the client connected to the server (through `port` when not
// 0), each with one registered buffer framed by canaries.
struct Pair {
    Plugin plugin{flood_plugin_path()};
    std::unique_ptr<Instance> server, client;
    Buffer remote, local;
    uint64_t local_handle = 0, peer = 0, rmem = 0;
    size_t size;

    Pair(size_t size_, const Options &client_options) : remote(size_ + 2 * kCanary), local(size_ + 2 * kCanary) {
        size = size_;
        memset(remote.data(), kCanaryByte, remote.size());
        memset(local.data(), kCanaryByte, local.size());
        server = std::make_unique<Instance>(plugin, Options{});
        client = std::make_unique<Instance>(plugin, client_options);
    }
    uint8_t *r() const { return remote.data() + kCanary; }
    uint8_t *l() const { return local.data() + kCanary; }
    uint64_t raddr(size_t off) const { return reinterpret_cast<uint64_t>(r()) + off; }
    uint64_t laddr(size_t off) const { return reinterpret_cast<uint64_t>(l()) + off; }
    ::testing::AssertionResult open(uint16_t port) {
        if (server->create_rc() != 0 || client->create_rc() != 0) return ::testing::AssertionFailure() << "create";
        uint64_t h;
        if (server->register_mem(r(), size, kRW, &h) != 0) return ::testing::AssertionFailure() << "register";
        if (client->register_mem(l(), size, 0, &local_handle) != 0) return ::testing::AssertionFailure() << "register";
        auto ep = port != 0 ? via_port(server->endpoint(), port) : server->endpoint();
        if (client->connect(ep, &peer) != 0) return ::testing::AssertionFailure() << client->last_error();
        if (client->import_mem(peer, raddr(0), size, kRW, &rmem) != 0)
            return ::testing::AssertionFailure() << client->last_error();
        return ::testing::AssertionSuccess();
    }
    bool canaries_intact() const {
        for (const Buffer *b : {&remote, &local})
            for (size_t i = 0; i < kCanary; ++i)
                if (b->data()[i] != kCanaryByte || b->data()[b->size() - 1 - i] != kCanaryByte) return false;
        return true;
    }
};

// A batch of `n` small ops at slot `first` on: even slots READ remote -> local, odd slots WRITE
// local -> remote; slot i covers [i * kSlot, i * kSlot + len(i)).
constexpr size_t kSlot = 256;
size_t slot_len(size_t i) { return 16 + (i * 37) % 241; }
std::vector<ferry_xfer_op_t> small_batch(const Pair &p, size_t first, size_t n) {
    std::vector<ferry_xfer_op_t> ops;
    for (size_t i = first; i < first + n; ++i)
        ops.push_back(make_op(i % 2 == 0 ? FERRY_OP_READ : FERRY_OP_WRITE, p.laddr(i * kSlot), p.local_handle,
                              p.raddr(i * kSlot), p.rmem, slot_len(i), i));
    return ops;
}

struct CutCase {
    CuttingProxy::Cut how;
    uint64_t cut_after;  // bytes client -> server on the first connection
};

class TcpSmallOpsCut : public ::testing::TestWithParam<CutCase> {};

// Batches of 128 small ops go out back to back (the submitting thread sends them itself on the
// idle lane) while the waiting thread parses responses; the relay cuts the connection after
// `cut_after` bytes. Every op completes once; done ones moved their bytes; failed READs'
// buffers keep their sentinel (no byte landed after the failure, checked again once later
// traffic has flowed); later batches succeed on a new connection.
TEST_P(TcpSmallOpsCut, BatchesInFlightOnTheDirectPathFailCleanly) {
    constexpr size_t kBatch = 128, kBatches = 24, kOps = kBatch * kBatches;
    Pair p(kOps * kSlot, {{"op_timeout_ms", "10000"}, {"lanes", "1"}});
    fill_pattern(p.r(), p.size, 3);
    fill_pattern(p.l(), p.size, 4);
    auto sentinel = [&](size_t i) { memset(p.l() + i * kSlot, 0xEE, slot_len(i)); };
    for (size_t i = 0; i < kOps; i += 2) sentinel(i);
    CuttingProxy proxy(endpoint_port(p.server->endpoint()), GetParam().cut_after, GetParam().how);
    ASSERT_TRUE(p.open(proxy.port()));
    // Two batches first: the lane is up and in waiter mode before the rest goes out.
    std::vector<int> seen(kOps, 0), status(kOps, 1);
    size_t submitted = 0, got = 0;
    auto collect = [&](size_t n) {
        auto done = p.client->wait(n, std::chrono::seconds(30));
        for (auto &c : done) {
            ASSERT_LT(c.user_data, kOps);
            ++seen[c.user_data];
            status[c.user_data] = c.status;
            if (c.status != 0) EXPECT_NE(std::string(c.message).find("127.0.0.1:"), std::string::npos) << c.message;
        }
        got += done.size();
    };
    for (size_t b = 0; b < 2; ++b, submitted += kBatch) {
        ASSERT_EQ(p.client->submit(p.peer, small_batch(p, submitted, kBatch)), 0) << p.client->last_error();
        collect(kBatch);
    }
    while (submitted < kOps) {
        for (size_t b = 0; b < 4 && submitted < kOps; ++b, submitted += kBatch)
            ASSERT_EQ(p.client->submit(p.peer, small_batch(p, submitted, kBatch)), 0) << p.client->last_error();
        collect(submitted - got);
        ASSERT_EQ(got, submitted) << "every op completes, none hangs";
    }
    size_t failed = 0;
    std::vector<uint8_t> failed_reads;  // 1: READ slot reported failed
    failed_reads.assign(kOps, 0);
    for (size_t i = 0; i < kOps; ++i) {
        EXPECT_EQ(seen[i], 1) << "op " << i << " completed " << seen[i] << " times";
        if (status[i] != 0) {
            ++failed;
            EXPECT_LT(status[i], 0);
            if (i % 2 == 0) failed_reads[i] = 1;
        } else if (i % 2 == 0) {
            EXPECT_EQ(find_mismatch(p.l() + i * kSlot, slot_len(i), 3, i * kSlot), SIZE_MAX) << "READ " << i;
        } else {
            EXPECT_EQ(find_mismatch(p.r() + i * kSlot, slot_len(i), 4, i * kSlot), SIZE_MAX) << "WRITE " << i;
        }
    }
    EXPECT_TRUE(proxy.cut_done());
    EXPECT_GT(failed, 0u) << "the cut connection carried ops that cannot have completed";
    std::cout << failed << " of " << kOps << " ops failed (cut after " << GetParam().cut_after << " bytes)\n";
    // Later batches reconnect and succeed (the first may still meet the dead connection).
    for (int round = 0; round < 6; ++round) {
        ASSERT_EQ(p.client->submit(p.peer, small_batch(p, 0, 1)), 0);
        auto one = p.client->wait(1, std::chrono::seconds(30));
        ASSERT_EQ(one.size(), 1u);
        ASSERT_EQ(p.client->submit(p.peer, small_batch(p, 1, kBatch - 1)), 0) << p.client->last_error();
        auto more = p.client->wait(kBatch - 1, std::chrono::seconds(30));
        ASSERT_EQ(more.size(), kBatch - 1);
        bool all_ok = one[0].status == 0;
        for (auto &c : more) all_ok = all_ok && c.status == 0;
        if (round > 0) EXPECT_TRUE(all_ok) << "ops after the cut succeed on a new connection";
    }
    EXPECT_GE(proxy.connections(), 2);
    for (size_t i = kBatch; i < kOps; ++i)  // slots the later rounds did not reuse
        if (failed_reads[i]) {
            bool untouched = true;
            for (size_t k = 0; k < slot_len(i); ++k) untouched = untouched && p.l()[i * kSlot + k] == 0xEE;
            EXPECT_TRUE(untouched) << "bytes landed in the buffer of READ " << i << " after it was reported failed";
        }
    EXPECT_TRUE(p.canaries_intact()) << "bytes landed outside the registered regions";
    p.client->destroy();
    p.server->destroy();
}

INSTANTIATE_TEST_SUITE_P(Cuts, TcpSmallOpsCut,
                         ::testing::Values(CutCase{CuttingProxy::Cut::Reset, 40 * 1024},
                                           CutCase{CuttingProxy::Cut::Truncate, 40 * 1024 + 17},
                                           CutCase{CuttingProxy::Cut::Reset, 150 * 1024 + 5},
                                           CutCase{CuttingProxy::Cut::Truncate, 150 * 1024}),
                         [](const auto &info) {
                             return std::string(info.param.how == CuttingProxy::Cut::Reset ? "Reset" : "Truncate") +
                                    std::to_string(info.index);
                         });

// Four threads submit small batches to one peer and poll the one transport at once (a thread
// gets completions of the others' ops too): every op completes once, and its bytes are right.
TEST(TcpSmallOps, ConcurrentSubmittersAndPollers) {
    constexpr size_t kThreads = 4, kBatch = 32, kRounds = 60, kPerThread = kBatch * kRounds;
    constexpr size_t kOps = kThreads * kPerThread;
    Pair p(kOps * kSlot, {{"op_timeout_ms", "20000"}});
    fill_pattern(p.r(), p.size, 11);
    fill_pattern(p.l(), p.size, 12);
    ASSERT_TRUE(p.open(0));
    std::vector<std::atomic<int>> seen(kOps);
    std::vector<std::atomic<int>> status(kOps);
    int cfd = -1;
    ferry_error_t e{};
    ASSERT_EQ(p.plugin->completion_fd(p.client->t(), &cfd, &e), 0);
    std::atomic<bool> problem{false};
    auto worker = [&](size_t t) {
        std::vector<ferry_completion_t> buf(16);  // small: a poll leaves completions for others
        for (size_t round = 0; round < kRounds && !problem; ++round) {
            const size_t first = t * kPerThread + round * kBatch;
            if (p.client->submit(p.peer, small_batch(p, first, kBatch)) != 0) {
                problem = true;
                return;
            }
            auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(30);
            for (;;) {
                bool mine = true;
                for (size_t i = first; i < first + kBatch; ++i) mine = mine && seen[i].load() > 0;
                if (mine) break;
                if (std::chrono::steady_clock::now() > deadline) {
                    problem = true;
                    return;
                }
                int k = p.plugin->poll(p.client->t(), buf.data(), buf.size(), &e);
                for (int j = 0; j < k; ++j) {
                    status[buf[j].user_data] = buf[j].status;
                    seen[buf[j].user_data].fetch_add(1);
                }
                if (k == 0) {
                    pollfd pf{cfd, POLLIN, 0};
                    ::poll(&pf, 1, 5);
                }
            }
        }
    };
    std::vector<std::thread> threads;
    for (size_t t = 0; t < kThreads; ++t) threads.emplace_back(worker, t);
    for (auto &t : threads) t.join();
    ASSERT_FALSE(problem) << "a submit failed or a batch did not complete within 30 s";
    // A last poll: anything completed twice would show up now.
    std::this_thread::sleep_for(Ms(50));
    std::vector<ferry_completion_t> rest(64);
    int k = p.plugin->poll(p.client->t(), rest.data(), rest.size(), &e);
    EXPECT_EQ(k, 0) << "completions left over: some op completed twice";
    for (size_t i = 0; i < kOps; ++i) {
        ASSERT_EQ(seen[i].load(), 1) << "op " << i;
        ASSERT_EQ(status[i].load(), 0) << "op " << i;
        if (i % 2 == 0) ASSERT_EQ(find_mismatch(p.l() + i * kSlot, slot_len(i), 11, i * kSlot), SIZE_MAX) << i;
        else ASSERT_EQ(find_mismatch(p.r() + i * kSlot, slot_len(i), 12, i * kSlot), SIZE_MAX) << i;
    }
    EXPECT_TRUE(p.canaries_intact());
    p.client->destroy();
    p.server->destroy();
}

// A host that submits small batches and then does not poll for three times op_timeout_ms: the
// responses wait in the socket (nobody parses them in poll()), yet no op times out, and all
// are there when it polls.
TEST(TcpSmallOps, OpsDoNotTimeOutWhileTheHostDoesNotPoll) {
    constexpr size_t kBatch = 64;
    Pair p(4 * kBatch * kSlot, {{"op_timeout_ms", "300"}, {"lanes", "1"}});
    fill_pattern(p.r(), p.size, 21);
    ASSERT_TRUE(p.open(0));
    for (size_t round = 0; round < 4; ++round) {
        ASSERT_EQ(p.client->submit(p.peer, small_batch(p, round * kBatch, kBatch)), 0) << p.client->last_error();
        if (round >= 2) std::this_thread::sleep_for(Ms(900));  // waiter mode by now: no poll() meanwhile
        auto done = p.client->wait(kBatch, std::chrono::seconds(10));
        ASSERT_EQ(done.size(), kBatch);
        for (auto &c : done) EXPECT_EQ(c.status, 0) << "round " << round << ": " << c.message;
    }
    for (size_t i = 0; i < 4 * kBatch; i += 2)
        EXPECT_EQ(find_mismatch(p.l() + i * kSlot, slot_len(i), 21, i * kSlot), SIZE_MAX) << i;
    p.client->destroy();
    p.server->destroy();
}

// Small READs to a target that stops while the lane is in waiter mode end with -ETIMEDOUT
// within op_timeout_ms; when the target resumes and answers, their buffers stay untouched.
TEST(TcpSmallOps, SmallReadsToAStoppedTargetTimeOutAndNeverLandLater) {
    constexpr unsigned kOpTimeoutMs = 500;
    constexpr size_t kBatch = 128, kSize = 4 * kBatch * kSlot;
    ChildPeer target(flood_plugin_path(), kSize, kRW, {});
    ASSERT_TRUE(target.ok()) << target.error();
    ASSERT_TRUE(target.fill(0, kSize, 5));
    const size_t target_fds = fd_count(target.pid());
    Plugin plugin(flood_plugin_path());
    Instance a(plugin, {{"op_timeout_ms", std::to_string(kOpTimeoutMs)}, {"lanes", "1"}});
    ASSERT_EQ(a.create_rc(), 0) << a.last_error();
    Buffer dst(kSize);
    memset(dst.data(), kCanaryByte, kSize);
    uint64_t hd, peer, rmem;
    ASSERT_EQ(a.register_mem(dst.data(), kSize, 0, &hd), 0);
    ASSERT_EQ(a.connect(target.endpoint(), &peer), 0) << a.last_error();
    ASSERT_EQ(a.import_mem(peer, target.addr(), kSize, kRW, &rmem), 0);
    auto reads = [&](size_t first) {
        std::vector<ferry_xfer_op_t> ops;
        for (size_t i = first; i < first + kBatch; ++i)
            ops.push_back(make_op(FERRY_OP_READ, dst.addr() + i * kSlot, hd, target.addr() + i * kSlot, rmem, 64, i));
        return ops;
    };
    for (size_t b = 0; b < 2; ++b) {  // the lane is up and in waiter mode
        ASSERT_EQ(a.submit(peer, reads(b * kBatch)), 0);
        auto c = a.wait(kBatch);
        ASSERT_EQ(c.size(), kBatch);
        for (auto &x : c) ASSERT_EQ(x.status, 0) << x.message;
    }
    memset(dst.data(), kCanaryByte, kSize);
    target.stop();
    auto start = std::chrono::steady_clock::now();
    ASSERT_EQ(a.submit(peer, reads(2 * kBatch)), 0);
    auto c = a.wait(kBatch, std::chrono::seconds(30));
    auto took = std::chrono::duration_cast<Ms>(std::chrono::steady_clock::now() - start).count();
    ASSERT_EQ(c.size(), kBatch);
    for (auto &x : c) ASSERT_EQ(x.status, -ETIMEDOUT) << x.message;
    EXPECT_GE(took, kOpTimeoutMs * 9 / 10) << "failed before op_timeout_ms";
    EXPECT_LT(took, kOpTimeoutMs + 5000) << "ended long after op_timeout_ms";
    target.resume();
    auto guard = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (fd_count(target.pid()) > target_fds && std::chrono::steady_clock::now() < guard)
        std::this_thread::sleep_for(Ms(20));
    ASSERT_EQ(a.submit(peer, reads(3 * kBatch)), 0);  // on a new connection
    c = a.wait(kBatch);
    ASSERT_EQ(c.size(), kBatch);
    for (auto &x : c) EXPECT_EQ(x.status, 0) << x.message;
    size_t changed = 0;
    for (size_t i = 2 * kBatch; i < 3 * kBatch; ++i)
        for (size_t k = 0; k < 64; ++k) changed += dst.data()[i * kSlot + k] != kCanaryByte;
    EXPECT_EQ(changed, 0u) << "bytes landed in buffers of READs reported failed";
    EXPECT_TRUE(target.exit_cleanly());
}

}  // namespace

#endif  // FERRY_TEST_TCP_PLUGIN
