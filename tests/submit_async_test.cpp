// submit never waits on the network: against a ferry_test_peer child stopped with SIGSTOP
// (its kernel still accepts TCP connections, the process answers nothing: a connect or a
// descriptor fetch that hangs until its timeout), submit returns at once, the op fails with
// the connect's (or fetch's) error within that timeout, ops to a live peer in the same batch
// are not held up, a peer that answers late is served, and the engine tears down cleanly with
// a connect still blocked inside tcp.so.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <thread>

#include "ferry/engine.hpp"
#include "ferry/ferry.h"
#include "peer_pattern.hpp"
#include "peer_process.hpp"

using namespace ferry;
using ferry::test::PeerProcess;
using Clock = std::chrono::steady_clock;
using namespace std::chrono_literals;

namespace {

// How long a connect to (or a descriptor fetch from) the stopped peer hangs. Submit must
// return far sooner: the bound holds on a loaded 2-core machine.
constexpr int kStallMs = 4000;
constexpr auto kSubmitBound = 200ms;

// The peer stopped for this scope (continued after, so its SIGKILL at the end is reaped).
class Stopped {
public:
    explicit Stopped(pid_t pid) : pid_(pid) { EXPECT_TRUE(test::stop_process(pid_)) << "the peer did not stop"; }
    ~Stopped() { resume(); }
    void resume() {
        if (pid_ > 0) ::kill(pid_, SIGCONT);
        pid_ = -1;
    }

private:
    pid_t pid_;
};

std::unique_ptr<Engine> make_engine(int connect_timeout_ms = kStallMs) {
    auto e = Engine::create({{"plugins", "tcp"},
                             {"tcp.connect_timeout_ms", std::to_string(connect_timeout_ms)},
                             {"handshake_timeout_ms", std::to_string(kStallMs)}});
    EXPECT_TRUE(e) << e.error().message;
    return e ? std::move(*e) : nullptr;
}

template <class F>
Clock::duration timed(F &&f) {
    auto t0 = Clock::now();
    f();
    return Clock::now() - t0;
}

long ms(Clock::duration d) {
    return static_cast<long>(std::chrono::duration_cast<std::chrono::milliseconds>(d).count());
}

class SubmitAsyncTest : public ::testing::Test {
protected:
    void SetUp() override {
        engine = make_engine();
        ASSERT_TRUE(engine);
        local.assign(1 << 20, 0);
        ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
    }
    std::unique_ptr<Engine> engine;
    std::vector<uint8_t> local;
};

}  // namespace

