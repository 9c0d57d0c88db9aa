// Helpers of the tcp.so flood and stop tests: raw connections from a chosen source address,
// a child's descriptors and CPU time from /proc, a log that counts lines. Every wait has a
// hang guard.
#pragma once

#include "../transport/harness.hpp"

#include <ferry/plugin.h>

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <mutex>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

namespace ferry_fault {

inline std::string flood_plugin_path() {
    const char *e = std::getenv("FERRY_TEST_TCP_PLUGIN");
    return e != nullptr && *e != '\0' ? e : FERRY_TEST_TCP_PLUGIN;
}

// FERRY_TEST_TCP_BASELINE=1 (with FERRY_TEST_TCP_PLUGIN pointing at an older tcp.so, from before
// these limit options) drops them, to measure how an older build behaves.
inline ferry_test::Options limit_options(ferry_test::Options o) {
    if (std::getenv("FERRY_TEST_TCP_BASELINE") == nullptr) return o;
    ferry_test::Options kept;
    for (auto &kv : o)
        if (kv.first.rfind("handshake_timeout_ms", 0) != 0 && kv.first.rfind("max_", 0) != 0) kept.push_back(kv);
    return kept;
}

inline uint16_t endpoint_port(const std::vector<uint8_t> &ep) {
    return static_cast<uint16_t>(ep[8] | (ep[9] << 8));  // tcp endpoint: port at offset 8, LE
}

// A HELLO without a cluster key (plugins/tcp/wire.hpp), encoded here independently.
inline std::vector<uint8_t> hello_frame() {
    std::vector<uint8_t> f(40 + 32, 0);
    const uint32_t magic = 0x59525246u;
    memcpy(f.data(), &magic, 4);  // little-endian hosts only, like the wire
    f[4] = 2;                     // version
    f[6] = 1;                     // HELLO
    f[12] = 32;                   // msg_len: the client nonce
    return f;
}

// A blocking TCP connection from `src` (any 127.x address is this host) to 127.0.0.1:port.
class Conn {
public:
    Conn() = default;
    static Conn open(const char *src, uint16_t port) {
        Conn c;
        c.fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        if (c.fd_ < 0) return c;
        sockaddr_in a{};
        a.sin_family = AF_INET;
        inet_pton(AF_INET, src, &a.sin_addr);
        if (bind(c.fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) return c;
        a.sin_port = htons(port);
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        c.ok_ = ::connect(c.fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
        return c;
    }
    Conn(Conn &&o) noexcept : fd_(o.fd_), ok_(o.ok_) { o.fd_ = -1; }
    Conn &operator=(Conn &&o) noexcept {
        std::swap(fd_, o.fd_);
        std::swap(ok_, o.ok_);
        return *this;
    }
    ~Conn() {
        if (fd_ >= 0) close(fd_);
    }
    bool ok() const { return ok_; }
    bool send(const void *p, size_t n) {
        auto *b = static_cast<const uint8_t *>(p);
        while (n > 0) {
            ssize_t k = ::send(fd_, b, n, MSG_NOSIGNAL);
            if (k <= 0) return false;
            b += k;
            n -= static_cast<size_t>(k);
        }
        return true;
    }
    // Reads until the other side closed (EOF or reset): true, with what it sent in *got; false
    // when it is still open after guard_ms.
    bool read_until_closed(std::string *got, int guard_ms) {
        auto end = std::chrono::steady_clock::now() + std::chrono::milliseconds(guard_ms);
        for (;;) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - std::chrono::steady_clock::now());
            pollfd pf{fd_, POLLIN, 0};
            if (::poll(&pf, 1, static_cast<int>(std::max<int64_t>(left.count(), 0))) <= 0) return false;
            char b[4096];
            ssize_t n = recv(fd_, b, sizeof b, MSG_DONTWAIT);
            if (n < 0 && (errno == EAGAIN || errno == EINTR)) continue;
            if (n <= 0) return true;
            got->append(b, static_cast<size_t>(n));
        }
    }

private:
    int fd_ = -1;
    bool ok_ = false;
};

inline size_t fd_count(pid_t pid) {
    size_t n = 0;
    std::string dir = "/proc/" + std::to_string(pid) + "/fd";
    if (DIR *d = opendir(dir.c_str())) {
        while (dirent *e = readdir(d))
            if (e->d_name[0] != '.') ++n;
        closedir(d);
    }
    return n;
}

// User + system CPU time of a running process (/proc/<pid>/stat fields 14 and 15).
inline double cpu_seconds(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::istringstream rest(all.substr(all.rfind(')') + 2));  // after "(comm) "
    std::string f;
    unsigned long long utime = 0, stime = 0;
    for (int i = 3; i <= 15 && rest >> f; ++i) {
        if (i == 14) utime = std::stoull(f);
        if (i == 15) stime = std::stoull(f);
    }
    return static_cast<double>(utime + stime) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

inline bool set_nofile(pid_t pid, rlim_t n) {
    rlimit rl{n, n};
    return prlimit(pid, RLIMIT_NOFILE, &rl, nullptr) == 0;
}

// The flood tests hold over a thousand sockets in this process.
inline void raise_own_nofile(rlim_t want) {
    rlimit rl{};
    getrlimit(RLIMIT_NOFILE, &rl);
    if (rl.rlim_cur < want) {
        rl.rlim_cur = std::min(want, rl.rlim_max);
        setrlimit(RLIMIT_NOFILE, &rl);
    }
}

// Retries fn (which returns "" on success, else what failed) until it succeeds or 20 s pass:
// for state the target releases asynchronously (a closed connection's slot).
inline std::string eventually(const std::function<std::string()> &fn) {
    auto guard = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    std::string r = fn();
    while (!r.empty() && std::chrono::steady_clock::now() < guard) {
        std::this_thread::sleep_for(std::chrono::milliseconds(100));
        r = fn();
    }
    return r;
}

// A host that keeps every log line at WARN and above.
class CountingLog {
public:
    CountingLog() { host_ = {sizeof(ferry_host_api_t), 0, this, &CountingLog::log, FERRY_LOG_WARN}; }
    ferry_host_api_t *host() { return &host_; }
    std::vector<std::string> lines() {
        std::lock_guard lk(mu_);
        return lines_;
    }

private:
    static void log(void *ctx, int, const char *, const char *message) {
        auto *self = static_cast<CountingLog *>(ctx);
        std::lock_guard lk(self->mu_);
        self->lines_.emplace_back(message);
    }
    ferry_host_api_t host_{};
    std::mutex mu_;
    std::vector<std::string> lines_;
};

}  // namespace ferry_fault
