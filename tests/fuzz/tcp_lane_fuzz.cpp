// tcp.so's initiating side (plugins/tcp/lane.cpp) fed by a fake server over a real socket: a
// real tcp.so instance in this process connects to a listening socket of this harness, which
// answers with the input's bytes. Byte 0 picks the mode:
//   0: the input is the server's answer to HELLO (HELLO_ACK, AUTH_ACK, ERROR, ...), then EOF;
//      the client has no key
//   1: the same, and the client has a cluster key (it must refuse any server proof the input
//      can hold: it cannot know the key)
//   2: the harness completes a correct handshake (no key), the client submits a fixed batch of
//      READs and WRITEs over one lane, and the input is the server's response stream, then EOF
// Invariants: no crash or hang; connect() never succeeds in mode 1; in mode 2 every op
// completes exactly once (within the guard) and READ_RESP bytes land only inside the READ ops'
// own destination ranges (the rest of the local buffer and the canaries around it never
// change). One instance and one harness thread for the whole run; every input's sockets are
// closed before the next.
#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>
#include <vector>

#include <ferry/plugin.h>

#include "fuzz_bytes.hpp"
#include "fuzz_check.hpp"
#include "wire.hpp"

extern "C" const ferry_plugin_v1_t ferry_plugin_v1;

namespace {

using namespace ferry_tcp;

constexpr size_t kCanary = 64 << 10, kLocal = 512 << 10;
constexpr uint8_t kCanaryByte = 0xC3, kLocalByte = 0x4C;
constexpr uint64_t kRemote = 0x10000000;  // the fake server's region: never touched here
struct Range {
    uint64_t off, len;
};
// The READ ops' destinations in the local buffer (the WRITEs read from elsewhere in it).
constexpr Range kReads[] = {{0, 4096}, {65536, 70000}, {300000, 8}};

const ferry_plugin_v1_t &api = ferry_plugin_v1;
ferry_transport_t *g_client[2] = {};
uint64_t g_local_handle[2] = {};
uint8_t *g_mem = nullptr;  // canary | local buffer | canary
int g_listen = -1;
std::vector<uint8_t> g_endpoint;

// Waits for `events` on fd; false after 5 s (the hang guard).
bool wait_fd(int fd, short events) {
    pollfd p{fd, events, 0};
    for (;;) {
        int r = poll(&p, 1, 5000);
        if (r < 0 && errno == EINTR) continue;
        return r > 0;
    }
}

bool read_exactly(int fd, void *buf, size_t n) {
    auto *b = static_cast<uint8_t *>(buf);
    while (n > 0) {
        if (!wait_fd(fd, POLLIN)) return false;
        ssize_t k = recv(fd, b, n, MSG_DONTWAIT);
        if (k < 0 && (errno == EAGAIN || errno == EINTR)) continue;
        if (k <= 0) return false;
        b += k;
        n -= static_cast<size_t>(k);
    }
    return true;
}

void send_all(int fd, const uint8_t *p, size_t n) {
    while (n > 0) {
        ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) return;  // the client closed: it read what it needed
        p += k;
        n -= static_cast<size_t>(k);
    }
}

void send_frame(int fd, uint8_t type, uint32_t msg_len = 0) {
    Header h;
    h.type = type;
    h.msg_len = msg_len;
    uint8_t b[kHeaderSize + 64] = {};
    encode_header(h, b);
    send_all(fd, b, kHeaderSize + msg_len);  // HELLO_ACK: zero nonce and proof (no key)
}

// Sends `data` while reading (and dropping) what the client sends, half-closes, and reads
// until the client closes. In mode 2 the completions are collected meanwhile.
void serve(int fd, const uint8_t *data, size_t size, ferry_transport_t *t, size_t want,
           std::vector<ferry_completion_t> *done) {
    size_t sent = 0;
    bool half = false, client_closed = false;
    int cfd = -1;
    ferry_error_t e{};
    if (t != nullptr) api.completion_fd(t, &cfd, &e);
    while (!client_closed || (t != nullptr && done->size() < want)) {
        if (sent == size && !half) {
            shutdown(fd, SHUT_WR);
            half = true;
        }
        pollfd p[2] = {{fd, static_cast<short>(client_closed ? 0 : (POLLIN | (half ? 0 : POLLOUT))), 0},
                       {cfd, POLLIN, 0}};
        int r = poll(p, cfd >= 0 ? 2 : 1, 5000);
        if (r < 0 && errno == EINTR) continue;
        FUZZ_CHECK(r > 0, "no progress for 5 s: the client hangs");
        if (p[0].revents & POLLOUT) {
            ssize_t n = send(fd, data + sent, size - sent, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) sent += static_cast<size_t>(n);
            else if (n < 0 && errno != EAGAIN && errno != EINTR) sent = size;
        }
        if (p[0].revents & (POLLIN | POLLHUP | POLLERR)) {
            uint8_t buf[65536];
            ssize_t n = recv(fd, buf, sizeof buf, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) client_closed = true;
        }
        if (cfd >= 0 && (p[1].revents & POLLIN)) {
            ferry_completion_t c[16];
            int k = api.poll(t, c, 16, &e);
            FUZZ_CHECK(k >= 0, "poll");
            done->insert(done->end(), c, c + k);
        }
    }
}

