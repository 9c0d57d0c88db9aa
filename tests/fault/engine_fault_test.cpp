// Faults at the engine level, with real sockets and child processes: garbage, truncated frames
// and resets on the handshake port and on tcp.so's port (including requests that skip the
// handshake), a handshake peer that never answers, a peer process that stalls mid-transfer
// (SIGSTOP) and comes back, and wait() telling an op that timed out from a wait that did. Each
// must end in a clear error or a closed connection, never a crash or a hang, never a byte
// outside registered memory; the engine keeps serving.
#include <gtest/gtest.h>

#include <signal.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "ferry/engine.hpp"
#include "ferry/ferry.h"
#include "peer_pattern.hpp"
#include "peer_process.hpp"
#include "raw_socket.hpp"

using namespace ferry;
using namespace ferry_fault;
using ferry::test::PeerProcess;
using ferry::test::stop_process;
using Clock = std::chrono::steady_clock;

namespace {

constexpr size_t kCanary = 64 << 10;
constexpr uint8_t kCanaryByte = 0x5A;
constexpr size_t kRegion = 4 << 20;

uint16_t port_of(const std::string &segment) {
    return static_cast<uint16_t>(std::stoul(segment.substr(segment.rfind(':') + 1)));
}

std::vector<uint8_t> le(uint64_t v, int n) {
    std::vector<uint8_t> out;
    for (int i = 0; i < n; ++i) out.push_back(static_cast<uint8_t>(v >> (8 * i)));
    return out;
}
std::vector<uint8_t> first(std::vector<uint8_t> v, size_t n) {
    v.resize(n);
    return v;
}
std::vector<uint8_t> operator+(std::vector<uint8_t> a, const std::vector<uint8_t> &b) {
    a.insert(a.end(), b.begin(), b.end());
    return a;
}

// A serving engine in this process whose registered region sits between two canary areas.
class Target {
public:
    Target() {
        before = listening_ports();
        auto e = Engine::create({{"plugins", "tcp"}});
        if (!e) {
            error = e.error().message;
            return;
        }
        engine = std::move(*e);
        buffer.assign(kRegion + 2 * kCanary, kCanaryByte);
        for (size_t i = 0; i < kRegion; ++i) region()[i] = test::peer_pattern(i);
        if (auto r = engine->register_memory(region(), kRegion); !r) error = r.error().message;
    }
    uint8_t *region() { return buffer.data() + kCanary; }
    uint64_t region_addr() { return reinterpret_cast<uint64_t>(region()); }
    bool canaries_intact() const {
        for (size_t i = 0; i < kCanary; ++i)
            if (buffer[i] != kCanaryByte || buffer[buffer.size() - 1 - i] != kCanaryByte) return false;
        return true;
    }
    bool region_unchanged() {
        for (size_t i = 0; i < kRegion; ++i)
            if (region()[i] != test::peer_pattern(i)) return false;
        return true;
    }
    std::unique_ptr<Engine> engine;
    std::vector<uint8_t> buffer;
    std::set<uint16_t> before;  // listening before the engine started
    std::string error;
};

// A second engine reads the whole region and writes a page back, checking the bytes.
void check_still_served(Target &t) {
    auto e = Engine::create({{"plugins", "tcp"}});
    ASSERT_TRUE(e) << e.error().message;
    auto &initiator = *e;
    std::vector<uint8_t> local(kRegion);
    ASSERT_TRUE(initiator->register_memory(local.data(), local.size()));
    auto seg = initiator->open_segment(t.engine->segment_name());
    ASSERT_TRUE(seg) << seg.error().message;
    Request read{Opcode::Read, local.data(), *seg, t.region_addr(), kRegion, ""};
    auto b = initiator->submit(std::span(&read, 1));
    ASSERT_TRUE(b) << b.error().message;
    auto w = initiator->wait(*b, std::chrono::seconds(30));
    ASSERT_TRUE(w) << w.error().message;
    (void)initiator->free_batch(*b);
    for (size_t i = 0; i < kRegion; ++i) ASSERT_EQ(local[i], test::peer_pattern(i)) << "byte " << i;
}

}  // namespace

