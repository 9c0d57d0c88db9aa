// tcp.rails through the engine, with two rails on one host: this process runs in a network
// namespace of its own whose loopback also has 127.0.0.2, so tcp.rails=127.0.0.1,127.0.0.2 names
// two local addresses (each lane binds its rail's address before connecting) towards a
// ferry_test_peer child. Engine::stats() reports per local rail: the bytes both rails carried add
// up to what moved, both measured a throughput, and a rail whose connection a relay resets
// mid-batch shows the failure, the pause and the peer it is paused for, while the other rail
// carries its slices and every byte lands.
//
// The namespace: unshare(CLONE_NEWNET) as root, else a user namespace too (where the kernel
// allows one). Where neither can be made every test is skipped, and the reason printed.
#include <arpa/inet.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/socket.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <fstream>
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
constexpr uint64_t kPeerSize = 64 * kMiB;
std::string g_no_namespace;  // why the namespace could not be made; empty when it was

bool write_file(const char *path, const std::string &text) {
    std::ofstream f(path);
    f << text;
    return static_cast<bool>(f.flush());
}

// Enters a new network namespace (a user namespace too when not root), brings its loopback up
// and gives it 127.0.0.2 beside 127.0.0.1 (as alias lo:1). Before any thread starts.
std::string enter_two_address_loopback() {
    const uid_t uid = geteuid();
    const gid_t gid = getegid();
    if (unshare(CLONE_NEWNET) != 0) {
        if (errno != EPERM) return std::string("unshare(CLONE_NEWNET): ") + strerror(errno);
        if (unshare(CLONE_NEWUSER | CLONE_NEWNET) != 0)
            return std::string("not root, and unshare(CLONE_NEWUSER | CLONE_NEWNET): ") + strerror(errno);
        if (!write_file("/proc/self/setgroups", "deny") ||
            !write_file("/proc/self/uid_map", "0 " + std::to_string(uid) + " 1") ||
            !write_file("/proc/self/gid_map", "0 " + std::to_string(gid) + " 1"))
            return "cannot map this user into the new user namespace";
    }
    int s = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0);
    if (s < 0) return std::string("socket: ") + strerror(errno);
    ifreq lo{};
    strcpy(lo.ifr_name, "lo");
    std::string why;
    if (ioctl(s, SIOCGIFFLAGS, &lo) != 0) why = "SIOCGIFFLAGS lo";
    lo.ifr_flags = static_cast<short>(lo.ifr_flags | IFF_UP);
    if (why.empty() && ioctl(s, SIOCSIFFLAGS, &lo) != 0) why = "SIOCSIFFLAGS lo up";
    ifreq alias{};
    strcpy(alias.ifr_name, "lo:1");
    auto *a = reinterpret_cast<sockaddr_in *>(&alias.ifr_addr);
    a->sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.2", &a->sin_addr);
    if (why.empty() && ioctl(s, SIOCSIFADDR, &alias) != 0) why = "SIOCSIFADDR lo:1 127.0.0.2";
    inet_pton(AF_INET, "255.0.0.0", &a->sin_addr);
    if (why.empty() && ioctl(s, SIOCSIFNETMASK, &alias) != 0) why = "SIOCSIFNETMASK lo:1 255.0.0.0";
    if (!why.empty()) why += std::string(": ") + strerror(errno);
    close(s);
    return why;
}

using ferry_fault::free_port;

const std::vector<RailStats> &tcp_rails(const EngineStats &s) {
    static const std::vector<RailStats> none;
    for (const auto &t : s.transports)
        if (t.transport == "tcp") return t.rails;
    return none;
}

std::string peer_sum(const std::vector<uint8_t> &expected) {
    char want[64];
    snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(expected.data(), expected.size()));
    return want;
}

