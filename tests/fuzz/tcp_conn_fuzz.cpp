// tcp.so's serving side fed over a real socket: each input is sent, as a client would, on a
// fresh connection to a real tcp.so instance (the plugin's sources, through its ferry_plugin_v1
// table) while the replies are read; then the connection is half-closed and read until the
// server closes it. This reaches the server's connection state machine (HELLO, AUTH, requests,
// refused-WRITE drain, READ_DONE, batched READ runs) as a peer would. Three instances
// (tcp_conn_fuzz.h): no secret, a cluster secret (the fuzzer cannot know the proof, so it must
// never get past AUTH), and no secret with zero-copy READ responses.
// Invariants: no crash, no hang (5 s without progress fails), every reply is a well-formed
// frame, every READ_RESP payload byte comes from the read-only region, the canaries around the
// regions and the read-only region itself never change, and with a secret nothing but
// HELLO_ACK and ERROR is ever answered. The instances live for the whole run; each input
// leaves no descriptor behind (the server closes its end before the client sees EOF).
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include <ferry/plugin.h>

#include "fuzz_bytes.hpp"
#include "fuzz_check.hpp"
#include "tcp_conn_fuzz.h"
#include "wire.hpp"

extern "C" const ferry_plugin_v1_t ferry_plugin_v1;

using namespace tcp_conn_fuzz;
using ferry_tcp::Header;

namespace {

uint16_t g_port[kConfigs];
uint8_t *g_mem = nullptr;

// Checks the server's byte stream frame by frame as it arrives.
class ReplyChecker {
public:
    explicit ReplyChecker(bool secret) : secret_(secret) {}
    void feed(const uint8_t *p, size_t n) {
        while (n > 0) {
            if (body_left_ > 0) {
                size_t take = std::min<uint64_t>(n, body_left_);
                if (read_payload_)
                    FUZZ_CHECK(all_bytes(p, take, kReadByte), "READ_RESP bytes from outside the read-only region");
                body_left_ -= take;
                p += take;
                n -= take;
                continue;
            }
            size_t take = std::min(n, ferry_tcp::kHeaderSize - got_);
            memcpy(hdr_ + got_, p, take);
            got_ += take;
            p += take;
            n -= take;
            if (got_ == ferry_tcp::kHeaderSize) {
                got_ = 0;
                on_header(ferry_tcp::decode_header(hdr_));
            }
        }
    }

