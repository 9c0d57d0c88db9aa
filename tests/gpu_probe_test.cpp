// The GPU IPC plugins build everywhere and their probes say plainly why they are unavailable
// (on these CI machines: no NVIDIA driver, no /dev/kfd), or that they found devices.
#include <gtest/gtest.h>

#include <sys/stat.h>

#include "loader/plugin_loader.hpp"

using namespace ferry;

namespace {

PluginRecord load(const char *dir, const char *name) {
    LoaderOptions o;
    o.search_path = {dir};
    o.selection = PluginSelection::parse(name);
    auto r = load_plugins(o);
    for (auto &p : r.plugins)
        if (p.name == name) return p;
    ADD_FAILURE() << name << ".so not found in " << dir;
    return {};
}

bool exists(const char *path) {
    struct stat st;
    return stat(path, &st) == 0;
}

}  // namespace

#ifdef FERRY_CUDA_IPC_DIR
TEST(GpuProbe, CudaIpcSaysWhetherADriverIsThere) {
    auto p = load(FERRY_CUDA_IPC_DIR, "cuda_ipc");
    std::cout << "cuda_ipc: " << to_string(p.state) << ": " << p.reason << "\n";
    ASSERT_NE(p.state, PluginState::Failed) << p.reason;
    EXPECT_FALSE(p.reason.empty());
    if (p.state == PluginState::Unavailable) {
        EXPECT_TRUE(p.reason.find("no NVIDIA driver") != std::string::npos ||
                    p.reason.find("CUDA") != std::string::npos)
            << p.reason;
    } else {
        EXPECT_NE(p.reason.find("CUDA device"), std::string::npos) << p.reason;
    }
}
#endif

#ifdef FERRY_HIP_IPC_DIR
TEST(GpuProbe, HipIpcSaysWhetherAnAmdGpuIsThere) {
    // FERRY_HIP_IPC_DIR holds rocm<N>/hip_ipc.so; the loader picks the variant whose
    // libamdhip64.so.N resolves here (its record comes first).
    auto p = load(FERRY_HIP_IPC_DIR, "hip_ipc");
    std::cout << "hip_ipc: " << p.path << ": " << to_string(p.state) << ": " << p.reason << "\n";
    if (p.state == PluginState::VariantSkipped)
        GTEST_SKIP() << "SKIPPED: no rocm<N>/ variant of this build has its HIP runtime on this host: " << p.reason;
    ASSERT_NE(p.state, PluginState::Failed) << p.reason;
    if (!exists("/dev/kfd")) {
        EXPECT_EQ(p.state, PluginState::Unavailable);
        EXPECT_NE(p.reason.find("no /dev/kfd"), std::string::npos) << p.reason;
    }
}
#endif