TEST(EngineFaults, HandshakePortSurvivesGarbageTruncatedFramesAndResets) {
    Target t;
    ASSERT_TRUE(t.error.empty()) << t.error;
    uint16_t port = port_of(t.engine->segment_name());
    // The documented frame header: magic "FRHS", version, code, length (core/metadata/metadata.hpp).
    auto header = [](uint16_t version, uint16_t code, uint32_t length) {
        return le(0x46524853u, 4) + le(version, 2) + le(code, 2) + le(length, 4);
    };
    struct Attempt {
        const char *what;
        std::vector<uint8_t> bytes;
        bool reset;
    };
    std::vector<Attempt> attempts = {
        {"4 KiB of garbage", junk(4096, 1), false},
        {"5 bytes of a header, then FIN", std::vector<uint8_t>{0x53, 0x48, 0x52, 0x46, 0x01}, false},
        {"a header announcing 4 GiB", header(1, 1, 0xffffffffu), false},
        {"a header announcing 4 GiB, version 2", header(2, 1, 0xffffffffu), false},
        {"an unknown request type", header(1, 999, 0), false},
        {"a newer handshake version", header(0xffff, 1, 0), false},
        {"half a header, then RST", std::vector<uint8_t>{0x53, 0x48, 0x52, 0x46, 0x01, 0x00}, true},
    };
    for (auto &a : attempts) {
        SCOPED_TRACE(a.what);
        RawTcp raw(port);
        ASSERT_TRUE(raw.connected());
        ASSERT_TRUE(raw.send_bytes(a.bytes));
        if (a.reset) {
            raw.reset();
            continue;
        }
        raw.finish();
        // Whatever the request, the engine answers (an error frame) and/or closes; it never
        // leaves the connection hanging or crashes.
        auto start = Clock::now();
        EXPECT_TRUE(raw.closed_by_peer(15000)) << "the engine kept a bad connection open";
        std::cout << a.what << ": closed after "
                  << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - start).count() << " ms, "
                  << raw.received().size() << " bytes of reply\n";
    }
    // A client that connects and says nothing must not keep other peers out.
    RawTcp silent(port);
    ASSERT_TRUE(silent.connected());
    check_still_served(t);
    EXPECT_TRUE(t.canaries_intact());
    EXPECT_TRUE(t.region_unchanged());
}

TEST(EngineFaults, TcpPortSurvivesGarbageAndRequestsWithoutHandshake) {
    Target t;
    ASSERT_TRUE(t.error.empty()) << t.error;
    std::set<uint16_t> ports = listening_ports();
    ports.erase(port_of(t.engine->segment_name()));
    for (auto p : t.before) ports.erase(p);
    ASSERT_EQ(ports.size(), 1u) << "expected exactly tcp.so's listening port";
    uint16_t port = *ports.begin();
    // tcp.so's documented 40-byte header (plugins/tcp/wire.hpp).
    auto header = [](uint8_t type, uint64_t addr, uint64_t len) {
        return le(0x59525246u, 4) + le(1, 2) + std::vector<uint8_t>{type, 0} + le(0, 4) + le(0, 4) + le(1, 8) +
               le(addr, 8) + le(len, 8);
    };
    std::vector<uint8_t> payload(4096, 0xEE);
    struct Attempt {
        const char *what;
        std::vector<uint8_t> bytes;
        bool reset;
    };
    std::vector<Attempt> attempts = {
        {"64 KiB of garbage", junk(64 << 10, 2), false},
        {"20 bytes of a HELLO header, then FIN", first(header(1, 0, 0), 20), false},
        {"a WRITE_REQ into the region without HELLO", header(3, t.region_addr(), payload.size()) + payload, false},
        {"a READ_REQ of the region without HELLO", header(5, t.region_addr(), 4096), false},
        {"a WRITE_REQ into the canary without HELLO", header(3, t.region_addr() - 4096, payload.size()) + payload,
         false},
        {"a WRITE_REQ, then RST mid-payload", header(3, t.region_addr(), 1 << 20) + payload, true},
    };
    for (auto &a : attempts) {
        SCOPED_TRACE(a.what);
        RawTcp raw(port);
        ASSERT_TRUE(raw.connected());
        raw.send_bytes(a.bytes);  // the engine may close before it has read everything
        if (a.reset) {
            raw.reset();
            continue;
        }
        raw.finish();
        EXPECT_TRUE(raw.closed_by_peer(15000)) << "tcp.so kept a bad connection open";
        // A connection that skipped the handshake never gets region bytes back.
        EXPECT_EQ(raw.received().find(std::string(reinterpret_cast<const char *>(t.region()), 64)), std::string::npos);
    }
    EXPECT_TRUE(t.canaries_intact()) << "bytes landed outside the registered region";
    EXPECT_TRUE(t.region_unchanged()) << "a request without a handshake changed the region";
    check_still_served(t);
}

