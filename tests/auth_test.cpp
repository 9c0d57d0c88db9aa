// Authentication with a cluster secret: HMAC-SHA-256 (libcrypto) test vectors and pinned proofs, the secret's sources and
// their precedence, and real engines in two processes over real sockets: the control channel
// and tcp.so refuse peers that do not know the secret, in both directions, a replayed
// handshake is refused, and per-region access rights hold.
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

#include "auth.hpp"
#include "auth_proof.hpp"
#include "control_client.hpp"
#include "control_protocol.hpp"
#include "descriptor.hpp"
#include "ferry/engine.hpp"
#include "hmac_sha256.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"
#include "plugin_loader.hpp"
#include "socket_util.hpp"
#include "test_util.hpp"
#include "transport.hpp"

using namespace ferry;
using ferry::test::PeerProcess;

namespace {

const std::string kSecret = "correct horse battery staple 42";
const std::string kOtherSecret = "another cluster's secret, 1234";

bool contains(const std::string &text, const std::string &part) { return text.find(part) != std::string::npos; }

std::unique_ptr<Engine> engine_with(Config extra) {
    Config c{{"plugins", "tcp"}};
    for (auto &[k, v] : extra) c[k] = v;
    auto e = Engine::create(c);
    EXPECT_TRUE(e) << e.error().message;
    return e ? std::move(*e) : nullptr;
}

// Captures what this process writes to stderr (the log) while it lives.
class StderrCapture {
public:
    StderrCapture() {
        std::fflush(stderr);
        saved_ = dup(2);
        int fd = ::open((dir_ / "stderr").c_str(), O_CREAT | O_WRONLY | O_TRUNC, 0600);
        dup2(fd, 2);
        close(fd);
    }
    ~StderrCapture() { restore(); }
    std::string text() {
        restore();
        int status = 0;
        return ferry::test::run_command("cat " + (dir_ / "stderr").string(), &status);
    }

private:
    void restore() {
        if (saved_ < 0) return;
        std::fflush(stderr);
        dup2(saved_, 2);
        close(saved_);
        saved_ = -1;
    }
    ferry::test::TempDir dir_;
    int saved_ = -1;
};

size_t count_lines_with(const std::string &text, const std::string &a, const std::string &b) {
    size_t n = 0, start = 0;
    while (start < text.size()) {
        size_t end = text.find('\n', start);
        if (end == std::string::npos) end = text.size();
        std::string line = text.substr(start, end - start);
        if (contains(line, a) && contains(line, b)) ++n;
        start = end + 1;
    }
    return n;
}

std::string hex_of(const ferry_crypto::Digest &d) { return ferry_crypto::to_hex(d.data(), d.size()); }

std::string unhex(std::string_view h) {
    std::string out;
    EXPECT_TRUE(ferry_crypto::from_hex(h, out)) << h;
    return out;
}

}  // namespace

// Proofs pinned from the hand-written SHA-256/HMAC this library replaced: the wire is
// unchanged, so engines of either version interoperate.
TEST(HmacSha256, ProofsOnTheWireAreThoseOfEarlierVersions) {
    EXPECT_EQ(transport_auth_key(kSecret), "af34c3c4d4732049341bfd18fe04285bf3b9403259679590ebc97d8c411bf396");
    control::Nonce cn, sn;
    for (size_t i = 0; i < cn.size(); ++i) {
        cn[i] = static_cast<uint8_t>(i);
        sn[i] = static_cast<uint8_t>(0xa0 + i);
    }
    EXPECT_EQ(hex_of(ferry_auth::make_proof(kSecret, control::kProtocol, control::Role::kClient, cn, sn, "node-a")),
              "7ce7b1964f2efdba69148a02dfc2f6beb8cd92903840237d443febe35a7f2797");
    std::string key = unhex(transport_auth_key(kSecret));
    ferry_crypto::HmacSha256 tcp(key.data(), key.size());
    tcp.update("ferry tcp v2").update("server").update(cn.data(), cn.size()).update(sn.data(), sn.size());
    EXPECT_EQ(hex_of(tcp.finish()), "8e7b84fbb33e294c7e81bdf7afdca6caa1c9c0ebdf1a2bd6684028ff341f511f");
}

