// Authentication with a cluster secret on the control channel: real engines in two processes over
// real sockets; peers that do not know the secret are refused in both directions, clearly and
// logged once, and a replayed handshake is refused.
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

}  // namespace

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
