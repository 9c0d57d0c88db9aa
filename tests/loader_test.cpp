// Plugin loader: every way a plugin can fail to load is recorded with its exact reason, and the
// other plugins still load. Uses the fake plugins built from tests/fake_plugins.
#include <gtest/gtest.h>

#include <fstream>

#include "loader/plugin_loader.hpp"
#include "test_util.hpp"

using namespace ferry;
using ferry::test::TempDir;

namespace {

std::string fake(const std::string &name) { return std::string(FERRY_FAKE_PLUGIN_DIR) + "/" + name + ".so"; }

PluginReport load_from(const std::vector<std::string> &dirs, const std::string &selection = "") {
    LoaderOptions o;
    o.search_path = dirs;
    o.selection = PluginSelection::parse(selection);
    return load_plugins(o);
}

const PluginRecord &record(const PluginReport &r, const std::string &name) {
    for (auto &p : r.plugins)
        if (p.name == name) return p;
    static PluginRecord none;
    ADD_FAILURE() << "no record for " << name << "\n" << r.to_text();
    return none;
}

class LoaderTest : public ::testing::Test {
protected:
    void put(const std::string &built, const std::string &as = "") {
        test::copy_file(fake(built), dir / ((as.empty() ? built : as) + ".so"));
    }
    TempDir dir;
};

}  // namespace

TEST_F(LoaderTest, GoodPluginLoadsAndProbes) {
    put("fake_good");
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_good");
    EXPECT_EQ(p.state, PluginState::Loaded) << p.reason;
    EXPECT_EQ(p.version, "0.0.1");
    EXPECT_EQ(p.abi_version, FERRY_PLUGIN_ABI_VERSION);
    EXPECT_EQ(p.reason, "fake device present");
    ASSERT_TRUE(p.plugin);
    EXPECT_TRUE(r.errors.empty());
}

TEST_F(LoaderTest, WrongAbiMajorIsRejectedNamingBothVersions) {
    put("fake_wrong_abi");
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_wrong_abi");
    EXPECT_EQ(p.state, PluginState::Failed);
    EXPECT_NE(p.reason.find("plugin ABI 2.0"), std::string::npos) << p.reason;
    const std::string ours = "implements ABI " + std::to_string(FERRY_PLUGIN_ABI_MAJOR) + "." +
                             std::to_string(FERRY_PLUGIN_ABI_MINOR);  // whatever this header says
    EXPECT_NE(p.reason.find(ours), std::string::npos) << p.reason;
}

TEST_F(LoaderTest, NewerMajorSymbolIsNamed) {
    put("fake_v2_only");
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_v2_only");
    EXPECT_EQ(p.state, PluginState::Failed);
    EXPECT_NE(p.reason.find("exports ferry_plugin_v2"), std::string::npos) << p.reason;
}

TEST_F(LoaderTest, MissingSymbol) {
    put("fake_no_symbol");
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_no_symbol");
    EXPECT_EQ(p.state, PluginState::Failed);
    EXPECT_NE(p.reason.find("no symbol ferry_plugin_v1"), std::string::npos) << p.reason;
}

TEST_F(LoaderTest, MissingDependencyReportsTheDynamicLoadersText) {
    put("fake_missing_dep");
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_missing_dep");
    EXPECT_EQ(p.state, PluginState::Failed);
    EXPECT_NE(p.reason.find("libferry_fake_dep.so.1: cannot open shared object file"), std::string::npos) << p.reason;
}

TEST_F(LoaderTest, ProbeUnavailableKeepsTheReason) {
    put("fake_unavailable");
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_unavailable");
    EXPECT_EQ(p.state, PluginState::Unavailable);
    EXPECT_EQ(p.reason, "no fake device: /dev/fake0 does not exist");
    EXPECT_FALSE(p.plugin);
}

TEST_F(LoaderTest, NewerMinorWithExtraFieldsLoads) {
    put("fake_newer_minor");
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_newer_minor");
    EXPECT_EQ(p.state, PluginState::Loaded) << p.reason;
    EXPECT_EQ(p.abi_version, 0x10005u);
    ASSERT_TRUE(p.plugin);
    EXPECT_GT(p.plugin->api->struct_size, sizeof(ferry_plugin_v1_t));
}

