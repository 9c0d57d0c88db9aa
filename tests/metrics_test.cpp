// What an engine reports of its data path (Engine::stats, ferry_stats) and its Prometheus
// endpoint (metrics_port): ops, failures and bytes by transport and operation, and by tcp.so's
// rail, against what the test moved through a ferry_test_peer child over tcp.so; ferry_rail_stats'
// capacity convention; the endpoint's text through promtool; bad ports refused by name; a flood
// of scrapes and stalled connections survived.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <string>
#include <thread>

#include "ferry/engine.hpp"
#include "ferry/ferry.h"
#include "peer_process.hpp"

using namespace ferry;
using ferry::test::PeerProcess;

namespace {

// GET `path` from 127.0.0.1:port; the whole response, or "" when the connection failed.
std::string http_get(const std::string &address, const std::string &path = "/metrics") {
    auto colon = address.rfind(':');
    int port = std::stoi(address.substr(colon + 1));
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    timeval tv{10, 0};
    setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof tv);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(static_cast<uint16_t>(port));
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    std::string out;
    if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) {
        std::string req = "GET " + path + " HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n";
        if (send(fd, req.data(), req.size(), MSG_NOSIGNAL) == static_cast<ssize_t>(req.size())) {
            char buf[65536];
            for (ssize_t n; (n = recv(fd, buf, sizeof buf, 0)) > 0;) out.append(buf, static_cast<size_t>(n));
        }
    }
    close(fd);
    return out;
}

std::string body_of(const std::string &response) {
    auto at = response.find("\r\n\r\n");
    return at == std::string::npos ? std::string() : response.substr(at + 4);
}

// The value of the sample `name{labels}` in Prometheus text, or -1.
double sample(const std::string &text, const std::string &series) {
    auto at = text.find("\n" + series + " ");
    if (at == std::string::npos) return -1;
    return std::stod(text.substr(at + series.size() + 2));
}

// promtool check metrics on `text`: its exit status and what it said; -1 when there is no promtool.
std::pair<int, std::string> promtool_check(const std::string &text) {
    if (system("command -v promtool >/dev/null 2>&1") != 0) return {-1, "no promtool"};
    char path[] = "/tmp/ferry_metrics_XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return {-1, "mkstemp failed"};
    (void)!write(fd, text.data(), text.size());
    close(fd);
    std::string cmd = std::string("promtool check metrics < ") + path + " 2>&1";
    std::string said;
    FILE *p = popen(cmd.c_str(), "r");
    char line[512];
    while (p && fgets(line, sizeof line, p)) said += line;
    int status = p ? pclose(p) : -1;
    unlink(path);
    return {WIFEXITED(status) ? WEXITSTATUS(status) : -1, said};
}

const TransportStats *find(const EngineStats &s, const std::string &name) {
    for (const auto &t : s.transports)
        if (t.transport == name) return &t;
    return nullptr;
}

uint64_t bucket_total(const OpStats &s) {
    uint64_t n = 0;
    for (auto b : s.latency_buckets) n += b;
    return n;
}

class Metrics : public ::testing::Test {
protected:
    void SetUp() override {
        auto e = Engine::create({{"plugins", "tcp"}, {"metrics_port", "0"}});
        ASSERT_TRUE(e) << e.error().message;
        engine = std::move(*e);
        local.assign(4 << 20, 0);
        ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
    }
    Result<void> run(const std::vector<Request> &reqs) {
        auto b = engine->submit(reqs);
        if (!b) return std::unexpected(b.error());
        auto w = engine->wait(*b, std::chrono::seconds(30));
        (void)engine->free_batch(*b);
        return w;
    }
    std::unique_ptr<Engine> engine;
    std::vector<uint8_t> local;
};

}  // namespace