    std::string summary() const { return seen_; }

private:
    void on_header(const Header &h) {
        using namespace ferry_tcp;
        seen_ += msg_type_name(h.type);
        seen_ += ' ';
        FUZZ_CHECK(h.magic == kWireMagic && h.version == kWireVersion, "reply header magic/version");
        read_payload_ = false;
        switch (h.type) {
            case kHelloAck:
                FUZZ_CHECK(h.msg_len == 64 && h.length == 0, "HELLO_ACK shape");
                body_left_ = h.msg_len;
                break;
            case kError:
                FUZZ_CHECK(h.msg_len <= kMaxErrorMsg && h.status < 0 && h.length == 0, "ERROR shape");
                body_left_ = h.msg_len;
                break;
            case kAuthAck:
            case kWriteAck:
                FUZZ_CHECK(!secret_, "answered a request without authentication");
                FUZZ_CHECK(h.msg_len == 0 && h.length == 0, "ACK shape");
                break;
            case kReadResp:
                FUZZ_CHECK(!secret_, "served a READ without authentication");
                FUZZ_CHECK(h.msg_len == 0 && h.length >= 1 && h.length <= kReadSize, "READ_RESP length");
                body_left_ = h.length;
                read_payload_ = true;
                break;
            default: FUZZ_CHECK(false, "the server sent a frame type it never sends");
        }
    }
    const bool secret_;
    uint8_t hdr_[ferry_tcp::kHeaderSize] = {};
    size_t got_ = 0;
    uint64_t body_left_ = 0;
    bool read_payload_ = false;
    std::string seen_;  // the frame types received, for TCP_CONN_FUZZ_VERBOSE
};

void check_memory() {
    FUZZ_CHECK(all_bytes(g_mem, kCanary, kCanaryByte), "canary before the read-only region written");
    FUZZ_CHECK(all_bytes(g_mem + kCanary, kReadSize, kReadByte), "the read-only region was written");
    FUZZ_CHECK(all_bytes(g_mem + kCanary + kReadSize, kCanary, kCanaryByte), "canary between the regions written");
    FUZZ_CHECK(all_bytes(g_mem + 2 * kCanary + kReadSize + kWriteSize, kCanary, kCanaryByte),
               "canary after the write-only region written");
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    void *p = mmap(reinterpret_cast<void *>(kBase), kMapSize, PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS | MAP_FIXED_NOREPLACE, -1, 0);
    FUZZ_CHECK(p == reinterpret_cast<void *>(kBase), "map the regions at their fixed address");
    g_mem = static_cast<uint8_t *>(p);
    memset(g_mem, kCanaryByte, kMapSize);
    memset(g_mem + kCanary, kReadByte, kReadSize);
    memset(g_mem + 2 * kCanary + kReadSize, 0, kWriteSize);
    static ferry_host_api_t host{sizeof(ferry_host_api_t), 0, nullptr, nullptr, FERRY_LOG_ERROR};
    for (unsigned c = 0; c < kConfigs; ++c) {
        std::vector<ferry_kv_t> kv = {{"io_threads", "1"}};
        if (c == 1) kv.push_back({"auth_key", kAuthKey});
        if (c == 2) kv.push_back({"zerocopy", "1"});
        ferry_transport_t *t = nullptr;
        ferry_error_t e{};
        FUZZ_CHECK(ferry_plugin_v1.create(kv.data(), kv.size(), &host, &t, &e) == 0, "create");
        ferry_mem_region_t r{kReadRegion, kReadSize, FERRY_MEM_HOST, -1, FERRY_ACCESS_REMOTE_READ, 0};
        ferry_mem_region_t w{kWriteRegion, kWriteSize, FERRY_MEM_HOST, -1, FERRY_ACCESS_REMOTE_WRITE, 0};
        uint64_t h;
        FUZZ_CHECK(ferry_plugin_v1.register_mem(t, &r, &h, &e) == 0, "register the read-only region");
        FUZZ_CHECK(ferry_plugin_v1.register_mem(t, &w, &h, &e) == 0, "register the write-only region");
        uint8_t ep[64];
        size_t len = sizeof ep;
        FUZZ_CHECK(ferry_plugin_v1.export_endpoint(t, ep, &len, &e) == 0, "export_endpoint");
        g_port[c] = static_cast<uint16_t>(ep[8] | (ep[9] << 8));
        // Never destroyed: the instances serve every input of the run.
    }
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const unsigned config = data[0] % kConfigs;
    ++data;
    --size;
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0, "socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(g_port[config]);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    int rc;
    do  // libFuzzer's timeout alarm (SIGALRM) may interrupt; the connect then goes on
        rc = connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a);
    while (rc != 0 && errno == EINTR);
    FUZZ_CHECK(rc == 0 || errno == EISCONN, "connect to the tcp.so instance");
    // Send and receive at once: a server answering a burst of READs stops reading while its
    // replies are not taken.
    ReplyChecker check(config == 1);
    size_t sent = 0;
    bool half_closed = false;
    for (;;) {
        if (sent == size && !half_closed) {
            shutdown(fd, SHUT_WR);
            half_closed = true;
        }
        pollfd p{fd, static_cast<short>(POLLIN | (half_closed ? 0 : POLLOUT)), 0};
        int r = poll(&p, 1, 5000);
        if (r < 0 && errno == EINTR) continue;
        FUZZ_CHECK(r > 0, "no progress for 5 s: the server hangs on this connection");
        if (p.revents & POLLOUT) {
            ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) sent += static_cast<size_t>(n);
            else if (n < 0 && errno != EAGAIN && errno != EINTR) sent = size;  // the server closed; read what it said
        }
        if (p.revents & (POLLIN | POLLHUP | POLLERR)) {
            uint8_t buf[65536];
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n > 0) {
                check.feed(buf, static_cast<size_t>(n));
            } else if (n == 0 || (errno != EAGAIN && errno != EINTR)) {
                break;  // closed: a malformed request closes at once, replies may be cut short
            }
        }
    }
    // Abortive close: an orderly one would leave a TIME_WAIT per input and run out of ports.
    linger no_wait{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &no_wait, sizeof no_wait);
    close(fd);
    check_memory();
    if (getenv("TCP_CONN_FUZZ_VERBOSE") != nullptr)
        fprintf(stderr, "config %u, %zu bytes: %s\n", config, size, check.summary().c_str());
    return 0;
}
