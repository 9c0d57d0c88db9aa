// Engine API: transfers and every documented error, over the in-process example transport (so
// these tests are about the engine, not a network), plus the C API and YAML configuration.
#include <gtest/gtest.h>

#include <tuple>

#include <cstring>
#include <fstream>
#include <numeric>

#include "ferry/engine.hpp"
#include "ferry/ferry.h"
#include "test_util.hpp"

using namespace ferry;

namespace {

Config example_config() {
    return {{"plugin_path", FERRY_EXAMPLE_PLUGIN_DIR}, {"plugins", "example"}, {"local_ip", "127.0.0.1"}};
}

std::unique_ptr<Engine> make_engine(Config c = example_config()) {
    auto e = Engine::create(c);
    EXPECT_TRUE(e) << e.error().message;
    return e ? std::move(*e) : nullptr;
}

class EngineTest : public ::testing::Test {
protected:
    void SetUp() override {
        target = make_engine();
        initiator = make_engine();
        ASSERT_TRUE(target && initiator);
        remote.resize(1 << 20);
        local.resize(1 << 20);
        for (size_t i = 0; i < remote.size(); ++i) remote[i] = static_cast<uint8_t>(i * 7 + 3);
        ASSERT_TRUE(target->register_memory(remote.data(), remote.size()));
        ASSERT_TRUE(initiator->register_memory(local.data(), local.size()));
        auto s = initiator->open_segment(target->segment_name());
        ASSERT_TRUE(s) << s.error().message;
        seg = *s;
    }
    uint64_t raddr(size_t off = 0) const { return reinterpret_cast<uintptr_t>(remote.data()) + off; }

    Error submit_error(Request r) {
        auto b = initiator->submit(std::span(&r, 1));
        EXPECT_FALSE(b) << "submit should have been refused";
        return b ? Error{} : b.error();
    }

    // A cause only the peer's descriptor can answer: when the cached one does not, the
    // descriptor is re-read off the submit path and the op fails instead of the submit.
    Error op_error(Request r) {
        auto b = initiator->submit(std::span(&r, 1));
        if (!b) return b.error();
        auto w = initiator->wait(*b, std::chrono::seconds(10));
        EXPECT_FALSE(w) << "the op should have failed";
        (void)initiator->free_batch(*b);
        return w ? Error{} : w.error();
    }

    // Before the engines, so it is freed after them: the target may still be in the sendmsg of
    // a READ's reply when the initiator saw the READ complete and the test ended.
    std::vector<uint8_t> remote, local;
    std::unique_ptr<Engine> target, initiator;
    SegmentId seg = 0;
};

}  // namespace

TEST_F(EngineTest, ReadAndWriteMoveTheBytes) {
    std::vector<Request> reqs = {{Opcode::Read, local.data(), seg, raddr(100), 5000, ""},
                                 {Opcode::Read, local.data() + 8192, seg, raddr(0), 1, ""}};
    auto b = initiator->submit(reqs);
    ASSERT_TRUE(b) << b.error().message;
    ASSERT_TRUE(initiator->wait(*b, std::chrono::seconds(10)));
    EXPECT_EQ(memcmp(local.data(), remote.data() + 100, 5000), 0);
    EXPECT_EQ(local[8192], remote[0]);
    auto st = initiator->status(*b, 1);
    ASSERT_TRUE(st);
    EXPECT_EQ(st->state, OpState::Done);
    EXPECT_EQ(st->transport, "example");
    ASSERT_TRUE(initiator->free_batch(*b));

    std::iota(local.begin(), local.begin() + 4096, 0);
    Request w{Opcode::Write, local.data(), seg, raddr(65536), 4096, ""};
    b = initiator->submit(std::span(&w, 1));
    ASSERT_TRUE(b);
    ASSERT_TRUE(initiator->wait(*b, std::chrono::seconds(10)));
    EXPECT_EQ(memcmp(local.data(), remote.data() + 65536, 4096), 0);
}

