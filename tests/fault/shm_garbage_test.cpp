// shm.so's serving socket fed by hand: truncated and garbage handshakes, a stale token, a probe
// pointing at unmapped memory, requests before any handshake. Each is refused (with a HelloAck
// naming the problem where the handshake got that far) or the connection is closed; the
// instance keeps serving, and no byte lands outside its registered region.
#include "../transport/harness.hpp"
#include "shm_raw.hpp"

#include <gtest/gtest.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#ifdef FERRY_TEST_SHM_PLUGIN

using namespace ferry_test;
using ferry_fault::hello_for;
using ferry_fault::RawShm;

namespace {

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
constexpr size_t kCanary = 4096;
constexpr uint8_t kCanaryByte = 0xA7;

TEST(ShmGarbage, HandshakeGarbageIsRefusedAndServingGoesOn) {
    Plugin plugin(FERRY_TEST_SHM_PLUGIN);
    ASSERT_TRUE(plugin.ok()) << plugin.error();
    Instance server(plugin, {});
    ASSERT_EQ(server.create_rc(), 0) << server.last_error();
    Buffer remote(1 << 20);
    memset(remote.data(), kCanaryByte, remote.size());
    uint8_t *region = remote.data() + kCanary;
    const size_t region_len = remote.size() - 2 * kCanary;
    memset(region, 0, region_len);
    uint64_t rh;
    ASSERT_EQ(server.register_mem(region, region_len, kRW, &rh), 0) << server.last_error();
    auto ep = server.endpoint();
    ASSERT_EQ(ep.size(), sizeof(ferry_shm::EndpointBytes));

    {  // A handshake cut short: the serving side waits for the rest, then sees the close.
        RawShm raw(ep);
        ASSERT_TRUE(raw.connected());
        ASSERT_TRUE(raw.send_bytes("FSHH\x02", 5));
    }
    {  // 4 KiB of garbage.
        RawShm raw(ep);
        std::vector<uint8_t> junk(4096);
        for (size_t i = 0; i < junk.size(); ++i) junk[i] = static_cast<uint8_t>(i * 131 + 7);
        ASSERT_TRUE(raw.send_bytes(junk.data(), junk.size()));
        ferry_shm::HelloAck ack{};
        ASSERT_TRUE(raw.ack(&ack));
        EXPECT_EQ(ack.status, -EPROTO) << ack.message;
        EXPECT_NE(std::string(ack.message).find("not a shm.so"), std::string::npos) << ack.message;
        EXPECT_TRUE(raw.closed_by_peer());
    }
    {  // Another instance's token.
        RawShm raw(ep);
        auto h = hello_for(raw.token() ^ 1, 0, 0);
        ASSERT_TRUE(raw.send_bytes(&h, sizeof h));
        ferry_shm::HelloAck ack{};
        ASSERT_TRUE(raw.ack(&ack));
        EXPECT_EQ(ack.status, -ESTALE) << ack.message;
        EXPECT_TRUE(raw.closed_by_peer());
    }
    {  // A probe at an unmapped address, followed by a request that must never be served.
        RawShm raw(ep);
        auto h = hello_for(raw.token(), 8, 42);
        ferry_shm::Request r{};
        r.id = 1;
        r.opcode = FERRY_OP_READ;
        r.local_fd = -1;
        r.remote_addr = reinterpret_cast<uint64_t>(region);
        r.length = 4096;
        r.local_addr = 8;
        std::vector<uint8_t> bytes(sizeof h + sizeof r);
        memcpy(bytes.data(), &h, sizeof h);
        memcpy(bytes.data() + sizeof h, &r, sizeof r);
        ASSERT_TRUE(raw.send_bytes(bytes.data(), bytes.size()));
        ferry_shm::HelloAck ack{};
        ASSERT_TRUE(raw.ack(&ack));
        EXPECT_LT(ack.status, 0) << ack.message;
        std::cout << "unmapped probe refused: " << ack.message << "\n";
        EXPECT_TRUE(raw.closed_by_peer());
    }
    {  // A probe that does not hold the token: the peer is not who it claims.
        RawShm raw(ep);
        uint64_t probe[2] = {1, 2};
        auto h = hello_for(raw.token(), reinterpret_cast<uint64_t>(probe), 3);
        ASSERT_TRUE(raw.send_bytes(&h, sizeof h));
        ferry_shm::HelloAck ack{};
        ASSERT_TRUE(raw.ack(&ack));
        EXPECT_EQ(ack.status, -EHOSTUNREACH) << ack.message;
        EXPECT_TRUE(raw.closed_by_peer());
    }
    {  // A proper handshake, then requests outside the region and straddling its ends.
        RawShm raw(ep);
        uint64_t probe[2] = {77, 77};
        auto h = hello_for(raw.token(), reinterpret_cast<uint64_t>(probe), 77);
        ASSERT_TRUE(raw.send_bytes(&h, sizeof h));
        ferry_shm::HelloAck ack{};
        ASSERT_TRUE(raw.ack(&ack));
        ASSERT_EQ(ack.status, 0) << ack.message;
        std::vector<uint8_t> src(8192, 0xEE);
        uint64_t base = reinterpret_cast<uint64_t>(region);
        const uint64_t bad_targets[][2] = {{base - 16, 32},
                                           {base + region_len - 16, 32},
                                           {base - kCanary, 4096},
                                           {base, UINT64_MAX},
                                           {UINT64_MAX - 8, 16}};
        uint64_t id = 10;
        for (auto &t : bad_targets) {
            ferry_shm::Request r{};
            r.id = id++;
            r.opcode = FERRY_OP_WRITE;
            r.local_fd = -1;
            r.remote_addr = t[0];
            r.length = t[1];
            r.local_addr = reinterpret_cast<uint64_t>(src.data());
            ASSERT_TRUE(raw.send_bytes(&r, sizeof r));
            ferry_shm::Done d{};
            ASSERT_TRUE(raw.recv_exact(&d, sizeof d)) << "no answer to request " << r.id;
            std::string message(d.message_len, '\0');
            ASSERT_TRUE(raw.recv_exact(message.data(), message.size()));
            EXPECT_EQ(d.id, r.id);
            EXPECT_LT(d.status, 0) << "a write to [" << std::hex << t[0] << ", +" << t[1] << ") was served";
            EXPECT_FALSE(message.empty());
        }
    }
    for (size_t i = 0; i < kCanary; ++i) {
        ASSERT_EQ(remote.data()[i], kCanaryByte) << "byte " << i << " before the region was written";
        ASSERT_EQ(remote.data()[remote.size() - 1 - i], kCanaryByte) << "byte after the region was written";
    }

    // A real initiator is still served.
    Instance client(plugin, {});
    ASSERT_EQ(client.create_rc(), 0) << client.last_error();
    Buffer local(region_len);
    fill_pattern(local.data(), local.size(), 3);
    uint64_t lh, peer, rmem;
    ASSERT_EQ(client.register_mem(local.data(), local.size(), 0, &lh), 0);
    ASSERT_EQ(client.connect(ep, &peer), 0) << client.last_error();
    ASSERT_EQ(client.import_mem(peer, reinterpret_cast<uint64_t>(region), region_len, kRW, &rmem), 0);
    ASSERT_EQ(client.submit(peer, {make_op(FERRY_OP_WRITE, local.addr(), lh, reinterpret_cast<uint64_t>(region), rmem,
                                           region_len, 1)}),
              0);
    auto c = client.wait(1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, 0) << c[0].message;
    EXPECT_EQ(find_mismatch(region, region_len, 3), SIZE_MAX);
    client.destroy();
    server.destroy();
}

}  // namespace

#endif  // FERRY_TEST_SHM_PLUGIN
