// efa.so against a peer that does not follow its protocol: a raw libfabric endpoint (tcp
// provider, 127.0.0.1) fi_sends control messages straight at an instance, as anyone who can
// reach its address can. The instance must keep serving honest peers, and its log must carry
// counts, not a line per bad message.
#ifdef FERRY_TEST_EFA_PLUGIN

#include "harness.hpp"
#include "staging_host.hpp"

#include <gtest/gtest.h>
#include <rdma/fabric.h>
#include <rdma/fi_cm.h>
#include <rdma/fi_domain.h>
#include <rdma/fi_endpoint.h>

#include <array>
#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ferry_test {
namespace {

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;

std::string efa_path() {
    const char *e = std::getenv("FERRY_TEST_EFA_PLUGIN");
    return e != nullptr && *e ? e : FERRY_TEST_EFA_PLUGIN;
}

// Layout of plugins/efa/wire.hpp's CtrlHeader.
struct RawHeader {
    uint32_t magic = 0x43464546;
    uint16_t version = 1, type = 1;
    uint64_t req_id = 1, from_token = 0, to_token = 0;
    int32_t status = 0;
    uint32_t body_len = 0;
};
static_assert(sizeof(RawHeader) == 40);

// A bare RDM endpoint on the tcp provider that sends whatever it is given to one address.
class RawPeer {
public:
    explicit RawPeer(const std::vector<uint8_t> &target_name) {
        fi_info *hints = fi_allocinfo();
        hints->ep_attr->type = FI_EP_RDM;
        hints->caps = FI_MSG;
        hints->fabric_attr->prov_name = strdup("tcp");
        int rc = fi_getinfo(FI_VERSION(1, 9), "127.0.0.1", nullptr, FI_SOURCE, hints, &info_);
        fi_freeinfo(hints);
        if (rc != 0 || (rc = fi_fabric(info_->fabric_attr, &fabric_, nullptr)) != 0 ||
            (rc = fi_domain(fabric_, info_, &domain_, nullptr)) != 0) {
            fail("open", rc);
            return;
        }
        fi_av_attr av_attr{};
        av_attr.type = FI_AV_TABLE;
        fi_cq_attr cq_attr{};
        cq_attr.format = FI_CQ_FORMAT_CONTEXT;
        if ((rc = fi_av_open(domain_, &av_attr, &av_, nullptr)) != 0 ||
            (rc = fi_cq_open(domain_, &cq_attr, &cq_, nullptr)) != 0 ||
            (rc = fi_endpoint(domain_, info_, &ep_, nullptr)) != 0 || (rc = fi_ep_bind(ep_, &av_->fid, 0)) != 0 ||
            (rc = fi_ep_bind(ep_, &cq_->fid, FI_TRANSMIT | FI_RECV)) != 0 || (rc = fi_enable(ep_)) != 0) {
            fail("endpoint", rc);
            return;
        }
        if (fi_av_insert(av_, target_name.data(), 1, &dest_, 0, nullptr) != 1) {
            fail("fi_av_insert", -FI_EINVAL);
            return;
        }
        size_t len = sizeof name_;
        fi_getname(&ep_->fid, name_, &len);
        name_len_ = len;
        recv_bufs_.assign(kRecvs, std::vector<uint8_t>(4096));
        for (auto &b : recv_bufs_) fi_recv(ep_, b.data(), b.size(), nullptr, FI_ADDR_UNSPEC, b.data());
        ok_ = true;
    }
    ~RawPeer() {
        for (fid *f : {ep_ ? &ep_->fid : nullptr, av_ ? &av_->fid : nullptr, cq_ ? &cq_->fid : nullptr,
                       domain_ ? &domain_->fid : nullptr, fabric_ ? &fabric_->fid : nullptr})
            if (f) fi_close(f);
        if (info_) fi_freeinfo(info_);
    }
    bool ok() const { return ok_; }
    const std::string &error() const { return error_; }
    std::vector<uint8_t> name() const { return {name_, name_ + name_len_}; }