TEST_F(EngineTest, UnregisteredLocalAddressIsRefused) {
    std::vector<uint8_t> stray(64);
    auto e = submit_error({Opcode::Read, stray.data(), seg, raddr(), 64, ""});
    EXPECT_EQ(e.code, -EFAULT);
    EXPECT_NE(e.message.find("is not inside one registered region"), std::string::npos) << e.message;
    e = submit_error({Opcode::Read, local.data() + local.size() - 10, seg, raddr(), 64, ""});
    EXPECT_EQ(e.code, -EFAULT) << "a range that runs off the end of the region";
}

TEST_F(EngineTest, UnknownSegmentIsRefused) {
    auto e = submit_error({Opcode::Read, local.data(), seg + 100, raddr(), 64, ""});
    EXPECT_EQ(e.code, -ENOENT);
    EXPECT_NE(e.message.find("is not open"), std::string::npos) << e.message;
    auto o = initiator->open_segment("not-a-segment");
    ASSERT_FALSE(o);
    EXPECT_EQ(o.error().code, -EINVAL);
    EXPECT_NE(o.error().message.find("is not ip:port"), std::string::npos) << o.error().message;
    // A port nobody listens on: the engine's own listener is closed when it goes away.
    std::string gone;
    {
        auto tmp = make_engine();
        gone = tmp->segment_name();
    }
    o = initiator->open_segment(gone);
    ASSERT_FALSE(o);
    EXPECT_EQ(o.error().code, -ECONNREFUSED) << o.error().message;
    EXPECT_NE(o.error().message.find(gone), std::string::npos) << o.error().message;
}

TEST_F(EngineTest, ZeroLengthAndEmptyBatchAreRefused) {
    auto e = submit_error({Opcode::Read, local.data(), seg, raddr(), 0, ""});
    EXPECT_EQ(e.code, -EINVAL);
    EXPECT_NE(e.message.find("length is 0"), std::string::npos) << e.message;
    auto b = initiator->submit({});
    ASSERT_FALSE(b);
    EXPECT_EQ(b.error().code, -EINVAL);
}

TEST_F(EngineTest, OverlappingRegistrationIsRefused) {
    auto r = initiator->register_memory(local.data() + 100, 10);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -EEXIST);
    EXPECT_NE(r.error().message.find("overlaps the registered region"), std::string::npos) << r.error().message;
    std::vector<uint8_t> before(200);
    r = initiator->register_memory(before.data(), before.size());
    EXPECT_TRUE(r) << "disjoint ranges register fine";
    EXPECT_FALSE(initiator->register_memory(nullptr, 10));
    EXPECT_FALSE(initiator->register_memory(before.data(), 0));
    auto u = initiator->unregister_memory(before.data() + 1);
    ASSERT_FALSE(u);
    EXPECT_EQ(u.error().code, -ENOENT);
    EXPECT_TRUE(initiator->unregister_memory(before.data()));
}

TEST_F(EngineTest, RemoteRangeOutsideRegisteredMemoryIsRefused) {
    auto e = op_error({Opcode::Read, local.data(), seg, raddr(remote.size() - 8), 64, ""});
    EXPECT_EQ(e.code, -EFAULT);
    EXPECT_NE(e.message.find("is not inside one region that segment"), std::string::npos) << e.message;
    e = op_error({Opcode::Write, local.data(), seg, 0x10, 8, ""});
    EXPECT_EQ(e.code, -EFAULT);
}

TEST_F(EngineTest, AccessRightsAreEnforced) {
    std::vector<uint8_t> readonly(4096, 0x5a);
    ASSERT_TRUE(target->register_memory(readonly.data(), readonly.size(), {MemoryKind::Host, -1, kRemoteRead}));
    // Registered after open_segment: found (read-only) by re-reading the descriptor.
    auto e = op_error({Opcode::Write, local.data(), seg, reinterpret_cast<uintptr_t>(readonly.data()), 16, ""});
    EXPECT_EQ(e.code, -EACCES) << e.message;
    // Now the cached descriptor answers, and submit itself refuses.
    e = submit_error({Opcode::Write, local.data(), seg, reinterpret_cast<uintptr_t>(readonly.data()), 16, ""});
    EXPECT_EQ(e.code, -EACCES) << e.message;
    EXPECT_EQ(readonly[0], 0x5a);
    Request r{Opcode::Read, local.data(), seg, reinterpret_cast<uintptr_t>(readonly.data()), 16, ""};
    auto b = initiator->submit(std::span(&r, 1));
    ASSERT_TRUE(b) << b.error().message
                   << " (memory registered after open_segment is found by re-reading the descriptor)";
    EXPECT_TRUE(initiator->wait(*b, std::chrono::seconds(5)));
    EXPECT_EQ(local[0], 0x5a);
}

