// An untrusted metadata server: anyone who reaches Mooncake's HTTP metadata server (it has no
// authentication) or Redis can write a segment descriptor. With a cluster secret (auth_secret),
// such a descriptor must move no byte: tcp.so's mutual challenge-response refuses a listener that
// cannot prove the secret before any payload is sent, and the serving side checks every request
// against its own regions, whatever the descriptor claims. Both stores, each test against a real
// server on loopback (tests/metadata/servers.hpp); the descriptors are made with the core's own
// encoder.
#include <gtest/gtest.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <mutex>

#include "auth_util.hpp"
#include "ferry/engine.hpp"
#include "metadata/descriptor.hpp"
#include "metadata/servers.hpp"

using namespace ferry;
using namespace ferry::test::metadata;
using ferry::test::auth::kOtherSecret;
using ferry::test::auth::kSecret;

namespace {

// tcp.so's endpoint bytes (plugins/tcp/wire.hpp): the port, little-endian, at offset 8.
uint16_t tcp_port(const std::vector<uint8_t> &endpoint) { return endpoint[8] | (endpoint[9] << 8); }
void set_tcp_port(std::vector<uint8_t> &endpoint, uint16_t port) {
    endpoint[8] = static_cast<uint8_t>(port);
    endpoint[9] = static_cast<uint8_t>(port >> 8);
}

// Listens on 127.0.0.1 and relays every connection to `target_port`, keeping a copy of all the
// bytes its clients sent.
class RecordingProxy {
public:
    explicit RecordingProxy(uint16_t target_port) : target_port_(target_port) {
        listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a = loopback(0);
        socklen_t len = sizeof a;
        bind(listener_, reinterpret_cast<sockaddr *>(&a), sizeof a);
        listen(listener_, 16);
        getsockname(listener_, reinterpret_cast<sockaddr *>(&a), &len);
        port_ = ntohs(a.sin_port);
        thread_ = std::thread([this] { relay(); });
    }
    ~RecordingProxy() {
        stop_ = true;
        thread_.join();
        close(listener_);
    }
    uint16_t port() const { return port_; }
    size_t connections() const { return connections_; }
    std::string received() {
        std::lock_guard lock(mutex_);
        return received_;
    }

private:
    static sockaddr_in loopback(uint16_t port) {
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        return a;
    }
    void relay() {
        std::vector<std::pair<int, int>> pairs;  // (from the client, to the target)
        while (!stop_) {
            std::vector<pollfd> fds{{listener_, POLLIN, 0}};
            for (auto [c, t] : pairs) {
                fds.push_back({c, POLLIN, 0});
                fds.push_back({t, POLLIN, 0});
            }
            if (poll(fds.data(), fds.size(), 50) <= 0) continue;
            for (size_t i = 0; i < pairs.size();) {
                auto [c, t] = pairs[i];
                bool closed = false;
                for (int side = 0; side < 2 && !closed; ++side) {
                    if (!(fds[1 + 2 * i + side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
                    char buf[65536];
                    ssize_t n = read(side ? t : c, buf, sizeof buf);
                    if (n <= 0) {
                        closed = true;
                        break;
                    }
                    if (side == 0) {
                        std::lock_guard lock(mutex_);
                        received_.append(buf, n);
                    }
                    if (send(side ? c : t, buf, n, MSG_NOSIGNAL) != n) closed = true;
                }
                if (closed) {
                    close(c);
                    close(t);
                    pairs.erase(pairs.begin() + i);
                    fds.erase(fds.begin() + 1 + 2 * i, fds.begin() + 3 + 2 * i);
                } else {
                    ++i;
                }
            }
            // Last: `fds` has no entries for a pair accepted now.
            if (fds[0].revents & POLLIN) {
                int c = accept4(listener_, nullptr, nullptr, SOCK_CLOEXEC);
                int t = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
                sockaddr_in a = loopback(target_port_);
                if (c >= 0 && connect(t, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0) {
                    pairs.emplace_back(c, t);
                    ++connections_;
                } else {
                    if (c >= 0) close(c);
                    close(t);
                }
            }
        }
        for (auto [c, t] : pairs) {
            close(c);
            close(t);
        }
    }

    uint16_t target_port_;
    int listener_ = -1;
    uint16_t port_ = 0;
    std::atomic<bool> stop_{false};
    std::atomic<size_t> connections_{0};
    std::mutex mutex_;
    std::string received_;
    std::thread thread_;
};

class MetadataSecurityTest : public ::testing::TestWithParam<std::string> {
protected:
    void SetUp() override {
        std::string why = GetParam() == "redis" ? RedisServer::missing() : HttpMetadataServer::missing();
        if (!why.empty()) {
            std::printf("SKIPPED: %s\n", why.c_str());
            GTEST_SKIP() << why;
        }
        if (GetParam() == "redis") {
            redis = std::make_unique<RedisServer>();
            ASSERT_TRUE(redis->start()) << redis->log();
            url = redis->url();
        } else {
            http = std::make_unique<HttpMetadataServer>();
            ASSERT_TRUE(http->start());
            url = http->url();
        }
        store = raw_store(url);
        ASSERT_TRUE(store);
    }
    std::unique_ptr<Engine> engine(const std::string &name, const std::string &secret, Config extra = {}) {
        Config c{{"plugins", "tcp"},
                 {"metadata", url},
                 {"local_server_name", name},
                 {"metadata_poll_ms", "200"},
                 {"handshake_timeout_ms", "3000"},
                 {"tcp.connect_timeout_ms", "3000"}};
        if (!secret.empty()) c["auth_secret"] = secret;
        for (auto &[k, v] : extra) c[k] = v;
        auto e = Engine::create(c);
        EXPECT_TRUE(e) << e.error().message;
        return e ? std::move(*e) : nullptr;
    }
    SegmentDescriptor published(const std::string &name) {
        auto bytes = store->get("ferry/segments/" + name);
        EXPECT_TRUE(bytes && *bytes) << "no descriptor of " << name;
        if (!bytes || !*bytes) return {};
        auto d = decode_descriptor({reinterpret_cast<const uint8_t *>((*bytes)->data()), (*bytes)->size()});
        EXPECT_TRUE(d) << d.error().message;
        return d ? *d : SegmentDescriptor{};
    }
    void plant(const SegmentDescriptor &d, bool stamp = true) {
        auto bytes = encode_descriptor(d);
        ASSERT_TRUE(store->put("ferry/segments/" + d.name, std::string(bytes.begin(), bytes.end())));
        if (stamp) {
            ASSERT_TRUE(store->put("ferry/stamps/" + d.name, "0000000000000000-1"));
        }
    }

    std::unique_ptr<RedisServer> redis;
    std::unique_ptr<HttpMetadataServer> http;
    std::string url;
    std::unique_ptr<KvStore> store;
};

const std::string kMarker = "FERRY-PAYLOAD-MARKER-0123456789";

}  // namespace

// Someone without the secret publishes a descriptor under the name the cluster opens, pointing
// at a listener of theirs (here: a proxy that records everything, in front of their own engine).
TEST_P(MetadataSecurityTest, APlantedDescriptorPointingAtAnotherListenerGetsNoPayload) {
    for (const std::string &attacker_secret : {std::string(), kOtherSecret}) {
        SCOPED_TRACE(attacker_secret.empty() ? "attacker without a secret" : "attacker with another secret");
        const std::string attacker_name = attacker_secret.empty() ? "attacker" : "attacker-2";
        auto attacker = engine(attacker_name, attacker_secret);
        ASSERT_TRUE(attacker);
        std::vector<uint8_t> trap(1 << 20, 0);
        ASSERT_TRUE(attacker->register_memory(trap.data(), trap.size()));
        SegmentDescriptor d = published(attacker_name);
        auto tcp = std::find_if(d.transports.begin(), d.transports.end(),
                                [](const TransportEndpoint &t) { return t.transport == "tcp"; });
        ASSERT_NE(tcp, d.transports.end());
        RecordingProxy proxy(tcp_port(tcp->endpoint));
        set_tcp_port(tcp->endpoint, proxy.port());
        d.name = "victim";
        plant(d);

        // A cluster member, misled into using it.
        auto member = engine("member", kSecret);
        ASSERT_TRUE(member);
        std::vector<uint8_t> payload(1 << 20);
        for (size_t i = 0; i < payload.size(); ++i) payload[i] = kMarker[i % kMarker.size()];
        const auto original = payload;
        ASSERT_TRUE(member->register_memory(payload.data(), payload.size()));
        auto seg = member->open_segment("victim");
        ASSERT_TRUE(seg) << seg.error().message;
        const uint64_t remote = reinterpret_cast<uintptr_t>(trap.data());
        auto w = transfer(*member, Opcode::Write, payload.data(), *seg, remote, payload.size());
        ASSERT_FALSE(w) << "a write went to a listener that does not know the secret";
        EXPECT_TRUE(contains(w.error().message, "authentication failed")) << w.error().message;
        std::printf("write: %d %s\n", w.error().code, w.error().message.c_str());
        auto r = transfer(*member, Opcode::Read, payload.data(), *seg, remote, payload.size());
        ASSERT_FALSE(r) << "a read came from a listener that does not know the secret";
        EXPECT_TRUE(contains(r.error().message, "authentication failed")) << r.error().message;
        EXPECT_EQ(payload, original) << "a refused read changed the local buffer";

        EXPECT_GT(proxy.connections(), 0u) << "the member never dialled the planted endpoint: nothing was tested";
        const std::string seen = proxy.received();
        EXPECT_LT(seen.size(), 1024u) << "more than a handshake reached the planted listener";
        EXPECT_EQ(seen.find(kMarker.substr(0, 12)), std::string::npos) << "payload bytes reached the planted listener";
        EXPECT_TRUE(std::all_of(trap.begin(), trap.end(), [](uint8_t b) { return b == 0; }))
            << "payload reached the attacker's memory";
    }
}

// Someone without the secret rewrites the real target's descriptor: its own endpoints, but a
// read-only region made writable and a region the target never registered.
TEST_P(MetadataSecurityTest, ForgedRegionsOfTheRealTargetAreRefusedByTheTarget) {
    // The target polls rarely here, so the forgery stays in place for the whole test (the next
    // test shows an engine writing its own descriptor back).
    auto target = engine("target", kSecret, {{"metadata_poll_ms", "3600000"}});
    ASSERT_TRUE(target);
    std::vector<uint8_t> shared(64 << 10, 0x11), hidden(64 << 10, 0x22);
    MemoryOptions read_only;
    read_only.access = kRemoteRead;
    ASSERT_TRUE(target->register_memory(shared.data(), shared.size(), read_only));
    SegmentDescriptor d = published("target");
    ASSERT_EQ(d.regions.size(), 1u);
    d.regions[0].access = kRemoteRead | kRemoteWrite;
    RegionDescriptor forged = d.regions[0];
    forged.addr = reinterpret_cast<uintptr_t>(hidden.data());
    forged.length = hidden.size();
    d.regions.push_back(forged);
    std::sort(d.regions.begin(), d.regions.end(), [](auto &a, auto &b) { return a.addr < b.addr; });
    plant(d, /*stamp=*/false);  // the target's own stamp stays: it does not notice

    auto member = engine("member", kSecret);
    ASSERT_TRUE(member);
    std::vector<uint8_t> local(64 << 10, 0x99);
    ASSERT_TRUE(member->register_memory(local.data(), local.size()));
    auto seg = member->open_segment("target");
    ASSERT_TRUE(seg) << seg.error().message;
    auto regions = member->segment_regions(*seg);
    ASSERT_TRUE(regions) << regions.error().message;
    ASSERT_EQ(regions->size(), 2u) << "the forged descriptor was not the one read";
    const uint64_t shared_addr = reinterpret_cast<uintptr_t>(shared.data());
    const uint64_t hidden_addr = reinterpret_cast<uintptr_t>(hidden.data());
    for (auto [op, addr, what] : {std::tuple{Opcode::Write, shared_addr, "a write to a read-only region"},
                                  std::tuple{Opcode::Write, hidden_addr, "a write to unregistered memory"},
                                  std::tuple{Opcode::Read, hidden_addr, "a read of unregistered memory"}}) {
        auto r = transfer(*member, op, local.data(), *seg, addr, local.size());
        EXPECT_FALSE(r) << what << " succeeded";
        if (!r) std::printf("%s: %d %s\n", what, r.error().code, r.error().message.c_str());
    }
    EXPECT_TRUE(std::all_of(shared.begin(), shared.end(), [](uint8_t b) { return b == 0x11; }));
    EXPECT_TRUE(std::all_of(hidden.begin(), hidden.end(), [](uint8_t b) { return b == 0x22; }));
    EXPECT_TRUE(std::all_of(local.begin(), local.end(), [](uint8_t b) { return b == 0x99; }));
    // What the target did register stays readable to the cluster.
    auto ok = transfer(*member, Opcode::Read, local.data(), *seg, shared_addr, local.size());
    ASSERT_TRUE(ok) << ok.error().message;
    EXPECT_EQ(local[0], 0x11);

    // And whoever wrote the forgery cannot use the real endpoints without the secret.
    auto outsider = engine("outsider", "");
    ASSERT_TRUE(outsider);
    std::vector<uint8_t> theirs(64 << 10, 0x55);
    ASSERT_TRUE(outsider->register_memory(theirs.data(), theirs.size()));
    auto oseg = outsider->open_segment("target");
    ASSERT_TRUE(oseg) << oseg.error().message;
    auto refused = transfer(*outsider, Opcode::Write, theirs.data(), *oseg, hidden_addr, theirs.size());
    ASSERT_FALSE(refused);
    EXPECT_TRUE(contains(refused.error().message, "authentication failed")) << refused.error().message;
    refused = transfer(*outsider, Opcode::Read, theirs.data(), *oseg, shared_addr, theirs.size());
    ASSERT_FALSE(refused);
    EXPECT_TRUE(std::all_of(hidden.begin(), hidden.end(), [](uint8_t b) { return b == 0x22; }));
    EXPECT_TRUE(std::all_of(theirs.begin(), theirs.end(), [](uint8_t b) { return b == 0x55; }));
}

// The same forgery against an engine that polls: it reads its own descriptor back, finds it is
// not what it wrote, and writes its own again.
TEST_P(MetadataSecurityTest, AnEngineWritesItsOwnDescriptorBackOverAForgery) {
    auto target = engine("target", kSecret);
    ASSERT_TRUE(target);
    std::vector<uint8_t> shared(4096, 0x11);
    MemoryOptions read_only;
    read_only.access = kRemoteRead;
    ASSERT_TRUE(target->register_memory(shared.data(), shared.size(), read_only));
    auto real = store->get("ferry/segments/target");
    ASSERT_TRUE(real && *real);
    SegmentDescriptor d = published("target");
    d.regions[0].access = kRemoteRead | kRemoteWrite;
    plant(d, /*stamp=*/false);
    ASSERT_NE(store->get("ferry/segments/target").value_or(std::nullopt), *real);
    EXPECT_TRUE(eventually([&] { return store->get("ferry/segments/target").value_or(std::nullopt) == *real; }))
        << "the engine did not write its own descriptor back within seconds";
}

INSTANTIATE_TEST_SUITE_P(Stores, MetadataSecurityTest, ::testing::Values("redis", "http"),
                         [](const auto &info) { return info.param; });
