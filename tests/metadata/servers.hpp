// Real metadata servers for the Redis and HTTP metadata tests, each a child process on 127.0.0.1:
// Debian's redis-server (FERRY_REDIS_BIN) and tests/metadata/http_metadata_server.py (Mooncake's
// protocol, aiohttp) run with /usr/bin/python3, plus small canned TCP servers that answer wrongly
// on purpose. Ports come from 13000-16999 (below the kernel's ephemeral range, apart from
// etcd_test's 23000-31000), a window per test process, each probed with bind() before use.
#pragma once

#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "ferry/engine.hpp"
#include "metadata/kv_store.hpp"
#include "metadata/redis_client.hpp"
#include "test_util.hpp"

namespace ferry::test::metadata {

using Clock = std::chrono::steady_clock;

inline bool port_free(uint16_t port) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    int one = 1;
    setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    bool ok = bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
    close(fd);
    return ok;
}

inline uint16_t pick_port() {
    static uint16_t next = static_cast<uint16_t>(13000 + (getpid() % 500) * 8);
    for (int i = 0; i < 4000; ++i) {
        uint16_t p = next;
        next = next >= 16999 ? 13000 : next + 1;
        if (port_free(p)) return p;
    }
    return 0;
}

// Waits (bounded) for `check` to hold.
inline bool eventually(const std::function<bool()> &check, std::chrono::milliseconds limit = std::chrono::seconds(10)) {
    auto deadline = Clock::now() + limit;
    while (Clock::now() < deadline) {
        if (check()) return true;
        std::this_thread::sleep_for(std::chrono::milliseconds(50));  // a store changes on its own: nothing to wait on
    }
    return check();
}

// A child process started from prebuilt argv (only async-signal-safe calls between fork and exec).
class Child {
public:
    ~Child() { stop(); }
    // stdout to `out_fd` (-1: the log file), stderr to the log file.
    bool spawn(std::vector<std::string> args, const std::string &log, int out_fd = -1) {
        std::vector<char *> argv;
        for (auto &a : args) argv.push_back(a.data());
        argv.push_back(nullptr);
        int log_fd = open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
        pid_ = fork();
        if (pid_ == 0) {
            dup2(out_fd >= 0 ? out_fd : log_fd, 1);
            dup2(log_fd, 2);
            execv(argv[0], argv.data());
            _exit(127);
        }
        if (log_fd >= 0) close(log_fd);
        return pid_ > 0;
    }
    void stop() {
        if (pid_ > 0) {
            kill(pid_, SIGKILL);
            waitpid(pid_, nullptr, 0);
            pid_ = -1;
        }
    }
    bool running() const { return pid_ > 0 && waitpid(pid_, nullptr, WNOHANG) == 0; }

private:
    pid_t pid_ = -1;
};

// One redis-server, no persistence: a restart loses every key.
class RedisServer {
public:
    explicit RedisServer(std::vector<std::string> extra = {}) : port_(pick_port()), extra_(std::move(extra)) {}
    static std::string missing() {
        if (access(FERRY_REDIS_BIN, X_OK) != 0) return "redis-server not found (apt-get install redis-server)";
        if (!hiredis_error().empty()) return hiredis_error();
        return "";
    }
    uint16_t port() const { return port_; }
    std::string url(const std::string &tail = "") const { return "redis://127.0.0.1:" + std::to_string(port_) + tail; }

    bool start() {
        std::vector<std::string> args = {FERRY_REDIS_BIN,
                                         "--port",
                                         std::to_string(port_),
                                         "--bind",
                                         "127.0.0.1",
                                         "--save",
                                         "",
                                         "--appendonly",
                                         "no",
                                         "--dir",
                                         dir_.path().string()};
        args.insert(args.end(), extra_.begin(), extra_.end());
        if (!child_.spawn(args, (dir_ / "redis.log").string())) return false;
        // Ready once it answers (PONG, or NOAUTH when it wants a password).
        return eventually([&] { return answers(); }, std::chrono::seconds(10));
    }
    void stop() { child_.stop(); }
    std::string log() const {
        int status;
        return run_command("tail -5 " + (dir_ / "redis.log").string(), &status);
    }

private:
    bool answers() const {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port_);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        char buf[16] = {};
        bool ok = connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0 && write(fd, "PING\r\n", 6) == 6;
        pollfd p{fd, POLLIN, 0};
        ok = ok && poll(&p, 1, 1000) == 1 && read(fd, buf, sizeof buf - 1) > 0 && (buf[0] == '+' || buf[0] == '-');
        close(fd);
        return ok;
    }

    uint16_t port_;
    std::vector<std::string> extra_;
    TempDir dir_;
    Child child_;
};

