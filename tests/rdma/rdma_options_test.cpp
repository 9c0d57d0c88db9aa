// rdma.so's option parsing (the cluster key never echoed), the probe's words, GID choice, and
// the plugin's probe and create on this host (a host without RDMA devices in CI).
#include "options.hpp"
#include "rdma_test_util.hpp"
#include "verbs.hpp"

#include <ferry/plugin.h>
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <cerrno>

namespace ferry_rdma {
namespace {

using namespace ferry_rdma::test;

Config parse(std::vector<std::pair<std::string, std::string>> kv, int *rc, std::string *msg) {
    std::vector<ferry_kv_t> o;
    for (auto &[k, v] : kv) o.push_back({k.c_str(), v.c_str()});
    Config c;
    ferry_error_t e{};
    *rc = parse_config(o.data(), o.size(), &c, &e);
    *msg = e.message;
    return c;
}

TEST(RdmaOptions, ValuesAndRefusals) {
    int rc = 0;
    std::string msg;
    Config c =
        parse({{"devices", "mlx5_0, mlx5_1"}, {"max_mr_size", "2m"}, {"gid_index", "3"}, {"mtu", "4096"}}, &rc, &msg);
    ASSERT_EQ(rc, 0) << msg;
    EXPECT_EQ(c.devices, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
    EXPECT_EQ(c.max_mr_size, 2 * kMiB);
    EXPECT_EQ(c.gid_index, 3);
    EXPECT_EQ(c.bind_ip, "127.0.0.1") << "never the wildcard by default";
    EXPECT_EQ(c.advertise_ip, "127.0.0.1");
    for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{{"max_mr_size", "5000"},
                                                                        {"mtu", "1500"},
                                                                        {"devices", "mlx5_0,,x"},
                                                                        {"bind_ip", "localhost"},
                                                                        {"max_wr", "1"},
                                                                        {"retry_count", "8"},
                                                                        {"signal_interval", "0"}}) {
        parse({{k, v}}, &rc, &msg);
        EXPECT_EQ(rc, -EINVAL) << k << "=" << v;
        EXPECT_TRUE(contains(msg, "'" + k + "'")) << msg;
    }
    parse({{"no_such", "1"}}, &rc, &msg);
    EXPECT_EQ(rc, -EINVAL);
    EXPECT_TRUE(contains(msg, "no_such") && contains(msg, "known:")) << msg;
    parse({{"bind_ip", "0.0.0.0"}}, &rc, &msg);
    EXPECT_EQ(rc, -EINVAL);
    EXPECT_TRUE(contains(msg, "advertise_ip")) << msg;
}

TEST(RdmaProbeWords, NoDevicesNamesWhatWasChecked) {
    std::string s = describe_no_devices(ENOSYS, false, "/sys");
    EXPECT_TRUE(contains(s, "no RDMA devices")) << s;
    EXPECT_TRUE(contains(s, "ibv_get_device_list")) << s;
    EXPECT_TRUE(contains(s, "/sys/class/infiniband absent")) << s;
    EXPECT_TRUE(contains(s, "kernel has no RDMA support")) << s;
    s = describe_no_devices(0, true, "/sys");
    EXPECT_TRUE(contains(s, "/sys/class/infiniband exists")) << s;
    EXPECT_LT(s.size(), static_cast<size_t>(FERRY_MESSAGE_MAX));
}

TEST(RdmaProbeWords, GidChoicePrefersRoceV2Ipv4Mapped) {
    std::vector<GidEntry> t(4);
    t[0].gid[0] = 0xfe, t[0].gid[1] = 0x80, t[0].gid[15] = 1, t[0].type = "IB/RoCE v1";
    t[1] = t[0], t[1].type = "RoCE v2";
    t[2].gid[10] = 0xff, t[2].gid[11] = 0xff, t[2].gid[12] = 10, t[2].gid[15] = 1, t[2].type = "IB/RoCE v1";
    t[3] = t[2], t[3].type = "RoCE v2";
    EXPECT_EQ(choose_gid_index(t), 3);
    t.pop_back();
    EXPECT_EQ(choose_gid_index(t), 1) << "RoCE v2 before v1";
    std::vector<GidEntry> empty(2);
    EXPECT_EQ(choose_gid_index(empty), -1);
    EXPECT_EQ(mtu_code(4096), 5);
    EXPECT_EQ(mtu_bytes(mtu_code(1024)), 1024u);
    EXPECT_EQ(mtu_code(1500), 0);
}

TEST(RdmaOptions, AuthKeyIsHexAndNeverEchoed) {
    int rc = 0;
    std::string msg;
    Config c = parse({{"auth_key", std::string(64, 'a')}}, &rc, &msg);
    ASSERT_EQ(rc, 0) << msg;
    EXPECT_EQ(c.auth_key.size(), 32u);
    parse({{"auth_key", "secretsecret"}}, &rc, &msg);
    EXPECT_EQ(rc, -EINVAL);
    EXPECT_TRUE(contains(msg, "'auth_key'")) << msg;
    EXPECT_FALSE(contains(msg, "secretsecret")) << msg;
}

// ---------------- the plugin on this host ----------------

TEST(RdmaPlugin, ProbeAndCreateSayWhyNotOnAHostWithoutRdma) {
    void *h = dlopen(FERRY_TEST_RDMA_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(h, nullptr) << dlerror();
    auto *api = static_cast<const ferry_plugin_v1_t *>(dlsym(h, FERRY_PLUGIN_SYMBOL_V1));
    ASSERT_NE(api, nullptr);
    EXPECT_STREQ(api->name, "rdma");
    EXPECT_NE(api->caps & FERRY_CAP_MEM_CUDA, 0u);
    EXPECT_NE(api->caps & FERRY_CAP_MEM_ROCM, 0u);
    EXPECT_NE(api->caps & FERRY_CAP_AUTH_KEY, 0u);
    ferry_probe_result_t r{};
    ASSERT_EQ(api->probe(nullptr, 0, &r), 0);
    DeviceList devices;
    if (devices.size() > 0) {
        // Not this test's subject: the conformance suite runs where devices exist.
        GTEST_SKIP() << "SKIPPED: this host has " << devices.size() << " RDMA device(s); probe says: " << r.reason;
    }
    EXPECT_EQ(r.available, 0);
    std::string reason = r.reason;
    EXPECT_TRUE(contains(reason, "no RDMA devices (ibv_get_device_list found none")) << reason;
    EXPECT_TRUE(contains(reason, "/sys/class/infiniband")) << reason;
    ferry_transport_t *t = nullptr;
    ferry_error_t e{};
    EXPECT_EQ(api->create(nullptr, 0, nullptr, &t, &e), -ENODEV);
    EXPECT_EQ(t, nullptr) << "output set only on success";
    EXPECT_TRUE(contains(e.message, "no RDMA devices")) << e.message;
    // A bad option is reported by the probe too, naming the key.
    ferry_kv_t bad[] = {{"max_wr", "zero"}};
    ASSERT_EQ(api->probe(bad, 1, &r), 0);
    EXPECT_EQ(r.available, 0);
    EXPECT_TRUE(contains(r.reason, "max_wr")) << r.reason;
    dlclose(h);
}

}  // namespace
}  // namespace ferry_rdma
