// efa.so beyond the conformance suite, for real on libfabric's tcp provider (tcp;ofi_rxm): the
// probe's words for a missing provider, loopback-only binding, keys carried in export_mem bytes
// and split at max_mr_size, the serving side's provider refusing forged keys and rights (and the
// connection recovering), a stopped peer failing ops in bounded time, and HMEM honesty.
#include "harness.hpp"
#include "peer_process.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#ifdef FERRY_TEST_EFA_PLUGIN

namespace ferry_test {
namespace {

constexpr uint32_t kRW = FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE;
constexpr uint64_t kMiB = 1ull << 20;

// Layout of efa.so's export_mem bytes (plugins/efa/wire.hpp): a 16-byte header, then per
// registration {addr, len, key, rma_base, access, reserved}.
constexpr size_t kMemHead = 16, kChunk = 40;

std::string efa_path() {
    const char *e = std::getenv("FERRY_TEST_EFA_PLUGIN");
    return e != nullptr && *e ? e : FERRY_TEST_EFA_PLUGIN;
}

class EfaTest : public ::testing::Test {
protected:
    void SetUp() override {
        plugin = std::make_unique<Plugin>(efa_path());
        ASSERT_TRUE(plugin->ok()) << plugin->error();
    }
    std::unique_ptr<Instance> make(Options o = {}) {
        o.emplace_back("provider", "tcp");
        auto i = std::make_unique<Instance>(*plugin, o);
        EXPECT_EQ(i->create_rc(), 0) << i->last_error();
        return i->create_rc() == 0 ? std::move(i) : nullptr;
    }
    std::vector<uint8_t> export_mem(Instance &i, uint64_t handle) {
        size_t len = 0;
        ferry_error_t e{};
        EXPECT_EQ((*plugin)->export_mem(i.t(), handle, nullptr, &len, &e), -ENOSPC);
        std::vector<uint8_t> b(len);
        EXPECT_EQ((*plugin)->export_mem(i.t(), handle, b.data(), &len, &e), 0) << e.message;
        return b;
    }
    int import_with(Instance &i, uint64_t peer, uint64_t addr, uint64_t len, const std::vector<uint8_t> &desc,
                    uint64_t *rmem, std::string *why) {
        ferry_mem_region_t r{addr, len, FERRY_MEM_HOST, -1, kRW, 0};
        ferry_error_t e{};
        int rc = (*plugin)->import_mem(i.t(), peer, &r, desc.data(), desc.size(), rmem, &e);
        *why = e.message;
        return rc;
    }
    std::unique_ptr<Plugin> plugin;
};

uint64_t get_u64(const std::vector<uint8_t> &b, size_t off) {
    uint64_t v;
    memcpy(&v, b.data() + off, 8);
    return v;
}

TEST_F(EfaTest, ProbeReportsAMissingProviderWithLibfabricsWords) {
    ferry_kv_t o[] = {{"provider", "efa"}};
    ferry_probe_result_t r{};
    ASSERT_EQ((*plugin)->probe(o, 1, &r), 0);
    EXPECT_EQ(r.available, 0) << "this machine has no EFA device: " << r.reason;
    EXPECT_NE(std::string(r.reason).find("fi_getinfo"), std::string::npos) << r.reason;
    EXPECT_NE(std::string(r.reason).find("No data available"), std::string::npos)
        << r.reason;  // fi_strerror(FI_ENODATA)
    ferry_kv_t t[] = {{"provider", "tcp"}};
    ASSERT_EQ((*plugin)->probe(t, 1, &r), 0);
    EXPECT_EQ(r.available, 1) << r.reason;
    EXPECT_NE(std::string(r.reason).find("tcp;ofi_rxm"), std::string::npos) << r.reason;
    EXPECT_NE(std::string(r.reason).find("mr_mode"), std::string::npos) << r.reason;
    // Creating an instance on the missing provider fails the same way.
    Instance none(*plugin, {{"provider", "efa"}});
    EXPECT_LT(none.create_rc(), 0);
    EXPECT_NE(none.last_error().find("fi_getinfo"), std::string::npos) << none.last_error();
}

// The default provider on a host without an EFA device is refused from sysfs, without
// initialising libfabric (~0.3 s of fi_getinfo); a provider the caller names (above) is still
// asked. FERRY_EFA_PROVIDER counts as naming one, so it is unset here.
TEST_F(EfaTest, ProbeWithTheDefaultProviderLooksForAnEfaDeviceBeforeLibfabric) {
    std::error_code ec;
    for (const auto &dev : std::filesystem::directory_iterator("/sys/class/infiniband", ec))
        if (std::filesystem::read_symlink(dev.path() / "device/driver", ec).filename() == "efa")
            GTEST_SKIP() << "SKIPPED: this host has an EFA device (" << dev.path() << ")";
    const char *was = std::getenv("FERRY_EFA_PROVIDER");
    std::string saved = was ? was : "";
    unsetenv("FERRY_EFA_PROVIDER");
    ferry_probe_result_t r{};
    int rc = (*plugin)->probe(nullptr, 0, &r);
    if (was) setenv("FERRY_EFA_PROVIDER", saved.c_str(), 1);
    ASSERT_EQ(rc, 0);
    EXPECT_EQ(r.available, 0) << r.reason;
    std::string reason = r.reason;
    EXPECT_NE(reason.find("no EFA device: /sys/class/infiniband"), std::string::npos) << reason;
    EXPECT_NE(reason.find("efa.provider=tcp"), std::string::npos) << reason;  // what to do
    EXPECT_EQ(reason.find("fi_getinfo"), std::string::npos) << "libfabric was initialised: " << reason;
}

// Every listening TCP socket of this process's efa instance must be on 127.0.0.1.
TEST_F(EfaTest, ListensOnLoopbackOnly) {
    auto a = make();
    ASSERT_TRUE(a);
    std::vector<uint8_t> ep = a->endpoint();
    ASSERT_GE(ep.size(), 16u + 16u);                                      // header + sockaddr_in
    uint16_t port = static_cast<uint16_t>(ep[16 + 2] << 8 | ep[16 + 3]);  // sin_port, network order
    ASSERT_NE(port, 0);
    std::set<std::string> listeners;
    for (const char *file : {"/proc/net/tcp", "/proc/net/tcp6"}) {
        std::ifstream f(file);
        std::string line;
        std::getline(f, line);
        while (std::getline(f, line)) {
            std::istringstream s(line);
            std::string sl, local, remote, state;
            s >> sl >> local >> remote >> state;
            auto colon = local.find(':');
            if (state == "0A" && std::stoul(local.substr(colon + 1), nullptr, 16) == port)
                listeners.insert(local.substr(0, colon));
        }
    }
    ASSERT_FALSE(listeners.empty()) << "no listener on port " << port;
    for (const auto &l : listeners)
        EXPECT_EQ(l, "0100007F") << "efa.so (tcp provider) listens on " << l << ", not 127.0.0.1";
}

TEST_F(EfaTest, RegionsSplitAtMaxMrSizeAndOpsCrossTheSplits) {
    auto a = make({{"max_mr_size", "64k"}});
    auto b = make({{"max_mr_size", "96k"}});
    ASSERT_TRUE(a && b);
    const size_t sz = kMiB + 4096;
    Buffer src(sz), tgt(sz), back(sz);
    fill_pattern(src.data(), sz, 11);
    uint64_t hs, ht, hb, peer, rmem;
    ASSERT_EQ(a->register_mem(src.data(), sz, 0, &hs), 0) << a->last_error();
    ASSERT_EQ(a->register_mem(back.data(), sz, 0, &hb), 0);
    ASSERT_EQ(b->register_mem(tgt.data(), sz, kRW, &ht), 0);
    std::vector<uint8_t> keys = export_mem(*b, ht);
    ASSERT_EQ(keys.size(), kMemHead + kChunk * ((sz + 96 * 1024 - 1) / (96 * 1024)));
    ASSERT_EQ(a->connect(b->endpoint(), &peer), 0) << a->last_error();
    std::string why;
    ASSERT_EQ(import_with(*a, peer, tgt.addr(), sz, keys, &rmem, &why), 0) << why;
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_WRITE, src.addr() + 1, hs, tgt.addr() + 3, rmem, sz - 7, 1)}), 0);
    auto c = a->wait(1);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_EQ(c[0].status, 0) << c[0].message;
    EXPECT_EQ(find_mismatch(tgt.data() + 3, sz - 7, 11, 1), SIZE_MAX);
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_READ, back.addr(), hb, tgt.addr() + 3, rmem, sz - 7, 2)}), 0);
    c = a->wait(1);
    ASSERT_EQ(c.size(), 1u);
    ASSERT_EQ(c[0].status, 0) << c[0].message;
    EXPECT_EQ(find_mismatch(back.data(), sz - 7, 11, 1), SIZE_MAX);
}