TEST_F(Metrics, StatsCountOpsBytesAndFailuresByTransportAndOperation) {
    PeerProcess peer({"--size", "1048576"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<Request> reads, writes;
    for (uint64_t i = 0; i < 16; ++i)
        reads.push_back({Opcode::Read, local.data() + i * 4096, *seg, peer.base + i * 4096, 4096, "tcp"});
    for (uint64_t i = 0; i < 5; ++i)
        writes.push_back({Opcode::Write, local.data() + i * 65536, *seg, peer.base + i * 65536, 1000 + i, "tcp"});
    ASSERT_TRUE(run(reads));
    ASSERT_TRUE(run(writes));
    // Refused by the peer after it unregistered: a failure of tcp's READs, no bytes.
    ASSERT_EQ(peer.command("unreg"), "OK");
    ASSERT_FALSE(run({{Opcode::Read, local.data(), *seg, peer.base, 4096, "tcp"}}));

    auto s = engine->stats();
    const TransportStats *tcp = find(s, "tcp");
    ASSERT_NE(tcp, nullptr);
    EXPECT_EQ(tcp->read.done, 16u);
    EXPECT_EQ(tcp->read.bytes, 16u * 4096);
    EXPECT_EQ(tcp->read.failed, 1u);
    EXPECT_EQ(tcp->write.done, 5u);
    EXPECT_EQ(tcp->write.bytes, 1000u + 1001 + 1002 + 1003 + 1004);
    EXPECT_EQ(tcp->write.failed, 0u);
    EXPECT_EQ(bucket_total(tcp->read), 17u) << "every op that ended is in the latency histogram";
    EXPECT_EQ(bucket_total(tcp->write), 5u);
    EXPECT_GT(tcp->read.latency_sum_seconds, 0);
    EXPECT_LT(tcp->read.latency_sum_seconds, 17 * 30.0);
    EXPECT_EQ(tcp->peers, 1u);
    // tcp.so's one rail (its bind address): the bytes and slices of the ops that succeeded; the
    // refused READ is the op's failure, not the path's.
    ASSERT_EQ(tcp->rails.size(), 1u);
    const RailStats &rail = tcp->rails[0];
    EXPECT_EQ(rail.rail, "127.0.0.1");
    EXPECT_EQ(rail.read_bytes, tcp->read.bytes);
    EXPECT_EQ(rail.write_bytes, tcp->write.bytes);
    EXPECT_EQ(rail.completed, 21u) << "16 READs and 5 WRITEs, one slice each";
    EXPECT_EQ(rail.failures + rail.pauses + rail.paused_peers + rail.queued_bytes, 0u);
    EXPECT_EQ(s.batches, 3u);
    EXPECT_EQ(s.segments_open, 1u);
    ASSERT_NE(find(s, "none"), nullptr);

    // The C API says the same.
    ferry_engine_stats_t c{};
    std::vector<ferry_transport_stats_t> ct(s.transports.size());
    size_t n = 0;
    ferry_engine_t *none = nullptr;
    EXPECT_EQ(ferry_stats(none, &c, ct.data(), &n), -EINVAL);
    EXPECT_EQ(ferry_latency_bounds()[0], kLatencyBoundsSeconds[0]);
    EXPECT_EQ(ferry_latency_bounds()[FERRY_LATENCY_BUCKETS - 1], 10.0);
}

TEST(MetricsC, RailStatsNameEachTransportsRailsUnderTheCapacityConvention) {
    const char *keys[] = {"plugins"}, *values[] = {"tcp"};
    ferry_engine_t *e = nullptr;
    ASSERT_EQ(ferry_engine_create(keys, values, 1, &e), 0) << ferry_last_error();
    size_t n = 0;
    EXPECT_EQ(ferry_rail_stats(e, nullptr, &n), -ENOSPC);
    EXPECT_EQ(n, 1u) << "the count needed: tcp.so's one rail";
    EXPECT_NE(std::string(ferry_last_error()).find("ferry_rail_stats"), std::string::npos) << ferry_last_error();
    EXPECT_EQ(ferry_rail_stats(e, nullptr, nullptr), -EINVAL);
    std::vector<ferry_engine_rail_stats_t> rails(3);
    rails[1].read_bytes = 77;
    n = rails.size();
    ASSERT_EQ(ferry_rail_stats(e, rails.data(), &n), 0) << ferry_last_error();
    ASSERT_EQ(n, 1u);
    EXPECT_STREQ(rails[0].transport, "tcp");
    EXPECT_STREQ(rails[0].rail, "127.0.0.1");
    EXPECT_EQ(rails[0].read_bytes + rails[0].write_bytes + rails[0].completed, 0u);
    EXPECT_EQ(rails[1].read_bytes, 77u) << "nothing written past the count";
    ferry_engine_destroy(e);
}

TEST_F(Metrics, EndpointServesPrometheusTextThatPromtoolAccepts) {
    const std::string address = engine->metrics_address();
    ASSERT_EQ(address.rfind("127.0.0.1:", 0), 0u) << address;
    PeerProcess peer({"--size", "1048576"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg);
    std::vector<Request> reads;
    for (uint64_t i = 0; i < 8; ++i)
        reads.push_back({Opcode::Read, local.data() + i * 8192, *seg, peer.base + i * 8192, 8192, "tcp"});
    ASSERT_TRUE(run(reads));

    std::string response = http_get(address);
    ASSERT_NE(response.find("200 OK"), std::string::npos) << response.substr(0, 200);
    std::string text = body_of(response);
    EXPECT_EQ(sample(text, "ferry_ops_total{op=\"read\",transport=\"tcp\"}"), 8);
    EXPECT_EQ(sample(text, "ferry_bytes_total{op=\"read\",transport=\"tcp\"}"), 8 * 8192);
    EXPECT_EQ(sample(text, "ferry_op_failures_total{op=\"read\",transport=\"tcp\"}"), 0);
    EXPECT_EQ(sample(text, "ferry_op_latency_seconds_count{op=\"read\",transport=\"tcp\"}"), 8);
    EXPECT_EQ(sample(text, "ferry_op_latency_seconds_bucket{op=\"read\",transport=\"tcp\",le=\"+Inf\"}"), 8);
    EXPECT_EQ(sample(text, "ferry_peers{transport=\"tcp\"}"), 1);
    EXPECT_EQ(sample(text, "ferry_batches_total"), 1);
    // Per local rail: tcp.so's one rail, its bind address.
    const std::string rail = "rail=\"127.0.0.1\",transport=\"tcp\"";
    EXPECT_EQ(sample(text, "ferry_rail_bytes_total{op=\"read\"," + rail + "}"), 8 * 8192);
    EXPECT_EQ(sample(text, "ferry_rail_bytes_total{op=\"write\"," + rail + "}"), 0);
    EXPECT_EQ(sample(text, "ferry_rail_completions_total{" + rail + "}"), 8);
    EXPECT_EQ(sample(text, "ferry_rail_failures_total{" + rail + "}"), 0);
    EXPECT_EQ(sample(text, "ferry_rail_pauses_total{" + rail + "}"), 0);
    EXPECT_EQ(sample(text, "ferry_rail_paused_peers{" + rail + "}"), 0);
    EXPECT_EQ(sample(text, "ferry_rail_queued_bytes{" + rail + "}"), 0);
    EXPECT_EQ(sample(text, "ferry_rail_throughput_bytes_per_second{" + rail + "}"), 0);
    EXPECT_EQ(text.find(std::to_string(reinterpret_cast<uintptr_t>(local.data()))), std::string::npos)
        << "no addresses in the metrics";
    EXPECT_EQ(text.find(peer.segment), std::string::npos) << "no peers' names in the metrics";
    EXPECT_EQ(http_get(address, "/").find("200 OK"), std::string::npos) << "nothing but /metrics is served";

    auto [rc, said] = promtool_check(text);
    if (rc == -1) GTEST_SKIP() << "SKIPPED: promtool is not installed (apt-get install prometheus): " << said;
    EXPECT_EQ(rc, 0) << said << "\n" << text;
}

TEST(MetricsConfig, BadPortsAreRefusedByNameAndTheEngineDoesNotStart) {
    auto bad = Engine::create({{"plugins", "tcp"}, {"metrics_port", "91000"}});
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message.find("metrics_port"), std::string::npos) << bad.error().message;

    // A port another socket holds.
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    ASSERT_EQ(bind(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
    ASSERT_EQ(listen(fd, 1), 0);
    socklen_t len = sizeof a;
    getsockname(fd, reinterpret_cast<sockaddr *>(&a), &len);
    const std::string port = std::to_string(ntohs(a.sin_port));
    auto taken = Engine::create({{"plugins", "tcp"}, {"metrics_port", port}});
    ASSERT_FALSE(taken) << "an engine started without the metrics endpoint it was asked for";
    EXPECT_NE(taken.error().message.find("metrics_port " + port), std::string::npos) << taken.error().message;
    EXPECT_NE(taken.error().message.find("free port"), std::string::npos) << taken.error().message;
    std::cout << "port in use: " << taken.error().message << "\n";
    close(fd);

    auto off = Engine::create({{"plugins", "tcp"}});
    ASSERT_TRUE(off) << off.error().message;
    EXPECT_EQ((*off)->metrics_address(), "") << "off unless asked for";
}

TEST_F(Metrics, SurvivesStalledConnectionsAndAFloodOfScrapes) {
    const std::string address = engine->metrics_address();
    int port = std::stoi(address.substr(address.rfind(':') + 1));
    // Connections that never send a request, and one that sends half of one.
    std::vector<int> stalled;
    for (int i = 0; i < 12; ++i) {
        int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(static_cast<uint16_t>(port));
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        ASSERT_EQ(connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a), 0);
        if (i == 0) (void)!send(fd, "GET /met", 8, MSG_NOSIGNAL);
        stalled.push_back(fd);
    }
    // A scrape still gets its answer (the stalled ones are dropped after the request timeout).
    std::string r = http_get(address);
    EXPECT_NE(r.find("ferry_ops_total"), std::string::npos) << "a scrape behind stalled connections: " << r;
    // A flood from four threads: every scrape answered.
    std::atomic<int> answered{0};
    std::vector<std::thread> flood;
    for (int t = 0; t < 4; ++t)
        flood.emplace_back([&] {
            for (int i = 0; i < 50; ++i)
                if (http_get(address).find("ferry_batches_total") != std::string::npos) ++answered;
        });
    for (auto &t : flood) t.join();
    EXPECT_EQ(answered.load(), 200);
    // The data path is untouched, and the engine goes down with connections still open.
    PeerProcess peer({"--size", "1048576"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg);
    ASSERT_TRUE(run({{Opcode::Read, local.data(), *seg, peer.base, 4096, "tcp"}}));
    auto t0 = std::chrono::steady_clock::now();
    engine.reset();
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10)) << "teardown with stalled scrapers";
    for (int fd : stalled) close(fd);
}
