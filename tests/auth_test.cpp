// Authentication with a cluster secret where memory is served: tcp.so refuses peers that do not know
// the secret (its wire spoken directly, a replayed handshake included), per-region access rights
// hold, and shm.so serves only its own user. (auth_crypto_test: HMAC and the secret's sources;
// auth_control_test: the control channel.)
#include <gtest/gtest.h>

#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include <fcntl.h>
#include <unistd.h>

#include <chrono>
#include <thread>

#include "auth_proof.hpp"
#include "auth_util.hpp"
#include "control/auth.hpp"
#include "control/control_client.hpp"
#include "control/control_protocol.hpp"
#include "engine/transport.hpp"
#include "ferry/engine.hpp"
#include "hmac_sha256.hpp"
#include "loader/plugin_loader.hpp"
#include "metadata/descriptor.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"
#include "test_util.hpp"
#include "util/socket_util.hpp"

using namespace ferry;
using ferry::test::PeerProcess;
using namespace ferry::test::auth;

// Descriptors can leak (anyone who reads etcd has them), so tcp.so authenticates its own
// connections with a key derived from the secret. These tests speak its wire format directly.

namespace {

constexpr size_t kTcpHeader = 40;
enum : uint8_t {
    kTcpHello = 1,
    kTcpHelloAck = 2,
    kTcpReadReq = 5,
    kTcpReadResp = 6,
    kTcpError = 7,
    kTcpAuth = 9,
    kTcpAuthAck = 10
};

std::vector<uint8_t> tcp_header(uint8_t type, uint8_t flags, uint32_t msg_len, uint64_t id = 0, uint64_t addr = 0,
                                uint64_t length = 0) {
    ByteWriter w;
    w.u32(0x59525246u);
    w.u16(2);
    w.u8(type);
    w.u8(flags);
    w.u32(0);
    w.u32(msg_len);
    w.u64(id);
    w.u64(addr);
    w.u64(length);
    return w.take();
}

struct TcpReply {
    uint8_t type = 0, flags = 0;
    int32_t status = 0;
    std::vector<uint8_t> data;  // msg_len bytes after the header
    uint64_t length = 0;
};

std::string tcp_key(const std::string &secret) {
    auto k = ferry_crypto::hmac_sha256(secret, "ferry transport key v1");
    return std::string(k.begin(), k.end());
}

std::array<uint8_t, 32> tcp_proof(const std::string &key, const char *role, const uint8_t *cn, const uint8_t *sn) {
    ferry_crypto::HmacSha256 mac(key.data(), key.size());
    mac.update("ferry tcp v2").update(role).update(cn, 32).update(sn, 32);
    return mac.finish();
}

class TcpWire {
public:
    TcpWire(const HostPort &where) : deadline_(Clock::now() + std::chrono::seconds(10)) {
        auto fd = connect_tcp(where, deadline_);
        EXPECT_TRUE(fd) << fd.error().message;
        if (fd) fd_ = std::move(*fd);
    }
    bool send(const std::vector<uint8_t> &bytes) { return bool(write_all(fd_.get(), bytes, deadline_)); }
    std::optional<TcpReply> receive() {
        std::array<uint8_t, kTcpHeader> h{};
        if (!read_all(fd_.get(), h, deadline_)) return std::nullopt;
        ByteReader r(h);
        uint32_t magic, status, msg_len;
        uint16_t version;
        uint64_t id, addr;
        TcpReply out;
        r.u32(magic);
        r.u16(version);
        r.u8(out.type);
        r.u8(out.flags);
        r.u32(status);
        r.u32(msg_len);
        r.u64(id);
        r.u64(addr);
        r.u64(out.length);
        out.status = static_cast<int32_t>(status);
        out.data.resize(msg_len);
        if (!read_all(fd_.get(), out.data, deadline_)) return std::nullopt;
        return out;
    }

private:
    Clock::time_point deadline_;
    Fd fd_;
};

// The tcp endpoint and region of a peer, read through an authenticated control connection.
struct TcpTarget {
    HostPort where;
    uint64_t base = 0;
};

TcpTarget tcp_target(const PeerProcess &peer, const std::string &secret) {
    auto deadline = Clock::now() + std::chrono::seconds(5);
    auto client = ControlClient::connect(peer.segment, "peer", "auth-test", secret, deadline);
    EXPECT_TRUE(client) << client.error().message;
    if (!client) return {};
    auto bytes = client->call(control::kGetDescriptor, {}, deadline);
    EXPECT_TRUE(bytes);
    auto d = decode_descriptor(*bytes);
    EXPECT_TRUE(d);
    const auto *ep = d->endpoint_for("tcp");
    EXPECT_TRUE(ep && ep->endpoint.size() == 28);
    uint16_t port = static_cast<uint16_t>(ep->endpoint[8] | ep->endpoint[9] << 8);
    return {{"127.0.0.1", port}, peer.base};
}

std::vector<uint8_t> hello_with(const uint8_t nonce[32], bool has_key) {
    auto m = tcp_header(kTcpHello, has_key ? 0x2 : 0, 32);
    m.insert(m.end(), nonce, nonce + 32);
    return m;
}

}  // namespace

