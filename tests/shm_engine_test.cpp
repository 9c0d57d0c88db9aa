// shm.so end to end through the engine, between this process and ferry_test_peer children:
// data verified on both sides, shm chosen over tcp on the same host, the serving side's refusal
// of memory it no longer registers, a peer killed mid-transfer, and the fallback to tcp when the
// kernel forbids cross-process access (a peer running as another user).
#include <gtest/gtest.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cinttypes>
#include <cstring>
#include <thread>

#include "ferry/engine.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"

using namespace ferry;
using ferry::test::PeerProcess;

namespace {

const std::vector<std::string> kPeerShm = {"--option", "plugins=shm,tcp"};

std::vector<std::string> peer_args(uint64_t size) {
    std::vector<std::string> a = {"--size", std::to_string(size)};
    a.insert(a.end(), kPeerShm.begin(), kPeerShm.end());
    return a;
}

class ShmEngineTest : public ::testing::Test {
protected:
    void SetUp() override {
        auto e = Engine::create({{"plugins", "shm,tcp"}});
        ASSERT_TRUE(e) << e.error().message;
        engine = std::move(*e);
        local.assign(64 << 20, 0);
        ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
    }
    Result<BatchId> start(const std::vector<Request> &reqs) { return engine->submit(reqs); }
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

TEST_F(ShmEngineTest, ReadAndWriteAcrossProcessesWithVerification) {
    PeerProcess peer(peer_args(8 << 20));
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;

    std::vector<Request> reads;
    for (uint64_t off = 0; off < peer.size; off += 1 << 20)
        reads.push_back({Opcode::Read, local.data() + off, *seg, peer.base + off, 1 << 20, ""});
    std::string used;
    auto r = run(reads, &used);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(used, "shm") << "the same host: shm comes before tcp";
    for (uint64_t i = 0; i < peer.size; ++i) ASSERT_EQ(local[i], test::peer_pattern(i)) << "byte " << i;

    std::vector<uint8_t> expected(peer.size);
    for (uint64_t i = 0; i < peer.size; ++i) expected[i] = test::peer_pattern(i);
    struct Piece {
        uint64_t off, len;
    };
    std::vector<Piece> pieces = {{0, 1}, {1, 4095}, {5000, (1 << 20) + 3}, {3 << 20, 4 << 20}, {peer.size - 7, 7}};
    std::vector<Request> writes;
    uint64_t src = 32 << 20;
    for (auto p : pieces) {
        for (uint64_t k = 0; k < p.len; ++k) local[src + k] = static_cast<uint8_t>(k * 29 + p.off);
        memcpy(expected.data() + p.off, local.data() + src, p.len);
        writes.push_back({Opcode::Write, local.data() + src, *seg, peer.base + p.off, p.len, "shm"});
        src += p.len;
    }
    r = run(writes);
    ASSERT_TRUE(r) << r.error().message;
    char want[64];
    snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(expected.data(), expected.size()));
    EXPECT_EQ(peer.command("sum"), want) << "the peer holds exactly what was written, and nothing else moved";
}

TEST_F(ShmEngineTest, ServingSideRefusesMemoryNoLongerRegistered) {
    PeerProcess peer(peer_args(1 << 20));
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg);
    ASSERT_TRUE(run({{Opcode::Read, local.data(), *seg, peer.base, 4096, "shm"}}));
    ASSERT_EQ(peer.command("unreg"), "OK");
    auto r = run({{Opcode::Write, local.data(), *seg, peer.base, 4096, "shm"}});
    ASSERT_FALSE(r) << "the peer let us write memory it no longer registers";
    EXPECT_NE(r.error().message.find("shm"), std::string::npos) << r.error().message;
    EXPECT_NE(r.error().message.find("not inside a registered region"), std::string::npos) << r.error().message;
}

