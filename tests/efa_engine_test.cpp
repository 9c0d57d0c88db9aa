// efa.so end to end through the engine over libfabric's tcp provider (tcp;ofi_rxm on
// 127.0.0.1), between this process and ferry_test_peer children. Keys travel in the segment
// descriptor (export_mem bytes). Data verified on both sides, the serving side refusing memory
// it no longer registers, a peer killed mid-transfer, and a spinning host that waits without
// sleeping.
#include <gtest/gtest.h>
#include <sys/resource.h>

#include <cinttypes>
#include <cstring>
#include <thread>

#include "ferry/engine.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"

using namespace ferry;
using ferry::test::PeerProcess;

namespace {

std::vector<std::string> peer_args(uint64_t size, const std::string &spin_us = "") {
    std::vector<std::string> a = {"--size",   std::to_string(size), "--option", "plugins=efa",
                                  "--option", "efa.provider=tcp",   "--option", "efa.max_mr_size=4m"};
    if (!spin_us.empty()) a.insert(a.end(), {"--option", "efa.spin_us=" + spin_us});
    return a;
}

// Sleeps (voluntary context switches) of the calling thread so far.
long thread_sleeps() {
    rusage u{};
    getrusage(RUSAGE_THREAD, &u);
    return u.ru_nvcsw;
}

class EfaEngineTest : public ::testing::Test {
protected:
    void SetUp() override {
        auto e = Engine::create({{"plugins", "efa"}, {"efa.provider", "tcp"}, {"efa.op_timeout_ms", "10000"}});
        ASSERT_TRUE(e) << e.error().message;
        engine = std::move(*e);
        local.assign(64 << 20, 0);
        ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
    }
    Result<void> run(const std::vector<Request> &reqs, std::string *transport = nullptr) {
        auto b = engine->submit(reqs);
        if (!b) return std::unexpected(b.error());
        auto w = engine->wait(*b, std::chrono::seconds(60));
        if (transport) *transport = engine->status(*b, 0)->transport;
        (void)engine->free_batch(*b);
        return w;
    }
    std::unique_ptr<Engine> engine;
    std::vector<uint8_t> local;
};

}  // namespace

TEST_F(EfaEngineTest, ReadAndWriteAcrossProcessesWithVerification) {
    PeerProcess peer(peer_args(16 << 20));
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    // Reads cross the peer's 4 MiB registration boundaries.
    std::vector<Request> reads;
    for (uint64_t off = 0; off < peer.size; off += 3 << 20)
        reads.push_back({Opcode::Read, local.data() + off, *seg, peer.base + off,
                         std::min<uint64_t>(3 << 20, peer.size - off), ""});
    std::string used;
    auto r = run(reads, &used);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(used, "efa");
    for (uint64_t i = 0; i < peer.size; ++i) ASSERT_EQ(local[i], test::peer_pattern(i)) << "byte " << i;

    std::vector<uint8_t> expected(peer.size);
    for (uint64_t i = 0; i < peer.size; ++i) expected[i] = test::peer_pattern(i);
    struct Piece {
        uint64_t off, len;
    };
    std::vector<Piece> pieces = {
        {0, 1}, {1, 4095}, {5000, (1 << 20) + 3}, {(4 << 20) - 9, 4 << 20}, {peer.size - 7, 7}};
    std::vector<Request> writes;
    uint64_t src = 32 << 20;
    for (auto p : pieces) {
        for (uint64_t k = 0; k < p.len; ++k) local[src + k] = static_cast<uint8_t>(k * 31 + p.off);
        memcpy(expected.data() + p.off, local.data() + src, p.len);
        writes.push_back({Opcode::Write, local.data() + src, *seg, peer.base + p.off, p.len, "efa"});
        src += p.len;
    }
    r = run(writes);
    ASSERT_TRUE(r) << r.error().message;
    char want[64];
    snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(expected.data(), expected.size()));
    EXPECT_EQ(peer.command("sum"), want) << "a WRITE completes only once its bytes are in the peer's memory";
}

TEST_F(EfaEngineTest, ServingSideRefusesMemoryNoLongerRegistered) {
    PeerProcess peer(peer_args(1 << 20));
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg);
    ASSERT_TRUE(run({{Opcode::Read, local.data(), *seg, peer.base, 4096, "efa"}}));
    // The peer unregisters; our cached descriptor still holds its key, so only its provider stands
    // between this WRITE and its memory.
    ASSERT_EQ(peer.command("unreg"), "OK");
    auto r = run({{Opcode::Write, local.data(), *seg, peer.base, 4096, "efa"}});
    ASSERT_FALSE(r) << "the peer's provider let us write memory it no longer registers";
    EXPECT_NE(r.error().message.find("efa"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("refused"), std::string::npos) << r.error().message;
    std::cout << "refusal seen by the initiator: " << r.error().message << "\n";
    char want[64];
    snprintf(want, sizeof want, "SUM %" PRIx64, [] {
        std::vector<uint8_t> v(1 << 20);
        for (size_t i = 0; i < v.size(); ++i) v[i] = test::peer_pattern(i);
        return test::fnv1a(v.data(), v.size());
    }());
    EXPECT_EQ(peer.command("sum"), want) << "unregistered memory was written";
}

