// Which rocm<N>/ variant is chosen, as a user runs ferry-info: child processes whose loader
// path holds stand-ins for rocm-core and libamdhip64.so.N (tests/fake_plugins/fake_rocm.c),
// and rocm5/, rocm6/, rocm7/ copies of one plugin told apart by version. A variant is chosen
// only if its libamdhip64 resolves; gpu_staging dlopens the same one. (The same cases against
// ROCm's real user space run in a sid root: tests/rocm/run_root_suite.sh.)
#include <gtest/gtest.h>

#include <cstdlib>
#include <fstream>
#include <memory>

#include <unistd.h>
#include "ferry/engine.hpp"

#include "loader/library_path.hpp"
#include "staging/gpu_staging.hpp"
#include "test_util.hpp"

using ferry::test::TempDir;

namespace {

class RocmVariantTest : public ::testing::Test {
protected:
    void SetUp() override {
        for (const char *v : {"rocm5", "rocm6", "rocm7"})
            ferry::test::copy_file(std::string(FERRY_FAKE_PLUGIN_DIR) + "/fake_gpu_" + v + ".so",
                                   plugins / (std::string(v) + "/fake_gpu.so"));
        std::filesystem::create_directories(lib.path());
    }
    void add(const char *fake, const std::string &as) { ferry::test::copy_file(fake, lib / as); }
    // ferry-info --json with only `lib` (and the host's own system libraries) to find ROCm in.
    std::string info(const std::string &env = "") {
        int status = 0;
        std::string out = ferry::test::run_command("env -u FERRY_PLUGINS FERRY_PLUGIN_PATH=" + plugins.path().string() +
                                                       " LD_LIBRARY_PATH=" + lib.path().string() +
                                                       " ROCM_PATH=" + (opt / "rocm").string() + " " + env + " " +
                                                       FERRY_INFO_BIN + " --json 2>&1",
                                                   &status);
        EXPECT_EQ(status, 0) << out;
        return out;
    }
    std::string record(const char *variant, const char *state) {
        return "\"path\":\"" + (plugins / variant / "fake_gpu.so").string() + "\",\"variant\":\"" + variant +
               "\",\"state\":\"" + state + "\"";
    }
    TempDir plugins, lib, opt;
};

}  // namespace

TEST_F(RocmVariantTest, RocmCore7WithOnlyHip6ChoosesRocm6) {
    add(FERRY_FAKE_ROCM_CORE7, "librocm-core.so.1");
    add(FERRY_FAKE_HIP6, "libamdhip64.so.6");
    std::string out = info();
    EXPECT_NE(out.find("\"rocm_major\":7"), std::string::npos) << out;
    EXPECT_NE(out.find("\"rocm_source\":\"rocm-core\""), std::string::npos) << out;
    EXPECT_NE(out.find("\"rocm_variant\":\"rocm6\""), std::string::npos) << out;
    EXPECT_NE(out.find("ROCm 7.2.4 (rocm-core) but libamdhip64.so.7 is not on the loader path; libamdhip64.so.6 is ("),
              std::string::npos)
        << out;
    EXPECT_NE(out.find(record("rocm6", "loaded")), std::string::npos) << out;
    EXPECT_NE(out.find(record("rocm7", "variant-skipped")), std::string::npos) << out;
    EXPECT_NE(out.find("rocm7/: ROCm 7.2.4 found (rocm-core) but libamdhip64.so.7 is not on the loader path"),
              std::string::npos)
        << out;
}

TEST_F(RocmVariantTest, Hip6AndHip7BothPresentChoose7AndShadow6) {
    add(FERRY_FAKE_ROCM_CORE7, "librocm-core.so.1");
    add(FERRY_FAKE_HIP6, "libamdhip64.so.6");
    add(FERRY_FAKE_HIP7, "libamdhip64.so.7");
    std::string out = info();
    EXPECT_NE(out.find("\"rocm_variant\":\"rocm7\""), std::string::npos) << out;
    EXPECT_NE(out.find(record("rocm7", "loaded")), std::string::npos) << out;
    EXPECT_NE(out.find(record("rocm6", "shadowed")), std::string::npos) << out;
}

TEST_F(RocmVariantTest, WithoutRocmCoreTheNewestSonameIsTheRelease) {
    add(FERRY_FAKE_HIP6, "libamdhip64.so.6");
    add(FERRY_FAKE_HIP7, "libamdhip64.so.7");
    std::string out = info();
    EXPECT_NE(out.find("\"rocm_major\":7"), std::string::npos) << out;
    EXPECT_NE(out.find("\"rocm_source\":\"" + (lib / "libamdhip64.so.7").string() + "\""), std::string::npos) << out;
    EXPECT_NE(out.find(record("rocm7", "loaded")), std::string::npos) << out;
}

