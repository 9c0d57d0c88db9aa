// ferry-info as a user runs it: a child process with FERRY_PLUGIN_PATH, FERRY_PLUGINS and, for
// the variant directories, a fake NVIDIA driver library on LD_LIBRARY_PATH. Most tests run it over
// a copy of libferry in a directory of its own (first on LD_LIBRARY_PATH), so the build tree's
// <dir of libferry>/ferry/plugins (build/core/ferry/plugins) stays out of their search path.
#include <gtest/gtest.h>

#include "test_util.hpp"

using ferry::test::TempDir;

namespace {

std::string fake(const std::string &name) { return std::string(FERRY_FAKE_PLUGIN_DIR) + "/" + name + ".so"; }

std::string ferry_info(const std::string &env, const std::string &args, int *status) {
    return ferry::test::run_command("env -u FERRY_PLUGINS " + env + " " + FERRY_INFO_BIN + " " + args + " 2>&1",
                                    status);
}

class FerryInfoTest : public ::testing::Test {
protected:
    void SetUp() override {
        ferry::test::copy_file(fake("fake_gpu_plain"), dir / "fake_gpu.so");
        ferry::test::copy_file(fake("fake_gpu_cuda12"), dir / "cuda12/fake_gpu.so");
        ferry::test::copy_file(fake("fake_gpu_cuda13"), dir / "cuda13/fake_gpu.so");
        ferry::test::copy_file(fake("fake_gpu_cuda13"), dir / "cuda14/fake_gpu.so");
        ferry::test::copy_file(fake("fake_good"), dir / "fake_good.so");
        ferry::test::copy_file(fake("fake_unavailable"), dir / "fake_unavailable.so");
        path = "FERRY_PLUGIN_PATH=" + dir.path().string();
        ferry::test::copy_file(FERRY_LIBFERRY_SO, lib / "libferry.so.0");
        path += " LD_LIBRARY_PATH=" + lib.path().string();
    }
    TempDir dir;
    TempDir lib;  // a libferry with no ferry/plugins next to it
    std::string path;
};

}  // namespace

TEST_F(FerryInfoTest, WithoutADriverThePlainCopyLoadsAndVariantsSaySo) {
    int status = 0;
    // LD_LIBRARY_PATH alone cannot hide an installed driver (the loader cache still finds
    // libcuda.so.1); FERRY_LIBCUDA names the driver library the core loads.
    std::string out = ferry_info(path + ":/nonexistent FERRY_LIBCUDA=/nonexistent/libcuda.so.1", "", &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("fake_gpu  [loaded]  " + (dir / "fake_gpu.so").string()), std::string::npos) << out;
    EXPECT_NE(out.find("[variant-skipped]  " + (dir / "cuda13/fake_gpu.so").string()), std::string::npos) << out;
    EXPECT_NE(out.find("cuda13/: no NVIDIA driver"), std::string::npos) << out;
    EXPECT_NE(out.find("no fake device: /dev/fake0 does not exist"), std::string::npos) << out;
}

TEST_F(FerryInfoTest, WithADriverTheNewestMatchingVariantWins) {
    int status = 0;
    std::string out = ferry_info(path + ":" + FERRY_FAKE_RUNTIME_DIR, "--json", &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("\"cuda_major\":13"), std::string::npos) << out;
    EXPECT_NE(out.find("\"path\":\"" + (dir / "cuda13/fake_gpu.so").string() +
                       "\",\"variant\":\"cuda13\",\"state\":\"loaded\""),
              std::string::npos)
        << out;
    EXPECT_NE(out.find("\"variant\":\"cuda12\",\"state\":\"shadowed\""), std::string::npos) << out;
    EXPECT_NE(out.find("built for CUDA 14 but the driver supports CUDA 13 at most"), std::string::npos) << out;
    EXPECT_NE(out.find("\"variant\":\"\",\"state\":\"shadowed\""), std::string::npos) << out;
}

TEST_F(FerryInfoTest, ExitsNonZeroWhenARequestedPluginIsUnavailable) {
    int status = 0;
    std::string out = ferry_info(path + " FERRY_PLUGINS=fake_good,fake_unavailable", "", &status);
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find("plugin 'fake_unavailable'"), std::string::npos) << out;
    EXPECT_NE(out.find("[excluded]"), std::string::npos) << out;
    out = ferry_info(path + " FERRY_PLUGINS=fake_good", "", &status);
    EXPECT_EQ(status, 0) << out;
}

