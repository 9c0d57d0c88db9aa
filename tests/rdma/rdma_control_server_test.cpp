// rdma.so's control server against peers that do not follow the protocol: real sockets on
// 127.0.0.1, the real server thread, no RDMA hardware needed (it serves the handshake and hands
// authenticated requests to a handler, here an echo).
#include "control_server.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <poll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ferry_rdma {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

const uint8_t kLoopback[4] = {127, 0, 0, 1};

struct CountingHost {
    ferry_host_api_t api{};
    std::atomic<int> lines{0};
    std::mutex mu;
    std::string last;
    CountingHost() {
        api.struct_size = sizeof api;
        api.ctx = this;
        api.log_level = FERRY_LOG_DEBUG;
        api.log = [](void *ctx, int, const char *, const char *message) {
            auto *self = static_cast<CountingHost *>(ctx);
            self->lines++;
            std::lock_guard lock(self->mu);
            self->last = message;
        };
    }
};

// A server on an ephemeral port whose handler answers every authenticated request.
struct Server {
    explicit Server(ControlLimits limits, std::string key = "") : key_(std::move(key)), log_(&host.api, "rdma") {
        std::string why;
        EXPECT_EQ(listen_tcp("127.0.0.1", 0, &fd_, &port, &why), 0) << why;
        server_ = std::make_unique<ControlServer>(
            fd_, &key_, limits, log_, [](ServedConn &c, const CtrlHeader &h, const std::vector<uint8_t> &b) {
                CtrlHeader reply;
                reply.type = static_cast<uint16_t>(h.type + 1);
                reply.req_id = h.req_id;
                std::string why;
                return send_msg(c.fd, reply, b, 2000, &why) == 0;
            });
        EXPECT_EQ(server_->start(&why), 0) << why;
    }
    ~Server() {
        server_.reset();
        close(fd_);
    }
    // 0 after a full handshake, else the client's error (why says it).
    int authenticate(int *out, std::string *why, const std::string &key = "") const {
        int fd = -1;
        if (int rc = connect_tcp(kLoopback, port, 2000, &fd, why); rc != 0) return rc;
        int rc = auth_client(fd, key, 3000, why);
        if (rc != 0 || out == nullptr) close(fd);
        else *out = fd;
        return rc;
    }
    bool wait_connections(size_t n, std::chrono::milliseconds limit) const {
        auto end = Clock::now() + limit;
        while (server_->connections() != n && Clock::now() < end) std::this_thread::sleep_for(5ms);
        return server_->connections() == n;
    }

    CountingHost host;
    uint16_t port = 0;
    std::string key_;
    Logger log_;
    int fd_ = -1;
    std::unique_ptr<ControlServer> server_;
};

int raw_connect(uint16_t port) {
    int fd = -1;
    std::string why;
    EXPECT_EQ(connect_tcp(kLoopback, port, 2000, &fd, &why), 0) << why;
    return fd;
}

// Everything the server sends until it closes, or "(open)" if it is still open at the limit.
std::string read_until_closed(int fd, std::chrono::milliseconds limit) {
    std::string got;
    auto end = Clock::now() + limit;
    for (;;) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(end - Clock::now()).count();
        pollfd p{fd, POLLIN, 0};
        if (left <= 0 || poll(&p, 1, static_cast<int>(left)) <= 0) return got + "(open)";
        char buf[512];
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n <= 0) return got;
        got.append(buf, static_cast<size_t>(n));
    }
}

TEST(RdmaControlServer, SilentConnectionsAreClosedAtTheHandshakeDeadline) {
    ControlLimits limits;
    limits.handshake_timeout_ms = 300;
    Server s(limits);
    std::vector<int> fds;
    for (int i = 0; i < 20; ++i) fds.push_back(raw_connect(s.port));
    for (int fd : fds) {
        std::string got = read_until_closed(fd, 10s);
        EXPECT_EQ(got.find("(open)"), std::string::npos) << "a silent connection outlived the handshake deadline";
        EXPECT_NE(got.find("no handshake within 300 ms"), std::string::npos) << got;
        close(fd);
    }
    EXPECT_TRUE(s.wait_connections(0, 5s));
}

