// The Redis metadata backend (redis://) against a real redis-server that each test starts on
// loopback (tests/metadata/servers.hpp: ports 13000-16999), and engines in child processes:
// publish and fetch with bytes moved over tcp.so, the default segment name, a crashed engine's
// keys expiring after the lease TTL, a clean close deleting them, a restarted peer re-read through
// polling, re-registration after FLUSHALL and a restart, an engine started before Redis,
// passwords, ACL users and databases, and bad URLs, values and servers failing with a message.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <cerrno>
#include <cinttypes>
#include <fstream>

#include "ferry/engine.hpp"
#include "metadata/redis_client.hpp"
#include "metadata/servers.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"

using namespace ferry;
using namespace ferry::test::metadata;
using ferry::test::PeerProcess;

namespace {

class RedisMetadataTest : public ::testing::Test {
protected:
    void SetUp() override {
        if (auto why = RedisServer::missing(); !why.empty()) {
            std::printf("SKIPPED: %s\n", why.c_str());
            GTEST_SKIP() << why;
        }
        server = std::make_unique<RedisServer>();
        ASSERT_TRUE(server->start()) << "redis-server did not start: " << server->log();
        url = server->url();
    }
    Config config(const std::string &name) {
        return {{"plugins", "tcp"},           {"metadata", url},           {"local_server_name", name},
                {"etcd_lease_ttl_s", "2"},    {"metadata_poll_ms", "200"}, {"handshake_timeout_ms", "3000"},
                {"metadata_retry_ms", "2000"}};
    }
    std::vector<std::string> peer_args(const std::string &name) {
        std::vector<std::string> a = {"--size", "1048576"};
        for (auto &[k, v] : config(name))
            if (k != "plugins" && (k != "local_server_name" || !name.empty()))
                a.insert(a.end(), {"--option", k + "=" + v});
        return a;
    }
    std::optional<std::string> raw_get(const std::string &key) {
        auto store = raw_store(url);
        auto v = store ? store->get(key) : Result<std::optional<std::string>>(std::optional<std::string>());
        EXPECT_TRUE(v) << v.error().message;
        return v ? *v : std::nullopt;
    }
    // Reads the peer's whole buffer, then writes another pattern over it and asks for its checksum.
    void move_bytes(Engine &e, SegmentId seg, PeerProcess &peer) {
        std::vector<uint8_t> local(peer.size);
        ASSERT_TRUE(e.register_memory(local.data(), local.size()));
        auto r = transfer(e, Opcode::Read, local.data(), seg, peer.base, local.size());
        ASSERT_TRUE(r) << r.error().message;
        for (size_t i = 0; i < local.size(); ++i) ASSERT_EQ(local[i], test::peer_pattern(i)) << "byte " << i;
        for (size_t i = 0; i < local.size(); ++i) local[i] = static_cast<uint8_t>(i * 13 + 5);
        r = transfer(e, Opcode::Write, local.data(), seg, peer.base, local.size());
        ASSERT_TRUE(r) << r.error().message;
        char sum[40];
        std::snprintf(sum, sizeof sum, "SUM %" PRIx64, test::fnv1a(local.data(), local.size()));
        EXPECT_EQ(peer.command("sum"), sum);
        ASSERT_TRUE(e.unregister_memory(local.data()));
    }

    std::unique_ptr<RedisServer> server;
    std::string url;
};

}  // namespace

TEST_F(RedisMetadataTest, SegmentsArePublishedAndFetchedThroughRedis) {
    PeerProcess peer(peer_args("node-a"));
    ASSERT_TRUE(peer.ok) << peer.error;
    EXPECT_EQ(peer.segment, "node-a");
    auto engine = Engine::create(config("node-b"));
    ASSERT_TRUE(engine) << engine.error().message;
    auto seg = (*engine)->open_segment("node-a");
    ASSERT_TRUE(seg) << seg.error().message;
    move_bytes(**engine, *seg, peer);
    // Both keys carry the lease.
    RedisClient client({"127.0.0.1", server->port(), "", "", 0, url, ""}, std::chrono::seconds(3));
    for (const char *key : {"ferry/segments/node-a", "ferry/stamps/node-a"}) {
        auto ttl = client.command({"PTTL", key});
        ASSERT_TRUE(ttl) << ttl.error().message;
        EXPECT_GT(ttl->integer, 0) << key;
        EXPECT_LE(ttl->integer, 2000) << key;
    }
    auto missing = (*engine)->open_segment("node-nobody");
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().code, -ENOENT);
    EXPECT_TRUE(contains(missing.error().message, "is not registered in Redis " + url)) << missing.error().message;
}

