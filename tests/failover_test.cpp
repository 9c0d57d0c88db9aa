// Failover through the engine, between this process and a ferry_test_peer child that serves
// tcp.so (reached through a relay that cuts its first connection mid-batch) and shm.so: the
// ops the cut broke are posted again over shm.so and the batch succeeds with every byte where
// it belongs; the tcp path is paused, then carries traffic again after its pause. Without
// failover, forced onto tcp, or to a peer that died, ops fail, once, with every attempt named.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cinttypes>
#include <cstring>
#include <thread>

#include "fault/cutting_proxy.hpp"
#include "ferry/engine.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"

using namespace ferry;
using ferry::test::PeerProcess;
using ferry_fault::CuttingProxy;

namespace {

constexpr uint64_t kMiB = 1 << 20;
constexpr uint64_t kOps = 64;

using ferry_fault::free_port;

const TransportStats *stats_of(const EngineStats &s, const std::string &name) {
    for (const auto &t : s.transports)
        if (t.transport == name) return &t;
    return nullptr;
}

std::string peer_sum(const std::vector<uint8_t> &expected) {
    char want[64];
    snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(expected.data(), expected.size()));
    return want;
}

// A peer whose tcp endpoint is a relay that cuts the first connection once `cut_after` bytes
// went to the peer; its shm.so is reached directly.
struct CutPeer {
    explicit CutPeer(uint64_t cut_after, CuttingProxy::Cut how = CuttingProxy::Cut::Reset)
        : tcp_port(free_port()),
          proxy(tcp_port, cut_after, how),
          peer({"--size", std::to_string(kOps * kMiB), "--managed", "--option", "plugins=tcp,shm", "--option",
                "tcp.port=" + std::to_string(tcp_port), "--option",
                "tcp.advertise_port=" + std::to_string(proxy.port())}) {}
    uint16_t tcp_port;
    CuttingProxy proxy;
    PeerProcess peer;
};

class FailoverTest : public ::testing::Test {
protected:
    void make_engine(std::map<std::string, std::string> extra = {}) {
        Config config{{"plugins", "tcp,shm"}, {"protocols", "tcp,shm"}, {"path_cooldown_ms", "300"}};
        for (auto &[k, v] : extra) config[k] = v;
        auto e = Engine::create(config);
        ASSERT_TRUE(e) << e.error().message;
        engine = std::move(*e);
        local.assign(kOps * kMiB, 0);
        ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
    }
    Result<void> run(const std::vector<Request> &reqs) {
        auto b = engine->submit(reqs);
        if (!b) return std::unexpected(b.error());
        auto w = engine->wait(*b, std::chrono::seconds(60));
        EXPECT_NE(w ? 0 : w.error().code, kWaitPending) << "every op ends: " << (w ? "" : w.error().message);
        (void)engine->free_batch(*b);
        return w;
    }
    std::vector<Request> batch(Opcode op, SegmentId seg, uint64_t base, const std::string &transport = "") {
        std::vector<Request> reqs;
        for (uint64_t i = 0; i < kOps; ++i)
            reqs.push_back({op, local.data() + i * kMiB, seg, base + i * kMiB, kMiB, transport});
        return reqs;
    }
    std::unique_ptr<Engine> engine;
    std::vector<uint8_t> local;
};

}  // namespace