// How long discovery took, per plugin (load and probe) and in all, in text and JSON.
TEST_F(FerryInfoTest, SaysHowLongEachProbeTook) {
    int status = 0;
    std::string out = ferry_info(path, "", &status);
    EXPECT_EQ(status, 0) << out;
    auto good = out.find("fake_good  [loaded]");
    ASSERT_NE(good, std::string::npos) << out;
    auto timing = out.find("      load ", good);
    ASSERT_NE(timing, std::string::npos) << out;
    EXPECT_LT(timing, std::min(out.find("  [", good + 20), out.find("Discovery: ")))
        << "no timing line under fake_good: " << out;
    EXPECT_NE(out.find(" ms, probe ", timing), std::string::npos) << out;
    EXPECT_NE(out.find("Discovery: "), std::string::npos) << out;
    EXPECT_NE(out.find(" ms (runtimes "), std::string::npos) << out;
    out = ferry_info(path, "--json", &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("\"load_ms\":"), std::string::npos) << out;
    EXPECT_NE(out.find("\"probe_ms\":"), std::string::npos) << out;
    EXPECT_NE(out.find("\"discovery_ms\":"), std::string::npos) << out;
    EXPECT_NE(out.find("\"runtimes_ms\":"), std::string::npos) << out;
}

TEST_F(FerryInfoTest, RejectsUnknownArguments) {
    int status = 0;
    std::string out = ferry_info(path, "--frobnicate", &status);
    EXPECT_EQ(status, 2);
    EXPECT_NE(out.find("unknown argument '--frobnicate'"), std::string::npos) << out;
}

TEST_F(FerryInfoTest, ExitsNonZeroAndSaysWhereItLookedWhenNoPluginFileExists) {
    TempDir empty;
    int status = 0;
    std::string env = "FERRY_PLUGIN_PATH=" + empty.path().string() + " LD_LIBRARY_PATH=" + lib.path().string();
    std::string out = ferry_info(env, "", &status);
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find("(no plugin files found)"), std::string::npos) << out;
    EXPECT_NE(out.find("no plugin files (<name>.so) in any directory of the search path (" + empty.path().string()),
              std::string::npos)
        << out;
    EXPECT_NE(out.find((lib / "ferry/plugins").string()), std::string::npos) << out;  // where it looked
    EXPECT_NE(out.find("set FERRY_PLUGIN_PATH"), std::string::npos) << out;           // what to set
    out = ferry_info(env, "--json", &status);
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find("\"errors\":[\"no plugin files"), std::string::npos) << out;
}

// The build tree runs as built: build/core/ferry-info finds the plugins of this build in
// build/core/ferry/plugins (the loader's <dir of libferry>/ferry/plugins) with no environment.
TEST(FerryInfoBuildTree, FindsThisBuildsPluginsWithNoEnvironment) {
    int status = 0;
    std::string out = ferry::test::run_command(
        std::string("env -u FERRY_PLUGIN_PATH -u FERRY_PLUGINS -u LD_LIBRARY_PATH ") + FERRY_INFO_BIN + " 2>&1",
        &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find(std::string("tcp  [loaded]  ") + FERRY_BUILD_PLUGIN_DIR + "/tcp.so"), std::string::npos) << out;
    EXPECT_EQ(out.find("(no plugin files found)"), std::string::npos) << out;
}

// `ferry-info --options`: generated from the tables plugins publish (ABI 1.2), here example.so's
// one option, and the engine's own keys.
TEST(FerryInfoOptions, ListsEachPluginsTableAndTheEngineKeys) {
    int status = 0;
    std::string env = std::string("FERRY_PLUGIN_PATH=") + FERRY_EXAMPLE_PLUGIN_DIR;
    std::string out = ferry_info(env, "--options example", &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("example ("), std::string::npos) << out;
    EXPECT_NE(out.find("  max_regions = 256\n      uint: 1..256\n      regions one instance may have registered"),
              std::string::npos)
        << out;
    EXPECT_EQ(out.find("handshake_timeout_ms"), std::string::npos) << "only the plugin asked for";
    out = ferry_info(env, "--options example --json", &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("{\"name\":\"max_regions\",\"type\":\"uint\",\"default\":\"256\",\"min\":1,\"max\":256"),
              std::string::npos)
        << out;
    out = ferry_info(env, "--options example --markdown", &status);
    EXPECT_NE(out.find("| `example.max_regions` | `256` | 1..256 | regions one instance may have registered at once |"),
              std::string::npos)
        << out;
    out = ferry_info(env, "--options engine", &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("  handshake_timeout_ms = 5000\n      1..3600000\n"), std::string::npos) << out;
    out = ferry_info(env, "--options", &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("engine ("), std::string::npos) << out;
    EXPECT_NE(out.find("max_regions = 256"), std::string::npos) << out;
}

TEST(FerryInfoOptions, AnUnknownPluginFailsSayingWhy) {
    int status = 0;
    std::string out =
        ferry_info(std::string("FERRY_PLUGIN_PATH=") + FERRY_EXAMPLE_PLUGIN_DIR, "--options nonesuch", &status);
    EXPECT_EQ(status, 1) << out;
    EXPECT_NE(out.find("no plugin named 'nonesuch' was loaded"), std::string::npos) << out;
}