class TcpRailsEngine : public ::testing::Test {
protected:
    void SetUp() override {
        if (!g_no_namespace.empty()) GTEST_SKIP() << "SKIPPED: no network namespace of our own: " << g_no_namespace;
        auto e = Engine::create({{"plugins", "tcp"}, {"tcp.rails", "127.0.0.1,127.0.0.2"}});
        ASSERT_TRUE(e) << e.error().message;
        engine = std::move(*e);
        local.assign(kPeerSize, 0);
        for (uint64_t i = 0; i < local.size(); ++i) local[i] = static_cast<uint8_t>(i * 29 + i / 4093);
        ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
    }
    std::vector<Request> ops(Opcode op, SegmentId seg, uint64_t base) {
        std::vector<Request> reqs;
        for (uint64_t off = 0; off < kPeerSize; off += kMiB)
            reqs.push_back({op, local.data() + off, seg, base + off, kMiB, "tcp"});
        return reqs;
    }
    std::unique_ptr<Engine> engine;
    std::vector<uint8_t> local;
};

}  // namespace

TEST_F(TcpRailsEngine, BytesSplitOverBothRailsAndAddUpToWhatMoved) {
    PeerProcess peer({"--size", std::to_string(kPeerSize), "--option", "plugins=tcp"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;

    // Batches of 64 x 1 MiB WRITEs, four in flight: each submit finds the lanes busy, so the
    // rails' throughput is measured (an idle rail's is not). Until both rails have a measured
    // throughput, at least 8 batches, at most 30 s.
    uint64_t written = 0, ops_done = 0;
    std::vector<BatchId> in_flight;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    auto measured = [&] {
        const auto rails = tcp_rails(engine->stats());
        return rails.size() == 2 && rails[0].throughput > 0 && rails[1].throughput > 0;
    };
    for (int round = 0; round < 8 || (!measured() && std::chrono::steady_clock::now() < give_up); ++round) {
        auto b = engine->submit(ops(Opcode::Write, *seg, peer.base));
        ASSERT_TRUE(b) << b.error().message;
        in_flight.push_back(*b);
        written += kPeerSize;
        ops_done += kPeerSize / kMiB;
        if (in_flight.size() < 4) continue;
        ASSERT_TRUE(engine->wait(in_flight.front(), std::chrono::seconds(30)));
        ASSERT_TRUE(engine->free_batch(in_flight.front()));
        in_flight.erase(in_flight.begin());
    }
    for (auto b : in_flight) {
        ASSERT_TRUE(engine->wait(b, std::chrono::seconds(30)));
        ASSERT_TRUE(engine->free_batch(b));
    }
    EXPECT_EQ(peer.command("sum"), peer_sum(local)) << "every byte landed";
    auto b = engine->submit(ops(Opcode::Read, *seg, peer.base));
    ASSERT_TRUE(b) << b.error().message;
    ASSERT_TRUE(engine->wait(*b, std::chrono::seconds(30)));
    ASSERT_TRUE(engine->free_batch(*b));

    const auto rails = tcp_rails(engine->stats());
    ASSERT_EQ(rails.size(), 2u);
    EXPECT_EQ(rails[0].rail, "127.0.0.1");
    EXPECT_EQ(rails[1].rail, "127.0.0.2");
    EXPECT_EQ(rails[0].write_bytes + rails[1].write_bytes, written) << "slices count once, on the rail they took";
    EXPECT_EQ(rails[0].read_bytes + rails[1].read_bytes, kPeerSize);
    EXPECT_EQ(rails[0].completed + rails[1].completed, ops_done + kPeerSize / kMiB) << "one 1 MiB slice per op";
    for (const auto &r : rails) {
        std::cout << "rail " << r.rail << ": wrote " << r.write_bytes / kMiB << " MiB, read " << r.read_bytes / kMiB
                  << " MiB, " << r.throughput / 1e9 << " GB/s measured\n";
        // Equal rails share the work: each took a real part of it, not a stray slice.
        EXPECT_GE(r.write_bytes, written / 10) << r.rail;
        EXPECT_GT(r.throughput, 0) << r.rail << ": never measured";
        EXPECT_EQ(r.failures, 0u) << r.rail;
        EXPECT_EQ(r.pauses, 0u) << r.rail;
        EXPECT_EQ(r.paused_peers, 0u) << r.rail;
        EXPECT_EQ(r.queued_bytes, 0u) << r.rail << ": nothing is in flight";
    }
}

// The relay in front of the peer resets the first connection from 127.0.0.2 once 8 MiB went
// through it: that rail's lane fails on its path, the rail is paused for the peer (1 s) and its
// slices move to 127.0.0.1; the batch succeeds with every byte in place.
TEST_F(TcpRailsEngine, ARailWhoseConnectionBreaksShowsTheFailureAndThePause) {
    const uint16_t port = free_port();
    CuttingProxy proxy(port, 8 * kMiB, CuttingProxy::Cut::Reset, "127.0.0.2");
    PeerProcess peer({"--size", std::to_string(kPeerSize), "--option", "plugins=tcp", "--option",
                      "tcp.port=" + std::to_string(port), "--option",
                      "tcp.advertise_port=" + std::to_string(proxy.port())});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;

    // The pause is seen while it lasts (a second at least): the stats are read while the batch
    // runs and after it, until the paused peer shows or 30 s passed.
    auto b = engine->submit(ops(Opcode::Write, *seg, peer.base));
    ASSERT_TRUE(b) << b.error().message;
    bool seen_paused = false, done = false;
    const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while ((!seen_paused || !done) && std::chrono::steady_clock::now() < give_up) {
        const auto rails = tcp_rails(engine->stats());
        ASSERT_EQ(rails.size(), 2u);
        seen_paused = seen_paused || rails[1].paused_peers == 1;
        EXPECT_EQ(rails[0].paused_peers, 0u) << "the healthy rail is never paused";
        if (!done) {
            auto w = engine->wait(*b, std::chrono::milliseconds(2));
            ASSERT_TRUE(w || w.error().code == kWaitPending)
                << "the cut slices moved to the other rail: " << w.error().message;
            done = static_cast<bool>(w);
        }
    }
    ASSERT_TRUE(done) << "the batch never finished";
    ASSERT_TRUE(engine->free_batch(*b));
    EXPECT_TRUE(proxy.cut_done()) << "the relay reset a connection of rail 127.0.0.2";
    EXPECT_TRUE(seen_paused) << "rail 127.0.0.2 was never reported paused for the peer";
    EXPECT_EQ(peer.command("sum"), peer_sum(local)) << "every byte landed";

    const auto rails = tcp_rails(engine->stats());
    ASSERT_EQ(rails.size(), 2u);
    EXPECT_GE(rails[1].failures, 1u) << "the reset is a path failure of rail 127.0.0.2";
    EXPECT_GE(rails[1].pauses, 1u);
    EXPECT_EQ(rails[0].failures, 0u);
    EXPECT_EQ(rails[0].pauses, 0u);
    EXPECT_EQ(rails[0].write_bytes + rails[1].write_bytes, kPeerSize) << "a moved slice counts once, where it landed";
    EXPECT_GT(rails[0].write_bytes, rails[1].write_bytes) << "rail 127.0.0.1 took the cut rail's slices";
    std::cout << "rail 127.0.0.2: " << rails[1].failures << " failure(s), " << rails[1].pauses << " pause(s), wrote "
              << rails[1].write_bytes / kMiB << " MiB; rail 127.0.0.1 wrote " << rails[0].write_bytes / kMiB
              << " MiB\n";

    // The pause ends (the gauge goes back to 0) and the rail carries slices again.
    while (tcp_rails(engine->stats())[1].paused_peers != 0 && std::chrono::steady_clock::now() < give_up)
        std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ASSERT_EQ(tcp_rails(engine->stats())[1].paused_peers, 0u) << "the pause never ended";
    b = engine->submit(ops(Opcode::Write, *seg, peer.base));
    ASSERT_TRUE(b) << b.error().message;
    ASSERT_TRUE(engine->wait(*b, std::chrono::seconds(30)));
    ASSERT_TRUE(engine->free_batch(*b));
    EXPECT_GT(tcp_rails(engine->stats())[1].write_bytes, rails[1].write_bytes) << "rail 127.0.0.2 is used again";
}

int main(int argc, char **argv) {
    g_no_namespace = enter_two_address_loopback();
    if (!g_no_namespace.empty()) std::cout << "SKIPPED: no network namespace of our own: " << g_no_namespace << "\n";
    ::testing::InitGoogleTest(&argc, argv);
    return RUN_ALL_TESTS();
}
