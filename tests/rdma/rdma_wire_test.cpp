// rdma.so's wire codecs (endpoints, memory descriptors, handshake bodies, control headers):
// round trips, and every malformed input rejected with a reason.
#include "rdma_test_util.hpp"
#include "wire.hpp"

#include <ferry/plugin.h>
#include <gtest/gtest.h>

#include <cerrno>

namespace ferry_rdma {
namespace {

using namespace ferry_rdma::test;

TEST(RdmaWire, EndpointRoundTrip) {
    Endpoint ep;
    ep.token = 0x1122334455667788ull;
    ep.ip[0] = 127, ep.ip[3] = 1;
    ep.port = 18515;
    ep.nics = {nic("mlx5_0", LinkLayer::InfiniBand, 7, 1), nic("mlx5_1", LinkLayer::Ethernet, 0, 2)};
    auto bytes = encode_endpoint(ep);
    Endpoint out;
    std::string why;
    ASSERT_TRUE(decode_endpoint(bytes.data(), bytes.size(), &out, &why)) << why;
    EXPECT_EQ(out.token, ep.token);
    EXPECT_EQ(out.port, 18515);
    EXPECT_EQ(out.ip[0], 127);
    EXPECT_EQ(out.ip[3], 1);
    ASSERT_EQ(out.nics.size(), 2u);
    EXPECT_EQ(out.nics[0].name, "mlx5_0");
    EXPECT_EQ(out.nics[0].lid, 7);
    EXPECT_EQ(out.nics[1].link, LinkLayer::Ethernet);
    EXPECT_EQ(out.nics[1].gid_index, 3);
    EXPECT_EQ(memcmp(out.nics[1].gid, ep.nics[1].gid, 16), 0);
    EXPECT_EQ(gid_string(out.nics[1].gid), "fe80::2");
}

TEST(RdmaWire, EveryTruncationOfAnEndpointIsRejectedWithAReason) {
    Endpoint ep;
    ep.port = 1;
    ep.nics = {nic("mlx5_0", LinkLayer::InfiniBand, 7, 1)};
    auto bytes = encode_endpoint(ep);
    for (size_t n = 0; n < bytes.size(); ++n) {
        Endpoint out;
        std::string why;
        EXPECT_FALSE(decode_endpoint(bytes.data(), n, &out, &why)) << n;
        EXPECT_FALSE(why.empty()) << n;
    }
    bytes.push_back(0);
    std::string why;
    Endpoint out;
    EXPECT_FALSE(decode_endpoint(bytes.data(), bytes.size(), &out, &why));
    EXPECT_TRUE(contains(why, "trailing")) << why;
}

TEST(RdmaWire, EndpointFieldsAreChecked) {
    Endpoint ep;
    ep.port = 1;
    ep.nics = {nic("mlx5_0", LinkLayer::InfiniBand, 7, 1)};
    auto good = encode_endpoint(ep);
    std::string why;
    Endpoint out;
    auto bad = good;
    bad[0] ^= 0xff;
    EXPECT_FALSE(decode_endpoint(bad.data(), bad.size(), &out, &why));
    EXPECT_TRUE(contains(why, "magic")) << why;
    bad = good;
    bad[4] = 9;  // version
    EXPECT_FALSE(decode_endpoint(bad.data(), bad.size(), &out, &why));
    EXPECT_TRUE(contains(why, "version 9")) << why;
    // RoCE needs a GID.
    Endpoint roce = ep;
    roce.nics[0].link = LinkLayer::Ethernet;
    memset(roce.nics[0].gid, 0, 16);
    auto r = encode_endpoint(roce);
    EXPECT_FALSE(decode_endpoint(r.data(), r.size(), &out, &why));
    EXPECT_TRUE(contains(why, "RoCE without a GID")) << why;
    // MTU code out of range.
    Endpoint mtu = ep;
    mtu.nics[0].mtu = 9;
    auto m = encode_endpoint(mtu);
    EXPECT_FALSE(decode_endpoint(m.data(), m.size(), &out, &why));
    EXPECT_TRUE(contains(why, "MTU")) << why;
    Endpoint none = ep;
    none.nics.clear();
    auto z = encode_endpoint(none);
    EXPECT_FALSE(decode_endpoint(z.data(), z.size(), &out, &why));
    EXPECT_TRUE(contains(why, "NIC count 0")) << why;
}

TEST(RdmaWire, MemoryDescriptorRoundTripWithOneKeyPerNic) {
    MemDescriptor m;
    m.nearest_nics = 0b10;
    m.chunks.push_back({0x10000, 4 * kMiB, FERRY_ACCESS_REMOTE_READ, {11, 12}});
    m.chunks.push_back({0x10000 + 4 * kMiB, kMiB, FERRY_ACCESS_REMOTE_READ, {21, 22}});
    auto b = encode_mem(m, 2);
    MemDescriptor out;
    std::string why;
    ASSERT_TRUE(decode_mem(b.data(), b.size(), 2, &out, &why)) << why;
    EXPECT_EQ(out.nearest_nics, 0b10u);
    ASSERT_EQ(out.chunks.size(), 2u);
    EXPECT_EQ(out.chunks[1].addr, 0x10000 + 4 * kMiB);
    EXPECT_EQ(out.chunks[1].rkeys, (std::vector<uint32_t>{21, 22}));
    // The peer's endpoint has 3 NICs but the descriptor carries keys for 2.
    EXPECT_FALSE(decode_mem(b.data(), b.size(), 3, &out, &why));
    EXPECT_TRUE(contains(why, "keys for 2 NICs")) << why;
    for (size_t n = 0; n < b.size(); ++n) EXPECT_FALSE(decode_mem(b.data(), n, 2, &out, &why)) << n;
}

TEST(RdmaWire, MemoryDescriptorRejectsOverlapsUnknownRightsAndForeignNics) {
    std::string why;
    MemDescriptor out;
    MemDescriptor overlap;
    overlap.chunks.push_back({0x10000, 8192, 3, {1}});
    overlap.chunks.push_back({0x11000, 4096, 3, {2}});
    auto b = encode_mem(overlap, 1);
    EXPECT_FALSE(decode_mem(b.data(), b.size(), 1, &out, &why));
    EXPECT_TRUE(contains(why, "overlaps")) << why;
    MemDescriptor rights;
    rights.chunks.push_back({0x10000, 4096, 4, {1}});
    b = encode_mem(rights, 1);
    EXPECT_FALSE(decode_mem(b.data(), b.size(), 1, &out, &why));
    EXPECT_TRUE(contains(why, "access")) << why;
    MemDescriptor mask;
    mask.nearest_nics = 0b100;
    mask.chunks.push_back({0x10000, 4096, 3, {1, 2}});
    b = encode_mem(mask, 2);
    EXPECT_FALSE(decode_mem(b.data(), b.size(), 2, &out, &why));
    EXPECT_TRUE(contains(why, "nearest")) << why;
    MemDescriptor wrap;
    wrap.chunks.push_back({UINT64_MAX - 10, 4096, 3, {1}});
    b = encode_mem(wrap, 1);
    EXPECT_FALSE(decode_mem(b.data(), b.size(), 1, &out, &why));
    // A query reply with gaps, or with nothing registered in the range, is valid.
    MemDescriptor gaps;
    gaps.chunks.push_back({0x10000, 4096, 3, {1}});
    gaps.chunks.push_back({0x20000, 4096, 1, {2}});
    b = encode_mem(gaps, 1);
    EXPECT_TRUE(decode_mem(b.data(), b.size(), 1, &out, &why)) << why;
    b = encode_mem(MemDescriptor{}, 1);
    EXPECT_TRUE(decode_mem(b.data(), b.size(), 1, &out, &why)) << why;
    EXPECT_TRUE(out.chunks.empty());
}

TEST(RdmaWire, ConnectHandshakeBodies) {
    ConnectBody c;
    c.token = 42;
    c.nics = {nic("mlx5_0", LinkLayer::InfiniBand, 1, 1), nic("mlx5_1", LinkLayer::InfiniBand, 2, 2)};
    c.pairs = {{0, 0, 0x123, 0xabcdef}, {1, 3, 0xffffff, 0}};
    auto b = encode_connect(c);
    ConnectBody out;
    std::string why;
    ASSERT_TRUE(decode_connect(b.data(), b.size(), &out, &why)) << why;
    EXPECT_EQ(out.token, 42u);
    ASSERT_EQ(out.pairs.size(), 2u);
    EXPECT_EQ(out.pairs[1].remote_nic, 3);
    EXPECT_EQ(out.pairs[1].qpn, 0xffffffu);
    // A pair naming an initiator NIC it did not list.
    c.pairs[0].local_nic = 2;
    b = encode_connect(c);
    EXPECT_FALSE(decode_connect(b.data(), b.size(), &out, &why));
    EXPECT_TRUE(contains(why, "initiator NIC 2")) << why;
    // QP numbers are 24 bits; 0 is never a valid RC queue pair.
    ConnectAckBody ack;
    ack.pairs = {{0, 0, 0x1000000, 1}};
    b = encode_connect_ack(ack);
    ConnectAckBody aout;
    EXPECT_FALSE(decode_connect_ack(b.data(), b.size(), &aout, &why));
    ack.pairs = {{0, 0, 0, 1}};
    b = encode_connect_ack(ack);
    EXPECT_FALSE(decode_connect_ack(b.data(), b.size(), &aout, &why));
    ack.pairs = {{1, 0, 77, 5}};
    b = encode_connect_ack(ack);
    ASSERT_TRUE(decode_connect_ack(b.data(), b.size(), &aout, &why)) << why;
    EXPECT_EQ(aout.pairs[0].qpn, 77u);
}

// The Query body (which registrations hold a range): the bytes the initiator has always sent,
// addr then length, little-endian; any other size is not a query.
TEST(RdmaWire, QueryBody) {
    auto b = encode_query(0x1122334455667788ull, 4096);
    ASSERT_EQ(b.size(), 16u);
    EXPECT_EQ(b[0], 0x88);
    EXPECT_EQ(b[7], 0x11);
    EXPECT_EQ(b[9], 0x10);
    uint64_t addr = 0, len = 0;
    ASSERT_TRUE(decode_query(b, &addr, &len));
    EXPECT_EQ(addr, 0x1122334455667788ull);
    EXPECT_EQ(len, 4096u);
    b.push_back(0);
    EXPECT_FALSE(decode_query(b, &addr, &len));
    b.resize(15);
    EXPECT_FALSE(decode_query(b, &addr, &len));
}

TEST(RdmaWire, ControlHeader) {
    CtrlHeader h;
    h.type = static_cast<uint16_t>(CtrlType::Query);
    h.req_id = 9;
    h.status = -ENOENT;
    h.body_len = 16;
    uint8_t b[kCtrlHeaderSize];
    encode_header(h, b);
    CtrlHeader out;
    std::string why;
    ASSERT_TRUE(decode_header(b, &out, &why)) << why;
    EXPECT_EQ(out.status, -ENOENT);
    EXPECT_EQ(out.req_id, 9u);
    h.body_len = kMaxCtrlBody + 1;
    encode_header(h, b);
    EXPECT_FALSE(decode_header(b, &out, &why));
    h.body_len = 0;
    h.type = 99;
    encode_header(h, b);
    EXPECT_FALSE(decode_header(b, &out, &why));
    EXPECT_TRUE(contains(why, "type 99")) << why;
}

}  // namespace
}  // namespace ferry_rdma
