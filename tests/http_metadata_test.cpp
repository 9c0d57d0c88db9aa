// The HTTP metadata backend (http://host:port/metadata, Mooncake's protocol) against
// tests/metadata/http_metadata_server.py, which each test starts on loopback (ports 13000-16999),
// and engines in child processes: publish and fetch with bytes moved over tcp.so, Mooncake's keys
// beside Ferry's on one server, a clean close deleting the keys, a crashed engine's keys staying
// (no leases over HTTP) while ops to it fail, a restarted peer re-read through polling,
// re-registration after the server restarts, an engine started before the server, and servers
// that answer wrongly (404, 500, 401, not HTTP, silent, forgetful, endless) failing with a message.
#include <gtest/gtest.h>

#include <cerrno>
#include <cinttypes>

#include "ferry/engine.hpp"
#include "metadata/servers.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"

using namespace ferry;
using namespace ferry::test::metadata;
using ferry::test::PeerProcess;

namespace {

class HttpMetadataTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (auto why = HttpMetadataServer::missing(); !why.empty()) {
            std::printf("SKIPPED: %s\n", why.c_str());
            GTEST_SKIP() << why;
        }
        ASSERT_TRUE(server.start()) << "the HTTP metadata server did not start on port " << server.port();
        url = server.url();
    }
    Config config(const std::string &name) {
        return {{"plugins", "tcp"},
                {"metadata", url},
                {"local_server_name", name},
                {"metadata_poll_ms", "200"},
                {"handshake_timeout_ms", "3000"},
                {"metadata_retry_ms", "2000"}};
    }
    std::vector<std::string> peer_args(const std::string &name) {
        std::vector<std::string> a = {"--size", "1048576"};
        for (auto &[k, v] : config(name))
            if (k != "plugins") a.insert(a.end(), {"--option", k + "=" + v});
        return a;
    }
    std::optional<std::string> raw_get(const std::string &key) {
        auto store = raw_store(url);
        auto v = store ? store->get(key) : Result<std::optional<std::string>>(std::optional<std::string>());
        EXPECT_TRUE(v) << v.error().message;
        return v ? *v : std::nullopt;
    }
    // An engine against a server on `port`; returns its error message ("created" if it started).
    std::string create_against(const std::string &server_url, Config extra = {},
                               std::chrono::milliseconds within = std::chrono::seconds(5)) {
        auto c = config("lost");
        c["metadata"] = server_url;
        c["metadata_retry_ms"] = "300";
        for (auto &[k, v] : extra) c[k] = v;
        auto start = Clock::now();
        auto e = Engine::create(c);
        EXPECT_LT(Clock::now() - start, within) << "creating against " << server_url << " took too long";
        return e ? std::string("created") : e.error().message;
    }

    HttpMetadataServer server;
    std::string url;
};

std::string canned_url(const CannedServer &s) { return "http://127.0.0.1:" + std::to_string(s.port()) + "/metadata"; }

}  // namespace

TEST_F(HttpMetadataTest, SegmentsArePublishedAndFetchedOverHttp) {
    PeerProcess peer(peer_args("node-a"));
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = Engine::create(config("node-b"));
    ASSERT_TRUE(engine) << engine.error().message;
    auto seg = (*engine)->open_segment("node-a");
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<uint8_t> local(peer.size);
    ASSERT_TRUE((*engine)->register_memory(local.data(), local.size()));
    auto r = transfer(**engine, Opcode::Read, local.data(), *seg, peer.base, local.size());
    ASSERT_TRUE(r) << r.error().message;
    for (size_t i = 0; i < local.size(); ++i) ASSERT_EQ(local[i], test::peer_pattern(i)) << "byte " << i;
    for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<uint8_t>(i * 29 + 1);
    r = transfer(**engine, Opcode::Write, local.data(), *seg, peer.base, local.size());
    ASSERT_TRUE(r) << r.error().message;
    char sum[40];
    std::snprintf(sum, sizeof sum, "SUM %" PRIx64, test::fnv1a(local.data(), local.size()));
    EXPECT_EQ(peer.command("sum"), sum);
    auto stamp = raw_get("ferry/stamps/node-a");
    ASSERT_TRUE(stamp);
    EXPECT_EQ(stamp->size(), 16 + 1 + 1) << *stamp;  // "<16 hex>-1": the first publish
    auto missing = (*engine)->open_segment("node-nobody");
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().code, -ENOENT);
    EXPECT_TRUE(contains(missing.error().message, "is not registered in HTTP metadata server " + url))
        << missing.error().message;
}

