// Option tables (plugins/common/option_table.hpp, plugin ABI 1.2): the parser and its messages,
// and, for every built plugin, that the table it publishes is the one its create() parses with.
#include "harness.hpp"

#include <gtest/gtest.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <string>

#include "option_table.hpp"

using namespace ferry_test;

namespace {

struct Cfg {
    unsigned lanes = 2;
    uint64_t slice = 1 << 20;
    unsigned timeout_ms = 5000;
    bool zerocopy = false;
    std::string mode = "fast";
    std::string key;
};

bool store_key(Cfg &c, const ferry_plugin::OptionValue &v) {
    if (strlen(v.text) < 8) return false;
    c.key = v.text;
    return true;
}

// clang-format off
constexpr auto kTable = ferry_plugin::make_options<Cfg>("demo",
    ferry_plugin::uint_option<Cfg>("lanes", "2", 1, 64, "connections per peer", ferry_plugin::store<&Cfg::lanes>),
    ferry_plugin::size_option<Cfg>("slice", "1m", 4096, 64ull << 20, "slice size", ferry_plugin::store<&Cfg::slice>),
    ferry_plugin::duration_option<Cfg>("timeout_ms", "5000", 1, 60000, "timeout", ferry_plugin::store<&Cfg::timeout_ms>),
    ferry_plugin::bool_option<Cfg>("zerocopy", "false", "splice", ferry_plugin::store<&Cfg::zerocopy>),
    ferry_plugin::enum_option<Cfg>("mode", "fast", "fast|safe|paranoid", "how", ferry_plugin::store<&Cfg::mode>),
    ferry_plugin::secret_option<Cfg>("key", "at least 8 characters", "the key", store_key));
// clang-format on

struct Parsed {
    int rc;
    std::string msg;
    Cfg cfg;
};

Parsed parse(const Options &o) {
    std::vector<ferry_kv_t> kv;
    for (auto &[k, v] : o) kv.push_back({k.c_str(), v.c_str()});
    Parsed p{};
    ferry_error_t err{};
    p.rc = kTable.parse(kv.data(), kv.size(), p.cfg, &err);
    p.msg = err.message;
    return p;
}

bool has(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

}  // namespace

TEST(OptionTable, EveryTypeParsesItsValues) {
    auto p = parse({{"lanes", "64"},
                    {"slice", "64k"},
                    {"timeout_ms", "1"},
                    {"zerocopy", "yes"},
                    {"mode", "safe"},
                    {"key", "0123456789"}});
    ASSERT_EQ(p.rc, 0) << p.msg;
    EXPECT_EQ(p.cfg.lanes, 64u);
    EXPECT_EQ(p.cfg.slice, 65536u);
    EXPECT_EQ(p.cfg.timeout_ms, 1u);
    EXPECT_TRUE(p.cfg.zerocopy);
    EXPECT_EQ(p.cfg.mode, "safe");
    EXPECT_EQ(p.cfg.key, "0123456789");
    EXPECT_FALSE(parse({{"zerocopy", "off"}}).cfg.zerocopy);
    EXPECT_EQ(parse({{"lanes", "3"}, {"lanes", "5"}}).cfg.lanes, 5u) << "a later key wins";
}

TEST(OptionTable, BadValuesNameKeyValueRangeAndDefault) {
    auto p = parse({{"lanes", "65"}});
    EXPECT_EQ(p.rc, -EINVAL);
    EXPECT_EQ(p.msg, "demo: invalid value '65' for option 'lanes': expected an integer from 1 to 64 (default 2)");
    p = parse({{"slice", "1x"}});
    EXPECT_EQ(p.msg,
              "demo: invalid value '1x' for option 'slice': expected a size from 4k to 64m bytes (suffixes k, m, g) "
              "(default 1m)");
    for (const char *bad : {"", "-1", " 1", "1 ", "+1", "99999999999999999999999"})
        EXPECT_EQ(parse({{"timeout_ms", bad}}).rc, -EINVAL) << "'" << bad << "'";
    EXPECT_TRUE(has(parse({{"zerocopy", "maybe"}}).msg, "expected true or false")) << parse({{"zerocopy", "2"}}).msg;
    EXPECT_TRUE(has(parse({{"mode", "slow"}}).msg, "expected one of fast, safe or paranoid"));
}

TEST(OptionTable, UnknownKeySuggestsTheNearestAndListsAll) {
    auto p = parse({{"lane", "2"}});
    EXPECT_EQ(p.rc, -EINVAL);
    EXPECT_TRUE(has(p.msg, "unknown option 'lane' (did you mean 'lanes'?)")) << p.msg;
    EXPECT_TRUE(has(p.msg, "ferry-info --options demo")) << p.msg;
    EXPECT_TRUE(has(p.msg, "known: lanes, slice, timeout_ms, zerocopy, mode, key")) << p.msg;
    EXPECT_FALSE(has(parse({{"bandwidth", "2"}}).msg, "did you mean")) << "no far-fetched guess";
}

TEST(OptionTable, SecretsAreNeverEchoed) {
    auto p = parse({{"key", "hunter2"}});  // too short: the store function refuses it
    EXPECT_EQ(p.rc, -EINVAL);
    EXPECT_TRUE(has(p.msg, "'key'")) << p.msg;
    EXPECT_TRUE(has(p.msg, "at least 8 characters")) << p.msg;
    EXPECT_FALSE(has(p.msg, "hunter2")) << p.msg;
    EXPECT_EQ(parse({{"key", ""}}).rc, -EINVAL);
}

TEST(OptionTable, NullKeysValuesAndHugeValuesAreRefusedCleanly) {
    Cfg c;
    ferry_error_t err{};
    ferry_kv_t null_key{nullptr, "1"}, null_value{"lanes", nullptr};
    EXPECT_EQ(kTable.parse(&null_key, 1, c, &err), -EINVAL);
    EXPECT_TRUE(has(err.message, "NULL key")) << err.message;
    EXPECT_EQ(kTable.parse(&null_value, 1, c, &err), -EINVAL);
    EXPECT_TRUE(has(err.message, "'(null)' for option 'lanes'")) << err.message;
    EXPECT_EQ(kTable.parse(nullptr, 3, c, &err), -EINVAL);
    EXPECT_EQ(kTable.parse(nullptr, 0, c, &err), 0);
    auto p = parse({{"lanes", std::string(100000, '7')}});
    EXPECT_EQ(p.rc, -EINVAL);
    EXPECT_TRUE(has(p.msg, "...' for option 'lanes': expected")) << p.msg;
    EXPECT_LT(p.msg.size(), size_t{FERRY_MESSAGE_MAX});
}

// ---- the tables the built plugins publish ----

namespace {

std::vector<std::string> built_plugins() {
    std::vector<std::string> out;
    for (const char *p : {
             FERRY_TEST_EXAMPLE_PLUGIN,
#ifdef FERRY_TEST_TCP_PLUGIN
             FERRY_TEST_TCP_PLUGIN,
#endif
#ifdef FERRY_TEST_SHM_PLUGIN
             FERRY_TEST_SHM_PLUGIN,
#endif
#ifdef FERRY_TEST_EFA_PLUGIN
             FERRY_TEST_EFA_PLUGIN,
#endif
#ifdef FERRY_TEST_RDMA_PLUGIN
             FERRY_TEST_RDMA_PLUGIN,
#endif
#ifdef FERRY_TEST_CUDA_IPC_PLUGIN  // create() parses its options before it looks for a GPU
             FERRY_TEST_CUDA_IPC_PLUGIN,
#endif
         })
        out.push_back(p);
    return out;
}

}  // namespace

class PublishedTable : public ::testing::TestWithParam<std::string> {};

// The table is well formed, and every key in it is one create() parses: a value no option takes
// (5000 x's) fails naming that key, never as an unknown option, and a secret is never echoed.
TEST_P(PublishedTable, IsWellFormedAndIsWhatCreateParses) {
    Plugin plugin(GetParam());
    ASSERT_TRUE(plugin.ok()) << plugin.error();
    ASSERT_GE(plugin->struct_size, FERRY_PLUGIN_V1_SIZE_UNTIL(option_desc_size));
    ASSERT_EQ(plugin->option_desc_size, sizeof(ferry_option_desc_t));
    ASSERT_GT(plugin->n_options, 0u);
    ASSERT_NE(plugin->options, nullptr);
    std::set<std::string> names;
    const std::string junk(5000, 'x');
    for (uint32_t i = 0; i < plugin->n_options; ++i) {
        const ferry_option_desc_t &d = plugin->options[i];
        ASSERT_NE(d.name, nullptr);
        SCOPED_TRACE(std::string(plugin->name) + "." + d.name);
        EXPECT_TRUE(names.insert(d.name).second) << "listed twice";
        EXPECT_LE(d.type, static_cast<uint32_t>(FERRY_OPTION_SECRET));
        EXPECT_NE(d.default_text, nullptr);
        ASSERT_NE(d.help, nullptr);
        EXPECT_GT(strlen(d.help), 5u);
        EXPECT_LE(d.min, d.max);
        EXPECT_EQ(d.type == FERRY_OPTION_ENUM, d.values != nullptr);
        Instance i(plugin, {{d.name, junk}});
        if (i.create_rc() == 0) continue;  // a free-form text (a secret's presence) may take it
        EXPECT_EQ(i.create_rc(), -EINVAL) << i.last_error();
        EXPECT_TRUE(has(i.last_error(), std::string("'") + d.name + "'")) << i.last_error();
        EXPECT_FALSE(has(i.last_error(), "unknown option")) << i.last_error();
        EXPECT_FALSE(has(i.last_error(), "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx")) << "value not cut";
        if (d.type == FERRY_OPTION_SECRET) EXPECT_FALSE(has(i.last_error(), "xxx")) << i.last_error();
    }
    for (uint32_t i = 0; i < plugin->n_options; ++i) {  // a host bug: a NULL value
        ferry_kv_t kv{plugin->options[i].name, nullptr};
        ferry_transport_t *t = nullptr;
        ferry_error_t err{};
        EXPECT_EQ(plugin->create(&kv, 1, test_host(), &t, &err), -EINVAL) << kv.key;
        EXPECT_TRUE(has(err.message, std::string("'") + kv.key + "'")) << err.message;
    }
    Instance unknown(plugin, {{"no_such_option", "1"}});
    EXPECT_EQ(unknown.create_rc(), -EINVAL);
    EXPECT_TRUE(has(unknown.last_error(), "unknown option 'no_such_option'")) << unknown.last_error();
}

INSTANTIATE_TEST_SUITE_P(Plugins, PublishedTable, ::testing::ValuesIn(built_plugins()), [](const auto &info) {
    std::string n = info.param.substr(info.param.rfind('/') + 1);
    return n.substr(0, n.find('.'));
});

// example.c's one option, parsed in plain C against the table it publishes.
TEST(ExampleOption, MaxRegionsBoundsRegistrations) {
    Plugin plugin(FERRY_TEST_EXAMPLE_PLUGIN);
    ASSERT_TRUE(plugin.ok()) << plugin.error();
    ASSERT_EQ(plugin->n_options, 1u);
    EXPECT_STREQ(plugin->options[0].name, "max_regions");
    Instance one(plugin, {{"max_regions", "1"}});
    ASSERT_EQ(one.create_rc(), 0) << one.last_error();
    Buffer buf(8192);
    uint64_t h1 = 0, h2 = 0;
    ASSERT_EQ(one.register_mem(buf.data(), 4096, FERRY_ACCESS_REMOTE_READ, &h1), 0) << one.last_error();
    EXPECT_EQ(one.register_mem(buf.data() + 4096, 4096, FERRY_ACCESS_REMOTE_READ, &h2), -ENOSPC);
    EXPECT_TRUE(has(one.last_error(), "max_regions")) << one.last_error();
    EXPECT_EQ(one.deregister_mem(h1), 0);
    EXPECT_EQ(one.register_mem(buf.data() + 4096, 4096, FERRY_ACCESS_REMOTE_READ, &h2), 0) << one.last_error();

    Instance zero(plugin, {{"max_regions", "0"}});
    EXPECT_EQ(zero.create_rc(), -EINVAL);
    EXPECT_EQ(zero.last_error(),
              "example: invalid value '0' for option 'max_regions': expected an integer from 1 to 256 (default 256)");
    Instance typo(plugin, {{"max_region", "1"}});
    EXPECT_EQ(typo.create_rc(), -EINVAL);
    EXPECT_TRUE(has(typo.last_error(), "unknown option 'max_region'")) << typo.last_error();
}
