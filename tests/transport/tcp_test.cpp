// tcp.so through its plugin calls: options, rails, the endpoint, device memory, transfers that
// must land exactly, timeouts, and descriptors. The wire protocol spoken by hand over raw
// sockets is tested in tcp_wire_test.cpp.
#include "tcp_test_util.hpp"

#include "peer_process.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

#ifdef FERRY_TEST_TCP_PLUGIN

namespace ferry_test {
namespace {

using namespace tcp_wire;

TEST_F(TcpTest, ListensOnLoopbackOnlyByDefault) {
    auto s = make();
    ASSERT_TRUE(s);
    auto ep = s->endpoint();
    ASSERT_EQ(ep.size(), 28u);
    EXPECT_EQ(memcmp(ep.data(), "FRTE", 4), 0);
    EXPECT_EQ(ep[6], 4) << "IPv4 endpoint";
    EXPECT_EQ(memcmp(&ep[12], "\x7f\x00\x00\x01", 4), 0) << "endpoint is not 127.0.0.1";
    uint16_t port = endpoint_port(ep);
    ASSERT_NE(port, 0);
    Raw ok(port, "127.0.0.1");
    EXPECT_TRUE(ok.connected());
    // 127.0.0.2 is this host too: only a wildcard bind would accept it.
    Raw other(port, "127.0.0.2");
    EXPECT_FALSE(other.connected()) << "listener accepts on 127.0.0.2: bound to a wildcard?";
}
TEST_F(TcpTest, OptionErrorsNameTheKeyAndTheAcceptedValues) {
    const Options bad[] = {
        {{"lanes", "0"}},       {{"lanes", "two"}},     {{"port", "70000"}},       {{"bind_ip", "localhost"}},
        {{"slice_size", "1"}},  {{"slice_size", "1x"}}, {{"op_timeout_ms", "-1"}}, {{"connect_timeout_ms", ""}},
        {{"io_threads", "65"}}, {{"sndbuf", "12"}},     {{"advertise_ip", "a.b"}}, {{"rails", "10.0.0.1,eth0"}},
    };
    for (const Options &o : bad) {
        Instance i(*plugin_, o);
        EXPECT_EQ(i.create_rc(), -EINVAL) << o[0].first << "=" << o[0].second;
        EXPECT_NE(i.last_error().find(o[0].first), std::string::npos) << i.last_error();
        EXPECT_NE(i.last_error().find("expected"), std::string::npos) << i.last_error();
    }
    Instance unknown(*plugin_, {{"lane", "2"}});
    EXPECT_EQ(unknown.create_rc(), -EINVAL);
    EXPECT_NE(unknown.last_error().find("lanes"), std::string::npos) << "lists accepted keys";
    Instance wildcard(*plugin_, {{"bind_ip", "0.0.0.0"}});
    EXPECT_EQ(wildcard.create_rc(), -EINVAL);
    EXPECT_NE(wildcard.last_error().find("advertise_ip"), std::string::npos);
    auto good = make(
        {{"lanes", "4"}, {"slice_size", "256k"}, {"sndbuf", "1m"}, {"op_timeout_ms", "0"}, {"bind_ip", "127.0.0.1"}});
    EXPECT_TRUE(good);
}
// tcp.rails is checked against the host's own addresses when the instance starts: an address
// it does not have, one listed twice, or advertise_ip beside several rails stop it, saying why
// and what to do. (Several rails at work: tests/netns, which makes hosts with two links.)
TEST_F(TcpTest, RailsTheHostCannotServeAreRefusedWithTheFix) {
    Instance absent(*plugin_, {{"rails", "127.0.0.1,192.0.2.77"}});
    EXPECT_EQ(absent.create_rc(), -EINVAL);
    EXPECT_NE(absent.last_error().find("'192.0.2.77' is not an address of this host"), std::string::npos)
        << absent.last_error();
    EXPECT_NE(absent.last_error().find("ip -brief address"), std::string::npos) << absent.last_error();
    EXPECT_NE(absent.last_error().find("127.0.0.1"), std::string::npos) << "lists the host's addresses";
    Instance twice(*plugin_, {{"rails", "127.0.0.1,127.0.0.1"}});
    EXPECT_EQ(twice.create_rc(), -EINVAL);
    EXPECT_NE(twice.last_error().find("listed twice"), std::string::npos) << twice.last_error();
}
// One rail named explicitly: lanes leave from its address (bound before connecting) and the
// endpoint keeps the single-address form, which peers without rails read.
TEST_F(TcpTest, OneRailKeepsTheSingleAddressEndpointAndMovesData) {
    auto s = make({{"rails", "127.0.0.1"}});
    auto c = make({{"rails", "127.0.0.1"}});
    ASSERT_TRUE(s && c);
    auto ep = s->endpoint();
    ASSERT_EQ(ep.size(), 28u);
    std::vector<uint8_t> remote(1 << 20), local(1 << 20);
    fill_pattern(remote.data(), remote.size(), 3);
    uint64_t rh, lh, peer, rmem;
    ASSERT_EQ(s->register_mem(remote.data(), remote.size(), FERRY_ACCESS_REMOTE_READ, &rh), 0) << s->last_error();
    ASSERT_EQ(c->register_mem(local.data(), local.size(), 0, &lh), 0);
    ASSERT_EQ(c->connect(ep, &peer), 0) << c->last_error();
    ASSERT_EQ(
        c->import_mem(peer, reinterpret_cast<uint64_t>(remote.data()), remote.size(), FERRY_ACCESS_REMOTE_READ, &rmem),
        0);
    ASSERT_EQ(c->submit(peer, {make_op(FERRY_OP_READ, reinterpret_cast<uint64_t>(local.data()), lh,
                                       reinterpret_cast<uint64_t>(remote.data()), rmem, remote.size(), 1)}),
              0);
    auto done = c->wait(1);
    ASSERT_EQ(done.size(), 1u);
    EXPECT_EQ(done[0].status, 0) << done[0].message;
    EXPECT_EQ(find_mismatch(local.data(), local.size(), 3), SIZE_MAX);
}
// rail_stats (ABI 1.5): one entry per local rail (without tcp.rails, the bind address), under the
// capacity convention (-ENOSPC with the count needed); the initiator counts the bytes and slices
// it completed there, the serving side none (it initiated nothing).
TEST_F(TcpTest, RailStatsCountWhatEachLocalRailCarried) {
    ASSERT_GE(plugin_->api()->struct_size, FERRY_PLUGIN_V1_SIZE_UNTIL(rail_stats));
    ASSERT_NE(plugin_->api()->rail_stats, nullptr);
    auto s = make();
    auto c = make({{"slice_size", "256k"}});
    ASSERT_TRUE(s && c);
    auto rails = [&](Instance &i) {
        std::vector<ferry_rail_stats_t> out(4);
        size_t n = out.size();
        ferry_error_t err{};
        EXPECT_EQ(plugin_->api()->rail_stats(i.t(), out.data(), &n, &err), 0) << err.message;
        out.resize(n);
        return out;
    };
    size_t n = 0;
    ferry_error_t err{};
    EXPECT_EQ(plugin_->api()->rail_stats(c->t(), nullptr, &n, &err), -ENOSPC);
    EXPECT_EQ(n, 1u) << "the count needed";
    EXPECT_EQ(plugin_->api()->rail_stats(c->t(), nullptr, nullptr, &err), -EINVAL);
    auto before = rails(*c);
    ASSERT_EQ(before.size(), 1u);
    EXPECT_STREQ(before[0].name, "127.0.0.1");
    EXPECT_EQ(before[0].read_bytes + before[0].write_bytes + before[0].completed, 0u);

    std::vector<uint8_t> remote(1 << 20), local(1 << 20);
    fill_pattern(remote.data(), remote.size(), 5);
    uint64_t rh, lh, peer, rmem;
    ASSERT_EQ(s->register_mem(remote.data(), remote.size(), kRW, &rh), 0) << s->last_error();
    ASSERT_EQ(c->register_mem(local.data(), local.size(), 0, &lh), 0);
    ASSERT_EQ(c->connect(s->endpoint(), &peer), 0) << c->last_error();
    ASSERT_EQ(c->import_mem(peer, reinterpret_cast<uint64_t>(remote.data()), remote.size(), kRW, &rmem), 0);
    const auto l = reinterpret_cast<uint64_t>(local.data()), r = reinterpret_cast<uint64_t>(remote.data());
    ASSERT_EQ(c->submit(peer, {make_op(FERRY_OP_READ, l, lh, r, rmem, 1 << 20, 1),
                               make_op(FERRY_OP_WRITE, l, lh, r + 4096, rmem, 5000, 2)}),
              0);
    auto done = c->wait(2);
    ASSERT_EQ(done.size(), 2u);
    EXPECT_EQ(done[0].status | done[1].status, 0) << done[0].message << done[1].message;
    auto after = rails(*c);
    ASSERT_EQ(after.size(), 1u);
    EXPECT_EQ(after[0].read_bytes, 1u << 20);
    EXPECT_EQ(after[0].write_bytes, 5000u);
    EXPECT_EQ(after[0].completed, 5u) << "four 256 KiB slices and one small one";
    EXPECT_EQ(after[0].failures + after[0].pauses + after[0].paused_peers + after[0].queued_bytes, 0u);
    EXPECT_EQ(after[0].throughput, 0) << "one rail: nothing to balance, not measured";
    auto served = rails(*s);
    ASSERT_EQ(served.size(), 1u);
    EXPECT_EQ(served[0].read_bytes + served[0].write_bytes, 0u) << "serving is not counted: the initiator's rails are";
}
// Without the host's staging calls (test_host offers none) device memory is refused; with them
// it is served staged (staged_device_test.cpp).
TEST_F(TcpTest, GpuMemoryIsRefusedWithNotSupported) {
    auto s = make();
    ASSERT_TRUE(s);
    std::vector<uint8_t> mem(4096);
    uint64_t h = 777;
    EXPECT_EQ(s->register_mem(mem.data(), mem.size(), kRW, &h, FERRY_MEM_CUDA), -ENOTSUP);
    EXPECT_NE(s->last_error().find("offers no staging"), std::string::npos) << s->last_error();
    EXPECT_EQ(s->register_mem(mem.data(), mem.size(), kRW, &h, FERRY_MEM_ROCM), -ENOTSUP);
    EXPECT_EQ(h, 777u) << "output written on failure";
    EXPECT_EQ((*plugin_)->caps, FERRY_CAP_MEM_HOST | FERRY_CAP_INTRA_NODE | FERRY_CAP_INTER_NODE | FERRY_CAP_AUTH_KEY |
                                    FERRY_CAP_STAGED_DEVICE);
}
// A refused WRITE's payload is drained. A short read during the drain raised the receive low-water
// mark to the rest of the payload; the reads after it lowered the debt but not the mark, so when
// the socket ran dry with a few payload bytes still to come, the server waited for more bytes
// than would ever arrive and the connection stalled until op_timeout_ms (about one run in fifty
// of WriteToReadOnlyRegionRefused). It needs a fresh connection (a small receive window), so
// each round makes new instances.
TEST_F(TcpTest, RefusedLargeWritesDoNotStallTheConnection) {
    const size_t sz = 256 * 1024;
    Buffer tgt(sz), loc(sz);
    fill_pattern(tgt.data(), sz, 4);
    for (int round = 0; round < 1000; ++round) {
        auto a = make({{"op_timeout_ms", "3000"}});
        auto b = make();
        ASSERT_TRUE(a && b);
        uint64_t ht, hl, peer, rmem;
        ASSERT_EQ(b->register_mem(tgt.data(), sz, FERRY_ACCESS_REMOTE_READ, &ht), 0);
        ASSERT_EQ(a->register_mem(loc.data(), sz, 0, &hl), 0);
        ASSERT_EQ(a->connect(b->endpoint(), &peer), 0) << a->last_error();
        ASSERT_EQ(a->import_mem(peer, tgt.addr(), sz, kRW, &rmem), 0);
        ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_WRITE, loc.addr(), hl, tgt.addr(), rmem, sz, 0),
                                   make_op(FERRY_OP_WRITE, loc.addr(), hl, tgt.addr() + 7, rmem, 1, 1),
                                   make_op(FERRY_OP_READ, loc.addr(), hl, tgt.addr(), rmem, sz, 2)}),
                  0);
        auto c = a->wait(3, std::chrono::seconds(20));
        ASSERT_EQ(c.size(), 3u) << "round " << round;
        for (const auto &x : c)
            ASSERT_EQ(x.status, x.user_data < 2 ? -EACCES : 0) << "round " << round << ": " << x.message;
    }
}
// More zero-copy READs in flight on one connection than the server queues responses for:
// READ_DONE reports must keep flowing while the server throttles reading.
TEST_F(TcpTest, ManyLargeReadsInFlightOnOneLane) {
    auto a = make({{"lanes", "1"}});
    auto b = make({{"zerocopy", "1"}});  // the serving side splices its READ responses
    ASSERT_TRUE(a && b);
    const size_t sz = 512 * 1024;
    Buffer src(sz), dst(sz);
    fill_pattern(src.data(), sz, 11);
    uint64_t hs, hd, peer, rmem;
    ASSERT_EQ(b->register_mem(src.data(), sz, kRW, &hs), 0);
    ASSERT_EQ(a->register_mem(dst.data(), sz, 0, &hd), 0);
    ASSERT_EQ(a->connect(b->endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, src.addr(), sz, kRW, &rmem), 0);
    const size_t n = 1500;
    std::vector<ferry_xfer_op_t> ops;
    for (size_t i = 0; i < n; ++i) ops.push_back(make_op(FERRY_OP_READ, dst.addr(), hd, src.addr(), rmem, sz, i));
    ASSERT_EQ(a->submit(peer, ops), 0) << a->last_error();
    auto c = a->wait(n);
    ASSERT_EQ(c.size(), n);
    for (const auto &x : c) ASSERT_EQ(x.status, 0) << x.message;
    EXPECT_EQ(find_mismatch(dst.data(), sz, 11), SIZE_MAX);
    EXPECT_EQ(b->deregister_mem(hs), 0);  // every READ_DONE arrived: returns at once
}
// One lane, one batch: small READs (answered in runs, lane_recv.cpp), READs the server refuses
// (ERROR frames much shorter than the READ_RESP they replace, so a run reads past them into the
// next responses), and large READs right behind them (whose first bytes then arrive in a run).
// Every byte lands where its op says, and a refused op's memory is never written.
TEST_F(TcpTest, RunsOfSmallReadsWithRefusalsAndLargeReadsLandExactly) {
    auto a = make({{"lanes", "1"}});
    auto b = make();
    ASSERT_TRUE(a && b);
    const size_t sz = 4 << 20, big = 1 << 20, small = 64, refused = 8192;
    Buffer src(sz), closed(sz), dst(sz);
    fill_pattern(src.data(), sz, 21);
    std::memset(dst.data(), 0xEE, sz);
    uint64_t hs, hc, hd, peer, rsrc, rclosed;
    ASSERT_EQ(b->register_mem(src.data(), sz, FERRY_ACCESS_REMOTE_READ, &hs), 0);
    ASSERT_EQ(b->register_mem(closed.data(), sz, FERRY_ACCESS_REMOTE_WRITE, &hc), 0);  // READs refused
    ASSERT_EQ(a->register_mem(dst.data(), sz, 0, &hd), 0);
    ASSERT_EQ(a->connect(b->endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, src.addr(), sz, kRW, &rsrc), 0);
    // Imported as readable: the initiator's early check passes, the server's refuses.
    ASSERT_EQ(a->import_mem(peer, closed.addr(), sz, kRW, &rclosed), 0);
    struct Want {
        uint64_t off, len;
        bool ok;
    };
    std::vector<Want> want;
    std::vector<ferry_xfer_op_t> ops;
    uint64_t off = 0;
    for (int round = 0; round < 3; ++round) {
        for (int i = 0; i < 40; ++i, off += small) want.push_back({off, small, true});
        for (int i = 0; i < 3; ++i, off += refused) want.push_back({off, refused, false});
        want.push_back({off, big, true});
        off += big;
        for (int i = 0; i < 5; ++i, off += small) want.push_back({off, small, true});
    }
    ASSERT_LE(off, sz);
    for (size_t i = 0; i < want.size(); ++i) {
        const Want &w = want[i];
        ops.push_back(w.ok ? make_op(FERRY_OP_READ, dst.addr() + w.off, hd, src.addr() + w.off, rsrc, w.len, i)
                           : make_op(FERRY_OP_READ, dst.addr() + w.off, hd, closed.addr() + w.off, rclosed, w.len, i));
    }
    ASSERT_EQ(a->submit(peer, ops), 0) << a->last_error();
    auto c = a->wait(ops.size());
    ASSERT_EQ(c.size(), ops.size());
    for (const auto &x : c) {
        const Want &w = want[x.user_data];
        EXPECT_EQ(x.status, w.ok ? 0 : -EACCES) << "op " << x.user_data << ": " << x.message;
    }
    for (size_t i = 0; i < want.size(); ++i) {
        const Want &w = want[i];
        if (w.ok) {
            EXPECT_EQ(find_mismatch(dst.data() + w.off, w.len, 21, w.off), SIZE_MAX) << "op " << i;
        } else {
            for (uint64_t k = 0; k < w.len; ++k)
                ASSERT_EQ(dst.data()[w.off + k], 0xEE) << "refused op " << i << " wrote byte " << k;
        }
    }
}
TEST_F(TcpTest, StalledPeerTimesOut) {
    auto a = make({{"op_timeout_ms", "300"}});
    ASSERT_TRUE(a);
    ChildPeer child(tcp_path(), 1 << 20, kRW, {});
    ASSERT_TRUE(child.ok()) << child.error();
    Buffer loc(1 << 20);
    uint64_t hl, peer, rmem;
    ASSERT_EQ(a->register_mem(loc.data(), loc.size(), 0, &hl), 0);
    ASSERT_EQ(a->connect(child.endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, child.addr(), 1 << 20, kRW, &rmem), 0);
    child.stop();
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_READ, loc.addr(), hl, child.addr(), rmem, 4096, 1)}), 0);
    auto c = a->wait(1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, -ETIMEDOUT) << c[0].message;
    EXPECT_NE(std::string(c[0].message).find("127.0.0.1:"), std::string::npos) << c[0].message;
    child.resume();
    EXPECT_TRUE(child.exit_cleanly());
}
TEST_F(TcpTest, ConnectToSilentListenerTimesOut) {
    // A socket that accepts TCP connections (kernel backlog) but never answers HELLO.
    int l = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    ASSERT_EQ(bind(l, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    ASSERT_EQ(listen(l, 16), 0);
    socklen_t len = sizeof a;
    getsockname(l, reinterpret_cast<sockaddr *>(&a), &len);
    auto s = make();
    ASSERT_TRUE(s);
    std::vector<uint8_t> ep = s->endpoint();
    uint16_t port = ntohs(a.sin_port);
    ep[8] = static_cast<uint8_t>(port);
    ep[9] = static_cast<uint8_t>(port >> 8);
    auto c = make({{"connect_timeout_ms", "200"}});
    ASSERT_TRUE(c);
    uint64_t peer = 5;
    EXPECT_EQ(c->connect(ep, &peer), -ETIMEDOUT) << c->last_error();
    EXPECT_NE(c->last_error().find("timed out"), std::string::npos) << c->last_error();
    EXPECT_EQ(peer, 5u);
    close(l);
}
size_t open_fds() {
    size_t n = 0;
    if (DIR *d = opendir("/proc/self/fd")) {
        while (readdir(d) != nullptr) ++n;
        closedir(d);
    }
    return n;
}
TEST_F(TcpTest, DestroyClosesEveryDescriptor) {
    const size_t before = open_fds();
    {
        auto a = make({{"lanes", "3"}, {"io_threads", "2"}, {"zerocopy", "1"}});
        auto b = make({{"io_threads", "2"}, {"zerocopy", "1"}});
        ASSERT_TRUE(a && b);
        const size_t sz = 4 << 20;
        Buffer src(sz), tgt(sz);
        uint64_t hs, ht, peer, rmem;
        ASSERT_EQ(a->register_mem(src.data(), sz, 0, &hs), 0);
        ASSERT_EQ(b->register_mem(tgt.data(), sz, kRW, &ht), 0);
        ASSERT_EQ(a->connect(b->endpoint(), &peer), 0) << a->last_error();
        ASSERT_EQ(a->import_mem(peer, tgt.addr(), sz, kRW, &rmem), 0);
        // A large WRITE and READ make both sides open their zero-copy pipes. They touch
        // different halves: ops of one batch are not ordered against each other.
        const size_t half = sz / 2;
        ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_WRITE, src.addr(), hs, tgt.addr(), rmem, half, 1),
                                   make_op(FERRY_OP_READ, src.addr() + half, hs, tgt.addr() + half, rmem, half, 2)}),
                  0);
        auto c = a->wait(2);
        ASSERT_EQ(c.size(), 2u);
        EXPECT_GT(open_fds(), before);
        // Destroyed with the peer still connected and memory still registered.
    }
    EXPECT_EQ(open_fds(), before) << "descriptors leaked by create/connect/transfer/destroy";
}
TEST_F(TcpTest, MalformedEndpointRejected) {
    auto s = make();
    ASSERT_TRUE(s);
    std::vector<uint8_t> ep = s->endpoint();
    uint64_t peer = 0;
    std::vector<uint8_t> short_ep(ep.begin(), ep.begin() + 10);
    EXPECT_EQ(s->connect(short_ep, &peer), -EINVAL);
    ep[0] = 'X';
    EXPECT_EQ(s->connect(ep, &peer), -EINVAL);
    EXPECT_FALSE(s->last_error().empty());
}

}  // namespace
}  // namespace ferry_test

#endif  // FERRY_TEST_TCP_PLUGIN