// base/auth_proof.hpp computes the proofs of all three protocols: each is HMAC-SHA-256 over
// its own label | role | client nonce | server nonce | context, exactly as each protocol wrote
// it before (computed here independently), zeros without a key, and no two protocols or roles
// share a proof.
TEST(AuthProof, OneFunctionGivesEveryProtocolsBytes) {
    ferry_auth::Nonce cn, sn;
    for (size_t i = 0; i < cn.size(); ++i) {
        cn[i] = static_cast<uint8_t>(3 * i);
        sn[i] = static_cast<uint8_t>(0x55 ^ i);
    }
    const std::string key = unhex(transport_auth_key(kSecret));
    struct Case {
        ferry_auth::Protocol protocol;
        const char *label;
        const char *context;
    } cases[] = {{ferry_auth::Protocol::kControl, "ferry control v2", "node-b"},
                 {ferry_auth::Protocol::kTcp, "ferry tcp v2", ""},
                 {ferry_auth::Protocol::kRdma, "ferry rdma v1", ""}};
    std::vector<std::string> seen;
    for (const auto &c : cases)
        for (auto role : {ferry_auth::Role::kServer, ferry_auth::Role::kClient}) {
            const char *role_name = role == ferry_auth::Role::kServer ? "server" : "client";
            ferry_crypto::HmacSha256 mac(key.data(), key.size());
            mac.update(c.label).update(role_name).update(cn.data(), cn.size()).update(sn.data(), sn.size());
            mac.update(c.context);
            auto want = mac.finish();
            auto got = ferry_auth::make_proof(key, c.protocol, role, cn, sn, c.context);
            EXPECT_EQ(hex_of(got), hex_of(want)) << c.label << " " << role_name;
            EXPECT_TRUE(ferry_auth::proof_matches(key, c.protocol, role, cn, sn, got, c.context));
            auto flipped = got;
            flipped[31] ^= 1;
            EXPECT_FALSE(ferry_auth::proof_matches(key, c.protocol, role, cn, sn, flipped, c.context));
            seen.push_back(hex_of(got));
            EXPECT_EQ(hex_of(ferry_auth::make_proof("", c.protocol, role, cn, sn, c.context)), std::string(64, '0'));
        }
    std::sort(seen.begin(), seen.end());
    EXPECT_EQ(std::unique(seen.begin(), seen.end()), seen.end()) << "two protocols or roles share a proof";
}

// A host without libcrypto (FERRY_LIBCRYPTO names a library that does not exist, so the real
// one is not found): an engine with a secret refuses to start and says what to install; one
// without a secret needs no libcrypto and starts.
TEST(HmacSha256, ASecretWithoutLibcryptoIsRefusedWithWhatToInstall) {
    ASSERT_EQ(setenv("FERRY_LIBCRYPTO", "/nonexistent/libcrypto.so.3", 1), 0);
    std::unique_ptr<PeerProcess> with_secret, without;
    with_secret =
        std::make_unique<PeerProcess>(std::vector<std::string>{"--size", "4096", "--option", "auth_secret=" + kSecret});
    without = std::make_unique<PeerProcess>(std::vector<std::string>{"--size", "4096"});
    unsetenv("FERRY_LIBCRYPTO");
    EXPECT_FALSE(with_secret->ok) << with_secret->ready_line;
    EXPECT_TRUE(contains(with_secret->error,
                         "auth_secret is set but OpenSSL's libcrypto (libcrypto.so.3) could not be "
                         "loaded: install libssl3 (Debian/Ubuntu) or openssl-libs (RHEL)"))
        << with_secret->error;
    EXPECT_TRUE(contains(with_secret->error, "/nonexistent/libcrypto.so.3")) << with_secret->error;
    EXPECT_TRUE(without->ok) << without->error;
}

