// shm.so's serving side against initiators that do not follow the protocol: answers
// never read, connections that never send a Hello, too many connections, a target
// out of descriptors, and garbage that must not flood the log. Targets are real child processes
// (ChildPeer) where the test measures them, in-process instances where it reads their log.
#include "../transport/harness.hpp"
#include "../transport/peer_process.hpp"
#include "shm_raw.hpp"

#include <gtest/gtest.h>

#include <fcntl.h>
#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <fstream>
#include <memory>
#include <mutex>
#include <sstream>
#include <thread>

#ifdef FERRY_TEST_SHM_PLUGIN

using namespace ferry_test;
using ferry_fault::RawShm;
using Clock = std::chrono::steady_clock;

namespace {

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;

uint64_t rss_kib(pid_t pid) {
    std::ifstream in("/proc/" + std::to_string(pid) + "/status");
    std::string line;
    while (std::getline(in, line))
        if (line.rfind("VmRSS:", 0) == 0) return std::stoull(line.substr(6));
    return 0;
}

double cpu_seconds(pid_t pid) {  // utime + stime of the whole process
    std::ifstream in("/proc/" + std::to_string(pid) + "/stat");
    std::string s((std::istreambuf_iterator<char>(in)), {});
    std::istringstream rest(s.substr(s.rfind(')') + 2));
    std::string f;
    unsigned long long ut = 0, st = 0;
    for (int i = 3; i <= 15 && rest >> f; ++i) {
        if (i == 14) ut = std::stoull(f);
        if (i == 15) st = std::stoull(f);
    }
    return static_cast<double>(ut + st) / static_cast<double>(sysconf(_SC_CLK_TCK));
}

// Requests that are refused (outside every region): each is answered with a message.
ferry_shm::Request refused_request(uint64_t id) {
    ferry_shm::Request r{};
    r.id = id;
    r.opcode = FERRY_OP_WRITE;
    r.local_fd = -1;
    r.remote_addr = 16;
    r.length = 8;
    r.local_addr = 16;
    return r;
}

TEST(ShmLimits, AnswersNeverReadDoNotGrowTheTarget) {
    ChildPeer target(FERRY_TEST_SHM_PLUGIN, 1 << 20, kRW, {});
    ASSERT_TRUE(target.ok()) << target.error();
    RawShm raw(target.endpoint());
    ASSERT_TRUE(ferry_fault::handshake(raw));
    const uint64_t before = rss_kib(target.pid());
    // Up to 32 MiB of requests, as fast as the target takes them, never reading an answer.
    std::vector<ferry_shm::Request> batch(4096);
    for (size_t i = 0; i < batch.size(); ++i) batch[i] = refused_request(i);
    const size_t batch_bytes = batch.size() * sizeof batch[0];
    uint64_t sent = 0;
    auto deadline = Clock::now() + std::chrono::seconds(20);
    int stalls = 0;
    while (sent < (32ull << 20) && Clock::now() < deadline && stalls < 20) {
        const char *p = reinterpret_cast<const char *>(batch.data()) + sent % batch_bytes;
        size_t want = batch_bytes - sent % batch_bytes;
        ssize_t n = send(raw.fd(), p, want, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            sent += static_cast<uint64_t>(n);
            stalls = 0;
        } else if (n < 0 && errno == EAGAIN) {
            pollfd pf{raw.fd(), POLLOUT, 0};
            if (poll(&pf, 1, 100) == 0) ++stalls;  // 2 s without room: the target stopped reading
        } else {
            break;
        }
    }
    const uint64_t after = rss_kib(target.pid());
    std::cout << "sent " << (sent >> 10) << " KiB of requests; target RSS " << before << " -> " << after << " KiB\n";
    EXPECT_LT(after, before + 16 * 1024) << "the target holds the answers nobody reads";
    uint64_t h;
    EXPECT_TRUE(target.hash(0, 4096, &h)) << "the target died";
}

TEST(ShmLimits, ConnectionsWithoutAHelloAreClosedAfterTheDeadline) {
    ChildPeer target(FERRY_TEST_SHM_PLUGIN, 1 << 20, kRW, {{"connect_timeout_ms", "300"}});
    ASSERT_TRUE(target.ok()) << target.error();
    std::vector<std::unique_ptr<RawShm>> silent;
    for (int i = 0; i < 8; ++i) {
        silent.push_back(std::make_unique<RawShm>(target.endpoint()));
        ASSERT_TRUE(silent.back()->connected());
    }
    auto half = std::make_unique<RawShm>(target.endpoint());  // a Hello cut short
    ASSERT_TRUE(half->send_bytes("FSHH", 4));
    auto t0 = Clock::now();
    for (auto &s : silent) EXPECT_TRUE(s->closed_by_peer(5000)) << "a silent connection is still open";
    EXPECT_TRUE(half->closed_by_peer(5000)) << "a half handshake is still open";
    std::cout << "closed after " << std::chrono::duration_cast<std::chrono::milliseconds>(Clock::now() - t0).count()
              << " ms (deadline 300 ms)\n";
}

TEST(ShmLimits, ConnectionCapsRefuseWithAClearMessage) {
    Plugin plugin(FERRY_TEST_SHM_PLUGIN);
    ASSERT_TRUE(plugin.ok()) << plugin.error();
    for (auto [key, cap] :
         std::vector<std::pair<std::string, int>>{{"max_connections_per_user", 3}, {"max_connections", 2}}) {
        ChildPeer target(FERRY_TEST_SHM_PLUGIN, 1 << 20, kRW, {{key, std::to_string(cap)}});
        ASSERT_TRUE(target.ok()) << target.error();
        std::vector<std::unique_ptr<RawShm>> held;
        for (int i = 0; i < cap; ++i) {
            held.push_back(std::make_unique<RawShm>(target.endpoint()));
            ASSERT_TRUE(ferry_fault::handshake(*held.back()));
        }
        Instance a(plugin, {});
        uint64_t peer;
        EXPECT_EQ(a.connect(target.endpoint(), &peer), -EBUSY) << a.last_error();
        EXPECT_NE(a.last_error().find(key), std::string::npos) << a.last_error();
        std::cout << "refusal: " << a.last_error() << "\n";
        held.pop_back();  // a slot frees up once the target sees the close
        int rc = -1;
        for (int attempt = 0; attempt < 100 && rc != 0; ++attempt) {
            rc = a.connect(target.endpoint(), &peer);
            if (rc != 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
        }
        EXPECT_EQ(rc, 0) << a.last_error();
    }
}

// Out of descriptors, the listening socket stays readable with the connection in its backlog:
// a loop that retries at once spins (and logs) without end.
TEST(ShmLimits, OutOfDescriptorsTheTargetBacksOffInsteadOfSpinning) {
    ChildPeer target(FERRY_TEST_SHM_PLUGIN, 1 << 20, kRW, {});
    ASSERT_TRUE(target.ok()) << target.error();
    rlimit low{48, 48};
    ASSERT_EQ(prlimit(target.pid(), RLIMIT_NOFILE, &low, nullptr), 0) << strerror(errno);
    std::vector<std::unique_ptr<RawShm>> conns;
    for (int i = 0; i < 64; ++i) conns.push_back(std::make_unique<RawShm>(target.endpoint()));
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // let it reach the limit
    const double c0 = cpu_seconds(target.pid());
    std::this_thread::sleep_for(std::chrono::seconds(2));
    const double used = cpu_seconds(target.pid()) - c0;
    std::cout << "target CPU over 2 s out of descriptors: " << used << " s\n";
    EXPECT_LT(used, 0.4) << "the accept loop spins";
    conns.clear();  // descriptors come back: it accepts again
    rlimit normal{1024, 1024};
    prlimit(target.pid(), RLIMIT_NOFILE, &normal, nullptr);
    Plugin plugin(FERRY_TEST_SHM_PLUGIN);
    Instance a(plugin, {});
    uint64_t peer;
    int rc = -1;
    for (int attempt = 0; attempt < 100 && rc != 0; ++attempt) {
        rc = a.connect(target.endpoint(), &peer);
        if (rc != 0) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    }
    EXPECT_EQ(rc, 0) << a.last_error();
}

struct LogCapture {
    std::mutex mu;
    std::vector<std::string> lines;
    static void log(void *ctx, int, const char *, const char *message) {
        auto *self = static_cast<LogCapture *>(ctx);
        std::lock_guard lock(self->mu);
        self->lines.emplace_back(message);
    }
    size_t count(const std::string &needle) {
        std::lock_guard lock(mu);
        size_t n = 0;
        for (auto &l : lines) n += l.find(needle) != std::string::npos;
        return n;
    }
};

TEST(ShmLimits, RefusedConnectionsAreLoggedAsACount) {
    Plugin plugin(FERRY_TEST_SHM_PLUGIN);
    ASSERT_TRUE(plugin.ok()) << plugin.error();
    LogCapture cap;
    ferry_host_api_t host{sizeof(ferry_host_api_t), 0, &cap, LogCapture::log, FERRY_LOG_INFO};
    ferry_transport_t *t = nullptr;
    ferry_error_t err{};
    ASSERT_EQ(plugin->create(nullptr, 0, &host, &t, &err), 0) << err.message;
    size_t len = 0;
    plugin->export_endpoint(t, nullptr, &len, &err);
    std::vector<uint8_t> ep(len);
    ASSERT_EQ(plugin->export_endpoint(t, ep.data(), &len, &err), 0);
    const int bad = 300;
    for (int i = 0; i < bad; ++i) {
        RawShm raw(ep);
        auto junk = ferry_fault::hello_for(raw.token() ^ 1, 0, 0);  // a stale token: refused
        ASSERT_TRUE(raw.send_bytes(&junk, sizeof junk));
        ferry_shm::HelloAck ack{};
        ASSERT_TRUE(raw.ack(&ack));
        EXPECT_EQ(ack.status, -ESTALE);
    }
    const size_t lines = cap.count("refused a connection");
    std::cout << bad << " refused connections, " << lines << " log lines while they came\n";
    EXPECT_LE(lines, 2u) << "one log line per bad connection";
    plugin->destroy(t);  // the count still pending is logged
    EXPECT_GE(cap.count("more like this"), lines >= 2 ? 0u : 1u);
    std::lock_guard lock(cap.mu);
    bool counted = false;
    for (auto &l : cap.lines)
        counted |=
            l.find(std::to_string(bad - 1) + " more") != std::string::npos || l.find("more like") != std::string::npos;
    EXPECT_TRUE(counted) << "the refusals were not counted";
}

// A host table that ends before log_level (an older host) says nothing about the level: the
// plugin must not read past struct_size (the byte there is not the host's), and logs at the
// ABI's default, INFO. shm.so's own logger read log_level regardless, and here dropped the line.
TEST(ShmLimits, HostTableWithoutLogLevelLogsAtTheDefaultLevel) {
    Plugin plugin(FERRY_TEST_SHM_PLUGIN);
    ASSERT_TRUE(plugin.ok()) << plugin.error();
    LogCapture cap;
    ferry_host_api_t host{};
    host.struct_size = FERRY_HOST_API_SIZE_UNTIL(log);
    host.ctx = &cap;
    host.log = LogCapture::log;
    host.log_level = FERRY_LOG_ERROR;  // beyond struct_size: not the host's to say
    ferry_transport_t *t = nullptr;
    ferry_error_t err{};
    ASSERT_EQ(plugin->create(nullptr, 0, &host, &t, &err), 0) << err.message;
    size_t len = 0;
    plugin->export_endpoint(t, nullptr, &len, &err);
    std::vector<uint8_t> ep(len);
    ASSERT_EQ(plugin->export_endpoint(t, ep.data(), &len, &err), 0);
    {
        RawShm raw(ep);
        auto junk = ferry_fault::hello_for(raw.token() ^ 1, 0, 0);  // a stale token: refused, logged at INFO
        ASSERT_TRUE(raw.send_bytes(&junk, sizeof junk));
        ferry_shm::HelloAck ack{};
        ASSERT_TRUE(raw.ack(&ack));
        EXPECT_EQ(ack.status, -ESTALE);
    }
    plugin->destroy(t);
    EXPECT_EQ(cap.count("refused a connection"), 1u) << "the INFO line about the refusal was not logged";
}

}  // namespace

#endif  // FERRY_TEST_SHM_PLUGIN
