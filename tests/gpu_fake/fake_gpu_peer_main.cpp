// ferry_fake_gpu_peer: a target engine whose registered buffer is (fake) CUDA device memory,
// from the strict fake driver named by $FERRY_LIBCUDA. Prints "READY <segment> <addr> <size>",
// then answers on stdin: sum -> "SUM <fnv1a-64 of the buffer>" (read back through the driver),
// quit -> exits. Options: --size N, --option key=value (engine config).
#include <dlfcn.h>

#include <cinttypes>
#include <cstdio>
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "ferry/engine.hpp"
#include "peer_pattern.hpp"

int main(int argc, char **argv) {
    uint64_t size = 8 << 20;
    ferry::Config config{{"plugins", "tcp"}};
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--size" && i + 1 < argc) size = std::strtoull(argv[++i], nullptr, 0);
        else if (a == "--option" && i + 1 < argc) {
            std::string kv = argv[++i];
            auto eq = kv.find('=');
            config[kv.substr(0, eq)] = kv.substr(eq + 1);
        }
    }
    const char *path = std::getenv("FERRY_LIBCUDA");
    void *lib = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : nullptr;
    if (!lib) {
        std::printf("ERROR set FERRY_LIBCUDA to the fake driver: %s\n", dlerror());
        return 1;
    }
    auto init = reinterpret_cast<int (*)(unsigned)>(dlsym(lib, "cuInit"));
    auto retain = reinterpret_cast<int (*)(void **, int)>(dlsym(lib, "cuDevicePrimaryCtxRetain"));
    auto push = reinterpret_cast<int (*)(void *)>(dlsym(lib, "cuCtxPushCurrent_v2"));
    auto alloc = reinterpret_cast<int (*)(uintptr_t *, size_t)>(dlsym(lib, "cuMemAlloc_v2"));
    auto htod = reinterpret_cast<int (*)(uintptr_t, const void *, size_t)>(dlsym(lib, "cuMemcpyHtoD_v2"));
    auto dtoh = reinterpret_cast<int (*)(void *, uintptr_t, size_t)>(dlsym(lib, "cuMemcpyDtoH_v2"));
    void *ctx = nullptr;
    uintptr_t dev = 0;
    if (init(0) || retain(&ctx, 0) || push(ctx) || alloc(&dev, size)) {
        std::printf("ERROR the fake driver refused to allocate %" PRIu64 " bytes\n", size);
        return 1;
    }
    std::vector<uint8_t> host(size);
    for (uint64_t i = 0; i < size; ++i) host[i] = ferry::test::peer_pattern(i);
    htod(dev, host.data(), size);
    auto engine = ferry::Engine::create(config);
    if (!engine) {
        std::printf("ERROR %s\n", engine.error().message.c_str());
        return 1;
    }
    if (auto r = (*engine)->register_memory(reinterpret_cast<void *>(dev), size, {ferry::MemoryKind::Auto}); !r) {
        std::printf("ERROR %s\n", r.error().message.c_str());
        return 1;
    }
    std::printf("READY %s %" PRIxPTR " %" PRIu64 "\n", (*engine)->segment_name().c_str(), dev, size);
    std::fflush(stdout);
    std::string cmd;
    while (std::getline(std::cin, cmd)) {
        if (cmd == "sum") {
            dtoh(host.data(), dev, size);
            std::printf("SUM %" PRIx64 "\n", ferry::test::fnv1a(host.data(), host.size()));
        } else if (cmd == "stats") {
            auto st = (*engine)->staging_stats();
            std::printf("STATS %" PRIu64 " %" PRIu64 " %" PRIu64 " %" PRIu64 "\n", st.lent_bytes, st.peak_lent_bytes,
                        st.served_packs, st.served_packed_requests);
        } else if (cmd == "quit") {
            return 0;
        } else {
            std::printf("ERROR unknown command\n");
        }
        std::fflush(stdout);
    }
    return 0;
}