// tcp.so checks for libcrypto itself when it is given a key (any host program may load it). In
// a re-executed child, so that this process's libcrypto, already loaded, does not count.
TEST(HmacSha256, TcpSoGivenAKeyWithoutLibcryptoRefusesIt) {
    GTEST_FLAG_SET(death_test_style, "threadsafe");
    EXPECT_EXIT(
        {
            setenv("FERRY_LIBCRYPTO", "/nonexistent/libcrypto.so.3", 1);
            auto plugins = load_plugins([] {
                LoaderOptions o;
                o.search_path = default_search_path();
                o.selection = PluginSelection::parse("tcp");
                return o;
            }());
            std::shared_ptr<LoadedPlugin> tcp;
            for (auto &p : plugins.plugins)
                if (p.name == "tcp" && p.state == PluginState::Loaded) tcp = p.plugin;
            if (!tcp) _exit(2);
            // The key of kSecret, pinned above: computing it here would need libcrypto.
            auto t = Transport::create(
                tcp, {{"auth_key", "af34c3c4d4732049341bfd18fe04285bf3b9403259679590ebc97d8c411bf396"}});
            std::fprintf(stderr, "%s\n", t ? "created" : t.error().message.c_str());
            std::fflush(stderr);
            _exit(t ? 1 : 0);
        },
        ::testing::ExitedWithCode(0), "tcp: option 'auth_key': auth_secret is set but OpenSSL's libcrypto");
}

// RFC 4231, test cases 1-4, 6 and 7 (case 5 is a truncated output).
TEST(HmacSha256, Rfc4231Vectors) {
    struct Case {
        std::string key, data, mac;
    };
    const Case cases[] = {
        {std::string(20, '\x0b'), "Hi There", "b0344c61d8db38535ca8afceaf0bf12b881dc200c9833da726e9376c2e32cff7"},
        {"Jefe", "what do ya want for nothing?", "5bdcc146bf60754e6a042426089575c75a003f089d2739839dec58b964ec3843"},
        {std::string(20, '\xaa'), std::string(50, '\xdd'),
         "773ea91e36800e46854db8ebd09181a72959098b3ef8c122d9635514ced565fe"},
        {unhex("0102030405060708090a0b0c0d0e0f10111213141516171819"), std::string(50, '\xcd'),
         "82558a389a443c0ea4cc819899f2083a85f0faa3e578f8077a2e3ff46729665b"},
        {std::string(131, '\xaa'), "Test Using Larger Than Block-Size Key - Hash Key First",
         "60e431591ee0b67f0d8a26aacbf5b77f8e0bc6213728c5140546040f0ee37f54"},
        {std::string(131, '\xaa'),
         "This is a test using a larger than block-size key and a larger than block-size data. The key needs to be "
         "hashed before being used by the HMAC algorithm.",
         "9b09ffa71b942fcb27635fbcd5b0e944bfdc63644f0713938a7f51535c3a35e2"},
    };
    for (const auto &c : cases) EXPECT_EQ(hex_of(ferry_crypto::hmac_sha256(c.key, c.data)), c.mac) << c.data;
}

TEST(HmacSha256, ComparisonAndHex) {
    auto a = ferry_crypto::hmac_sha256("k", "m");
    auto b = a;
    EXPECT_TRUE(ferry_crypto::equal_digests(a.data(), b.data(), a.size()));
    b[31] ^= 1;
    EXPECT_FALSE(ferry_crypto::equal_digests(a.data(), b.data(), a.size()));
    std::string out;
    EXPECT_FALSE(ferry_crypto::from_hex("abc", out));
    EXPECT_FALSE(ferry_crypto::from_hex("zz", out));
    EXPECT_TRUE(ferry_crypto::from_hex("00fF", out));
    EXPECT_EQ(out, std::string("\x00\xff", 2));
}

// ---- where the secret comes from -------------------------------------------------------

class SecretSources : public ::testing::Test {
protected:
    void SetUp() override {
        unsetenv("FERRY_AUTH_SECRET");
        unsetenv("FERRY_AUTH_SECRET_FILE");
    }
    void TearDown() override { SetUp(); }
    std::string write_file(const std::string &name, const std::string &text) {
        auto path = (dir / name).string();
        std::ofstream(path) << text;
        chmod(path.c_str(), 0600);
        return path;
    }
    ferry::test::TempDir dir;
};

