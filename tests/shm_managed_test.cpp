// Managed buffers over shm.so (ferry_alloc_shared; plugins/shm/map_wire.hpp), between this
// process and a ferry_test_peer child: WRITE/READ byte-exact through the mapped path (the
// peer's memfd mapped here), its later ops failing cleanly once the peer freed the buffer (and
// never landing in the memory it re-used at the same address), and raw clients on the peer's
// shm socket that never receive a descriptor unless they authenticated and ask for a region
// they may access.
#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstring>
#include <fstream>
#include <string>

#include "ferry/engine.hpp"
#include "ferry/plugin.h"
#include "map_wire.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"
#include "wire.hpp"

using namespace ferry;
using ferry::test::PeerProcess;

namespace {

// Mappings of peers' managed buffers in this process (/proc/self/maps names the memfd).
int shared_mappings() {
    std::ifstream in("/proc/self/maps");
    int n = 0;
    for (std::string line; std::getline(in, line);) n += line.find("/memfd:ferry-shared") != std::string::npos;
    return n;
}

class ShmManagedTest : public ::testing::Test {
protected:
    void SetUp() override {
        auto e = Engine::create({{"plugins", "shm,tcp"}});
        ASSERT_TRUE(e) << e.error().message;
        engine = std::move(*e);
        local.assign(16 << 20, 0);
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

const std::vector<std::string> kManagedPeer = {"--size", std::to_string(8 << 20), "--managed", "--option",
                                               "plugins=shm,tcp"};

}  // namespace

TEST_F(ShmManagedTest, WriteAndReadThroughTheMappedMemfdByteExact) {
    const int before = shared_mappings();
    PeerProcess peer(kManagedPeer);
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    std::string used;
    auto r = run({{Opcode::Read, local.data(), *seg, peer.base, peer.size, ""}}, &used);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(used, "shm");
    EXPECT_EQ(shared_mappings(), before + 1) << "the peer's managed buffer is mapped here: the memcpy path";
    for (uint64_t i = 0; i < peer.size; ++i) ASSERT_EQ(local[i], test::peer_pattern(i)) << "byte " << i;

    std::vector<uint8_t> expected(peer.size);
    for (uint64_t i = 0; i < peer.size; ++i) expected[i] = test::peer_pattern(i);
    struct Piece {
        uint64_t off, len;
    };
    std::vector<Piece> pieces = {{0, 1}, {1, 4095}, {5000, (1 << 20) + 3}, {3 << 20, 4 << 20}, {peer.size - 7, 7}};
    std::vector<Request> writes;
    uint64_t src = 8 << 20;
    for (auto [off, len] : pieces) {
        for (uint64_t i = 0; i < len; ++i) local[src + i] = expected[off + i] = static_cast<uint8_t>(~(off + i) * 7);
        writes.push_back({Opcode::Write, local.data() + src, *seg, peer.base + off, len, ""});
        src += len;
    }
    r = run(writes);
    ASSERT_TRUE(r) << r.error().message;
    char want[64];
    snprintf(want, sizeof want, "SUM %llx",
             static_cast<unsigned long long>(test::fnv1a(expected.data(), expected.size())));
    EXPECT_EQ(peer.command("sum"), want);
    EXPECT_EQ(shared_mappings(), before + 1) << "mapped once";
    ASSERT_TRUE(engine->close_segment(*seg));
    peer.command("quit");
}

TEST_F(ShmManagedTest, FreedWhileMappedLaterOpsFailAndReusedMemoryIsNeverWritten) {
    const int before = shared_mappings();
    PeerProcess peer(kManagedPeer);
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    auto r = run({{Opcode::Read, local.data(), *seg, peer.base, 4096, ""}});
    ASSERT_TRUE(r) << r.error().message;
    ASSERT_EQ(shared_mappings(), before + 1);
    // The peer frees the buffer and maps fresh memory (all 0xee) at the same address.
    ASSERT_EQ(peer.command("free"), "OK");
    memset(local.data(), 0x5a, 1 << 20);
    r = run({{Opcode::Write, local.data(), *seg, peer.base, 1 << 20, ""}});
    ASSERT_FALSE(r) << "a WRITE into a freed managed buffer must fail";
    EXPECT_EQ(r.error().code, -EFAULT) << r.error().message;
    EXPECT_EQ(shared_mappings(), before) << "the mapping is dropped once the region is gone";
    r = run({{Opcode::Write, local.data(), *seg, peer.base, 1 << 20, ""}});
    EXPECT_FALSE(r) << "and stays refused (now by the serving side)";
    std::vector<uint8_t> reused(peer.size, 0xee);
    char want[64];
    snprintf(want, sizeof want, "SUM %llx", static_cast<unsigned long long>(test::fnv1a(reused.data(), reused.size())));
    EXPECT_EQ(peer.command("sum"), want) << "no byte landed in the memory the peer re-used";
    peer.command("quit");
}

// ---- raw clients on the peer's shm socket ----

namespace {

// The peer's shm socket name, from /proc/net/unix (abstract names are listed there).
std::string shm_socket_of(pid_t pid) {
    std::ifstream in("/proc/net/unix");
    const std::string want = "@ferry-shm." + std::to_string(pid) + ".";
    for (std::string line; std::getline(in, line);) {
        auto at = line.find(want);
        if (at != std::string::npos) return std::string(1, '\0') + line.substr(at + 1);
    }
    return {};
}

int dial(const std::string &name) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, name.data(), name.size());
    if (connect(fd, reinterpret_cast<sockaddr *>(&sa),
                static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())) != 0) {
        close(fd);
        return -1;
    }
    return fd;
}