TEST_F(RedisMetadataTest, TheDefaultSegmentNameIsTheControlServersAddress) {
    PeerProcess peer(peer_args(""));
    ASSERT_TRUE(peer.ok) << peer.error;
    const std::string port = peer.segment.substr(std::min(peer.segment.size(), size_t{10}));
    EXPECT_TRUE(peer.segment.rfind("127.0.0.1:", 0) == 0 && !port.empty() &&
                port.find_first_not_of("0123456789") == std::string::npos)
        << peer.segment;
    auto engine = Engine::create(config("reader"));
    ASSERT_TRUE(engine) << engine.error().message;
    auto seg = (*engine)->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    move_bytes(**engine, *seg, peer);
}

TEST_F(RedisMetadataTest, ACrashedEnginesSegmentExpiresAfterItsLease) {
    auto engine = Engine::create(config("observer"));
    ASSERT_TRUE(engine) << engine.error().message;
    PeerProcess doomed(peer_args("doomed"));
    ASSERT_TRUE(doomed.ok) << doomed.error;
    ASSERT_TRUE((*engine)->open_segment("doomed"));
    ASSERT_TRUE(raw_get("ferry/segments/doomed"));
    doomed.kill_now();  // no clean shutdown: only the TTL can remove it
    auto start = Clock::now();
    EXPECT_TRUE(eventually([&] { return !raw_get("ferry/segments/doomed") && !raw_get("ferry/stamps/doomed"); },
                           std::chrono::seconds(6)))
        << "the dead engine's keys are still in Redis long after the 2 s TTL";
    std::printf("keys gone after %.1f s\n", std::chrono::duration<double>(Clock::now() - start).count());
    EXPECT_GT(Clock::now() - start, std::chrono::milliseconds(500)) << "the keys left before the TTL could run out";
    auto cached = (*engine)->open_segment("doomed");  // still open from before: forget it and ask Redis
    ASSERT_TRUE(cached && (*engine)->close_segment(*cached));
    auto gone = (*engine)->open_segment("doomed");
    ASSERT_FALSE(gone);
    EXPECT_EQ(gone.error().code, -ENOENT);
}

TEST_F(RedisMetadataTest, ACleanCloseDeletesItsKeysAtOnce) {
    PeerProcess peer(peer_args("leaver"));
    ASSERT_TRUE(peer.ok) << peer.error;
    ASSERT_TRUE(raw_get("ferry/segments/leaver"));
    ASSERT_TRUE(raw_get("ferry/stamps/leaver"));
    peer.command("quit");  // returns once the process closed its end: the engine is gone
    EXPECT_FALSE(raw_get("ferry/segments/leaver"));
    EXPECT_FALSE(raw_get("ferry/stamps/leaver"));
}

TEST_F(RedisMetadataTest, ARestartedPeerIsReReadThroughPolling) {
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
    // The same name from a new process: a new tcp port, and a new buffer address.
    PeerProcess second(peer_args("phoenix"));
    ASSERT_TRUE(second.ok) << second.error;
    std::fill(local.begin(), local.end(), 0);
    ASSERT_TRUE(eventually([&] {
        return static_cast<bool>(transfer(**engine, Opcode::Read, local.data(), *seg, second.base, local.size()));
    })) << "ops to the restarted peer never succeeded";
    for (size_t i = 0; i < local.size(); ++i) ASSERT_EQ(local[i], test::peer_pattern(i));
}

TEST_F(RedisMetadataTest, EnginesRegisterAgainAfterFlushAllAndARestart) {
    PeerProcess peer(peer_args("survivor"));
    ASSERT_TRUE(peer.ok) << peer.error;
    RedisClient client({"127.0.0.1", server->port(), "", "", 0, url, ""}, std::chrono::seconds(3));
    ASSERT_TRUE(client.command({"FLUSHALL"}));
    ASSERT_FALSE(raw_get("ferry/segments/survivor"));
    EXPECT_TRUE(eventually([&] { return raw_get("ferry/segments/survivor").has_value(); }))
        << "the peer did not register again after FLUSHALL";
    server->stop();
    ASSERT_TRUE(server->start());  // no persistence: every key is gone
    auto engine = Engine::create(config("late-reader"));
    ASSERT_TRUE(engine) << engine.error().message;
    ASSERT_TRUE(eventually([&] { return static_cast<bool>((*engine)->open_segment("survivor")); }))
        << "the peer never registered again in the restarted Redis";
    move_bytes(**engine, *(*engine)->open_segment("survivor"), peer);
}