TEST(TcpAuth, TheRightKeyIsServedAndAReplayOfItsHandshakeIsRefused) {
    PeerProcess peer({"--size", "65536", "--option", "auth_secret=" + kSecret});
    ASSERT_TRUE(peer.ok) << peer.error;
    TcpTarget t = tcp_target(peer, kSecret);
    const std::string key = tcp_key(kSecret);
    uint8_t nonce[32];
    for (int i = 0; i < 32; ++i) nonce[i] = static_cast<uint8_t>(i * 7);
    std::vector<uint8_t> recorded_auth;
    {
        TcpWire c(t.where);
        ASSERT_TRUE(c.send(hello_with(nonce, true)));
        auto ack = c.receive();
        ASSERT_TRUE(ack && ack->type == kTcpHelloAck && ack->data.size() == 64);
        EXPECT_EQ(ack->flags & 0x2, 0x2) << "the server says it has a key";
        auto server_proof = tcp_proof(key, "server", nonce, ack->data.data());
        EXPECT_TRUE(std::equal(server_proof.begin(), server_proof.end(), ack->data.begin() + 32))
            << "the server proved the key";
        auto proof = tcp_proof(key, "client", nonce, ack->data.data());
        recorded_auth = tcp_header(kTcpAuth, 0, 32);
        recorded_auth.insert(recorded_auth.end(), proof.begin(), proof.end());
        ASSERT_TRUE(c.send(recorded_auth));
        auto done = c.receive();
        ASSERT_TRUE(done && done->type == kTcpAuthAck);
        ASSERT_TRUE(c.send(tcp_header(kTcpReadReq, 0, 0, 1, t.base, 16)));
        auto resp = c.receive();
        ASSERT_TRUE(resp && resp->type == kTcpReadResp && resp->length == 16);
    }
    TcpWire replay(t.where);
    ASSERT_TRUE(replay.send(hello_with(nonce, true)));
    auto ack = replay.receive();
    ASSERT_TRUE(ack && ack->type == kTcpHelloAck);
    ASSERT_TRUE(replay.send(recorded_auth));
    auto refused = replay.receive();
    ASSERT_TRUE(refused);
    EXPECT_EQ(refused->type, kTcpError);
    EXPECT_EQ(refused->status, -EACCES);
    EXPECT_TRUE(contains(std::string(refused->data.begin(), refused->data.end()), "authentication failed"));
    EXPECT_FALSE(replay.send(tcp_header(kTcpReadReq, 0, 0, 1, t.base, 16)) && replay.receive())
        << "a refused connection served a READ";
}