// Reads n bytes (or until EOF/timeout); counts every descriptor that arrives (and closes it).
size_t read_counting_fds(int fd, void *buf, size_t n, int *fds) {
    size_t got = 0;
    while (got < n) {
        pollfd pf{fd, POLLIN, 0};
        if (poll(&pf, 1, 10000) <= 0) break;
        iovec iov{static_cast<char *>(buf) + got, n - got};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 8)];
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = control;
        mh.msg_controllen = sizeof control;
        ssize_t k = recvmsg(fd, &mh, MSG_CMSG_CLOEXEC);
        for (cmsghdr *cm = k >= 0 ? CMSG_FIRSTHDR(&mh) : nullptr; cm; cm = CMSG_NXTHDR(&mh, cm))
            if (cm->cmsg_type == SCM_RIGHTS)
                for (size_t i = 0; i < (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int); ++i) {
                    int x;
                    memcpy(&x, CMSG_DATA(cm) + i * sizeof(int), sizeof x);
                    close(x);
                    ++*fds;
                }
        if (k <= 0) break;
        got += static_cast<size_t>(k);
    }
    return got;
}

uint64_t token_of(const std::string &name) { return std::stoull(name.substr(name.rfind('.') + 1), nullptr, 16); }

alignas(16) uint64_t probe[2] = {0x1234567890abcdefull, 0x1234567890abcdefull};

ferry_shm::Hello hello(uint32_t magic, uint64_t token) {
    return {magic,
            ferry_shm::kWireVersion,
            0,
            token,
            reinterpret_cast<uint64_t>(probe),
            probe[0],
            static_cast<uint32_t>(getpid()),
            static_cast<uint32_t>(geteuid())};
}

}  // namespace

TEST(ShmManagedRawClient, OnlyAnAuthenticatedPeerAskingForItsRegionGetsADescriptor) {
    PeerProcess peer(kManagedPeer);
    ASSERT_TRUE(peer.ok) << peer.error;
    const std::string name = shm_socket_of(peer.pid());
    ASSERT_FALSE(name.empty()) << "the peer's shm socket is not in /proc/net/unix";
    const uint64_t token = token_of(name);
    ferry_shm::MapRequest want{ferry_shm::kMapRequestMagic, FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE,
                               peer.base, 4096};
    struct Case {
        const char *what;
        ferry_shm::Hello h;
        ferry_shm::MapRequest m;
        bool authenticated, gets_fd;
    };
    auto bad_probe = hello(ferry_shm::kMapHelloMagic, token);
    bad_probe.probe_token ^= 1;
    auto outside = want;
    outside.addr = peer.base + peer.size;  // past the managed buffer: nothing registered there
    std::vector<Case> cases = {
        {"no handshake (a map request where the Hello goes)", {}, want, false, false},
        {"another instance's token", hello(ferry_shm::kMapHelloMagic, token ^ 2), want, false, false},
        {"a probe that does not match", bad_probe, want, false, false},
        {"a range outside every managed buffer", hello(ferry_shm::kMapHelloMagic, token), outside, true, false},
        {"the managed buffer (control: the wire is right)", hello(ferry_shm::kMapHelloMagic, token), want, true, true},
    };
    memcpy(&cases[0].h, &want, sizeof want);  // the request's bytes where the Hello goes
    for (auto &c : cases) {
        SCOPED_TRACE(c.what);
        int fd = dial(name);
        ASSERT_GE(fd, 0);
        ASSERT_EQ(send(fd, &c.h, sizeof c.h, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof c.h));
        int fds = 0;
        ferry_shm::HelloAck ack{};
        ASSERT_EQ(read_counting_fds(fd, &ack, sizeof ack, &fds), sizeof ack);
        EXPECT_EQ(ack.status == 0, c.authenticated) << ack.message;
        (void)!send(fd, &c.m, sizeof c.m, MSG_NOSIGNAL);
        ferry_shm::MapReply rep{};
        size_t got = read_counting_fds(fd, &rep, sizeof rep, &fds);
        EXPECT_EQ(fds, c.gets_fd ? 1 : 0);
        if (c.gets_fd) {
            EXPECT_EQ(rep.status, 0) << rep.message;
        } else if (c.authenticated) {
            ASSERT_EQ(got, sizeof rep);
            EXPECT_EQ(rep.status, -ENOENT) << rep.message;
        }
        close(fd);
    }
    peer.command("quit");
}