TEST_F(EfaEngineTest, PeerKilledMidTransferFailsItsOpsAndOthersCarryOn) {
    PeerProcess doomed(peer_args(64 << 20));
    PeerProcess survivor(peer_args(1 << 20));
    ASSERT_TRUE(doomed.ok && survivor.ok) << doomed.error << survivor.error;
    auto s1 = engine->open_segment(doomed.segment);
    auto s2 = engine->open_segment(survivor.segment);
    ASSERT_TRUE(s1 && s2);
    std::vector<Request> big;
    for (int i = 0; i < 1024; ++i)
        big.push_back({Opcode::Write, local.data() + (i % 64) * (1 << 20), *s1, doomed.base + (i % 64) * (1 << 20),
                       1 << 20, "efa"});
    auto b = engine->submit(big);
    ASSERT_TRUE(b) << b.error().message;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
    doomed.kill_now();
    auto w = engine->wait(*b, std::chrono::seconds(60));
    ASSERT_FALSE(w) << "1 GiB over loopback TCP cannot have finished before the kill";
    std::cout << "error seen: " << w.error().message << "\n";
    size_t failed = 0;
    for (size_t i = 0; i < big.size(); ++i) {
        auto st = engine->status(*b, i);
        ASSERT_TRUE(st);
        EXPECT_NE(st->state, OpState::Pending) << "op " << i << " never completed";
        if (st->state == OpState::Failed) {
            ++failed;
            EXPECT_LT(st->code, 0);
            EXPECT_NE(st->message.find("127.0.0.1:"), std::string::npos) << st->message;
        }
    }
    EXPECT_GT(failed, 0u);
    ASSERT_TRUE(engine->free_batch(*b));
    auto r = run({{Opcode::Read, local.data(), *s2, survivor.base, survivor.size, "efa"}});
    ASSERT_TRUE(r) << "the other peer is still served: " << r.error().message;
    for (uint64_t i = 0; i < survivor.size; ++i) ASSERT_EQ(local[i], test::peer_pattern(i));
    auto again = run({{Opcode::Read, local.data(), *s1, doomed.base, 4096, "efa"}});
    EXPECT_FALSE(again);
}

// efa.spin_us > 0 (the default with 4 CPUs or more): the thread waiting in Engine::wait reads the
// CQ itself and the progress thread stands aside while it polls, so the waiting thread has to be
// the one spinning: with one op in flight it must not sleep in poll(2) per op. (Before it did,
// the waiting thread slept once per op here and nothing on the initiator spun.) A long spin
// window keeps a slow (sanitized, shared) machine's round trips inside it.
TEST_F(EfaEngineTest, SpinningHostWaitsForOneOpInFlightWithoutSleeping) {
    constexpr int kOps = 300;
    constexpr uint64_t kBlock = 64 << 10;
    const std::string spin = "200000";
    auto e = Engine::create(
        {{"plugins", "efa"}, {"efa.provider", "tcp"}, {"efa.op_timeout_ms", "10000"}, {"efa.spin_us", spin}});
    ASSERT_TRUE(e) << e.error().message;
    auto &eng = **e;
    std::vector<uint8_t> buf(kOps * kBlock);
    ASSERT_TRUE(eng.register_memory(buf.data(), buf.size()));
    PeerProcess peer(peer_args(kOps * kBlock, spin));
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = eng.open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    for (size_t i = 0; i < buf.size(); ++i) buf[i] = static_cast<uint8_t>(i * 7 + i / 4093);
    auto one = [&](int i) -> Result<void> {
        std::vector<Request> req = {
            {Opcode::Write, buf.data() + i * kBlock, *seg, peer.base + i * kBlock, kBlock, "efa"}};
        auto b = eng.submit(req);
        if (!b) return std::unexpected(b.error());
        auto w = eng.wait(*b, std::chrono::seconds(30));
        (void)eng.free_batch(*b);
        return w;
    };
    ASSERT_TRUE(one(0));  // the connection, and the first wake-up
    const long before = thread_sleeps();
    for (int i = 1; i < kOps; ++i) {
        auto r = one(i);
        ASSERT_TRUE(r) << "op " << i << ": " << r.error().message;
    }
    const double per_op = static_cast<double>(thread_sleeps() - before) / (kOps - 1);
    std::cout << "efa.spin_us=" << spin << ": the waiting thread slept " << per_op << " times per op\n";
    EXPECT_LT(per_op, 0.25) << "a spinning host slept in poll(2) while its op was in flight";
    char want[64];
    snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(buf.data(), buf.size()));
    EXPECT_EQ(peer.command("sum"), want) << "every WRITE's bytes are in the peer's memory";
}