// ABI 1.2: the option table is copied out (stepping by the plugin's option_desc_size, which a
// newer header may have grown), so it outlives an unloaded plugin.
TEST_F(LoaderTest, OptionTableIsCopiedSteppingByTheEntrySize) {
    put("fake_options");
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_options");
    EXPECT_EQ(p.state, PluginState::Loaded) << p.reason;
    ASSERT_EQ(p.options.size(), 2u) << p.options_note;
    EXPECT_EQ(p.options[0].name, "depth");
    EXPECT_EQ(p.options[0].type, static_cast<uint32_t>(FERRY_OPTION_UINT));
    EXPECT_EQ(p.options[0].default_text, "8");
    EXPECT_EQ(p.options[0].min, 1u);
    EXPECT_EQ(p.options[0].max, 64u);
    EXPECT_EQ(p.options[0].help, "queue depth");
    EXPECT_EQ(p.options[1].name, "mode");
    EXPECT_EQ(p.options[1].values, "fast|safe");
}

TEST_F(LoaderTest, Abi11PluginWithoutAnOptionTableLoads) {
    put("fake_abi_1_1");
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_abi_1_1");
    EXPECT_EQ(p.state, PluginState::Loaded) << p.reason;
    EXPECT_EQ(p.abi_version, 0x10001u);
    EXPECT_TRUE(p.options.empty());
    EXPECT_NE(p.options_note.find("publishes no option table (plugin ABI 1.1"), std::string::npos) << p.options_note;
}

TEST_F(LoaderTest, MalformedOptionTableIsNotedNotFatal) {
    put("fake_bad_options");  // claims 5000 entries
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_bad_options");
    EXPECT_EQ(p.state, PluginState::Loaded) << p.reason;
    EXPECT_TRUE(p.options.empty());
    EXPECT_NE(p.options_note.find("option table ignored: 5000 entries"), std::string::npos) << p.options_note;
}

TEST_F(LoaderTest, StructTooSmallForTheFieldsWeUseIsRejected) {
    put("fake_too_small");
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_too_small");
    EXPECT_EQ(p.state, PluginState::Failed);
    EXPECT_NE(p.reason.find("needs at least"), std::string::npos) << p.reason;
}

TEST_F(LoaderTest, NameMustMatchTheFile) {
    put("fake_misnamed");
    auto r = load_from({dir.path()});
    auto &p = record(r, "fake_misnamed");
    EXPECT_EQ(p.state, PluginState::Failed);
    EXPECT_NE(p.reason.find("calls itself 'someone_else'"), std::string::npos) << p.reason;
}

TEST_F(LoaderTest, CorruptAndEmptyFilesFailCleanly) {
    { std::ofstream(dir / "empty.so"); }
    { std::ofstream(dir / "garbage.so") << std::string(4096, 'x'); }
    put("fake_good");
    auto r = load_from({dir.path()});
    EXPECT_EQ(record(r, "empty").state, PluginState::Failed);
    EXPECT_NE(record(r, "empty").reason.find("empty.so"), std::string::npos) << record(r, "empty").reason;
    EXPECT_NE(record(r, "garbage").reason.find("invalid ELF header"), std::string::npos) << record(r, "garbage").reason;
    EXPECT_EQ(record(r, "fake_good").state, PluginState::Loaded);
}

TEST_F(LoaderTest, FailuresDoNotStopTheOthers) {
    for (auto n :
         {"fake_good", "fake_wrong_abi", "fake_no_symbol", "fake_missing_dep", "fake_unavailable", "fake_newer_minor"})
        put(n);
    auto r = load_from({dir.path()});
    EXPECT_EQ(record(r, "fake_good").state, PluginState::Loaded);
    EXPECT_EQ(record(r, "fake_newer_minor").state, PluginState::Loaded);
    EXPECT_TRUE(r.errors.empty()) << "nobody asked for the broken ones by name";
}

TEST_F(LoaderTest, AllowListExcludesTheRestAndRequestedFailuresAreErrors) {
    for (auto n : {"fake_good", "fake_unavailable", "fake_wrong_abi"}) put(n);
    auto r = load_from({dir.path()}, "fake_good,fake_unavailable,fake_absent");
    EXPECT_EQ(record(r, "fake_good").state, PluginState::Loaded);
    EXPECT_EQ(record(r, "fake_wrong_abi").state, PluginState::Excluded);
    ASSERT_EQ(r.errors.size(), 2u) << r.to_text();
    EXPECT_NE(r.errors[0].find("no fake device"), std::string::npos) << r.errors[0];
    EXPECT_NE(r.errors[1].find("no fake_absent.so exists"), std::string::npos) << r.errors[1];
}

