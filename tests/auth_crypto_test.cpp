// Authentication with a cluster secret, the secret and its proofs: HMAC-SHA-256 (libcrypto) test
// vectors and proofs pinned from earlier versions, a host without libcrypto, and the secret's
// sources and their precedence. (auth_control_test: the control channel; auth_test: tcp.so, shm.so
// and per-region access rights.)
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

namespace {

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
