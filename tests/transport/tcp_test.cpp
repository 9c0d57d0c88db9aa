// tcp.so specifics: options, endpoint, GPU memory, timeouts, and the wire protocol spoken by
// hand over raw sockets (malformed and hostile requests must never touch memory outside
// registered regions).
#include "harness.hpp"
#include "peer_process.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <future>
#include <thread>

#ifdef FERRY_TEST_TCP_PLUGIN

namespace ferry_test {
namespace {

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;

std::string tcp_path() {
    const char *e = std::getenv("FERRY_TEST_TCP_PLUGIN");
    return e != nullptr && *e != '\0' ? e : FERRY_TEST_TCP_PLUGIN;
}

// The documented wire header (plugins/tcp/wire.hpp), encoded independently here.
enum : uint8_t {
    kHello = 1,
    kHelloAck = 2,
    kWriteReq = 3,
    kWriteAck = 4,
    kReadReq = 5,
    kReadResp = 6,
    kError = 7,
    kReadDone = 8,
    kAuth = 9,
    kAuthAck = 10
};
constexpr uint8_t kFlagNeedsDone = 1;
using Hdr = std::array<uint8_t, 40>;

void put(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
uint64_t get(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

Hdr header(uint8_t type, uint64_t id = 0, uint64_t addr = 0, uint64_t len = 0, uint16_t version = 2,
           uint32_t magic = 0x59525246u) {
    Hdr h{};
    put(&h[0], magic, 4);
    put(&h[4], version, 2);
    h[6] = type;
    put(&h[16], id, 8);
    put(&h[24], addr, 8);
    put(&h[32], len, 8);
    return h;
}

struct Reply {
    uint8_t type = 0;
    uint8_t flags = 0;
    int32_t status = 0;
    uint64_t id = 0;
    uint64_t length = 0;
    std::string message;
};

uint16_t endpoint_port(const std::vector<uint8_t> &ep) { return static_cast<uint16_t>(ep[8] | (ep[9] << 8)); }

// A hand-driven client connection with a 30 s hang guard on every read.
class Raw {
public:
    explicit Raw(uint16_t port, const char *ip = "127.0.0.1") {
        fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        inet_pton(AF_INET, ip, &a.sin_addr);
        connected_ = ::connect(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
        err_ = errno;
    }
    ~Raw() { close(fd_); }
    bool connected() const { return connected_; }
    int connect_errno() const { return err_; }
    bool send_all(const void *p, size_t n) {
        auto *b = static_cast<const uint8_t *>(p);
        while (n > 0) {
            ssize_t k = send(fd_, b, n, MSG_NOSIGNAL);
            if (k <= 0) return false;
            b += k;
            n -= static_cast<size_t>(k);
        }
        return true;
    }
    bool send_hdr(const Hdr &h) { return send_all(h.data(), h.size()); }
    // false on EOF, error or the hang guard.
    bool recv_all(void *p, size_t n) {
        auto *b = static_cast<uint8_t *>(p);
        while (n > 0) {
            pollfd pf{fd_, POLLIN, 0};
            if (::poll(&pf, 1, 30000) <= 0) return false;
            ssize_t k = recv(fd_, b, n, 0);
            if (k <= 0) return false;
            b += k;
            n -= static_cast<size_t>(k);
        }
        return true;
    }
    bool reply(Reply *r) {
        Hdr h;
        if (!recv_all(h.data(), h.size())) return false;
        r->type = h[6];
        r->flags = h[7];
        r->status = static_cast<int32_t>(get(&h[8], 4));
        r->id = get(&h[16], 8);
        r->length = get(&h[32], 8);
        uint32_t ml = static_cast<uint32_t>(get(&h[12], 4));
        r->message.assign(ml, '\0');
        return ml == 0 || recv_all(r->message.data(), ml);
    }
    // The handshake of a client without a cluster key (wire.hpp): HELLO with a nonce,
    // HELLO_ACK, AUTH with the all-zero proof of "no key", AUTH_ACK.
    bool hello() {
        Reply r;
        Hdr h = header(kHello);
        put(&h[12], 32, 4);  // msg_len: the client nonce follows
        std::array<uint8_t, 32> nonce{};
        nonce[0] = 1;
        if (!send_hdr(h) || !send_all(nonce.data(), nonce.size()) || !reply(&r) || r.type != kHelloAck ||
            r.message.size() != 64)
            return false;
        Hdr a = header(kAuth);
        put(&a[12], 32, 4);
        std::array<uint8_t, 32> proof{};
        return send_hdr(a) && send_all(proof.data(), proof.size()) && reply(&r) && r.type == kAuthAck;
    }
    // True once the server closed the connection (EOF or reset), within the hang guard.
    bool closed_by_server() {
        for (;;) {
            pollfd pf{fd_, POLLIN, 0};
            if (::poll(&pf, 1, 30000) <= 0) return false;
            char buf[4096];
            ssize_t k = recv(fd_, buf, sizeof buf, 0);
            if (k <= 0) return true;
        }
    }

private:
    int fd_;
    bool connected_ = false;
    int err_ = 0;
};

class TcpTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (access(tcp_path().c_str(), R_OK) != 0) GTEST_SKIP() << "tcp.so not built";
        plugin_ = std::make_unique<Plugin>(tcp_path());
        ASSERT_TRUE(plugin_->ok()) << plugin_->error();
    }
    std::unique_ptr<Instance> make(const Options &o = {}) {
        auto i = std::make_unique<Instance>(*plugin_, o);
        EXPECT_EQ(i->create_rc(), 0) << i->last_error();
        return i->create_rc() == 0 ? std::move(i) : nullptr;
    }
    std::unique_ptr<Plugin> plugin_;
};

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