TEST_F(SecretSources, ConfigBeatsEnvironmentAndAValueBeatsAFile) {
    EXPECT_TRUE(resolve_auth_secret(nullptr, nullptr)->secret.empty()) << "no secret anywhere: none";
    std::string file = write_file("secret", kOtherSecret + "\n");
    setenv("FERRY_AUTH_SECRET_FILE", file.c_str(), 1);
    auto from_env_file = resolve_auth_secret(nullptr, nullptr);
    ASSERT_TRUE(from_env_file) << from_env_file.error().message;
    EXPECT_EQ(from_env_file->secret, kOtherSecret) << "the file's trailing newline is not part of it";
    EXPECT_EQ(from_env_file->origin, "environment FERRY_AUTH_SECRET_FILE");
    setenv("FERRY_AUTH_SECRET", kSecret.c_str(), 1);
    EXPECT_EQ(resolve_auth_secret(nullptr, nullptr)->secret, kSecret);
    std::string config_file = write_file("config-secret", "from the config file secret");
    EXPECT_EQ(resolve_auth_secret(nullptr, &config_file)->secret, "from the config file secret");
    std::string value = "from the config value itself";
    EXPECT_EQ(resolve_auth_secret(&value, nullptr)->secret, value);
    auto both = resolve_auth_secret(&value, &config_file);
    ASSERT_FALSE(both);
    EXPECT_EQ(both.error().code, -EINVAL);
    EXPECT_TRUE(contains(both.error().message, "both set")) << both.error().message;
}

TEST_F(SecretSources, ShortSecretsAndMissingFilesAreRefusedWithoutEchoingTheSecret) {
    std::string shorty = "tooshort";
    auto r = resolve_auth_secret(&shorty, nullptr);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -EINVAL);
    EXPECT_TRUE(contains(r.error().message, "at least 16")) << r.error().message;
    EXPECT_FALSE(contains(r.error().message, shorty)) << "the message must not contain the secret";
    std::string missing = (dir / "nope").string();
    auto m = resolve_auth_secret(nullptr, &missing);
    ASSERT_FALSE(m);
    EXPECT_TRUE(contains(m.error().message, missing)) << m.error().message;
    auto e = Engine::create({{"plugins", "tcp"}, {"auth_secret", shorty}});
    ASSERT_FALSE(e);
    EXPECT_TRUE(contains(e.error().message, "auth_secret")) << e.error().message;
}

// ---- the control channel ---------------------------------------------------------------

TEST(ControlAuth, TheRightSecretServesDescriptorsDataAndNotifications) {
    PeerProcess peer({"--size", "1048576", "--option", "auth_secret=" + kSecret});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = engine_with({{"auth_secret", kSecret}});
    ASSERT_TRUE(engine);
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<uint8_t> local(peer.size);
    ASSERT_TRUE(engine->register_memory(local.data(), local.size()));
    Request read{Opcode::Read, local.data(), *seg, peer.base, peer.size, "tcp"};
    auto b = engine->submit(std::span(&read, 1));
    ASSERT_TRUE(b) << b.error().message;
    auto w = engine->wait(*b, std::chrono::seconds(30));
    ASSERT_TRUE(w) << w.error().message << " (tcp.so with the derived key)";
    for (size_t i = 0; i < local.size(); ++i) ASSERT_EQ(local[i], test::peer_pattern(i));
    std::string text = "hi";
    ASSERT_TRUE(engine->send_notification(*seg, {reinterpret_cast<const uint8_t *>(text.data()), text.size()}));
    EXPECT_EQ(peer.command("take"), "TAKEN 1 " + engine->segment_name() + "|hi");
    ASSERT_EQ(peer.command("notify " + engine->segment_name() + " back"), "OK");
    EXPECT_EQ(engine->take_notifications().size(), 1u);
}

TEST(ControlAuth, AWrongSecretIsRefusedClearlyAndLoggedOnceByTheServer) {
    auto server = engine_with({{"auth_secret", kSecret}, {"log_level", "warn"}});
    auto client = engine_with({{"auth_secret", kOtherSecret}, {"log_level", "warn"}});
    ASSERT_TRUE(server && client);
    std::string log;
    Result<SegmentId> seg;
    {
        StderrCapture capture;
        seg = client->open_segment(server->segment_name());
        std::this_thread::sleep_for(std::chrono::milliseconds(200));  // the server thread logs
        log = capture.text();
    }
    ASSERT_FALSE(seg) << "a peer with another secret fetched the descriptor";
    EXPECT_EQ(seg.error().code, -EACCES);
    EXPECT_TRUE(contains(seg.error().message, "authentication failed")) << seg.error().message;
    EXPECT_TRUE(contains(seg.error().message, "auth_secret")) << seg.error().message;
    EXPECT_EQ(count_lines_with(log, "refused connection from 127.0.0.1:", "wrong auth_secret"), 1u) << log;
    EXPECT_FALSE(contains(log, kSecret) || contains(log, kOtherSecret)) << "a secret reached the log";
}