TEST(TcpAuth, NoKeyOrAWrongKeyIsRefusedBeforeAnyRequestIsServed) {
    PeerProcess peer({"--size", "65536", "--option", "auth_secret=" + kSecret});
    ASSERT_TRUE(peer.ok) << peer.error;
    TcpTarget t = tcp_target(peer, kSecret);
    uint8_t nonce[32] = {1, 2, 3};
    {
        // A client without a key, and one that skips the handshake and asks for memory at once.
        TcpWire c(t.where);
        ASSERT_TRUE(c.send(hello_with(nonce, false)));
        auto r = c.receive();
        ASSERT_TRUE(r);
        EXPECT_EQ(r->type, kTcpError);
        EXPECT_EQ(r->status, -EACCES);
        EXPECT_TRUE(contains(std::string(r->data.begin(), r->data.end()), "requires the cluster secret"));
        TcpWire rude(t.where);
        ASSERT_TRUE(rude.send(tcp_header(kTcpReadReq, 0, 0, 1, t.base, 16)));
        auto nothing = rude.receive();
        EXPECT_FALSE(nothing && nothing->type == kTcpReadResp) << "a READ was served without a handshake";
    }
    // A wrong key: the server's proof does not verify, and the server refuses our AUTH.
    const std::string wrong = tcp_key(kOtherSecret);
    TcpWire c(t.where);
    ASSERT_TRUE(c.send(hello_with(nonce, true)));
    auto ack = c.receive();
    ASSERT_TRUE(ack && ack->type == kTcpHelloAck);
    auto expected = tcp_proof(wrong, "server", nonce, ack->data.data());
    EXPECT_FALSE(std::equal(expected.begin(), expected.end(), ack->data.begin() + 32));
    auto proof = tcp_proof(wrong, "client", nonce, ack->data.data());
    auto auth = tcp_header(kTcpAuth, 0, 32);
    auth.insert(auth.end(), proof.begin(), proof.end());
    ASSERT_TRUE(c.send(auth));
    auto r = c.receive();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->type, kTcpError);
    EXPECT_EQ(r->status, -EACCES);
    EXPECT_TRUE(contains(std::string(r->data.begin(), r->data.end()), "wrong auth_secret"));
}

// The engine path: a peer whose descriptor we hold (as anyone reading etcd would) but whose
// secret we do not know: the transfer fails with tcp.so's refusal, and no byte moves.
TEST(TcpAuth, AnEngineWithAnotherSecretCannotTouchMemoryEvenWithTheDescriptor) {
    PeerProcess peer({"--size", "65536", "--option", "auth_secret=" + kSecret});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto deadline = Clock::now() + std::chrono::seconds(5);
    auto client = ControlClient::connect(peer.segment, "peer", "auth-test", kSecret, deadline);
    ASSERT_TRUE(client);
    auto bytes = client->call(control::kGetDescriptor, {}, deadline);
    ASSERT_TRUE(bytes);
    auto d = decode_descriptor(*bytes);
    ASSERT_TRUE(d);
    const auto *ep = d->endpoint_for("tcp");
    ASSERT_TRUE(ep);
    // tcp.so with another cluster's key, or none, connects to the leaked endpoint: refused.
    auto plugins = load_plugins([] {
        LoaderOptions o;
        o.search_path = default_search_path();
        o.selection = PluginSelection::parse("tcp");
        return o;
    }());
    std::shared_ptr<LoadedPlugin> tcp;
    for (auto &p : plugins.plugins)
        if (p.name == "tcp" && p.state == PluginState::Loaded) tcp = p.plugin;
    ASSERT_TRUE(tcp);
    auto t = Transport::create(tcp, {{"auth_key", transport_auth_key(kOtherSecret)}});
    ASSERT_TRUE(t) << t.error().message;
    auto p = (*t)->connect(ep->endpoint);
    ASSERT_FALSE(p) << "connected with another cluster's key";
    EXPECT_EQ(p.error().code, -EACCES) << p.error().message;
    EXPECT_TRUE(contains(p.error().message, "authentication failed")) << p.error().message;
    auto none = Transport::create(tcp, {});
    ASSERT_TRUE(none);
    auto q = (*none)->connect(ep->endpoint);
    ASSERT_FALSE(q) << "connected without a key";
    EXPECT_EQ(q.error().code, -EACCES) << q.error().message;
    EXPECT_TRUE(contains(q.error().message, "requires the cluster secret")) << q.error().message;
    std::vector<uint8_t> pattern(65536);
    for (size_t i = 0; i < pattern.size(); ++i) pattern[i] = test::peer_pattern(i);
    char expected[64];
    std::snprintf(expected, sizeof expected, "SUM %" PRIx64, test::fnv1a(pattern.data(), pattern.size()));
    EXPECT_EQ(peer.command("sum"), expected) << "the peer's memory changed";
}

// ---- access rights per region ------------------------------------------------------------