TEST_F(ShmEngineTest, PeerKilledMidTransferFailsItsOpsAndOthersCarryOn) {
    PeerProcess doomed(peer_args(64 << 20));
    PeerProcess survivor(peer_args(1 << 20));
    ASSERT_TRUE(doomed.ok && survivor.ok) << doomed.error << survivor.error;
    auto s1 = engine->open_segment(doomed.segment);
    auto s2 = engine->open_segment(survivor.segment);
    ASSERT_TRUE(s1 && s2);
    // 1 GiB of writes, killed right after the submit: whatever did not move by then must fail,
    // every op must complete either way.
    std::vector<Request> big;
    for (int i = 0; i < 1024; ++i)
        big.push_back({Opcode::Write, local.data() + (i % 64) * (1 << 20), *s1, doomed.base + (i % 64) * (1 << 20),
                       1 << 20, "shm"});
    auto b = engine->submit(big);
    ASSERT_TRUE(b) << b.error().message;
    doomed.kill_now();
    auto w = engine->wait(*b, std::chrono::seconds(60));
    size_t failed = 0;
    for (size_t i = 0; i < big.size(); ++i) {
        auto st = engine->status(*b, i);
        ASSERT_TRUE(st);
        EXPECT_NE(st->state, OpState::Pending) << "op " << i << " never completed";
        if (st->state == OpState::Failed) {
            ++failed;
            EXPECT_NE(st->message.find("pid"), std::string::npos) << st->message;
        }
    }
    std::cout << failed << " of " << big.size() << " ops failed after the kill" << (w ? "" : (": " + w.error().message))
              << "\n";
    ASSERT_TRUE(engine->free_batch(*b));
    auto r = run({{Opcode::Read, local.data(), *s2, survivor.base, survivor.size, "shm"}});
    ASSERT_TRUE(r) << "the other peer is still served: " << r.error().message;
    for (uint64_t i = 0; i < survivor.size; ++i) ASSERT_EQ(local[i], test::peer_pattern(i));
    auto again = run({{Opcode::Read, local.data(), *s1, doomed.base, 4096, "shm"}});
    EXPECT_FALSE(again) << "a dead peer cannot serve";
}

// A peer running as another user cannot read or write our memory (nor we its), so shm's
// connect fails with the reason and the engine carries the request over tcp instead.
TEST(ShmEngineFallback, AnotherUsersPeerIsReachedOverTcp) {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to start a peer as another user";
    // PeerProcess cannot change users; exec the peer through a tiny fork that does.
    int to_child[2], from_child[2];
    ASSERT_EQ(pipe2(to_child, O_CLOEXEC), 0);
    ASSERT_EQ(pipe2(from_child, O_CLOEXEC), 0);
    pid_t pid = fork();
    if (pid == 0) {
        dup2(to_child[0], 0);
        dup2(from_child[1], 1);
        prctl(PR_SET_PDEATHSIG, SIGKILL);
        if (setgid(65534) != 0 || setuid(65534) != 0) _exit(126);
        execl(FERRY_TEST_PEER_BIN, FERRY_TEST_PEER_BIN, "--size", "65536", "--option", "plugins=shm,tcp", nullptr);
        _exit(127);
    }
    close(to_child[0]);
    close(from_child[1]);
    FILE *out = fdopen(from_child[0], "r");
    char line[512] = "";
    ASSERT_NE(fgets(line, sizeof line, out), nullptr) << "peer did not start";
    char word[16], segment[128];
    uint64_t base = 0, size = 0;
    ASSERT_EQ(sscanf(line, "%15s %127s %" SCNx64 " %" SCNu64, word, segment, &base, &size), 4) << line;
    ASSERT_STREQ(word, "READY") << line;
    auto engine = Engine::create({{"plugins", "shm,tcp"}});
    ASSERT_TRUE(engine) << engine.error().message;
    std::vector<uint8_t> local(size);
    ASSERT_TRUE((*engine)->register_memory(local.data(), local.size()));
    auto seg = (*engine)->open_segment(segment);
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<Request> reqs = {{Opcode::Read, local.data(), *seg, base, size, ""}};
    auto b = (*engine)->submit(reqs);
    ASSERT_TRUE(b) << b.error().message;
    ASSERT_TRUE((*engine)->wait(*b, std::chrono::seconds(30)));
    EXPECT_EQ((*engine)->status(*b, 0)->transport, "tcp");
    for (uint64_t i = 0; i < size; ++i) ASSERT_EQ(local[i], test::peer_pattern(i));
    // Forcing shm reports why it cannot be used.
    reqs[0].transport = "shm";
    auto forced = (*engine)->submit(reqs);
    std::string why = forced ? "" : forced.error().message;
    if (forced) {
        auto w = (*engine)->wait(*forced, std::chrono::seconds(30));
        ASSERT_FALSE(w) << "shm reached a process of another user";
        why = w.error().message;
    }
    EXPECT_NE(why.find("different users"), std::string::npos) << why;
    std::cout << "forced shm: " << why << "\n";
    close(to_child[1]);
    kill(pid, SIGKILL);
    waitpid(pid, nullptr, 0);
    fclose(out);
}
