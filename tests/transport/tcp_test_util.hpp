// What the tcp.so tests of this binary share: the plugin under test, a fixture that makes
// instances of it, and a raw client that speaks the documented wire protocol by hand, to send
// what a real initiator would not.
#pragma once

#ifdef FERRY_TEST_TCP_PLUGIN

#include "harness.hpp"

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <array>
#include <cerrno>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

namespace ferry_test {

inline constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;

inline std::string tcp_path() {
    const char *e = std::getenv("FERRY_TEST_TCP_PLUGIN");
    return e != nullptr && *e != '\0' ? e : FERRY_TEST_TCP_PLUGIN;
}

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

namespace tcp_wire {

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
inline constexpr uint8_t kFlagNeedsDone = 1;
using Hdr = std::array<uint8_t, 40>;

inline void put(uint8_t *p, uint64_t v, int n) {
    for (int i = 0; i < n; ++i) p[i] = static_cast<uint8_t>(v >> (8 * i));
}
inline uint64_t get(const uint8_t *p, int n) {
    uint64_t v = 0;
    for (int i = n - 1; i >= 0; --i) v = (v << 8) | p[i];
    return v;
}

inline Hdr header(uint8_t type, uint64_t id = 0, uint64_t addr = 0, uint64_t len = 0, uint16_t version = 2,
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

inline uint16_t endpoint_port(const std::vector<uint8_t> &ep) { return static_cast<uint16_t>(ep[8] | (ep[9] << 8)); }

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

}  // namespace tcp_wire
}  // namespace ferry_test

#endif  // FERRY_TEST_TCP_PLUGIN