// Descriptors that lie (a forged key, write access the region does not have) get past the
// initiator's own checks; the serving side's provider must still refuse them, without touching
// the memory, and the connection must come back for honest ops afterwards.
TEST_F(EfaTest, ServingSideRefusesForgedKeysAndRightsThenRecovers) {
    auto a = make();
    auto b = make();
    ASSERT_TRUE(a && b);
    const size_t sz = 256 * 1024;
    Buffer rw(sz), ro(sz), loc(sz);
    fill_pattern(rw.data(), sz, 1);
    fill_pattern(ro.data(), sz, 2);
    fill_pattern(loc.data(), sz, 3);
    uint64_t hrw, hro, hl, peer;
    ASSERT_EQ(b->register_mem(rw.data(), sz, kRW, &hrw), 0);
    ASSERT_EQ(b->register_mem(ro.data(), sz, FERRY_ACCESS_REMOTE_READ, &hro), 0);
    ASSERT_EQ(a->register_mem(loc.data(), sz, 0, &hl), 0);
    ASSERT_EQ(a->connect(b->endpoint(), &peer), 0) << a->last_error();
    std::vector<uint8_t> good = export_mem(*b, hrw);
    std::vector<uint8_t> forged_key = good;
    uint64_t key = get_u64(good, kMemHead + 16) ^ 0x5a5a00;
    memcpy(forged_key.data() + kMemHead + 16, &key, 8);
    std::vector<uint8_t> forged_rights = export_mem(*b, hro);
    uint32_t rights = kRW;
    memcpy(forged_rights.data() + kMemHead + 32, &rights, 4);
    struct Case {
        const char *what;
        const std::vector<uint8_t> *desc;
        uint64_t addr;
    };
    for (Case k : {Case{"forged key", &forged_key, rw.addr()}, Case{"forged write right", &forged_rights, ro.addr()}}) {
        SCOPED_TRACE(k.what);
        uint64_t bad, ok;
        std::string why;
        ASSERT_EQ(import_with(*a, peer, k.addr, sz, *k.desc, &bad, &why), 0) << why;
        ASSERT_EQ(import_with(*a, peer, rw.addr(), sz, good, &ok, &why), 0) << why;
        ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_WRITE, loc.addr(), hl, k.addr, bad, sz, 1)}), 0);
        auto c = a->wait(1);
        ASSERT_EQ(c.size(), 1u);
        EXPECT_LT(c[0].status, 0) << "the peer accepted a " << k.what;
        // The peer refuses and drops the connection; when that drop of an earlier refusal is
        // still under way, the op fails on the connection instead. Either way nothing landed
        // (checked below).
        const std::string msg = c[0].message;
        EXPECT_TRUE(msg.find("refused") != std::string::npos || msg.find("the connection failed") != std::string::npos)
            << msg;
        std::cout << k.what << ": " << c[0].message << "\n";
        // An honest READ afterwards succeeds (the connection is re-established if needed).
        ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_READ, loc.addr(), hl, rw.addr(), ok, sz, 2)}), 0);
        c = a->wait(1);
        ASSERT_EQ(c.size(), 1u);
        EXPECT_EQ(c[0].status, 0) << c[0].message;
        EXPECT_EQ(find_mismatch(loc.data(), sz, 1), SIZE_MAX);
        fill_pattern(loc.data(), sz, 3);
    }
    EXPECT_EQ(find_mismatch(rw.data(), sz, 1), SIZE_MAX) << "a forged key wrote";
    EXPECT_EQ(find_mismatch(ro.data(), sz, 2), SIZE_MAX) << "a read-only region was written";
}

