// tcp.so's wire protocol spoken by hand over raw sockets: malformed and hostile requests must
// never touch memory outside registered regions, and a region stays registered while the
// server still uses it.
#include "tcp_test_util.hpp"

#include <gtest/gtest.h>

#include <array>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <future>
#include <thread>

#ifdef FERRY_TEST_TCP_PLUGIN

namespace ferry_test {
namespace {

using namespace tcp_wire;

TEST_F(TcpTest, BadMagicClosesTheConnectionAndServingGoesOn) {
    auto s = make();
    ASSERT_TRUE(s);
    uint16_t port = endpoint_port(s->endpoint());
    Raw raw(port);
    ASSERT_TRUE(raw.connected());
    std::string junk(40, 'x');
    ASSERT_TRUE(raw.send_all(junk.data(), junk.size()));
    EXPECT_TRUE(raw.closed_by_server());
    Raw good(port);
    EXPECT_TRUE(good.hello()) << "server stopped serving after a bad client";
}
TEST_F(TcpTest, WireVersionMismatchIsRefusedWithAMessage) {
    auto s = make();
    ASSERT_TRUE(s);
    Raw raw(endpoint_port(s->endpoint()));
    ASSERT_TRUE(raw.send_hdr(header(kHello, 0, 0, 0, /*version=*/1)));  // before authentication
    Reply r;
    ASSERT_TRUE(raw.reply(&r));
    EXPECT_EQ(r.type, kError);
    EXPECT_EQ(r.status, -EPROTONOSUPPORT);
    EXPECT_NE(r.message.find("version"), std::string::npos) << r.message;
    EXPECT_TRUE(raw.closed_by_server());
}
// A client that sends a request right behind a wrong AUTH still reads why it was refused: the
// request read along with the proof is not taken for a second, foreign handshake frame.
TEST_F(TcpTest, WrongProofFollowedByARequestIsRefusedWithAMessage) {
    auto s = make({{"auth_key", std::string(64, 'a')}});
    ASSERT_TRUE(s);
    Raw raw(endpoint_port(s->endpoint()));
    Hdr h = header(kHello);
    h[7] = 2;            // kFlagAuth: this client claims a key
    put(&h[12], 32, 4);  // the client nonce follows
    std::array<uint8_t, 32> nonce{};
    ASSERT_TRUE(raw.send_hdr(h) && raw.send_all(nonce.data(), nonce.size()));
    Reply r;
    ASSERT_TRUE(raw.reply(&r));
    ASSERT_EQ(r.type, kHelloAck);
    std::vector<uint8_t> burst(40 + 32 + 40, 0x17);
    Hdr a = header(kAuth);
    put(&a[12], 32, 4);
    memcpy(burst.data(), a.data(), 40);
    Hdr req = header(kReadReq, 1, 4096, 8);
    memcpy(burst.data() + 72, req.data(), 40);
    ASSERT_TRUE(raw.send_all(burst.data(), burst.size()));
    ASSERT_TRUE(raw.reply(&r)) << "closed without saying why";
    EXPECT_EQ(r.type, kError);
    EXPECT_EQ(r.status, -EACCES);
    EXPECT_NE(r.message.find("auth_secret"), std::string::npos) << r.message;
    EXPECT_TRUE(raw.closed_by_server());
}
TEST_F(TcpTest, RefusedWriteIsDrainedAndTheStreamStaysInSync) {
    auto s = make();
    ASSERT_TRUE(s);
    Buffer reg(8192), unreg(8192);
    fill_pattern(unreg.data(), 8192, 1);
    memset(reg.data(), 0, 8192);
    uint64_t h;
    ASSERT_EQ(s->register_mem(reg.data(), 8192, kRW, &h), 0);
    Raw raw(endpoint_port(s->endpoint()));
    ASSERT_TRUE(raw.hello());
    std::vector<uint8_t> payload(1000, 0xAB);
    ASSERT_TRUE(raw.send_hdr(header(kWriteReq, 1, unreg.addr() + 100, payload.size())));
    ASSERT_TRUE(raw.send_all(payload.data(), payload.size()));
    // Straddling the end of the registered region by one byte.
    ASSERT_TRUE(raw.send_hdr(header(kWriteReq, 2, reg.addr() + 8192 - 99, 100)));
    ASSERT_TRUE(raw.send_all(payload.data(), 100));
    ASSERT_TRUE(raw.send_hdr(header(kWriteReq, 3, reg.addr() + 10, 100)));
    ASSERT_TRUE(raw.send_all(payload.data(), 100));
    ASSERT_TRUE(raw.send_hdr(header(kReadReq, 4, unreg.addr(), 16)));
    Reply r;
    ASSERT_TRUE(raw.reply(&r));
    EXPECT_EQ(r.type, kError);
    EXPECT_EQ(r.id, 1u);
    EXPECT_EQ(r.status, -EFAULT);
    char addr[32];
    snprintf(addr, sizeof addr, "0x%llx", static_cast<unsigned long long>(unreg.addr() + 100));
    EXPECT_NE(r.message.find(addr), std::string::npos) << r.message;
    EXPECT_NE(r.message.find("1000"), std::string::npos) << r.message;
    ASSERT_TRUE(raw.reply(&r));
    EXPECT_EQ(r.type, kError);
    EXPECT_EQ(r.id, 2u);
    ASSERT_TRUE(raw.reply(&r));
    EXPECT_EQ(r.type, kWriteAck) << r.message;
    EXPECT_EQ(r.id, 3u);
    ASSERT_TRUE(raw.reply(&r));
    EXPECT_EQ(r.type, kError);
    EXPECT_EQ(r.id, 4u);
    EXPECT_EQ(find_mismatch(unreg.data(), 8192, 1), SIZE_MAX) << "unregistered memory written";
    for (size_t i = 0; i < 8192; ++i) ASSERT_EQ(reg.data()[i], (i >= 10 && i < 110) ? 0xAB : 0) << "byte " << i;
}
TEST_F(TcpTest, AbsurdHeaderClosesTheConnection) {
    auto s = make();
    ASSERT_TRUE(s);
    Buffer reg(4096);
    memset(reg.data(), 0, 4096);
    uint64_t h;
    ASSERT_EQ(s->register_mem(reg.data(), 4096, kRW, &h), 0);
    uint16_t port = endpoint_port(s->endpoint());
    {
        Raw raw(port);
        ASSERT_TRUE(raw.hello());
        ASSERT_TRUE(raw.send_hdr(header(kWriteReq, 1, reg.addr(), 1ull << 40)));
        EXPECT_TRUE(raw.closed_by_server());
    }
    {
        Raw raw(port);
        ASSERT_TRUE(raw.hello());
        ASSERT_TRUE(raw.send_hdr(header(kWriteAck, 1, reg.addr(), 8)));  // a response type
        EXPECT_TRUE(raw.closed_by_server());
    }
    {
        Raw raw(port);
        ASSERT_TRUE(raw.hello());
        ASSERT_TRUE(raw.send_hdr(header(kReadReq, 1, reg.addr(), 0)));  // zero length
        EXPECT_TRUE(raw.closed_by_server());
    }
    for (int i = 0; i < 4096; ++i) ASSERT_EQ(reg.data()[i], 0);
}
TEST_F(TcpTest, DeregisterWaitsForAWriteInProgress) {
    auto s = make();
    ASSERT_TRUE(s);
    const size_t sz = 64 * 1024;
    Buffer reg(sz);
    memset(reg.data(), 0, sz);
    uint64_t h;
    ASSERT_EQ(s->register_mem(reg.data(), sz, kRW, &h), 0);
    Raw raw(endpoint_port(s->endpoint()));
    ASSERT_TRUE(raw.hello());
    std::vector<uint8_t> payload(sz, 0x5A);
    ASSERT_TRUE(raw.send_hdr(header(kWriteReq, 1, reg.addr(), sz)));
    ASSERT_TRUE(raw.send_all(payload.data(), sz / 2));
    // Once payload bytes show up in the region, the server is inside the write.
    auto guard = std::chrono::steady_clock::now() + std::chrono::seconds(30);
    while (watch_byte(reg.data()) != 0x5A && std::chrono::steady_clock::now() < guard)
        std::this_thread::sleep_for(std::chrono::milliseconds(1));
    ASSERT_EQ(watch_byte(reg.data()), 0x5A);
    auto dereg = std::async(std::launch::async, [&] { return s->deregister_mem(h); });
    EXPECT_EQ(dereg.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
        << "deregister_mem returned while a write into the region was in progress";
    ASSERT_TRUE(raw.send_all(payload.data() + sz / 2, sz / 2));
    Reply r;
    ASSERT_TRUE(raw.reply(&r));
    EXPECT_EQ(r.type, kWriteAck) << r.message;
    ASSERT_EQ(dereg.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    EXPECT_EQ(dereg.get(), 0);
    ASSERT_TRUE(raw.send_hdr(header(kWriteReq, 2, reg.addr(), 8)));
    ASSERT_TRUE(raw.send_all(payload.data(), 8));
    ASSERT_TRUE(raw.reply(&r));
    EXPECT_EQ(r.type, kError) << "write to a deregistered region accepted";
    EXPECT_EQ(r.status, -EFAULT);
}
// A READ_RESP sent by reference keeps the region busy until the client reports, with
// READ_DONE, that it consumed the bytes.
TEST_F(TcpTest, DeregisterWaitsForReadDoneOfAZeroCopyRead) {
    auto s = make({{"zerocopy", "1"}});
    ASSERT_TRUE(s);
    const size_t sz = 1 << 20;
    Buffer reg(sz);
    fill_pattern(reg.data(), sz, 3);
    uint64_t h;
    ASSERT_EQ(s->register_mem(reg.data(), sz, kRW, &h), 0);
    const uint16_t port = endpoint_port(s->endpoint());
    Raw raw(port);
    ASSERT_TRUE(raw.hello());
    ASSERT_TRUE(raw.send_hdr(header(kReadReq, 7, reg.addr(), sz)));
    Reply r;
    ASSERT_TRUE(raw.reply(&r));
    ASSERT_EQ(r.type, kReadResp);
    ASSERT_EQ(r.length, sz);
    ASSERT_EQ(r.flags, kFlagNeedsDone) << "a 1 MiB READ should be sent by reference";
    std::vector<uint8_t> got(sz);
    ASSERT_TRUE(raw.recv_all(got.data(), sz));
    EXPECT_EQ(find_mismatch(got.data(), sz, 3), SIZE_MAX);
    auto dereg = std::async(std::launch::async, [&] { return s->deregister_mem(h); });
    EXPECT_EQ(dereg.wait_for(std::chrono::milliseconds(300)), std::future_status::timeout)
        << "deregister_mem returned before the client reported the READ consumed";
    ASSERT_TRUE(raw.send_hdr(header(kReadDone, 7, 0, 1)));
    ASSERT_EQ(dereg.wait_for(std::chrono::seconds(30)), std::future_status::ready);
    EXPECT_EQ(dereg.get(), 0);
    // A READ_DONE that reports more than was sent closes the connection.
    ASSERT_TRUE(raw.send_hdr(header(kReadDone, 7, 0, 1)));
    EXPECT_TRUE(raw.closed_by_server());
}

}  // namespace
}  // namespace ferry_test

#endif  // FERRY_TEST_TCP_PLUGIN