TEST_F(EngineTest, ForcedTransportMustExist) {
    auto e = submit_error({Opcode::Read, local.data(), seg, raddr(), 8, "rdma"});
    EXPECT_EQ(e.code, -ENOENT);
    EXPECT_NE(e.message.find("transport 'rdma' is not loaded"), std::string::npos) << e.message;
}

TEST_F(EngineTest, GpuMemoryWithoutAGpuTransportIsRefused) {
    std::vector<uint8_t> fake_device(64);
    auto r = initiator->register_memory(fake_device.data(), fake_device.size(), {MemoryKind::Cuda, 0, kRemoteRead});
    ASSERT_FALSE(r) << "a host vector registered as CUDA memory must be refused";
    // Without a CUDA driver nothing can stage it; with one, the stager sees it is not device memory.
    if (r.error().code == -ENOTSUP)
        EXPECT_NE(r.error().message.find("no loaded transport can move cuda memory"), std::string::npos)
            << r.error().message;
    else EXPECT_NE(r.error().message.find("is not CUDA device memory"), std::string::npos) << r.error().message;
}

TEST_F(EngineTest, BatchBookkeepingErrors) {
    Request r{Opcode::Read, local.data(), seg, raddr(), 8, ""};
    auto b = initiator->submit(std::span(&r, 1));
    ASSERT_TRUE(b);
    ASSERT_TRUE(initiator->wait(*b));
    auto st = initiator->status(*b, 1);
    ASSERT_FALSE(st);
    EXPECT_EQ(st.error().code, -EINVAL);
    ASSERT_TRUE(initiator->free_batch(*b));
    EXPECT_EQ(initiator->free_batch(*b).error().code, -ENOENT);
    EXPECT_EQ(initiator->wait(*b).error().code, -ENOENT);
}

TEST(EngineConfig, UnknownKeysAndBadValuesAreNamed) {
    auto e = Engine::create({{"metdata", "P2PHANDSHAKE"}});
    ASSERT_FALSE(e);
    EXPECT_NE(e.error().message.find("unknown config key 'metdata'"), std::string::npos) << e.error().message;
    e = Engine::create({{"rpc_port", "70000"}});
    ASSERT_FALSE(e);
    EXPECT_NE(e.error().message.find("rpc_port"), std::string::npos);
    auto c = example_config();
    c["plugins"] = "example,nonexistent";
    e = Engine::create(c);
    ASSERT_FALSE(e);
    EXPECT_NE(e.error().message.find("no nonexistent.so exists"), std::string::npos) << e.error().message;
    c = example_config();
    c["metadata"] = "zookeeper://127.0.0.1:2181";
    e = Engine::create(c);
    ASSERT_FALSE(e);
    EXPECT_EQ(e.error().code, -EPROTONOSUPPORT);
}

TEST(EngineConfig, ControlLimitsAreRangeChecked) {
    for (auto [key, value, range] : {std::tuple{"control_max_connections", "0", "1..1048576"},
                                     std::tuple{"control_max_connections_per_peer", "2000000", "1..1048576"},
                                     std::tuple{"control_idle_timeout_ms", "50", "100..86400000"},
                                     std::tuple{"control_log_interval_ms", "ten", "100..3600000"}}) {
        auto e = Engine::create({{"plugins", "example"}, {"plugin_path", FERRY_EXAMPLE_PLUGIN_DIR}, {key, value}});
        ASSERT_FALSE(e) << key << "=" << value;
        EXPECT_EQ(e.error().code, -EINVAL);
        EXPECT_NE(e.error().message.find(std::string("'") + key + "' = '" + value + "'; use " + range),
                  std::string::npos)
            << e.error().message;
    }
    auto e = Engine::create({{"plugins", "example"},
                             {"plugin_path", FERRY_EXAMPLE_PLUGIN_DIR},
                             {"control_max_connections", "16"},
                             {"control_max_connections_per_peer", "4"},
                             {"control_idle_timeout_ms", "1000"},
                             {"control_log_interval_ms", "100"}});
    EXPECT_TRUE(e) << e.error().message;
}

