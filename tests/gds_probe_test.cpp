// gds.so on any host, GPU or not: its table says it is a storage plugin for CUDA memory (ABI
// 1.4), and probe and create say exactly what is missing (libcufile.so.0, a GPU) instead of
// failing later. The data path runs in tests/gpu/cuda_gds_test.cpp, on a GPU.
#include <gtest/gtest.h>

#include <dlfcn.h>

#include <string>

#include "ferry/plugin.h"

namespace {

const ferry_plugin_v1_t *load_gds() {
    void *lib = ::dlopen(FERRY_GDS_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    if (!lib) return nullptr;
    return static_cast<const ferry_plugin_v1_t *>(::dlsym(lib, FERRY_PLUGIN_SYMBOL_V1));
}

bool has_cufile() {
    void *lib = ::dlopen("libcufile.so.0", RTLD_NOW | RTLD_LOCAL);
    if (lib) ::dlclose(lib);
    return lib != nullptr;
}

TEST(GdsProbe, TableSaysStorageForCudaMemory) {
    const ferry_plugin_v1_t *api = load_gds();
    ASSERT_NE(api, nullptr) << ::dlerror();
    EXPECT_STREQ(api->name, "gds");
    EXPECT_EQ(api->abi_version, FERRY_PLUGIN_ABI_VERSION);
    EXPECT_EQ(api->caps, FERRY_CAP_MEM_CUDA | FERRY_CAP_STORAGE);  // and no peer: no INTRA/INTER_NODE
    ASSERT_GE(api->struct_size, FERRY_PLUGIN_V1_SIZE_UNTIL(option_desc_size));
    std::string names;
    for (uint32_t i = 0; i < api->n_options; ++i) names += std::string(api->options[i].name) + " ";
    EXPECT_EQ(names, "threads max_io_bytes register_buffers create ");
}

TEST(GdsProbe, ProbeAndCreateNameWhatIsMissing) {
    const ferry_plugin_v1_t *api = load_gds();
    ASSERT_NE(api, nullptr) << ::dlerror();
    ferry_probe_result_t probe{};
    ASSERT_EQ(api->probe(nullptr, 0, &probe), 0);
    if (!has_cufile()) {
        EXPECT_EQ(probe.available, 0);
        EXPECT_NE(std::string(probe.reason).find("no libcufile.so.0"), std::string::npos) << probe.reason;
        ferry_transport_t *t = nullptr;
        ferry_error_t err{};
        EXPECT_EQ(api->create(nullptr, 0, nullptr, &t, &err), -ENOENT);
        EXPECT_NE(std::string(err.message).find("GPUDirect Storage"), std::string::npos) << err.message;
        return;
    }
    // libcufile is here: available with a GPU (the reason says which cuFile mode), else why not.
    std::string reason = probe.reason;
    if (probe.available) EXPECT_NE(reason.find("mode"), std::string::npos) << reason;
    else EXPECT_NE(reason.find("no CUDA GPU"), std::string::npos) << reason;
}

TEST(GdsProbe, BadOptionIsRefusedNamingIt) {
    const ferry_plugin_v1_t *api = load_gds();
    ASSERT_NE(api, nullptr) << ::dlerror();
    ferry_kv_t kv{"threads", "0"};
    ferry_probe_result_t probe{};
    ASSERT_EQ(api->probe(&kv, 1, &probe), 0);
    EXPECT_EQ(probe.available, 0);
    EXPECT_NE(std::string(probe.reason).find("threads"), std::string::npos) << probe.reason;
}

}  // namespace