// A peer that stops answering: its ops fail after op_timeout_ms (not before they could have
// completed), another peer is unaffected, and once the peer runs again it is usable again.
TEST_F(EfaTest, StoppedPeerFailsOpsByTimeoutAndRecovers) {
    // 3 s: long enough that the live peer's op never runs into it on a loaded machine.
    Options o = {{"provider", "tcp"}, {"op_timeout_ms", "3000"}};
    auto a = make({{"op_timeout_ms", "3000"}});
    auto other = make();
    ASSERT_TRUE(a && other);
    const size_t sz = 8 * kMiB;
    ChildPeer child(efa_path(), sz, kRW, o);
    ASSERT_TRUE(child.ok()) << child.error();
    Buffer loc(sz), otgt(sz);
    fill_pattern(loc.data(), sz, 4);
    uint64_t hl, ho, pc, po, rc_mem, ro_mem;
    ASSERT_EQ(a->register_mem(loc.data(), sz, 0, &hl), 0);
    ASSERT_EQ(other->register_mem(otgt.data(), sz, kRW, &ho), 0);
    ASSERT_EQ(a->connect(child.endpoint(), &pc), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(pc, child.addr(), sz, kRW, &rc_mem), 0) << a->last_error();
    ASSERT_EQ(a->connect(other->endpoint(), &po), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(po, otgt.addr(), sz, kRW, &ro_mem), 0) << a->last_error();
    child.stop();
    std::vector<ferry_xfer_op_t> ops;
    for (int i = 0; i < 8; ++i)
        ops.push_back(make_op(i % 2 ? FERRY_OP_READ : FERRY_OP_WRITE, loc.addr() + i * kMiB, hl,
                              child.addr() + i * kMiB, rc_mem, kMiB, i));
    ASSERT_EQ(a->submit(pc, ops), 0) << a->last_error();
    ASSERT_EQ(a->submit(po, {make_op(FERRY_OP_WRITE, loc.addr(), hl, otgt.addr(), ro_mem, sz, 100)}), 0);
    auto c = a->wait(ops.size() + 1);
    ASSERT_EQ(c.size(), ops.size() + 1);
    for (const auto &x : c) {
        if (x.user_data == 100) {
            EXPECT_EQ(x.status, 0) << "the other peer: " << x.message;
        } else {
            EXPECT_EQ(x.status, -ETIMEDOUT) << x.message;
            EXPECT_NE(std::string(x.message).find("127.0.0.1:"), std::string::npos) << x.message;
        }
    }
    child.resume();
    // Usable again once it answers (the connection is rebuilt on demand).
    bool done = false;
    std::string last;
    for (int attempt = 0; attempt < 20 && !done; ++attempt) {
        if (a->submit(pc, {make_op(FERRY_OP_WRITE, loc.addr(), hl, child.addr(), rc_mem, sz, 200 + attempt)}) != 0) {
            last = a->last_error();
            if (a->connect(child.endpoint(), &pc) != 0 || a->import_mem(pc, child.addr(), sz, kRW, &rc_mem) != 0)
                last += "; reconnect: " + a->last_error();
            continue;
        }
        auto d = a->wait(1);
        ASSERT_EQ(d.size(), 1u);
        done = d[0].status == 0;
        last = d[0].message;
    }
    ASSERT_TRUE(done) << last;
    uint64_t h = 0;
    ASSERT_TRUE(child.hash(0, sz, &h));
    EXPECT_EQ(h, fnv1a(loc.data(), sz));
}