TEST(EngineConfig, YamlFile) {
    test::TempDir dir;
    {
        std::ofstream f(dir / "ferry.yaml");
        f << "metadata: P2PHANDSHAKE\nlocal_ip: 127.0.0.1\nplugin_path: " << FERRY_EXAMPLE_PLUGIN_DIR
          << "\nplugins: [example]\nlog_level: warn\n";
    }
    auto e = Engine::create_from_file((dir / "ferry.yaml").string());
    ASSERT_TRUE(e) << e.error().message;
    EXPECT_EQ((*e)->transports().size(), 1u);
    EXPECT_EQ((*e)->transports()[0].name, "example");
    {
        std::ofstream f(dir / "bad.yaml");
        f << "metadata: [unclosed\n";
    }
    auto bad = Engine::create_from_file((dir / "bad.yaml").string());
    ASSERT_FALSE(bad);
    EXPECT_NE(bad.error().message.find("bad.yaml"), std::string::npos);
    auto missing = Engine::create_from_file((dir / "absent.yaml").string());
    ASSERT_FALSE(missing);
    EXPECT_EQ(missing.error().code, -ENOENT);
}

TEST(CApi, EndToEndAndLastError) {
    const char *keys[] = {"plugin_path", "plugins"};
    const char *values[] = {FERRY_EXAMPLE_PLUGIN_DIR, "example"};
    ferry_engine_t *a = nullptr, *b = nullptr;
    ASSERT_EQ(ferry_engine_create(keys, values, 2, &a), 0) << ferry_last_error();
    ASSERT_EQ(ferry_engine_create(keys, values, 2, &b), 0) << ferry_last_error();
    char name[128];
    ASSERT_EQ(ferry_engine_segment_name(b, name, sizeof name), 0);
    EXPECT_EQ(ferry_engine_segment_name(b, name, 3), -ENOSPC);
    std::vector<uint8_t> src(1000, 0xab), dst(1000, 0);
    ASSERT_EQ(ferry_register(a, dst.data(), dst.size(), FERRY_MEMORY_HOST, -1, FERRY_REMOTE_READ | FERRY_REMOTE_WRITE),
              0);
    ASSERT_EQ(ferry_register(b, src.data(), src.size(), FERRY_MEMORY_HOST, -1, FERRY_REMOTE_READ), 0);
    ferry_segment_id_t seg;
    ASSERT_EQ(ferry_open_segment(a, name, &seg), 0) << ferry_last_error();
    ferry_request_t req{FERRY_READ, 0, dst.data(), seg, reinterpret_cast<uintptr_t>(src.data()), src.size(), nullptr};
    ferry_batch_id_t batch;
    ASSERT_EQ(ferry_submit(a, &req, 1, &batch), 0) << ferry_last_error();
    ASSERT_EQ(ferry_wait_batch(a, batch, 5000), 0) << ferry_last_error();
    ferry_op_status_t st;
    ASSERT_EQ(ferry_get_status(a, batch, 0, &st), 0);
    EXPECT_EQ(st.state, static_cast<uint32_t>(FERRY_OP_DONE));
    EXPECT_STREQ(st.transport, "example");
    EXPECT_EQ(dst, src);
    EXPECT_EQ(ferry_free_batch(a, batch), 0);
    req.opcode = FERRY_WRITE;
    EXPECT_EQ(ferry_submit(a, &req, 1, &batch), -EACCES);
    EXPECT_NE(std::string(ferry_last_error()).find("without remote write access"), std::string::npos)
        << ferry_last_error();
    EXPECT_EQ(ferry_register(nullptr, dst.data(), 1, 0, -1, 0), -EINVAL);
    ferry_engine_destroy(a);
    ferry_engine_destroy(b);
}