TEST_F(RocmVariantTest, AmdOptLayoutOffTheLoaderPathSaysHowToFixIt) {
    auto prefix = opt / "rocm-7.2.3";
    std::filesystem::create_directories(prefix / ".info");
    std::ofstream(prefix / ".info/version") << "7.2.3-91\n";
    ferry::test::copy_file(FERRY_FAKE_HIP7, prefix / "lib/libamdhip64.so.7");
    std::filesystem::create_directory_symlink(prefix, opt / "rocm");
    std::string out = info();
    EXPECT_NE(out.find("\"rocm_major\":7"), std::string::npos) << out;
    EXPECT_NE(out.find("rocm7/: ROCm 7.2.3-91 found (" + (opt / "rocm/.info/version").string() +
                       ") but libamdhip64.so.7 is not on the loader path: add " + (opt / "rocm/lib").string() +
                       " to ld.so.conf (then run ldconfig) or LD_LIBRARY_PATH"),
              std::string::npos)
        << out;
    EXPECT_NE(out.find(record("rocm7", "variant-skipped")), std::string::npos) << out;
    // On the loader path, the same install is chosen.
    out = info("LD_LIBRARY_PATH=" + (opt / "rocm/lib").string());
    EXPECT_NE(out.find("\"rocm_variant\":\"rocm7\""), std::string::npos) << out;
    EXPECT_NE(out.find(record("rocm7", "loaded")), std::string::npos) << out;
}

// gpu_staging opens the HIP runtime of the chosen variant: with rocm-core 6 and both sonames
// present that is libamdhip64.so.6, not the newest file (the fake's error names its major).
TEST_F(RocmVariantTest, GpuStagingUsesTheChosenVariantsRuntime) {
    if (std::getenv("FERRY_TEST_STAGER_CHILD")) {
        std::string why;
        auto stager = ferry::GpuStager::open(static_cast<uint32_t>(ferry::MemoryKind::Rocm), why);
        if (!stager) {
            printf("STAGER: none: %s\n", why.c_str());
            return;
        }
        auto r = stager->alloc_pinned(0, 4096);
        printf("STAGER: %s\n", r ? "allocated" : r.error().message.c_str());
        return;
    }
    add(FERRY_FAKE_ROCM_CORE6, "librocm-core.so.1");
    add(FERRY_FAKE_HIP6, "libamdhip64.so.6");
    add(FERRY_FAKE_HIP7, "libamdhip64.so.7");
    int status = 0;
    std::string out =
        ferry::test::run_command("env FERRY_TEST_STAGER_CHILD=1 FERRY_TEST_KFD=" + lib.path().string() +
                                     " LD_LIBRARY_PATH=" + lib.path().string() + " /proc/" + std::to_string(getpid()) +
                                     "/exe --gtest_filter=RocmVariantTest.GpuStagingUsesTheChosenVariantsRuntime 2>&1",
                                 &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("STAGER: hipHostMalloc: fake HIP 6 (HIP error 606)"), std::string::npos) << out;
}

// Without /dev/kfd there is no HIP device memory: gpu_staging does not load HIP at all (its
// runtime and LLVM cost every engine ~15 ms, and leak at load), whatever libamdhip64 is installed.
TEST_F(RocmVariantTest, GpuStagingLeavesHipUnloadedWithoutAnAmdGpu) {
    if (std::getenv("FERRY_TEST_STAGER_CHILD")) {
        std::string why;
        auto stager = ferry::GpuStager::open(static_cast<uint32_t>(ferry::MemoryKind::Rocm), why);
        printf("STAGER: %s\n", stager ? "opened" : why.c_str());
        return;
    }
    if (access("/dev/kfd", F_OK) == 0) GTEST_SKIP() << "SKIPPED: this host has /dev/kfd (an AMD GPU driver)";
    add(FERRY_FAKE_ROCM_CORE6, "librocm-core.so.1");
    add(FERRY_FAKE_HIP6, "libamdhip64.so.6");
    int status = 0;
    std::string out = ferry::test::run_command(
        "env FERRY_TEST_STAGER_CHILD=1 FERRY_TEST_KFD= LD_LIBRARY_PATH=" + lib.path().string() + " /proc/" +
            std::to_string(getpid()) +
            "/exe --gtest_filter=RocmVariantTest.GpuStagingLeavesHipUnloadedWithoutAnAmdGpu 2>&1",
        &status);
    EXPECT_EQ(status, 0) << out;
    EXPECT_NE(out.find("STAGER: no HIP device: /dev/kfd does not exist"), std::string::npos) << out;
}

// The loader-path lookup the probe uses instead of dlopen (core/loader/library_path.cpp).
TEST(LoaderWouldFind, SearchesLdLibraryPathThenTheCacheAndOnlyFindsFiles) {
    TempDir dir;
    std::ofstream(dir / "libferry_probe_test.so.3") << "x";
    std::filesystem::create_directory(dir / "libferry_dir.so.1");
    const char *saved = std::getenv("LD_LIBRARY_PATH");
    std::string keep = saved ? saved : "";
    setenv("LD_LIBRARY_PATH", ("/nonexistent::" + dir.path().string()).c_str(), 1);
    EXPECT_EQ(ferry::loader_would_find("libferry_probe_test.so.3"), (dir / "libferry_probe_test.so.3").string());
    EXPECT_FALSE(ferry::loader_would_find("libferry_dir.so.1")) << "a directory is not a library";
    EXPECT_FALSE(ferry::loader_would_find(""));
    EXPECT_FALSE(ferry::loader_would_find("../libferry_probe_test.so.3")) << "a name with a slash is no search";
    EXPECT_FALSE(ferry::loader_would_find("libferry_no_such_library.so.9"));
    auto libc = ferry::loader_would_find("libc.so.6");  // from /etc/ld.so.cache or a default directory
    ASSERT_TRUE(libc);
    EXPECT_TRUE(std::filesystem::exists(*libc)) << *libc;
    if (saved) setenv("LD_LIBRARY_PATH", keep.c_str(), 1);
    else unsetenv("LD_LIBRARY_PATH");
}