TEST_F(FailoverTest, WritesCutMidBatchMoveToShmAndTheTcpPathComesBack) {
    make_engine();
    CutPeer p(8 * kMiB);
    ASSERT_TRUE(p.peer.ok) << p.peer.error;
    auto seg = engine->open_segment(p.peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;

    std::vector<uint8_t> expected(kOps * kMiB);
    for (uint64_t i = 0; i < local.size(); ++i) local[i] = expected[i] = static_cast<uint8_t>(i * 7 + i / 4093);
    auto r = run(batch(Opcode::Write, *seg, p.peer.base));
    ASSERT_TRUE(r) << "the ops the cut broke were posted again: " << r.error().message;
    EXPECT_TRUE(p.proxy.cut_done()) << "the relay cut the connection under the batch";
    EXPECT_EQ(p.peer.command("sum"), peer_sum(expected)) << "every byte of every op landed, nothing else";

    auto s = engine->stats();
    const auto *tcp = stats_of(s, "tcp");
    const auto *shm = stats_of(s, "shm");
    ASSERT_TRUE(tcp && shm);
    EXPECT_GT(tcp->failovers, 0u) << "ops moved off the cut path";
    EXPECT_EQ(tcp->write.failed, 0u) << "an op failed over is not counted as failed";
    EXPECT_GE(tcp->pauses, 1u);
    EXPECT_GE(shm->write.done, tcp->failovers) << "the moved ops went over shm";
    EXPECT_EQ(tcp->write.done + shm->write.done, kOps) << "each op completed exactly once";
    std::cout << tcp->failovers << " ops failed over from tcp to shm, " << tcp->write.done << " stayed on tcp\n";

    // Once the pause is over new ops go to tcp again (the relay passes new connections), and
    // READs bring back exactly what was written. The pause is 300 ms, or 600 ms and longer where
    // a late completion of the cut connection counted as a second failure (a slow machine,
    // a sanitizer): wait for its end rather than for a fixed time.
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (stats_of(engine->stats(), "tcp")->paused_paths != 0 && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
    ASSERT_EQ(stats_of(engine->stats(), "tcp")->paused_paths, 0u) << "the tcp path's pause ended";
    std::fill(local.begin(), local.end(), 0);
    r = run(batch(Opcode::Read, *seg, p.peer.base));
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(local, expected);
    auto after = engine->stats();
    EXPECT_GT(stats_of(after, "tcp")->read.done, 0u) << "traffic returned to the tcp path after its pause";
    EXPECT_GE(p.proxy.connections(), 2) << "tcp.so connected again";
}

TEST_F(FailoverTest, ReadsCutMidBatchMoveToShm) {
    make_engine();
    CutPeer p(600, CuttingProxy::Cut::Truncate);  // the handshake and a few READ requests get through
    ASSERT_TRUE(p.peer.ok) << p.peer.error;
    auto seg = engine->open_segment(p.peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    auto r = run(batch(Opcode::Read, *seg, p.peer.base));
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_TRUE(p.proxy.cut_done());
    for (uint64_t i = 0; i < local.size(); ++i) ASSERT_EQ(local[i], test::peer_pattern(i)) << "byte " << i;
    auto s = engine->stats();
    EXPECT_GT(stats_of(s, "tcp")->failovers, 0u);
    EXPECT_EQ(stats_of(s, "tcp")->read.done + stats_of(s, "shm")->read.done, kOps);
}

TEST_F(FailoverTest, WithoutFailoverTheCutOpsFailAndSayWhy) {
    make_engine({{"max_failover_attempts", "0"}});
    CutPeer p(8 * kMiB);
    ASSERT_TRUE(p.peer.ok) << p.peer.error;
    auto seg = engine->open_segment(p.peer.segment);
    ASSERT_TRUE(seg);
    auto r = run(batch(Opcode::Write, *seg, p.peer.base));
    ASSERT_FALSE(r) << "max_failover_attempts 0: the cut ops fail";
    EXPECT_NE(r.error().message.find("tcp: "), std::string::npos) << r.error().message;
    EXPECT_EQ(r.error().message.find("attempt 1"), std::string::npos) << r.error().message;
    auto s = engine->stats();
    EXPECT_EQ(stats_of(s, "tcp")->failovers, 0u);
    EXPECT_GT(stats_of(s, "tcp")->write.failed, 0u);
}

TEST_F(FailoverTest, AnOpForcedOntoTcpNeverMoves) {
    make_engine();
    CutPeer p(8 * kMiB);
    ASSERT_TRUE(p.peer.ok) << p.peer.error;
    auto seg = engine->open_segment(p.peer.segment);
    ASSERT_TRUE(seg);
    auto r = run(batch(Opcode::Write, *seg, p.peer.base, "tcp"));
    ASSERT_FALSE(r) << "ops forced onto tcp fail with it";
    auto s = engine->stats();
    EXPECT_EQ(stats_of(s, "shm")->write.done, 0u) << "nothing moved to shm";
    EXPECT_EQ(stats_of(s, "tcp")->failovers, 0u);
}

TEST_F(FailoverTest, ADeadPeersOpsFailOnceWithEveryAttemptNamed) {
    make_engine();
    CutPeer p(UINT64_MAX);  // the relay never cuts
    ASSERT_TRUE(p.peer.ok) << p.peer.error;
    auto seg = engine->open_segment(p.peer.segment);
    ASSERT_TRUE(seg);
    ASSERT_TRUE(run(batch(Opcode::Read, *seg, p.peer.base))) << "both paths connected";
    p.peer.kill_now();
    auto b = engine->submit(batch(Opcode::Write, *seg, p.peer.base));
    ASSERT_TRUE(b) << b.error().message;
    auto w = engine->wait(*b, std::chrono::seconds(30));
    ASSERT_FALSE(w);
    ASSERT_NE(w.error().code, kWaitPending)
        << "a dead peer's ops end, failover does not hang them: " << w.error().message;
    std::cout << "dead peer: " << w.error().message.substr(0, 600) << "\n";
    size_t failed = 0, named = 0;
    for (size_t i = 0; i < kOps; ++i) {
        auto op = engine->status(*b, i);
        ASSERT_TRUE(op) << op.error().message;
        if (op->state != OpState::Failed) continue;
        ++failed;
        if (op->message.find("attempt 1: ") != std::string::npos) ++named;
    }
    EXPECT_EQ(failed, kOps) << "no op of a dead peer succeeds";
    EXPECT_GT(named, 0u) << "ops that were failed over name their earlier attempts";
    (void)engine->free_batch(*b);
    auto s = engine->stats();
    EXPECT_LE(stats_of(s, "tcp")->failovers + stats_of(s, "shm")->failovers, 2 * kOps)
        << "at most max_failover_attempts per op: no retry storm";
}

TEST(FailoverConfig, BadValuesAreRefusedWithTheFix) {
    auto e = Engine::create({{"max_failover_attempts", "17"}});
    ASSERT_FALSE(e);
    EXPECT_NE(e.error().message.find("max_failover_attempts"), std::string::npos) << e.error().message;
    e = Engine::create({{"path_cooldown_ms", "5000"}, {"path_cooldown_max_ms", "1000"}});
    ASSERT_FALSE(e);
    EXPECT_NE(e.error().message.find("path_cooldown_max_ms"), std::string::npos) << e.error().message;
    e = Engine::create({{"failover_deadline_ms", "0"}});
    ASSERT_FALSE(e);
    EXPECT_NE(e.error().message.find("failover_deadline_ms"), std::string::npos) << e.error().message;
}
