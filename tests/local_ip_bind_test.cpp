// local_ip names the node's address for the data path too: an engine given local_ip (and no
// tcp.bind_ip) serves tcp.so's data on that address, not on tcp.so's own default 127.0.0.1, which
// peers on other nodes cannot reach. NIXL hosts configure Ferry only so (FERRY_LOCAL_IP), as do
// users of the Python package. Observed through the kernel's socket table: the listening sockets
// this process owns, and through a verified transfer to the engine.
#include <gtest/gtest.h>

#include <cstring>
#include <string>
#include <vector>

#include "ferry/engine.hpp"
#include "listeners.hpp"

using namespace ferry;
using namespace ferry::test;

// The handshake server and tcp.so's data listener both on local_ip; nothing on 127.0.0.1.
TEST(LocalIpBind, TcpDataListensOnLocalIp) {
    auto before = own_listeners();
    ASSERT_EQ(count_on(before, "127.0.0.7"), 0u) << joined(before);
    auto target = Engine::create({{"plugins", "tcp"}, {"protocols", "tcp"}, {"local_ip", "127.0.0.7"}});
    ASSERT_TRUE(target) << target.error().message;
    std::vector<uint8_t> region(1 << 20, 0);
    ASSERT_TRUE((*target)->register_memory(region.data(), region.size()));
    auto after = own_listeners();
    EXPECT_EQ(count_on(after, "127.0.0.7"), 2u) << "listening: " << joined(after);
    EXPECT_EQ(count_on(after, "127.0.0.1"), count_on(before, "127.0.0.1")) << "listening: " << joined(after);

    // A peer reaches the data path at the advertised address: a WRITE arrives intact.
    auto initiator = Engine::create({{"plugins", "tcp"}, {"protocols", "tcp"}, {"local_ip", "127.0.0.1"}});
    ASSERT_TRUE(initiator) << initiator.error().message;
    std::vector<uint8_t> src(region.size());
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 3);
    ASSERT_TRUE((*initiator)->register_memory(src.data(), src.size()));
    auto seg = (*initiator)->open_segment((*target)->segment_name());
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<Request> write = {
        {Opcode::Write, src.data(), *seg, reinterpret_cast<uint64_t>(region.data()), src.size(), "tcp"}};
    auto batch = (*initiator)->submit(write);
    ASSERT_TRUE(batch) << batch.error().message;
    auto done = (*initiator)->wait(*batch, std::chrono::seconds(60));
    ASSERT_TRUE(done) << done.error().message;
    (void)(*initiator)->free_batch(*batch);
    EXPECT_EQ(0, memcmp(src.data(), region.data(), src.size()));
}

// An explicit tcp.bind_ip still wins over local_ip.
TEST(LocalIpBind, ExplicitTcpBindIpWins) {
    auto e = Engine::create(
        {{"plugins", "tcp"}, {"protocols", "tcp"}, {"local_ip", "127.0.0.8"}, {"tcp.bind_ip", "127.0.0.9"}});
    ASSERT_TRUE(e) << e.error().message;
    std::vector<uint8_t> region(4096);
    ASSERT_TRUE((*e)->register_memory(region.data(), region.size()));
    auto l = own_listeners();
    EXPECT_EQ(count_on(l, "127.0.0.8"), 1u) << joined(l);  // the handshake server
    EXPECT_EQ(count_on(l, "127.0.0.9"), 1u) << joined(l);  // tcp.so's data listener
}

// A wildcard local_ip is not handed on: tcp.so would need advertise_ip, which only the user
// knows, so the engine starts as before (tcp.so on its default).
TEST(LocalIpBind, WildcardLocalIpLeavesTcpAlone) {
    auto e = Engine::create({{"plugins", "tcp"}, {"protocols", "tcp"}, {"local_ip", "0.0.0.0"}});
    ASSERT_TRUE(e) << e.error().message;
    std::vector<uint8_t> region(4096);
    EXPECT_TRUE((*e)->register_memory(region.data(), region.size()));
}