// A register while Redis is away returns at once; the engine writes it when Redis is back.
TEST_F(RedisMetadataTest, ARegisterWhileRedisIsAwayIsPublishedWhenItComesBack) {
    auto target = Engine::create(config("steady"));
    ASSERT_TRUE(target) << target.error().message;
    server->stop();
    std::vector<uint8_t> late(64 << 10, 0x5a);
    auto start = Clock::now();
    ASSERT_TRUE((*target)->register_memory(late.data(), late.size()));
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(2));
    ASSERT_TRUE(server->start());  // without the keys of before
    auto reader = Engine::create(config("reader"));
    ASSERT_TRUE(reader) << reader.error().message;
    std::vector<uint8_t> local(late.size());
    ASSERT_TRUE((*reader)->register_memory(local.data(), local.size()));
    ASSERT_TRUE(eventually([&] {
        auto seg = (*reader)->open_segment("steady");
        if (!seg) return false;
        return static_cast<bool>(transfer(**reader, Opcode::Read, local.data(), *seg,
                                          reinterpret_cast<uintptr_t>(late.data()), local.size()));
    })) << "the region registered while Redis was away never reached it";
    EXPECT_EQ(local, late);
}

TEST_F(RedisMetadataTest, AnEngineStartedBeforeRedisRetriesUntilItAnswers) {
    server->stop();
    std::thread later([&] {
        std::this_thread::sleep_for(std::chrono::milliseconds(1500));
        EXPECT_TRUE(server->start());
    });
    auto start = Clock::now();
    auto c = config("early-bird");
    c["metadata_retry_ms"] = "20000";
    auto engine = Engine::create(c);
    later.join();
    ASSERT_TRUE(engine) << engine.error().message;
    EXPECT_GT(Clock::now() - start, std::chrono::milliseconds(1000)) << "it cannot have registered before Redis ran";
    engine->reset();

    server->stop();
    c["metadata_retry_ms"] = "500";
    start = Clock::now();
    auto gives_up = Engine::create(c);
    ASSERT_FALSE(gives_up);
    EXPECT_LT(Clock::now() - start, std::chrono::seconds(3));
    EXPECT_TRUE(contains(gives_up.error().message, "Redis metadata: cannot reach Redis")) << gives_up.error().message;
    EXPECT_TRUE(contains(gives_up.error().message, url)) << gives_up.error().message;
    EXPECT_TRUE(contains(gives_up.error().message, "that redis-server runs")) << gives_up.error().message;
}

TEST_F(RedisMetadataTest, PasswordsAreCheckedWhenTheEngineStarts) {
    RedisServer locked({"--requirepass", "s3cret-pass"});
    ASSERT_TRUE(locked.start()) << locked.log();
    test::TempDir dir;
    const std::string file = (dir / "redis-password").string();
    std::ofstream(file) << "s3cret-pass\n";
    chmod(file.c_str(), 0600);
    auto with = [&](const std::string &u, Config extra) {
        auto c = config("locked");
        c["metadata"] = u;
        for (auto &[k, v] : extra) c[k] = v;
        auto start = Clock::now();
        auto e = Engine::create(c);
        EXPECT_LT(Clock::now() - start, std::chrono::seconds(2)) << "a refused password must not be retried";
        if (!e) {
            EXPECT_FALSE(contains(e.error().message, "s3cret") || contains(e.error().message, "wrong-pass"))
                << "a password in a message: " << e.error().message;
        }
        return e;
    };
    auto none = with(locked.url(), {});
    ASSERT_FALSE(none);
    EXPECT_EQ(none.error().code, -EACCES);
    EXPECT_TRUE(contains(none.error().message, "requires a password")) << none.error().message;
    EXPECT_TRUE(contains(none.error().message, "set redis_password_file")) << none.error().message;
    auto wrong = with(locked.url(), {{"redis_password", "wrong-pass"}});
    ASSERT_FALSE(wrong);
    EXPECT_EQ(wrong.error().code, -EACCES);
    EXPECT_TRUE(contains(wrong.error().message, "refused the password")) << wrong.error().message;
    EXPECT_TRUE(contains(wrong.error().message, "check redis_password")) << wrong.error().message;
    auto from_file = with(locked.url(), {{"redis_password_file", file}});
    ASSERT_TRUE(from_file) << from_file.error().message;
    from_file->reset();
    auto in_url = with("redis://:s3cret-pass@127.0.0.1:" + std::to_string(locked.port()), {});
    ASSERT_TRUE(in_url) << in_url.error().message;
    in_url->reset();
    auto twice =
        with("redis://:s3cret-pass@127.0.0.1:" + std::to_string(locked.port()), {{"redis_password_file", file}});
    ASSERT_FALSE(twice);
    EXPECT_TRUE(contains(twice.error().message, "give the password in one place")) << twice.error().message;
    EXPECT_TRUE(contains(twice.error().message, ":***@")) << twice.error().message;
    // A password for a Redis that has none.
    auto extra = with(url, {{"redis_password", "wrong-pass"}});
    ASSERT_FALSE(extra);
    EXPECT_TRUE(contains(extra.error().message, "this Redis has none")) << extra.error().message;
}