    // Sends one message and waits for its send completion.
    bool send(const std::vector<uint8_t> &msg) {
        for (;;) {
            ssize_t rc = fi_send(ep_, msg.data(), msg.size(), nullptr, dest_, this);
            if (rc == 0) break;
            if (rc != -FI_EAGAIN) return false;
            drain();
        }
        while (drain() == 0) {}
        return true;
    }

private:
    // Reads completions; answers that arrived are counted and their buffers posted again.
    // Returns how many of our sends completed.
    int drain() {
        fi_cq_entry e[16];
        ssize_t n = fi_cq_read(cq_, e, 16);
        if (n == -FI_EAVAIL) {
            fi_cq_err_entry err{};
            fi_cq_readerr(cq_, &err, 0);
            return err.op_context == this ? 1 : 0;
        }
        int sends = 0;
        for (ssize_t i = 0; i < n; ++i) {
            if (e[i].op_context == this) {
                ++sends;
                continue;
            }
            ++answers;
            RawHeader h;
            memcpy(&h, e[i].op_context, sizeof h);
            got.push_back(h);
            fi_recv(ep_, e[i].op_context, 4096, nullptr, FI_ADDR_UNSPEC, e[i].op_context);
        }
        return sends;
    }

public:
    size_t answers = 0;
    std::vector<RawHeader> got;  // headers of everything received, in order
    // Progresses until `n` answers arrived in all (or `limit` passed).
    bool wait_answers(size_t n, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
        const auto end = std::chrono::steady_clock::now() + limit;
        while (answers < n && std::chrono::steady_clock::now() < end) drain();
        return answers >= n;
    }
    // Progresses until pred() holds (or `limit` passed).
    bool wait_until(const std::function<bool()> &pred, std::chrono::milliseconds limit = std::chrono::seconds(30)) {
        const auto end = std::chrono::steady_clock::now() + limit;
        while (!pred() && std::chrono::steady_clock::now() < end) drain();
        return pred();
    }
    // A valid Hello from a fresh token, answered once the instance processed everything this
    // peer sent before it (one connection: in order). A barrier, not a sleep.
    bool barrier(uint64_t token) {
        RawHeader h;
        h.from_token = token;
        const std::vector<uint8_t> me = name();
        std::vector<uint8_t> m(sizeof h + me.size());
        h.body_len = static_cast<uint32_t>(me.size());
        memcpy(m.data(), &h, sizeof h);
        memcpy(m.data() + sizeof h, me.data(), me.size());
        const size_t before = answers;
        return send(m) && wait_answers(before + 1);
    }

private:
    static constexpr size_t kRecvs = 64;
    std::vector<std::vector<uint8_t>> recv_bufs_;
    void fail(const char *what, int rc) { error_ = std::string(what) + ": " + fi_strerror(rc < 0 ? -rc : rc); }
    fi_info *info_ = nullptr;
    fid_fabric *fabric_ = nullptr;
    fid_domain *domain_ = nullptr;
    fid_av *av_ = nullptr;
    fid_cq *cq_ = nullptr;
    fid_ep *ep_ = nullptr;
    fi_addr_t dest_ = FI_ADDR_NOTAVAIL;
    uint8_t name_[128] = {};
    size_t name_len_ = 0;
    bool ok_ = false;
    std::string error_;
};

std::vector<uint8_t> message(RawHeader h, const void *body, size_t len) {
    h.body_len = static_cast<uint32_t>(len);
    std::vector<uint8_t> m(sizeof h + len);
    memcpy(m.data(), &h, sizeof h);
    if (len) memcpy(m.data() + sizeof h, body, len);
    return m;
}

// Log lines of one instance, kept for the test.
struct LogSink {
    std::mutex mu;
    std::vector<std::string> warnings;
    static void log(void *ctx, int level, const char *, const char *message) {
        auto *s = static_cast<LogSink *>(ctx);
        if (level <= FERRY_LOG_WARN) {
            std::lock_guard lock(s->mu);
            s->warnings.push_back(message);
        }
    }
};

// The instance under attack, created through the plugin ABI with a host that keeps its log.
class EfaHostileTest : public ::testing::Test {
protected:
    void SetUp() override {
        plugin = std::make_unique<Plugin>(efa_path());
        ASSERT_TRUE(plugin->ok()) << plugin->error();
        host = ferry_host_api_t{sizeof(ferry_host_api_t), 0, &sink, &LogSink::log, FERRY_LOG_WARN};
        ferry_kv_t kv[] = {{"provider", "tcp"}};
        ferry_error_t err{};
        ASSERT_EQ((*plugin)->create(kv, 1, &host, &target, &err), 0) << err.message;
        size_t len = 256;
        endpoint.resize(len);
        ASSERT_EQ((*plugin)->export_endpoint(target, endpoint.data(), &len, &err), 0) << err.message;
        endpoint.resize(len);
        target_name.assign(endpoint.begin() + 16, endpoint.end());
    }
    void TearDown() override {
        if (target != nullptr) (*plugin)->destroy(target);
    }
    // An honest initiator connects, WRITEs 1 MiB into the target and checks it landed.
    void honest_peer_is_served(RawPeer *impostor = nullptr) {
        Instance a(*plugin, {{"provider", "tcp"}});
        ASSERT_EQ(a.create_rc(), 0) << a.last_error();
        Buffer src(1 << 20), dst(1 << 20);
        fill_pattern(src.data(), src.size(), 9);
        uint64_t hs, hd, peer, rmem;
        ferry_error_t err{};
        ASSERT_EQ(a.register_mem(src.data(), src.size(), 0, &hs), 0);
        ferry_mem_region_t region{dst.addr(), dst.size(), FERRY_MEM_HOST, -1, kRW, 0};
        ASSERT_EQ((*plugin)->register_mem(target, &region, &hd, &err), 0) << err.message;
        ASSERT_EQ(a.connect(endpoint, &peer), 0) << a.last_error();
        if (impostor != nullptr) {  // claims a's token from its own address
            std::vector<uint8_t> ep = a.endpoint();
            RawHeader h;
            memcpy(&h.from_token, ep.data() + 8, 8);
            const std::vector<uint8_t> me = impostor->name();
            const size_t before = impostor->answers;
            ASSERT_TRUE(impostor->send(message(h, me.data(), me.size())));
            ASSERT_TRUE(impostor->barrier(0x77770001)) << "the target never answered a valid Hello";
            EXPECT_EQ(impostor->answers, before + 1) << "the impostor's Hello was answered";
        }
        ASSERT_EQ(a.import_mem(peer, dst.addr(), dst.size(), kRW, &rmem), 0) << a.last_error();
        ASSERT_EQ(a.submit(peer, {make_op(FERRY_OP_WRITE, src.addr(), hs, dst.addr(), rmem, src.size(), 1)}), 0);
        auto c = a.wait(1);
        ASSERT_EQ(c.size(), 1u);
        EXPECT_EQ(c[0].status, 0) << c[0].message;
        EXPECT_EQ(find_mismatch(dst.data(), dst.size(), 9), SIZE_MAX);
        a.destroy();
        ASSERT_EQ((*plugin)->deregister_mem(target, hd, &err), 0) << err.message;
    }
    std::vector<std::string> warnings() {
        std::lock_guard lock(sink.mu);
        for (const auto &w : sink.warnings) std::cout << "WARN: " << w.substr(0, 400) << "\n";
        return sink.warnings;
    }
    static unsigned long counted(const std::vector<std::string> &lines) {
        unsigned long n = 0;
        for (const auto &w : lines)
            if (auto at = w.find("ignored "); at != std::string::npos)
                n += std::strtoul(w.c_str() + at + 8, nullptr, 10);
        return n;
    }
    std::unique_ptr<Plugin> plugin;
    LogSink sink;
    ferry_host_api_t host{};
    ferry_transport_t *target = nullptr;
    std::vector<uint8_t> endpoint, target_name;
};

// Hellos whose address is not one of the provider's (before: each was inserted and answered,
// and the answers to nowhere held every send buffer: an honest peer's connect then timed out),
// garbage and short Hellos: ignored, counted in at most two lines, and honest peers served.
TEST_F(EfaHostileTest, GarbageControlMessagesAreCountedNotLoggedEachAndServingGoesOn) {
    {
        RawPeer raw(target_name);
        ASSERT_TRUE(raw.ok()) << raw.error();
        const std::vector<uint8_t> me = raw.name();
        std::vector<uint8_t> bad_addr(me.size(), 0xee);  // no address the provider takes
        for (uint64_t i = 0; i < 1000; ++i) {
            RawHeader h;
            h.from_token = 0x1000 + i;
            ASSERT_TRUE(raw.send(message(h, bad_addr.data(), bad_addr.size()))) << "Hello " << i;
            RawHeader junk;
            junk.magic = static_cast<uint32_t>(i * 2654435761u);
            ASSERT_TRUE(raw.send(message(junk, &i, sizeof i)));
            RawHeader short_hello;  // an address shorter than the provider's
            short_hello.from_token = 0x900000 + i;
            ASSERT_TRUE(raw.send(message(short_hello, me.data(), 3)));
        }
        ASSERT_TRUE(raw.barrier(0x77770002)) << "the target stopped answering valid Hellos";
    }
    honest_peer_is_served();
    (*plugin)->destroy(target);
    target = nullptr;
    auto lines = warnings();
    // The first report comes at once, the next after the interval (or at destroy).
    EXPECT_LE(lines.size(), 2u) << "a log line per bad message";
    EXPECT_EQ(counted(lines), 3000u) << "the log does not count the 3000 ignored messages";
}

// 5,000 Hellos from ever new tokens at one address (each asks for a peer entry, an address
// vector slot, a connection and an answer), then a Hello that claims an honest peer's token
// from another address: the flood gets kMaxRemotesPerAddress entries and cheap refusals, the
// impostor nothing, the honest peer is served, and the log has a few count lines.
TEST_F(EfaHostileTest, HelloFloodAndImpostorLeaveTheTargetBoundedAndServing) {
    RawPeer raw(target_name);
    ASSERT_TRUE(raw.ok()) << raw.error();
    const std::vector<uint8_t> me = raw.name();
    for (uint64_t i = 0; i < 5000; ++i) {
        RawHeader h;
        h.from_token = 0x5000000 + i;
        ASSERT_TRUE(raw.send(message(h, me.data(), me.size()))) << "Hello " << i;
    }
    RawPeer impostor(target_name);  // another address: its Hellos are not refused for the flood's
    ASSERT_TRUE(impostor.ok()) << impostor.error();
    honest_peer_is_served(&impostor);
    std::cout << raw.answers << " HelloAcks reached the flooding peer\n";
    (*plugin)->destroy(target);
    target = nullptr;
    auto lines = warnings();
    EXPECT_LE(lines.size(), 3u) << "a log line per bad message";
    bool refused = false;
    for (const auto &w : lines)
        refused |= w.find("1 Hello naming a known instance from another address") != std::string::npos;
    EXPECT_TRUE(refused) << "the impostor's Hello was not refused";
}

// Staged device memory (plugins/efa/staged_serve.cpp) against a peer that speaks the protocol
// badly: requests outside the staged region or without its right are refused with the right
// code, a flood gets kMaxStagedServedPerRemote (64) requests and -EBUSY for the rest, the grants
// it never finishes hold at most one window (4 buffers) and come back within op_timeout_ms plus
// a Hello's time, forged StageDones free nothing, and an honest peer is served afterwards.
TEST_F(EfaHostileTest, ForgedStagedRequestsAreBoundedAndTheirBuffersComeBack) {
    constexpr uint64_t kSlice = 256 * 1024, kLen = 4 << 20, kMiB = 1 << 20;
    StagingHost sh(kSlice, 8 * kSlice);
    DeviceMemory dev(kLen);
    sh.add_device(dev);
    fill_pattern(dev.alias(), kLen, 5);
    const Options opts = {{"provider", "tcp"}, {"op_timeout_ms", "2000"}};
    Instance t(*plugin, opts, sh.api());
    ASSERT_EQ(t.create_rc(), 0) << t.last_error();
    uint64_t h = 0;
    ASSERT_EQ(t.register_mem(reinterpret_cast<void *>(dev.addr()), kLen, FERRY_ACCESS_REMOTE_READ, &h, FERRY_MEM_CUDA),
              0)
        << t.last_error();
    const std::vector<uint8_t> ep = t.endpoint();
    uint64_t token = 0;
    memcpy(&token, ep.data() + 8, 8);
    {
        RawPeer raw(std::vector<uint8_t>(ep.begin() + 16, ep.end()));
        ASSERT_TRUE(raw.ok()) << raw.error();
        constexpr uint64_t kMe = 0x51a6ed;
        ASSERT_TRUE(raw.barrier(kMe));
        auto request = [&](uint16_t type, uint64_t id, uint64_t addr, uint64_t len) {
            RawHeader hd;
            hd.type = type;
            hd.req_id = id;
            hd.from_token = kMe;
            hd.to_token = token;
            const uint64_t body[2] = {addr, len};
            return raw.send(message(hd, body, sizeof body));
        };
        auto status_of = [&](uint64_t id) -> std::optional<int32_t> {
            for (const auto &g : raw.got)
                if (g.type == 11 && g.req_id == id) return g.status;  // StageAck
            return std::nullopt;
        };
        ASSERT_TRUE(request(7, 1, dev.addr() - 4096, 8192));  // StageRead across the region's start
        ASSERT_TRUE(request(8, 2, dev.addr(), 4096));         // StageWrite into a read-only region
        ASSERT_TRUE(raw.wait_until([&] { return status_of(1) && status_of(2); }));
        EXPECT_EQ(status_of(1), -EFAULT);
        EXPECT_EQ(status_of(2), -EACCES);
        for (uint64_t id = 100; id < 200; ++id) ASSERT_TRUE(request(7, id, dev.addr(), kMiB));
        RawHeader forged;  // StageDone for requests it never made, and for a slice never granted
        forged.type = 10;
        forged.from_token = kMe;
        forged.to_token = token;
        const int32_t done[2] = {0, 0};
        for (uint64_t id : {7ull, 150ull}) {
            forged.req_id = id;
            const int32_t d[2] = {id == 150 ? 99 : 0, 0};
            ASSERT_TRUE(raw.send(message(forged, id == 150 ? d : done, sizeof done)));
        }
        auto count = [&](uint16_t type, int32_t status) {
            size_t n = 0;
            for (const auto &g : raw.got) n += g.type == type && (type != 11 || g.status == status);
            return n;
        };
        ASSERT_TRUE(raw.wait_until([&] { return count(11, -EBUSY) >= 36; }))
            << count(11, -EBUSY) << " of the 36 requests past kMaxStagedServedPerRemote refused";
        ASSERT_TRUE(raw.barrier(kMe));
        ASSERT_TRUE(raw.wait_until([&] { return count(2, 0) >= 2; })) << "no HelloAck for the second barrier";
        const size_t busy = count(11, -EBUSY), grants = count(9, 0);
        EXPECT_EQ(busy, 100u - 64u) << "requests past kMaxStagedServedPerRemote are refused";
        EXPECT_LE(sh.stats().peak_held_bytes, 4 * kSlice) << "one peer held more than its window";
        std::cout << grants << " grants reached the peer that never takes them\n";
        // It never finishes them: within op_timeout_ms (and a Hello it does not answer) they come back.
        EXPECT_TRUE(sh.wait_idle(std::chrono::seconds(30))) << "buffers still lent to a peer that never took them";
    }
    Instance a(*plugin, {{"provider", "tcp"}});
    ASSERT_EQ(a.create_rc(), 0) << a.last_error();
    Buffer local(kMiB);
    uint64_t lm = 0, peer = 0, remote = 0;
    ASSERT_EQ(a.register_mem(local.data(), kMiB, 0, &lm), 0);
    ASSERT_EQ(a.connect(ep, &peer), 0) << a.last_error();
    ASSERT_EQ(a.import_mem(peer, dev.addr(), kLen, FERRY_ACCESS_REMOTE_READ, &remote, FERRY_MEM_CUDA), 0);
    ASSERT_EQ(a.submit(peer, {make_op(FERRY_OP_READ, local.addr(), lm, dev.addr() + kMiB, remote, kMiB, 1)}), 0);
    auto c = a.wait(1);
    ASSERT_EQ(c.size(), 1u);
    EXPECT_EQ(c[0].status, 0) << c[0].message;
    EXPECT_EQ(find_mismatch(local.data(), kMiB, 5, kMiB), SIZE_MAX);
    a.destroy();
    t.destroy();
    EXPECT_TRUE(sh.wait_idle(std::chrono::seconds(30)));
    EXPECT_TRUE(sh.stats().misuse.empty());
}

}  // namespace
}  // namespace ferry_test

#endif  // FERRY_TEST_EFA_PLUGIN