// Deregistration on the serving side returns only once the peers that may use the region have
// confirmed that none of their RMA on it is in flight (Revoke/RevokeAck): whatever is written
// into it afterwards must survive every op still queued for it.
TEST_F(EfaTest, DeregisterWaitsForPeersInFlightRma) {
    auto a = make();
    // a's answer to the revocation queues behind its 128 MiB of WRITEs; under TSan on CI's busy
    // cores it came after the second b then granted a silent peer, and b closed the region early.
    auto b = make({{"connect_timeout_ms", "30000"}});
    ASSERT_TRUE(a && b);
    const size_t sz = 64 * kMiB;
    Buffer src(sz), tgt(sz);
    fill_pattern(src.data(), sz, 8);
    uint64_t hs, ht, peer, rmem;
    ASSERT_EQ(a->register_mem(src.data(), sz, 0, &hs), 0);
    ASSERT_EQ(b->register_mem(tgt.data(), sz, kRW, &ht), 0);
    ASSERT_EQ(a->connect(b->endpoint(), &peer), 0) << a->last_error();
    ASSERT_EQ(a->import_mem(peer, tgt.addr(), sz, kRW, &rmem), 0) << a->last_error();
    std::vector<ferry_xfer_op_t> ops;
    for (int round = 0; round < 2; ++round)
        for (uint64_t off = 0; off < sz; off += 4 * kMiB)
            ops.push_back(make_op(FERRY_OP_WRITE, src.addr() + off, hs, tgt.addr() + off, rmem, 4 * kMiB, ops.size()));
    ASSERT_EQ(a->submit(peer, ops), 0) << a->last_error();
    auto c = a->wait(1);  // under way (wait may return more than one)
    ASSERT_GE(c.size(), 1u);
    ASSERT_EQ(b->deregister_mem(ht), 0) << b->last_error();
    memset(tgt.data(), 0x5a, sz);
    auto rest = a->wait(ops.size() - c.size());
    c.insert(c.end(), rest.begin(), rest.end());
    ASSERT_EQ(c.size(), ops.size());
    size_t refused = 0;
    for (const auto &x : c)
        if (x.status != 0) {
            ++refused;
            EXPECT_EQ(x.status, -EFAULT) << x.message;
        }
    for (size_t i = 0; i < sz; ++i)
        ASSERT_EQ(tgt.data()[i], 0x5a) << "byte " << i << " written after deregister_mem returned";
    // Later ops to it are refused by the initiator from the revocation, without a round trip.
    ASSERT_EQ(a->submit(peer, {make_op(FERRY_OP_WRITE, src.addr(), hs, tgt.addr(), rmem, 4096, 999)}), 0);
    auto d = a->wait(1);
    ASSERT_EQ(d.size(), 1u);
    EXPECT_EQ(d[0].status, -EFAULT);
    EXPECT_NE(std::string(d[0].message).find("deregistered"), std::string::npos) << d[0].message;
    std::cout << refused << " of " << ops.size() << " ops refused after the deregistration\n";
}

TEST_F(EfaTest, DeviceMemoryRefusedWithoutProviderHmem) {
    auto a = make();
    ASSERT_TRUE(a);
    Buffer b(4096);
    uint64_t h = 99;
    EXPECT_EQ(a->register_mem(b.data(), 4096, kRW, &h, FERRY_MEM_CUDA), -ENOTSUP);
    EXPECT_NE(a->last_error().find("FI_HMEM"), std::string::npos) << a->last_error();
    EXPECT_EQ(h, 99u);
    EXPECT_EQ((*plugin)->caps & (FERRY_CAP_MEM_CUDA | FERRY_CAP_MEM_ROCM), 0u)
        << "device memory support is a run-time property of the provider; caps must not claim it";
}

}  // namespace
}  // namespace ferry_test

#endif  // FERRY_TEST_EFA_PLUGIN