// Mooncake's engines keep their keys on the same server; a segment name that needs escaping in
// a URL is kept whole.
TEST_F(HttpMetadataTest, MooncakeKeysAndOddNamesShareTheServer) {
    auto store = raw_store(url);
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->put("mooncake/ram/10.0.0.5:12345", "{\"name\": \"mooncake\"}"));
    ASSERT_TRUE(store->put("mooncake/rpc_meta/10.0.0.5:12345", "{\"ip\": \"10.0.0.5\"}"));
    auto again = store->put("mooncake/rpc_meta/10.0.0.5:12345", "{\"ip\": \"10.0.0.6\"}");
    ASSERT_FALSE(again) << "the server must refuse a second rpc_meta value, as Mooncake's does";
    EXPECT_TRUE(contains(again.error().message, "HTTP 400")) << again.error().message;
    const std::string odd = "node/a?b&c=%d+e#f:1";  // no blank: the peer prints it in a line of words
    PeerProcess peer(peer_args(odd));
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = Engine::create(config("plain"));
    ASSERT_TRUE(engine) << engine.error().message;
    auto seg = (*engine)->open_segment(odd);
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<uint8_t> local(4096);
    ASSERT_TRUE((*engine)->register_memory(local.data(), local.size()));
    auto moved = transfer(**engine, Opcode::Read, local.data(), *seg, peer.base, local.size());
    ASSERT_TRUE(moved) << moved.error().message;
    EXPECT_EQ(local[100], test::peer_pattern(100));
    EXPECT_EQ(raw_get("mooncake/ram/10.0.0.5:12345").value_or(""), "{\"name\": \"mooncake\"}");
    EXPECT_TRUE(raw_get("ferry/segments/" + odd));
}

TEST_F(HttpMetadataTest, ACleanCloseDeletesItsKeysAtOnce) {
    PeerProcess peer(peer_args("leaver"));
    ASSERT_TRUE(peer.ok) << peer.error;
    ASSERT_TRUE(raw_get("ferry/segments/leaver"));
    peer.command("quit");  // returns once the process closed its end: the engine is gone
    EXPECT_FALSE(raw_get("ferry/segments/leaver"));
    EXPECT_FALSE(raw_get("ferry/stamps/leaver"));
}

// HTTP has no leases: a crashed engine's keys stay, and ops to it fail with the transport's
// error (the address refused) instead of hanging.
TEST_F(HttpMetadataTest, ACrashedEnginesKeysStayAndOpsToItFailAtOnce) {
    auto engine = Engine::create(config("observer"));
    ASSERT_TRUE(engine) << engine.error().message;
    std::vector<uint8_t> local(4096);
    ASSERT_TRUE((*engine)->register_memory(local.data(), local.size()));
    PeerProcess doomed(peer_args("doomed"));
    ASSERT_TRUE(doomed.ok) << doomed.error;
    auto seg = (*engine)->open_segment("doomed");
    ASSERT_TRUE(seg);
    doomed.kill_now();
    EXPECT_TRUE(raw_get("ferry/segments/doomed"));
    auto start = Clock::now();
    auto r = transfer(**engine, Opcode::Read, local.data(), *seg, doomed.base, local.size());
    ASSERT_FALSE(r);
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(5));
    EXPECT_TRUE(contains(r.error().message, "127.0.0.1:")) << r.error().message;
}

TEST_F(HttpMetadataTest, ARestartedPeerIsReReadThroughPolling) {
    auto engine = Engine::create(config("reader"));
    ASSERT_TRUE(engine) << engine.error().message;
    std::vector<uint8_t> local(1 << 20);
    ASSERT_TRUE((*engine)->register_memory(local.data(), local.size()));
    auto first = std::make_unique<PeerProcess>(peer_args("phoenix"));
    ASSERT_TRUE(first->ok) << first->error;
    auto seg = (*engine)->open_segment("phoenix");
    ASSERT_TRUE(seg) << seg.error().message;
    ASSERT_TRUE(transfer(**engine, Opcode::Read, local.data(), *seg, first->base, local.size()));
    first->kill_now();
    PeerProcess second(peer_args("phoenix"));
    ASSERT_TRUE(second.ok) << second.error;
    std::fill(local.begin(), local.end(), 0);
    ASSERT_TRUE(eventually([&] {
        return static_cast<bool>(transfer(**engine, Opcode::Read, local.data(), *seg, second.base, local.size()));
    })) << "ops to the restarted peer never succeeded";
    for (size_t i = 0; i < local.size(); ++i) ASSERT_EQ(local[i], test::peer_pattern(i));
}

TEST_F(HttpMetadataTest, EnginesRegisterAgainAfterTheServerRestarts) {
    PeerProcess peer(peer_args("survivor"));
    ASSERT_TRUE(peer.ok) << peer.error;
    server.stop();
    ASSERT_TRUE(server.start());  // in memory only: every key is gone
    ASSERT_FALSE(raw_get("ferry/segments/survivor"));
    auto engine = Engine::create(config("late-reader"));
    ASSERT_TRUE(engine) << engine.error().message;
    ASSERT_TRUE(eventually([&] { return static_cast<bool>((*engine)->open_segment("survivor")); }))
        << "the peer never registered again on the restarted server";
    std::vector<uint8_t> local(peer.size);
    ASSERT_TRUE((*engine)->register_memory(local.data(), local.size()));
    auto r =
        transfer(**engine, Opcode::Read, local.data(), *(*engine)->open_segment("survivor"), peer.base, local.size());
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(local[12345], test::peer_pattern(12345));
}