TEST(EngineFaults, HandshakePeerThatNeverAnswersTimesOut) {
    SilentListener silent;
    auto e = Engine::create({{"plugins", "tcp"}, {"handshake_timeout_ms", "500"}});
    ASSERT_TRUE(e) << e.error().message;
    std::string name = "127.0.0.1:" + std::to_string(silent.port());
    auto start = Clock::now();
    auto seg = (*e)->open_segment(name);
    auto took = Clock::now() - start;
    ASSERT_FALSE(seg) << "a peer that never answers cannot be opened";
    EXPECT_LT(seg.error().code, 0);
    EXPECT_NE(seg.error().message.find(name), std::string::npos) << seg.error().message;
    EXPECT_LT(took, std::chrono::seconds(10)) << "bounded by handshake_timeout_ms, not hanging";
    std::cout << "error: " << seg.error().message << "\n";
}

TEST(EngineFaults, StalledPeerProcessTimesOutThenRecovers) {
    PeerProcess peer({"--size", "16777216"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto e = Engine::create({{"plugins", "tcp"}, {"tcp.op_timeout_ms", "1000"}});
    ASSERT_TRUE(e) << e.error().message;
    auto &engine = *e;
    std::vector<uint8_t> local(16 << 20);
    for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<uint8_t>(i * 7 + 1);
    ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;

    // Connected and working first: the stall hits an established connection.
    Request warm{Opcode::Read, local.data(), *seg, peer.base, 4096, ""};
    auto wb = engine->submit(std::span(&warm, 1));
    ASSERT_TRUE(wb) << wb.error().message;
    ASSERT_TRUE(engine->wait(*wb, std::chrono::seconds(30)));
    ASSERT_TRUE(engine->free_batch(*wb));

    ASSERT_EQ(kill(peer.pid(), SIGSTOP), 0);
    std::vector<Request> writes;
    for (int i = 0; i < 16; ++i)
        writes.push_back({Opcode::Write, local.data() + (i << 20), *seg, peer.base + (uint64_t(i) << 20), 1 << 20, ""});
    auto start = Clock::now();
    auto b = engine->submit(writes);
    ASSERT_TRUE(b) << b.error().message;
    auto w = engine->wait(*b, std::chrono::seconds(60));
    auto took = Clock::now() - start;
    ASSERT_FALSE(w) << "writes to a stopped process cannot complete";
    size_t timed_out = 0;
    for (size_t i = 0; i < writes.size(); ++i) {
        auto st = engine->status(*b, i);
        ASSERT_TRUE(st);
        EXPECT_NE(st->state, OpState::Pending) << "op " << i << " never completed";
        if (st->state == OpState::Failed) {
            EXPECT_FALSE(st->message.empty());
            timed_out += st->code == -ETIMEDOUT;
        }
    }
    EXPECT_GT(timed_out, 0u) << w.error().message;
    EXPECT_LT(took, std::chrono::seconds(30)) << "failed by op_timeout_ms, not by the wait's own limit";
    std::cout << "stalled peer: " << w.error().message << " after "
              << std::chrono::duration_cast<std::chrono::milliseconds>(took).count() << " ms\n";
    ASSERT_TRUE(engine->free_batch(*b));

    ASSERT_EQ(kill(peer.pid(), SIGCONT), 0);
    // Once it runs again, new ops go through (a new connection if the old one was dropped).
    Result<void> r = std::unexpected(Error{-1, "not run"});
    for (int attempt = 0; attempt < 2 && !r; ++attempt) {
        auto b2 = engine->submit(writes);
        ASSERT_TRUE(b2) << b2.error().message;
        r = engine->wait(*b2, std::chrono::seconds(30));
        (void)engine->free_batch(*b2);
        if (!r) std::cout << "attempt " << attempt << ": " << r.error().message << "\n";
    }
    ASSERT_TRUE(r) << r.error().message;
    std::vector<uint8_t> back(16 << 20);
    ASSERT_TRUE(engine->register_memory(back.data(), back.size()));
    Request read{Opcode::Read, back.data(), *seg, peer.base, back.size(), ""};
    auto b3 = engine->submit(std::span(&read, 1));
    ASSERT_TRUE(b3);
    ASSERT_TRUE(engine->wait(*b3, std::chrono::seconds(30)));
    (void)engine->free_batch(*b3);
    EXPECT_EQ(back, local) << "the peer holds exactly what the recovered writes put there";
}

// An op that fails because its transport timed out is the op's failure (-ETIMEDOUT), never
// "the wait timed out" (kWaitPending): a caller that waits again on the latter must not spin
// forever on the former. Both through C++ and through the C API.
class WaitResults : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_TRUE(peer.ok) << peer.error;
        auto e = Engine::create({{"plugins", "tcp"}, {"tcp.op_timeout_ms", "1500"}});
        ASSERT_TRUE(e) << e.error().message;
        engine = std::move(*e);
        ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
        auto s = engine->open_segment(peer.segment);
        ASSERT_TRUE(s) << s.error().message;
        seg = *s;
        Request warm{Opcode::Read, local.data(), seg, peer.base, 4096, ""};
        auto wb = engine->submit(std::span(&warm, 1));
        ASSERT_TRUE(wb) << wb.error().message;
        ASSERT_TRUE(engine->wait(*wb, std::chrono::seconds(30)));
        ASSERT_TRUE(engine->free_batch(*wb));
        ASSERT_TRUE(stop_process(peer.pid()));
        stopped = true;
    }
    void TearDown() override {
        if (stopped) kill(peer.pid(), SIGCONT);
    }
    PeerProcess peer{{"--size", "4194304"}};
    std::unique_ptr<Engine> engine;
    std::vector<uint8_t> local = std::vector<uint8_t>(4 << 20, 1);
    SegmentId seg = 0;
    bool stopped = false;
};