TEST(AccessRights, AReadOnlyRegionRefusesWritesAndKeepsItsBytes) {
    PeerProcess peer({"--size", "65536", "--access", "r", "--option", "auth_secret=" + kSecret});
    ASSERT_TRUE(peer.ok) << peer.error;
    std::string before = peer.command("sum");
    auto engine = engine_with({{"auth_secret", kSecret}});
    ASSERT_TRUE(engine);
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    auto regions = engine->segment_regions(*seg);
    ASSERT_TRUE(regions);
    ASSERT_EQ(regions->size(), 1u);
    EXPECT_EQ((*regions)[0].access, kRemoteRead);
    std::vector<uint8_t> local(65536, 0xee);
    ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
    Request write{Opcode::Write, local.data(), *seg, peer.base, local.size(), "tcp"};
    auto b = engine->submit(std::span(&write, 1));
    ASSERT_FALSE(b) << "a WRITE to a read-only region was accepted";
    EXPECT_EQ(b.error().code, -EACCES);
    EXPECT_TRUE(contains(b.error().message, "remote write")) << b.error().message;
    Request read{Opcode::Read, local.data(), *seg, peer.base, local.size(), "tcp"};
    auto r = engine->submit(std::span(&read, 1));
    ASSERT_TRUE(r) << r.error().message;
    ASSERT_TRUE(engine->wait(*r, std::chrono::seconds(30)));
    EXPECT_EQ(local[100], test::peer_pattern(100));
    EXPECT_EQ(peer.command("sum"), before) << "read-only memory changed";

    // A write-only region refuses READs.
    PeerProcess sink({"--size", "65536", "--access", "w", "--option", "auth_secret=" + kSecret});
    ASSERT_TRUE(sink.ok) << sink.error;
    auto sink_seg = engine->open_segment(sink.segment);
    ASSERT_TRUE(sink_seg);
    Request peek{Opcode::Read, local.data(), *sink_seg, sink.base, 4096, "tcp"};
    auto p = engine->submit(std::span(&peek, 1));
    ASSERT_FALSE(p) << "a READ of a write-only region was accepted";
    EXPECT_EQ(p.error().code, -EACCES);
}

// shm.so with a cluster secret serves only its own user: a process of another user (here
// `nobody` against this root process's peer, which root's ptrace right would otherwise let in)
// is refused, while tcp.so still serves it once it proves the secret.
TEST(ShmAuth, ServesOnlyItsOwnUserWhenTheClusterHasASecret) {
    if (geteuid() != 0) {
        std::printf("SKIPPED: needs root to run an initiator as another user (uid 65534)\n");
        GTEST_SKIP() << "needs root to run an initiator as another user";
    }
    PeerProcess peer({"--size", "65536", "--option", "plugins=shm,tcp", "--option", "auth_secret=" + kSecret});
    if (!peer.ok && contains(peer.error, "shm")) {
        std::printf("SKIPPED: shm.so is not available here: %s\n", peer.error.c_str());
        GTEST_SKIP() << "shm.so is not available: " << peer.error;
    }
    ASSERT_TRUE(peer.ok) << peer.error;
    int out[2];
    ASSERT_EQ(pipe(out), 0);
    pid_t child = fork();
    if (child == 0) {
        close(out[0]);
        auto report = [&](const std::string &line) {
            std::string l = line + "\n";
            (void)!write(out[1], l.data(), l.size());
        };
        if (setgid(65534) != 0 || setuid(65534) != 0) {
            report("SETUID failed");
            _exit(1);
        }
        auto e = Engine::create({{"plugins", "shm,tcp"}, {"auth_secret", kSecret}});
        if (!e) {
            report("CREATE " + e.error().message);
            _exit(1);
        }
        std::vector<uint8_t> local(4096);
        auto seg = (*e)->open_segment(peer.segment);
        if (!seg || !(*e)->register_memory(local.data(), local.size())) {
            report("OPEN failed");
            _exit(1);
        }
        for (const char *transport : {"shm", "tcp"}) {
            Request r{Opcode::Read, local.data(), *seg, peer.base, local.size(), transport};
            auto b = (*e)->submit(std::span(&r, 1));
            Result<void> w = b ? (*e)->wait(*b, std::chrono::seconds(20)) : Result<void>(std::unexpected(b.error()));
            report(std::string(transport) + " " +
                   (w ? "OK" : std::to_string(w.error().code) + " " + w.error().message));
        }
        _exit(0);
    }
    close(out[1]);
    std::string text;
    char buf[4096];
    ssize_t n;
    while ((n = read(out[0], buf, sizeof buf)) > 0) text.append(buf, static_cast<size_t>(n));
    close(out[0]);
    int status = 0;
    waitpid(child, &status, 0);
    ASSERT_TRUE(contains(text, "tcp OK")) << text;
    EXPECT_FALSE(contains(text, "shm OK")) << text;
    EXPECT_TRUE(contains(text, "serves only processes of its own user")) << text;
}