TEST_F(SubmitAsyncTest, SubmitToAHangingPeerReturnsAtOnceAndTheOpFailsWithTheConnectError) {
    PeerProcess peer({"--size", "65536"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    Stopped stopped(peer.pid());

    Result<BatchId> b = fail(0, "");
    auto took = timed([&] {
        b = engine->submit(std::vector<Request>{{Opcode::Read, local.data(), *seg, peer.base, 4096, ""}});
    });
    ASSERT_TRUE(b) << b.error().message;
    EXPECT_LT(took, kSubmitBound) << "submit waited " << ms(took) << " ms on the connect";
    auto st = engine->status(*b, 0);
    ASSERT_TRUE(st);
    EXPECT_EQ(st->state, OpState::Pending) << "the op waits inside the engine for its connect";

    Result<void> w;
    auto failed_after = timed([&] { w = engine->wait(*b, 30s); });
    ASSERT_FALSE(w) << "a READ from a stopped peer succeeded";
    EXPECT_EQ(w.error().code, -EHOSTUNREACH) << w.error().message;
    EXPECT_NE(w.error().message.find("no transport can carry it"), std::string::npos) << w.error().message;
    EXPECT_NE(w.error().message.find("timed out"), std::string::npos)
        << "the connect's own error: " << w.error().message;
    EXPECT_LT(failed_after, std::chrono::milliseconds(kStallMs) + 10s) << "the op ends by its connect timeout";
    std::cout << "submit took " << ms(took) << " ms; the op failed " << ms(failed_after)
              << " ms later: " << w.error().message << "\n";
    EXPECT_TRUE(engine->free_batch(*b));
}

TEST_F(SubmitAsyncTest, ALivePeerInTheSameBatchIsNotHeldUpAndALatePeerIsServed) {
    PeerProcess slow({"--size", "65536"});
    PeerProcess fast({"--size", "65536"});
    ASSERT_TRUE(slow.ok && fast.ok) << slow.error << fast.error;
    // A connect timeout far beyond the test: the slow peer's op can only end by its answer.
    engine = make_engine(60000);
    ASSERT_TRUE(engine);
    ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
    auto s_slow = engine->open_segment(slow.segment);
    auto s_fast = engine->open_segment(fast.segment);
    ASSERT_TRUE(s_slow && s_fast);
    Stopped stopped(slow.pid());

    std::vector<Request> reqs = {{Opcode::Read, local.data(), *s_slow, slow.base, 4096, ""},
                                 {Opcode::Read, local.data() + 65536, *s_fast, fast.base, 4096, ""}};
    Result<BatchId> b = fail(0, "");
    auto took = timed([&] { b = engine->submit(reqs); });
    ASSERT_TRUE(b) << b.error().message;
    EXPECT_LT(took, kSubmitBound) << "submit waited " << ms(took) << " ms";

    // The live peer's op finishes while the stopped one's connect still hangs.
    auto deadline = Clock::now() + 30s;
    Result<OpStatus> st = fail(0, "");
    while (Clock::now() < deadline) {
        st = engine->status(*b, 1);
        ASSERT_TRUE(st);
        if (st->state != OpState::Pending) break;
        std::this_thread::sleep_for(1ms);  // polling status, as callers do; not synchronisation
    }
    ASSERT_EQ(st->state, OpState::Done) << st->message;
    for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(local[65536 + i], test::peer_pattern(i));
    auto held = engine->status(*b, 0);
    ASSERT_TRUE(held);
    EXPECT_EQ(held->state, OpState::Pending) << "the stopped peer cannot have answered";

    // The slow peer answers at last: its connect completes and its op is served.
    stopped.resume();
    auto w = engine->wait(*b, 30s);
    ASSERT_TRUE(w) << w.error().message;
    for (size_t i = 0; i < 4096; ++i) ASSERT_EQ(local[i], test::peer_pattern(i));
    EXPECT_TRUE(engine->free_batch(*b));
}

TEST_F(SubmitAsyncTest, ADescriptorReReadThatHangsIsOffTheSubmitPath) {
    PeerProcess peer({"--size", "65536"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    Stopped stopped(peer.pid());
    // Beyond every region the cached descriptor lists: only a re-read can say whether the peer
    // registered it since, and the peer's control server answers nothing.
    Request rq{Opcode::Read, local.data(), *seg, peer.base + peer.size + 4096, 4096, ""};
    Result<BatchId> b = fail(0, "");
    auto took = timed([&] { b = engine->submit(std::span(&rq, 1)); });
    ASSERT_TRUE(b) << b.error().message;
    EXPECT_LT(took, kSubmitBound) << "submit waited " << ms(took) << " ms on the descriptor fetch";
    Result<void> w;
    auto failed_after = timed([&] { w = engine->wait(*b, 30s); });
    ASSERT_FALSE(w);
    EXPECT_NE(w.error().message.find("submit: op 0 (READ 4096 bytes): "), std::string::npos) << w.error().message;
    EXPECT_NE(w.error().message.find(peer.segment), std::string::npos)
        << "the fetch's error names the peer: " << w.error().message;
    EXPECT_LT(failed_after, std::chrono::milliseconds(kStallMs) + 10s);
    std::cout << "submit took " << ms(took) << " ms; the op failed " << ms(failed_after)
              << " ms later: " << w.error().message << "\n";
}

TEST_F(SubmitAsyncTest, TeardownWithAConnectBlockedInThePluginEndsAndFailsNothingTwice) {
    PeerProcess peer({"--size", "65536"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg);
    Stopped stopped(peer.pid());
    std::vector<Request> reqs;
    for (int i = 0; i < 16; ++i) reqs.push_back({Opcode::Read, local.data() + i * 4096, *seg, peer.base, 4096, ""});
    Result<BatchId> b = fail(0, "");
    auto took = timed([&] { b = engine->submit(reqs); });
    ASSERT_TRUE(b) << b.error().message;
    EXPECT_LT(took, kSubmitBound);
    // A second batch queued behind the first while its connect hangs.
    auto b2 = engine->submit(reqs);
    ASSERT_TRUE(b2) << b2.error().message;
    std::this_thread::sleep_for(50ms);  // lets the connector enter tcp.so's connect (not needed for correctness)
    auto destroyed = timed([&] { engine.reset(); });
    EXPECT_LT(destroyed, std::chrono::milliseconds(kStallMs) + 10s)
        << "destroying the engine waits at most for the blocked connect's own timeout";
    std::cout << "engine destroyed in " << ms(destroyed) << " ms with a connect blocked in tcp.so\n";
}

TEST_F(SubmitAsyncTest, CloseSegmentWhileItsConnectHangsFailsItsOps) {
    PeerProcess peer({"--size", "65536"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg);
    Stopped stopped(peer.pid());
    std::vector<Request> reqs = {{Opcode::Read, local.data(), *seg, peer.base, 4096, ""}};
    auto b = engine->submit(reqs);
    ASSERT_TRUE(b) << b.error().message;
    auto b2 = engine->submit(reqs);
    ASSERT_TRUE(b2) << b2.error().message;
    ASSERT_TRUE(engine->close_segment(*seg));
    for (auto id : {*b, *b2}) {
        auto w = engine->wait(id, std::chrono::milliseconds(kStallMs) + 20s);
        ASSERT_FALSE(w);
        EXPECT_NE(w.error().code, kWaitPending) << "every op ends within its connect timeout";
        EXPECT_TRUE(engine->free_batch(id));
    }
}

TEST(SubmitAsyncCApi, FerrySubmitToAHangingPeerReturnsAtOnce) {
    PeerProcess peer({"--size", "65536"});
    ASSERT_TRUE(peer.ok) << peer.error;
    std::string timeout = std::to_string(kStallMs);
    const char *keys[] = {"plugins", "tcp.connect_timeout_ms"};
    const char *values[] = {"tcp", timeout.c_str()};
    ferry_engine_t *e = nullptr;
    ASSERT_EQ(ferry_engine_create(keys, values, 2, &e), 0) << ferry_last_error();
    std::vector<uint8_t> dst(4096);
    ASSERT_EQ(ferry_register(e, dst.data(), dst.size(), FERRY_MEMORY_HOST, -1, FERRY_REMOTE_READ | FERRY_REMOTE_WRITE),
              0);
    ferry_segment_id_t seg;
    ASSERT_EQ(ferry_open_segment(e, peer.segment.c_str(), &seg), 0) << ferry_last_error();
    Stopped stopped(peer.pid());
    ferry_request_t req{FERRY_READ, 0, dst.data(), seg, peer.base, dst.size(), nullptr};
    ferry_batch_id_t batch;
    int rc = -1;
    auto took = timed([&] { rc = ferry_submit(e, &req, 1, &batch); });
    ASSERT_EQ(rc, 0) << ferry_last_error();
    EXPECT_LT(took, kSubmitBound) << "ferry_submit waited " << ms(took) << " ms";
    EXPECT_EQ(ferry_wait_batch(e, batch, kStallMs + 20000), -EHOSTUNREACH) << ferry_last_error();
    EXPECT_NE(std::string(ferry_last_error()).find("timed out"), std::string::npos) << ferry_last_error();
    EXPECT_EQ(ferry_free_batch(e, batch), 0);
    ferry_engine_destroy(e);
}