TEST_F(LoaderTest, DenyList) {
    for (auto n : {"fake_good", "fake_newer_minor"}) put(n);
    auto r = load_from({dir.path()}, "^fake_good");
    EXPECT_EQ(record(r, "fake_good").state, PluginState::Excluded);
    EXPECT_EQ(record(r, "fake_newer_minor").state, PluginState::Loaded);
    EXPECT_TRUE(r.errors.empty());
}

TEST_F(LoaderTest, EarlierDirectoryShadowsLater) {
    TempDir second;
    put("fake_good");
    test::copy_file(fake("fake_good"), second / "fake_good.so");
    auto r = load_from({dir.path(), second.path()});
    ASSERT_EQ(r.plugins.size(), 2u);
    EXPECT_EQ(r.plugins[0].state, PluginState::Loaded);
    EXPECT_EQ(r.plugins[1].state, PluginState::Shadowed);
    EXPECT_NE(r.plugins[1].reason.find(dir.path().string()), std::string::npos);
}

TEST_F(LoaderTest, AFailedCopyDoesNotShadowAGoodOne) {
    TempDir second;
    put("fake_wrong_abi", "fake_good");
    test::copy_file(fake("fake_good"), second / "fake_good.so");
    auto r = load_from({dir.path(), second.path()}, "fake_good");
    EXPECT_EQ(r.plugins[0].state, PluginState::Failed);
    EXPECT_EQ(r.plugins[1].state, PluginState::Loaded);
    EXPECT_TRUE(r.errors.empty()) << r.to_text();
}

TEST(PluginSelection, Parses) {
    auto allow = PluginSelection::parse("tcp, shm");
    EXPECT_TRUE(allow.allows("tcp"));
    EXPECT_FALSE(allow.allows("efa"));
    EXPECT_TRUE(allow.requested("shm"));
    auto deny = PluginSelection::parse("^efa,rdma");
    EXPECT_FALSE(deny.allows("efa"));
    EXPECT_FALSE(deny.allows("rdma"));
    EXPECT_TRUE(deny.allows("tcp"));
    EXPECT_FALSE(deny.requested("tcp"));
    EXPECT_TRUE(PluginSelection::parse("").allows("anything"));
}

TEST(RuntimeVariants, Matching) {
    InstalledRuntimes rt;
    rt.cuda_major = 13;
    rt.cuda_detail = "driver 13.0";
    rt.rocm_detail = "no ROCm runtime";
    std::string why;
    EXPECT_TRUE(variant_matches(rt, "cuda13", why));
    EXPECT_TRUE(variant_matches(rt, "cuda12", why)) << "a newer driver runs older CUDA majors";
    EXPECT_FALSE(variant_matches(rt, "cuda14", why));
    EXPECT_NE(why.find("supports CUDA 13 at most"), std::string::npos) << why;
    EXPECT_FALSE(variant_matches(rt, "rocm6", why));
    EXPECT_EQ(why, "libamdhip64.so.6 is not on the loader path");
    rt.rocm_major = 6;
    rt.rocm_detail = "ROCm 6.2.0";
    rt.rocm_source = "rocm-core";
    EXPECT_FALSE(variant_matches(rt, "rocm6", why)) << "a release without its HIP library serves no variant";
    EXPECT_EQ(why, "ROCm 6.2.0 found (rocm-core) but libamdhip64.so.6 is not on the loader path");
    rt.hip_libraries[6] = "/usr/lib/libamdhip64.so.6";
    rt.rocm_variant = 6;
    EXPECT_TRUE(variant_matches(rt, "rocm6", why));
    EXPECT_FALSE(variant_matches(rt, "rocm5", why)) << "a rocm<N>/ variant needs libamdhip64.so.N";
    rt.hip_libraries[7] = "/usr/lib/libamdhip64.so.7";
    EXPECT_TRUE(variant_matches(rt, "rocm7", why)) << "its runtime resolves: the next variant to try";
    EXPECT_GT(variant_priority(rt, "rocm6"), variant_priority(rt, "rocm7")) << "the chosen variant goes first";
    std::string family;
    int major;
    EXPECT_FALSE(parse_variant("cudax", family, major));
    EXPECT_FALSE(parse_variant("plugins", family, major));
}