TEST_F(HttpMetadataTest, AnEngineStartedBeforeTheServerRetriesUntilItAnswers) {
    server.stop();
    std::thread later([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        EXPECT_TRUE(server.start());
    });
    auto start = Clock::now();
    auto c = config("early-bird");
    c["metadata_retry_ms"] = "20000";
    auto engine = Engine::create(c);
    later.join();
    ASSERT_TRUE(engine) << engine.error().message;
    EXPECT_GT(Clock::now() - start, std::chrono::milliseconds(1000))
        << "it cannot have registered before the server ran";
    engine->reset();
    server.stop();
    auto why = create_against(url, {}, std::chrono::seconds(3));
    EXPECT_TRUE(contains(why, "HTTP metadata: cannot reach HTTP metadata server")) << why;
    EXPECT_TRUE(contains(why, url)) << why;
    EXPECT_TRUE(contains(why, "that the server runs")) << why;
}

TEST_F(HttpMetadataTest, ServersThatAnswerWronglyFailWithTheFix) {
    // Not the metadata path: aiohttp's own 404, at once (no retries).
    auto why = create_against(server.url("/wrong"), {}, std::chrono::seconds(1));
    EXPECT_TRUE(contains(why, "is not a metadata endpoint")) << why;
    EXPECT_TRUE(contains(why, "http://host:8080/metadata")) << why;

    CannedServer error("HTTP/1.1 500 Internal Server Error\r\nContent-Length: 4\r\nConnection: close\r\n\r\noops");
    why = create_against(canned_url(error));
    EXPECT_TRUE(contains(why, "HTTP 500, \"oops\"; see the metadata server's log")) << why;
    EXPECT_TRUE(contains(why, "after 300 ms")) << why;

    CannedServer locked("HTTP/1.1 401 Unauthorized\r\nContent-Length: 0\r\nConnection: close\r\n\r\n");
    why = create_against(canned_url(locked), {}, std::chrono::seconds(1));
    EXPECT_TRUE(contains(why, "the server wants credentials")) << why;

    CannedServer ssh("SSH-2.0-OpenSSH_9.2p1\r\n");
    why = create_against(canned_url(ssh), {}, std::chrono::seconds(1));
    EXPECT_TRUE(contains(why, "does not answer in HTTP")) << why;

    CannedServer silent("");
    why = create_against(canned_url(silent), {{"handshake_timeout_ms", "400"}});
    EXPECT_TRUE(contains(why, "Operation timed out") || contains(why, "timed out")) << why;

    // Says 200 to everything and keeps nothing (some other web service).
    CannedServer forgetful("HTTP/1.1 200 OK\r\nContent-Length: 2\r\nConnection: close\r\n\r\nok");
    why = create_against(canned_url(forgetful), {}, std::chrono::seconds(1));
    EXPECT_TRUE(contains(why, "does not keep what it is given")) << why;

    // An endless answer is cut off, not read into memory.
    CannedServer endless("HTTP/1.1 200 OK\r\nContent-Length: 200000000\r\n\r\n" + std::string(1 << 20, 'x'), 100);
    why = create_against(canned_url(endless));
    EXPECT_TRUE(contains(why, "larger than")) << why;

    for (auto [bad, expected] : {std::pair{"http://", "not an HTTP metadata server URL"},
                                 std::pair{"http:///metadata", "not an HTTP metadata server URL"},
                                 std::pair{"http://127.0.0.1:1/meta data", "not an HTTP metadata server URL"},
                                 std::pair{"http://127.0.0.1:99999/metadata", "not a valid URL"}}) {
        why = create_against(bad, {}, std::chrono::seconds(1));
        EXPECT_TRUE(contains(why, expected)) << bad << ": " << why;
    }
}

TEST_F(HttpMetadataTest, AGarbageValueIsRejectedByTheDecoder) {
    auto engine = Engine::create(config("reader"));
    ASSERT_TRUE(engine) << engine.error().message;
    auto store = raw_store(url);
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->put("ferry/segments/junk", std::string("FRSD\x01\x00garbage", 13)));
    auto junk = (*engine)->open_segment("junk");
    ASSERT_FALSE(junk);
    EXPECT_EQ(junk.error().code, -EPROTO);
    EXPECT_TRUE(contains(junk.error().message, "is not a Ferry segment descriptor")) << junk.error().message;
    EXPECT_TRUE(contains(junk.error().message, url)) << junk.error().message;
}