// The harness thread: accepts the client's connection and does the server's handshake, so
// that the main thread can sit in connect().
struct Harness {
    std::mutex mu;
    std::condition_variable cv;
    bool go = false, done = false;
    unsigned mode = 0;
    const uint8_t *data = nullptr;
    size_t size = 0;
    int fd = -1;  // mode 2: the accepted connection, handed to the main thread

    void run() {
        for (;;) {
            std::unique_lock lk(mu);
            cv.wait(lk, [&] { return go; });
            go = false;
            lk.unlock();
            FUZZ_CHECK(wait_fd(g_listen, POLLIN), "the client did not connect within 5 s");
            int c = accept4(g_listen, nullptr, nullptr, SOCK_CLOEXEC);
            FUZZ_CHECK(c >= 0, "accept");
            uint8_t hello[kHeaderSize + 32];
            FUZZ_CHECK(read_exactly(c, hello, sizeof hello), "the client's HELLO");
            if (mode == 2) {
                send_frame(c, kHelloAck, 64);
                uint8_t auth[kHeaderSize + 32];
                FUZZ_CHECK(read_exactly(c, auth, sizeof auth), "the client's AUTH");
                send_frame(c, kAuthAck);
            } else {
                serve(c, data, size, nullptr, 0, nullptr);
                close(c);
                c = -1;
            }
            lk.lock();
            fd = c;
            done = true;
            cv.notify_all();
        }
    }
};
// Never destroyed: its thread waits on the condition variable until the process exits.
Harness &g_harness = *new Harness;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    void *m = mmap(nullptr, kLocal + 2 * kCanary, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    FUZZ_CHECK(m != MAP_FAILED, "mmap");
    g_mem = static_cast<uint8_t *>(m);
    memset(g_mem, kCanaryByte, kLocal + 2 * kCanary);
    memset(g_mem + kCanary, kLocalByte, kLocal);
    g_listen = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    socklen_t len = sizeof a;
    FUZZ_CHECK(bind(g_listen, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 && listen(g_listen, 16) == 0 &&
                   getsockname(g_listen, reinterpret_cast<sockaddr *>(&a), &len) == 0,
               "the fake server's listening socket");
    static ferry_host_api_t host{sizeof(ferry_host_api_t), 0, nullptr, nullptr, FERRY_LOG_ERROR};
    if (getenv("TCP_LANE_FUZZ_VERBOSE") != nullptr) {
        host.log = [](void *, int level, const char *, const char *m) { fprintf(stderr, "[tcp %d] %s\n", level, m); };
        host.log_level = FERRY_LOG_DEBUG;
    }
    for (int k = 0; k < 2; ++k) {
        std::vector<ferry_kv_t> kv = {{"io_threads", "1"},
                                      {"lanes", "1"},
                                      {"slice_size", "64k"},
                                      {"connect_timeout_ms", "5000"},
                                      {"op_timeout_ms", "5000"}};
        if (k == 1) kv.push_back({"auth_key", "00112233445566778899aabbccddeeff00112233445566778899aabbccddeeff"});
        ferry_error_t e{};
        FUZZ_CHECK(api.create(kv.data(), kv.size(), &host, &g_client[k], &e) == 0, "create");
        ferry_mem_region_t r{reinterpret_cast<uint64_t>(g_mem + kCanary), kLocal, FERRY_MEM_HOST, -1, 0, 0};
        FUZZ_CHECK(api.register_mem(g_client[k], &r, &g_local_handle[k], &e) == 0, "register_mem");
        if (k == 0) {  // the endpoint of this harness: a tcp.so endpoint with our port
            uint8_t ep[64];
            size_t n = sizeof ep;
            FUZZ_CHECK(api.export_endpoint(g_client[k], ep, &n, &e) == 0, "export_endpoint");
            g_endpoint.assign(ep, ep + n);
            g_endpoint[8] = static_cast<uint8_t>(ntohs(a.sin_port));
            g_endpoint[9] = static_cast<uint8_t>(ntohs(a.sin_port) >> 8);
        }
    }
    std::thread([] { g_harness.run(); }).detach();
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size == 0) return 0;
    const unsigned mode = data[0] % 3;
    ferry_transport_t *t = g_client[mode == 1 ? 1 : 0];
    {
        std::lock_guard lk(g_harness.mu);
        g_harness.mode = mode;
        g_harness.data = data + 1;
        g_harness.size = size - 1;
        g_harness.done = false;
        g_harness.go = true;
    }
    g_harness.cv.notify_all();
    ferry_error_t e{};
    uint64_t peer = 0;
    int rc = api.connect(t, g_endpoint.data(), g_endpoint.size(), &peer, &e);
    int fd;
    {
        std::unique_lock lk(g_harness.mu);
        g_harness.cv.wait(lk, [] { return g_harness.done; });
        fd = g_harness.fd;
    }
    if (getenv("TCP_LANE_FUZZ_VERBOSE") != nullptr)
        fprintf(stderr, "mode %u: connect %d %s\n", mode, rc, rc != 0 ? e.message : "");
    if (mode == 1) FUZZ_CHECK(rc != 0, "connected to a server that cannot know the cluster key");
    if (mode == 2) {
        FUZZ_CHECK(rc == 0 && fd >= 0, "connect after a correct handshake");
        ferry_mem_region_t rr{
            kRemote, 1 << 20, FERRY_MEM_HOST, -1, FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE, 0};
        uint64_t rmem;
        FUZZ_CHECK(api.import_mem(t, peer, &rr, nullptr, 0, &rmem, &e) == 0, "import_mem");
        const uint64_t base = reinterpret_cast<uint64_t>(g_mem + kCanary);
        const uint64_t lh = g_local_handle[0];
        std::vector<ferry_xfer_op_t> ops;
        auto op = [&](uint32_t code, uint64_t off, uint64_t len, uint64_t remote_off) {
            ferry_xfer_op_t o{};
            o.opcode = code;
            o.local_addr = base + off;
            o.local_mem = lh;
            o.remote_addr = kRemote + remote_off;
            o.remote_mem = rmem;
            o.length = len;
            o.user_data = ops.size();
            ops.push_back(o);
        };
        op(FERRY_OP_READ, kReads[0].off, kReads[0].len, 0);
        op(FERRY_OP_WRITE, 8192, 4096, 4096);
        op(FERRY_OP_WRITE, 16384, 16, 8192);
        op(FERRY_OP_READ, kReads[1].off, kReads[1].len, 65536);
        op(FERRY_OP_READ, kReads[2].off, kReads[2].len, 300000);
        FUZZ_CHECK(api.submit(t, peer, ops.data(), ops.size(), &e) == 0, "submit");
        // The responses go out once every request is in (6 headers, 4096 + 16 WRITE bytes): a
        // response before its request is a protocol error, the input's to make, not a race's.
        std::vector<uint8_t> requests(6 * kHeaderSize + 4096 + 16);
        FUZZ_CHECK(read_exactly(fd, requests.data(), requests.size()), "the client's requests");
        std::vector<ferry_completion_t> done;
        serve(fd, data + 1, size - 1, t, ops.size(), &done);
        close(fd);
        FUZZ_CHECK(done.size() == ops.size(), "every op completes exactly once");
        std::set<uint64_t> seen;
        for (const auto &c : done) {
            FUZZ_CHECK(c.user_data < ops.size() && seen.insert(c.user_data).second, "a completion per op");
            if (getenv("TCP_LANE_FUZZ_VERBOSE") != nullptr)
                fprintf(stderr, "op %llu: %d %s\n", static_cast<unsigned long long>(c.user_data), c.status, c.message);
        }
    }
    if (rc == 0) api.disconnect(t, peer, &e);  // the lane is closed when this returns
    // Nothing outside the READ destinations changed; put those back for the next input.
    FUZZ_CHECK(all_bytes(g_mem, kCanary, kCanaryByte) && all_bytes(g_mem + kCanary + kLocal, kCanary, kCanaryByte),
               "bytes written outside the registered local buffer");
    uint64_t at = 0;
    for (const Range &r : kReads) {
        FUZZ_CHECK(all_bytes(g_mem + kCanary + at, r.off - at, kLocalByte),
                   "bytes written outside the READ destinations");
        memset(g_mem + kCanary + r.off, kLocalByte, r.len);
        at = r.off + r.len;
    }
    FUZZ_CHECK(all_bytes(g_mem + kCanary + at, kLocal - at, kLocalByte), "bytes written outside the READ destinations");
    return 0;
}