TEST(RdmaControlServer, PerAddressCapRefusesWithAReasonAndFreesUpAtTheDeadline) {
    ControlLimits limits;
    limits.handshake_timeout_ms = 500;
    limits.max_unauthenticated_per_address = 8;
    Server s(limits);
    std::vector<int> idle;
    for (int i = 0; i < 50; ++i) idle.push_back(raw_connect(s.port));
    ASSERT_TRUE(s.wait_connections(8, 5s)) << s.server_->connections();
    std::string why;
    int rc = s.authenticate(nullptr, &why);
    EXPECT_EQ(rc, -EBUSY) << why;
    EXPECT_NE(why.find("still in their handshake (rdma.max_unauthenticated_per_address)"), std::string::npos) << why;
    EXPECT_LE(s.server_->connections(), 8u);
    // Once the idle ones hit their deadline an honest peer gets in and is served.
    ASSERT_TRUE(s.wait_connections(0, 10s));
    int fd = -1;
    ASSERT_EQ(s.authenticate(&fd, &why), 0) << why;
    CtrlHeader q;
    q.type = static_cast<uint16_t>(CtrlType::Query);
    q.req_id = 7;
    ASSERT_EQ(send_msg(fd, q, std::vector<uint8_t>(16, 0), 2000, &why), 0) << why;
    CtrlHeader r;
    std::vector<uint8_t> body;
    ASSERT_EQ(recv_msg(fd, &r, &body, 2000, &why), 0) << why;
    EXPECT_EQ(r.type, static_cast<uint16_t>(CtrlType::QueryReply));
    EXPECT_EQ(r.req_id, 7u);
    close(fd);
    for (int f : idle) close(f);
}

TEST(RdmaControlServer, TotalCapRefusesWithAReasonAndAuthenticatedPeersStay) {
    ControlLimits limits;
    limits.max_connections = 4;
    limits.handshake_timeout_ms = 200;
    Server s(limits, "0123456789abcdef0123456789abcdef");
    std::vector<int> ok;
    std::string why;
    for (int i = 0; i < 4; ++i) {
        int fd = -1;
        ASSERT_EQ(s.authenticate(&fd, &why, s.key_), 0) << why;
        ok.push_back(fd);
    }
    EXPECT_EQ(s.authenticate(nullptr, &why, s.key_), -EBUSY);
    EXPECT_NE(why.find("already has 4 connections (max_control_connections)"), std::string::npos) << why;
    // Authenticated connections carry queue pairs: no deadline closes them.
    std::this_thread::sleep_for(400ms);
    EXPECT_EQ(s.server_->connections(), 4u);
    for (int fd : ok) close(fd);
    ASSERT_TRUE(s.wait_connections(0, 5s));
    EXPECT_EQ(s.authenticate(nullptr, &why, s.key_), 0) << why;
}

TEST(RdmaControlServer, AWrongKeyIsRefusedAndClosed) {
    Server s(ControlLimits{}, "0123456789abcdef0123456789abcdef");
    std::string why;
    EXPECT_EQ(s.authenticate(nullptr, &why, "another key of 32 bytes at least!"), -EACCES) << why;
    EXPECT_TRUE(s.wait_connections(0, 5s));
}

TEST(RdmaControlServer, ASlowPeerDoesNotStallOthers) {
    ControlLimits limits;
    limits.handshake_timeout_ms = 20000;
    Server s(limits);
    int slow = raw_connect(s.port);
    uint8_t head[kCtrlHeaderSize];
    CtrlHeader h;
    h.type = static_cast<uint16_t>(CtrlType::Hello);
    h.body_len = kNonceSize + 1;
    encode_header(h, head);
    ASSERT_EQ(send(slow, head, 10, MSG_NOSIGNAL), 10);  // part of a header, then nothing
    std::this_thread::sleep_for(50ms);
    auto t0 = Clock::now();
    std::string why;
    EXPECT_EQ(s.authenticate(nullptr, &why), 0) << why;
    EXPECT_LT(Clock::now() - t0, 2s) << "an honest handshake waited behind a stalled peer";
    close(slow);
}