TEST(ControlAuth, NoSecretAgainstASecretIsRefusedBothWays) {
    PeerProcess guarded({"--size", "4096", "--option", "auth_secret=" + kSecret});
    ASSERT_TRUE(guarded.ok) << guarded.error;
    PeerProcess open({"--size", "4096"});
    ASSERT_TRUE(open.ok) << open.error;
    auto without = engine_with({});
    auto with = engine_with({{"auth_secret", kSecret}});
    ASSERT_TRUE(without && with);

    auto a = without->open_segment(guarded.segment);
    ASSERT_FALSE(a);
    EXPECT_EQ(a.error().code, -EACCES);
    EXPECT_TRUE(contains(a.error().message, "requires the cluster secret (auth_secret)")) << a.error().message;

    auto b = with->open_segment(open.segment);
    ASSERT_FALSE(b);
    EXPECT_EQ(b.error().code, -EACCES);
    EXPECT_TRUE(contains(b.error().message, "has no cluster secret")) << b.error().message;

    // Notifications from the guarded peer to an engine without a secret are refused too.
    std::string reply = guarded.command("notify " + without->segment_name() + " x");
    EXPECT_TRUE(contains(reply, "ERROR -13") && contains(reply, "has no cluster secret")) << reply;
    EXPECT_TRUE(without->take_notifications().empty());
}

// A recorded HELLO + AUTH sent again gets a fresh server nonce its proof does not cover.
TEST(ControlAuth, AReplayedHandshakeIsRefused) {
    auto server = engine_with({{"auth_secret", kSecret}});
    ASSERT_TRUE(server);
    auto where = parse_host_port(server->segment_name());
    ASSERT_TRUE(where);
    auto deadline = Clock::now() + std::chrono::seconds(5);
    control::Nonce nonce{};
    nonce[0] = 7;
    ByteWriter hello;
    hello.bytes(nonce);
    hello.u32(control::kFlagSecret);
    hello.str("eavesdropped");
    auto hello_frame = control::frame(control::kHello, hello.data());
    auto read_frame = [&](int fd) -> std::pair<control::Header, std::vector<uint8_t>> {
        std::array<uint8_t, control::kHeaderBytes> head{};
        EXPECT_TRUE(read_all(fd, head, deadline));
        auto h = control::parse_header(head);
        std::vector<uint8_t> payload(h.length);
        EXPECT_TRUE(read_all(fd, payload, deadline));
        return {h, payload};
    };
    // The genuine exchange, as an eavesdropper would record it.
    std::vector<uint8_t> auth_frame;
    {
        auto fd = connect_tcp(*where, deadline);
        ASSERT_TRUE(fd);
        ASSERT_TRUE(write_all(fd->get(), hello_frame, deadline));
        auto [h, payload] = read_frame(fd->get());
        ASSERT_EQ(h.code, 0);
        control::Nonce server_nonce;
        std::copy(payload.begin() + 4, payload.begin() + 4 + 32, server_nonce.begin());
        auto proof = ferry_auth::make_proof(kSecret, control::kProtocol, control::Role::kClient, nonce, server_nonce,
                                            "eavesdropped");
        auth_frame = control::frame(control::kAuth, proof);
        ASSERT_TRUE(write_all(fd->get(), auth_frame, deadline));
        EXPECT_EQ(read_frame(fd->get()).first.code, 0) << "the genuine exchange is accepted";
    }
    auto fd = connect_tcp(*where, deadline);
    ASSERT_TRUE(fd);
    ASSERT_TRUE(write_all(fd->get(), hello_frame, deadline));
    EXPECT_EQ(read_frame(fd->get()).first.code, 0);
    ASSERT_TRUE(write_all(fd->get(), auth_frame, deadline));
    auto [h, payload] = read_frame(fd->get());
    EXPECT_EQ(h.code, EACCES);
    EXPECT_TRUE(contains(std::string(payload.begin(), payload.end()), "authentication failed"));
    // ...and nothing is served on it.
    auto get = control::frame(control::kGetDescriptor, std::string_view("x"));
    (void)write_all(fd->get(), get, deadline);
    std::array<uint8_t, 1> more{};
    EXPECT_FALSE(read_all(fd->get(), more, deadline)) << "the server kept talking after refusing";
}

// ---- tcp.so: memory access is gated too ------------------------------------------------
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