TEST_F(RedisMetadataTest, AclUsersAndDatabases) {
    RedisServer acl({"--user", "default", "off", "--user", "alice", "on", ">alice-pw", "~ferry/*", "+@all", "--user",
                     "bob", "on", ">bob-pw", "~other/*", "+@all"});
    ASSERT_TRUE(acl.start()) << acl.log();
    const std::string at = "127.0.0.1:" + std::to_string(acl.port());
    auto c = config("in-db-3");
    c["metadata"] = "redis://alice@" + at + "/3";
    c["redis_password"] = "alice-pw";
    auto engine = Engine::create(c);
    ASSERT_TRUE(engine) << engine.error().message;
    auto db3 = raw_store("redis://" + at + "/3", {"alice", "alice-pw", "", ""});
    auto db0 = raw_store("redis://" + at, {"alice", "alice-pw", "", ""});
    ASSERT_TRUE(db3 && db0);
    auto in3 = db3->get("ferry/segments/in-db-3");
    auto in0 = db0->get("ferry/segments/in-db-3");
    ASSERT_TRUE(in3 && in0);
    EXPECT_TRUE(in3->has_value()) << "the segment is not in database 3";
    EXPECT_FALSE(in0->has_value()) << "the segment went to database 0";
    engine->reset();

    c["metadata"] = "redis://" + at;
    c["redis_user"] = "bob";
    c["redis_password"] = "bob-pw";
    auto bob = Engine::create(c);
    ASSERT_FALSE(bob);
    EXPECT_EQ(bob.error().code, -EACCES);
    EXPECT_TRUE(contains(bob.error().message, "NOPERM")) << bob.error().message;
    EXPECT_TRUE(contains(bob.error().message, "ferry/*")) << bob.error().message;

    c["redis_user"] = "alice";
    c["redis_password"] = "alice-pw";
    c["redis_db"] = "999";
    auto far = Engine::create(c);
    ASSERT_FALSE(far);
    EXPECT_EQ(far.error().code, -EINVAL);
    EXPECT_TRUE(contains(far.error().message, "cannot SELECT database 999")) << far.error().message;
}

TEST_F(RedisMetadataTest, BadUrlsAndSettingsFailAtOnceWithTheFix) {
    const std::string here = "127.0.0.1:" + std::to_string(server->port());
    const std::vector<std::pair<Config, std::string>> cases = {
        {{{"metadata", "redis://"}}, "no host"},
        {{{"metadata", "redis://127.0.0.1:99999"}}, "port '99999' is not 1..65535"},
        {{{"metadata", "redis://" + here + "/x"}}, "is not a Redis database index"},
        {{{"metadata", "redis://" + here + "?db=1"}}, "a query or fragment is not understood"},
        {{{"metadata", "rediss://" + here}}, "Redis over TLS is not supported"},
        {{{"metadata", "redis://" + here + "/2"}, {"redis_db", "1"}}, "give the database in one place"},
        {{{"metadata", "redis://" + here}, {"redis_user", "carol"}}, "needs its password"},
        {{{"metadata", "redis://" + here}, {"redis_password", "a"}, {"redis_password_file", "/x"}}, "both set"},
        {{{"metadata", "etcd://127.0.0.1:1"}, {"redis_password", "a"}}, "redis_* are set"},
    };
    for (auto &[extra, expected] : cases) {
        auto c = config("bad");
        for (auto &[k, v] : extra) c[k] = v;
        auto start = Clock::now();
        auto e = Engine::create(c);
        ASSERT_FALSE(e) << expected;
        EXPECT_LT(Clock::now() - start, std::chrono::seconds(1)) << expected;
        EXPECT_TRUE(contains(e.error().message, expected)) << e.error().message;
        EXPECT_FALSE(contains(e.error().message, "s3cret"));
    }
}