TEST(RdmaControlServer, OversizedMessageBeforeAuthenticationDropsTheConnection) {
    Server s(ControlLimits{});
    int fd = raw_connect(s.port);
    uint8_t head[kCtrlHeaderSize];
    CtrlHeader h;
    h.type = static_cast<uint16_t>(CtrlType::Hello);
    h.body_len = kMaxCtrlBody;
    encode_header(h, head);
    ASSERT_EQ(send(fd, head, sizeof head, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof head));
    EXPECT_EQ(read_until_closed(fd, 5s).find("(open)"), std::string::npos);
    close(fd);
    EXPECT_TRUE(s.wait_connections(0, 5s));
}

TEST(RdmaControlServer, GarbageConnectionsAreLoggedAtMostOncePerInterval) {
    Server s(ControlLimits{});
    const char garbage[] = "GET / HTTP/1.1\r\nHost: x\r\n\r\n";
    for (int i = 0; i < 200; ++i) {
        int fd = raw_connect(s.port);
        ASSERT_EQ(send(fd, garbage, sizeof garbage - 1, MSG_NOSIGNAL), static_cast<ssize_t>(sizeof garbage - 1));
        EXPECT_EQ(read_until_closed(fd, 5s).find("(open)"), std::string::npos);
        close(fd);
    }
    EXPECT_TRUE(s.wait_connections(0, 5s));
    EXPECT_GE(s.host.lines.load(), 1);
    EXPECT_LE(s.host.lines.load(), 2) << "last line: " << s.host.last;
}

// Out of descriptors, the server must pause accepting, not spin on a listener that stays
// readable. Runs in a child whose open-file limit is lowered; the child reports its CPU time.
TEST(RdmaControlServer, OutOfDescriptorsPausesInsteadOfSpinning) {
    int report[2];
    ASSERT_EQ(pipe(report), 0);
    int port_pipe[2];
    ASSERT_EQ(pipe(port_pipe), 0);
    pid_t child = fork();
    ASSERT_GE(child, 0);
    if (child == 0) {
        close(report[0]);
        close(port_pipe[0]);
        {
            ControlLimits limits;
            limits.max_unauthenticated_per_address = 1000;  // descriptors, not the cap, run out
            limits.handshake_timeout_ms = 60000;
            Server s(limits);
            // Exactly 8 free descriptor numbers below the limit (new descriptors take the lowest
            // free numbers): the flood below runs the server out of them.
            int limit = 0;
            for (int free_slots = 0; free_slots < 8; ++limit) free_slots += fcntl(limit, F_GETFD) == -1 ? 1 : 0;
            rlimit lim{static_cast<rlim_t>(limit), static_cast<rlim_t>(limit)};
            setrlimit(RLIMIT_NOFILE, &lim);
            (void)!write(port_pipe[1], &s.port, sizeof s.port);
            rusage before{};
            getrusage(RUSAGE_SELF, &before);
            std::this_thread::sleep_for(3s);
            rusage after{};
            getrusage(RUSAGE_SELF, &after);
            auto us = [](const rusage &r) {
                return (r.ru_utime.tv_sec + r.ru_stime.tv_sec) * 1000000L + r.ru_utime.tv_usec + r.ru_stime.tv_usec;
            };
            long out[2] = {us(after) - us(before), s.host.lines.load()};
            (void)!write(report[1], out, sizeof out);
        }
        _exit(0);
    }
    close(report[1]);
    close(port_pipe[1]);
    uint16_t port = 0;
    ASSERT_EQ(read(port_pipe[0], &port, sizeof port), static_cast<ssize_t>(sizeof port));
    std::vector<int> fds;
    for (int i = 0; i < 60; ++i) fds.push_back(raw_connect(port));  // the kernel completes them: the backlog holds them
    long got[2] = {-1, -1};
    EXPECT_EQ(read(report[0], got, sizeof got), static_cast<ssize_t>(sizeof got));
    int status = 0;
    waitpid(child, &status, 0);
    for (int fd : fds) close(fd);
    close(report[0]);
    close(port_pipe[0]);
    EXPECT_LT(got[0], 200000) << "the server used " << got[0] << " us of CPU in 3 s out of descriptors";
    EXPECT_GE(got[1], 1) << "running out of descriptors was not logged";
    EXPECT_LE(got[1], 3) << "log lines while out of descriptors: " << got[1];
}

}  // namespace
}  // namespace ferry_rdma