TEST_F(WaitResults, OpTimeoutIsTheOpsFailureAndAWaitTimeoutKeepsTheBatch) {
    Request w{Opcode::Write, local.data(), seg, peer.base, 1 << 20, ""};
    auto b = engine->submit(std::span(&w, 1));
    ASSERT_TRUE(b) << b.error().message;
    // Well inside op_timeout_ms: the wait times out, the op is still in flight.
    auto early = engine->wait(*b, std::chrono::milliseconds(50));
    ASSERT_FALSE(early);
    EXPECT_EQ(early.error().code, kWaitPending) << early.error().message;
    EXPECT_EQ(early.error().code, -EINPROGRESS);
    auto st = engine->status(*b, 0);
    ASSERT_TRUE(st) << "the batch stays valid after a wait timed out";
    EXPECT_EQ(st->state, OpState::Pending);
    EXPECT_EQ(engine->free_batch(*b).error().code, -EBUSY);
    // Now the transport times the op out: wait reports that op's -ETIMEDOUT.
    auto start = Clock::now();
    auto r = engine->wait(*b, std::chrono::seconds(60));
    auto took = Clock::now() - start;
    ASSERT_FALSE(r) << "a write to a stopped process cannot succeed";
    EXPECT_EQ(r.error().code, -ETIMEDOUT) << r.error().message;
    EXPECT_NE(r.error().message.find("op 0 failed"), std::string::npos) << r.error().message;
    EXPECT_LT(took, std::chrono::seconds(30)) << "ended by tcp.op_timeout_ms, not by the wait's limit";
    st = engine->status(*b, 0);
    ASSERT_TRUE(st);
    EXPECT_EQ(st->state, OpState::Failed);
    // Waiting again on the finished batch gives the same failure at once, never kWaitPending.
    auto again = engine->wait(*b, std::chrono::milliseconds(0));
    ASSERT_FALSE(again);
    EXPECT_EQ(again.error().code, -ETIMEDOUT);
    EXPECT_TRUE(engine->free_batch(*b));
}