TEST_F(RedisMetadataTest, GarbageValuesAndServersThatAreNotRedisFailWithAMessage) {
    auto engine = Engine::create(config("reader"));
    ASSERT_TRUE(engine) << engine.error().message;
    auto store = raw_store(url);
    ASSERT_TRUE(store);
    ASSERT_TRUE(store->put("ferry/segments/junk", "{\"not\": \"a descriptor\"}"));
    auto junk = (*engine)->open_segment("junk");
    ASSERT_FALSE(junk);
    EXPECT_EQ(junk.error().code, -EPROTO);
    EXPECT_TRUE(contains(junk.error().message, "is not a Ferry segment descriptor")) << junk.error().message;
    // A real descriptor copied under another name.
    auto own = store->get("ferry/segments/reader");
    ASSERT_TRUE(own && *own);
    ASSERT_TRUE(store->put("ferry/segments/copy", **own));
    auto copy = (*engine)->open_segment("copy");
    ASSERT_FALSE(copy);
    EXPECT_TRUE(contains(copy.error().message, "holds the descriptor of segment 'reader', not 'copy'"))
        << copy.error().message;

    auto against = [&](CannedServer &s, const std::string &timeout_ms) {
        auto c = config("lost");
        c["metadata"] = "redis://127.0.0.1:" + std::to_string(s.port());
        c["handshake_timeout_ms"] = timeout_ms;
        c["metadata_retry_ms"] = "300";
        auto start = Clock::now();
        auto e = Engine::create(c);
        EXPECT_LT(Clock::now() - start, std::chrono::milliseconds(std::stoi(timeout_ms) + 1000))
            << "an op outlived its timeout";
        EXPECT_FALSE(e);
        return e ? std::string("created") : e.error().message;
    };
    CannedServer http("HTTP/1.1 400 Bad Request\r\nContent-Length: 0\r\n\r\n");
    auto why = against(http, "2000");
    EXPECT_TRUE(contains(why, "is it a Redis server?")) << why;
    CannedServer silent("");
    why = against(silent, "500");
    EXPECT_TRUE(contains(why, "no answer within 500 ms")) << why;
    // Answers PING, then resets the connection: the next command fails (and must not raise
    // SIGPIPE, whose default action would end this process).
    CannedServer reset("+PONG\r\n", 1, /*reset=*/true);
    why = against(reset, "2000");
    EXPECT_TRUE(contains(why, "Redis metadata: cannot reach Redis")) << why;
    EXPECT_GT(reset.connections(), 1u) << why;
    // A bulk string of 200 MB: refused as soon as it is announced, not read into memory.
    CannedServer huge("$200000000\r\n" + std::string(1 << 20, 'x'), 100);
    why = against(huge, "5000");
    EXPECT_TRUE(contains(why, "larger than")) << why;
    // An array of 100 strings of 1 MiB each: refused once more than the limit has arrived.
    CannedServer many("$1048576\r\n" + std::string(1 << 20, 'y') + "\r\n", 100, false, "*100\r\n");
    why = against(many, "20000");
    EXPECT_TRUE(contains(why, "an answer is larger than")) << why;
}

// A host without hiredis runs Ferry; only a redis:// URL fails, naming what to install. In
// child engines, since this process has loaded hiredis already.
TEST(RedisMetadataWithoutHiredis, OnlyARedisUrlFailsAndItNamesThePackage) {
    setenv("FERRY_LIBHIREDIS", "/nonexistent/libhiredis.so.0.14", 1);
    PeerProcess redis(
        {"--size", "4096", "--option", "metadata=redis://127.0.0.1:1", "--option", "metadata_retry_ms=0"});
    PeerProcess p2p({"--size", "4096"});
    unsetenv("FERRY_LIBHIREDIS");
    ASSERT_FALSE(redis.ok);
    EXPECT_TRUE(contains(redis.error, "redis:// metadata needs hiredis")) << redis.error;
    EXPECT_TRUE(contains(redis.error, "install libhiredis0.14")) << redis.error;
    EXPECT_TRUE(contains(redis.error, "FERRY_LIBHIREDIS")) << redis.error;
    EXPECT_TRUE(p2p.ok) << p2p.error;
}