// tests/metadata/http_metadata_server.py; keeps its port over restarts (which lose every key).
class HttpMetadataServer {
public:
    HttpMetadataServer() : port_(pick_port()) {}
    static std::string missing() {
        int status;
        run_command("/usr/bin/python3 -c 'import aiohttp' 2>/dev/null", &status);
        if (status != 0) return "aiohttp not found for /usr/bin/python3 (apt-get install python3-aiohttp)";
        return "";
    }
    uint16_t port() const { return port_; }
    std::string url(const std::string &path = "/metadata") const {
        return "http://127.0.0.1:" + std::to_string(port_) + path;
    }

    // Ready when it prints its READY line.
    bool start() {
        int pipefd[2];
        if (pipe2(pipefd, O_CLOEXEC) != 0) return false;
        bool spawned = child_.spawn({"/usr/bin/python3", FERRY_HTTP_METADATA_SERVER, "--port", std::to_string(port_)},
                                    (dir_ / "server.log").string(), pipefd[1]);
        close(pipefd[1]);
        std::string line;
        auto deadline = Clock::now() + std::chrono::seconds(15);
        while (spawned && line.find('\n') == std::string::npos && Clock::now() < deadline) {
            pollfd p{pipefd[0], POLLIN, 0};
            if (poll(&p, 1, 200) != 1) continue;
            char buf[256];
            ssize_t n = read(pipefd[0], buf, sizeof buf);
            if (n <= 0) break;
            line.append(buf, n);
        }
        close(pipefd[0]);
        return line.rfind("READY http://127.0.0.1:" + std::to_string(port_) + "/metadata", 0) == 0;
    }
    void stop() { child_.stop(); }

private:
    uint16_t port_;
    TempDir dir_;
    Child child_;
};

// A TCP server on 127.0.0.1 that answers every connection with `head` and `repeat` times `reply`
// (after reading what the client sent first, unless `reply` is empty: then it reads and never
// answers), then closes, with a reset when `reset` is set (the client's next write then fails).
class CannedServer {
public:
    explicit CannedServer(std::string reply, size_t repeat = 1, bool reset = false, std::string head = "")
        : reply_(std::move(reply)), head_(std::move(head)), repeat_(repeat), reset_(reset) {
        fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        socklen_t len = sizeof a;
        bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a);
        listen(fd_, 16);
        getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &len);
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { serve(); });
    }
    ~CannedServer() {
        stop_ = true;
        shutdown(fd_, SHUT_RDWR);
        thread_.join();
        close(fd_);
    }
    uint16_t port() const { return port_; }
    size_t connections() const { return connections_; }

private:
    void serve() {
        std::vector<int> held;
        while (!stop_) {
            pollfd p{fd_, POLLIN, 0};
            if (poll(&p, 1, 50) != 1) continue;
            int c = accept4(fd_, nullptr, nullptr, SOCK_CLOEXEC);
            if (c < 0) continue;
            ++connections_;
            char buf[4096];
            pollfd q{c, POLLIN, 0};
            if (poll(&q, 1, 2000) == 1) (void)!read(c, buf, sizeof buf);
            if (reply_.empty()) {
                held.push_back(c);  // silent: the client must give up on its own
                continue;
            }
            bool sent = head_.empty() || send(c, head_.data(), head_.size(), MSG_NOSIGNAL) >= 0;
            for (size_t i = 0; sent && i < repeat_ && !stop_; ++i)
                if (send(c, reply_.data(), reply_.size(), MSG_NOSIGNAL) < 0) break;
            if (reset_) {
                linger l{1, 0};
                setsockopt(c, SOL_SOCKET, SO_LINGER, &l, sizeof l);
            }
            close(c);
        }
        for (int c : held) close(c);
    }

    std::string reply_, head_;
    size_t repeat_;
    bool reset_;
    int fd_ = -1;
    uint16_t port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<size_t> connections_{0};
    std::thread thread_;
};

inline Result<void> transfer(Engine &e, Opcode op, void *local, SegmentId seg, uint64_t remote, uint64_t length) {
    std::vector<Request> r = {{op, local, seg, remote, length, ""}};
    auto b = e.submit(r);
    if (!b) return std::unexpected(b.error());
    auto w = e.wait(*b, std::chrono::seconds(20));
    (void)e.free_batch(*b);
    return w;
}

inline bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

// The store as an engine would reach it, for reading and planting keys.
inline std::unique_ptr<KvStore> raw_store(const std::string &url, RedisSettings redis = {}) {
    MetadataSettings s;
    s.url = url;
    s.timeout = std::chrono::milliseconds(3000);
    s.redis = std::move(redis);
    auto store = make_kv_store(s);
    EXPECT_TRUE(store) << store.error().message;
    return store ? std::move(*store) : nullptr;
}

}  // namespace ferry::test::metadata