TEST(WaitResultsCApi, WaitBatchTellsAnOpTimeoutFromAWaitTimeout) {
    PeerProcess peer({"--size", "4194304"});
    ASSERT_TRUE(peer.ok) << peer.error;
    const char *keys[] = {"plugins", "tcp.op_timeout_ms"};
    const char *values[] = {"tcp", "1500"};
    ferry_engine_t *e = nullptr;
    ASSERT_EQ(ferry_engine_create(keys, values, 2, &e), 0) << ferry_last_error();
    std::unique_ptr<ferry_engine_t, void (*)(ferry_engine_t *)> guard(e, ferry_engine_destroy);
    std::vector<uint8_t> local(1 << 20, 2);
    ASSERT_EQ(
        ferry_register(e, local.data(), local.size(), FERRY_MEMORY_HOST, -1, FERRY_REMOTE_READ | FERRY_REMOTE_WRITE),
        0);
    ferry_segment_id_t seg = 0;
    ASSERT_EQ(ferry_open_segment(e, peer.segment.c_str(), &seg), 0) << ferry_last_error();
    ferry_request_t rq{FERRY_WRITE, 0, local.data(), seg, peer.base, local.size(), nullptr};
    ferry_batch_id_t b = 0;
    ASSERT_EQ(ferry_submit(e, &rq, 1, &b), 0) << ferry_last_error();
    ASSERT_EQ(ferry_wait_batch(e, b, 30000), 0) << ferry_last_error();
    ASSERT_EQ(ferry_free_batch(e, b), 0);

    ASSERT_TRUE(stop_process(peer.pid()));
    ASSERT_EQ(ferry_submit(e, &rq, 1, &b), 0) << ferry_last_error();
    EXPECT_EQ(ferry_wait_batch(e, b, 50), -EINPROGRESS) << ferry_last_error();
    EXPECT_EQ(ferry_wait(e, b, 50), -ETIMEDOUT) << "version 1 behaviour is kept for old callers";
    // Waiting in slices, as Python does, ends with the op's failure instead of looping forever.
    int rc = -EINPROGRESS;
    auto start = Clock::now();
    while (rc == -EINPROGRESS && Clock::now() - start < std::chrono::seconds(60)) rc = ferry_wait_batch(e, b, 200);
    EXPECT_EQ(rc, -ETIMEDOUT) << ferry_last_error();
    EXPECT_NE(std::string(ferry_last_error()).find("op 0 failed"), std::string::npos) << ferry_last_error();
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(30));
    ferry_op_status_t st{};
    ASSERT_EQ(ferry_get_status(e, b, 0, &st), 0);
    EXPECT_EQ(st.state, static_cast<uint32_t>(FERRY_OP_FAILED));
    EXPECT_EQ(st.error, -ETIMEDOUT);
    EXPECT_EQ(ferry_free_batch(e, b), 0);
    kill(peer.pid(), SIGCONT);
}
