// ferry_gpu_test_peer [size] [device] [plugins] [key=value...]: a target engine whose memory is one cudaMalloc allocation, exposed as two
// sub-buffer regions with a gap between them (IPC handles cover whole allocations, so offsets
// must be right). Prints "READY <segment> <region0 addr> <region1 addr> <region size>", then:
//   sum   -> "SUM <fnv1a of region0 + region1>"
//   quit
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <iostream>
#include <string>
#include <vector>

#include "cuda_util.hpp"
#include "ferry/engine.hpp"
#include "peer_pattern.hpp"

int main(int argc, char **argv) {
    uint64_t size = 8 << 20;
    int device = 0;
    if (argc > 1) size = std::strtoull(argv[1], nullptr, 0);
    if (argc > 2) device = std::atoi(argv[2]);
    std::string plugins = argc > 3 ? argv[3] : "cuda_ipc";  // e.g. cuda_ipc,tcp: tcp serves it through staging
    ferry::Config config = {{"plugins", plugins}};
    for (int i = 4; i < argc; ++i)  // engine options, e.g. efa.provider=tcp
        if (const char *eq = strchr(argv[i], '='))
            config[std::string(argv[i], static_cast<size_t>(eq - argv[i]))] = eq + 1;
    CUDA_OR_DIE(cudaSetDevice(device));
    const uint64_t gap = 4096;
    auto engine = ferry::Engine::create(config);
    if (!engine) {
        std::printf("ERROR %s\n", engine.error().message.c_str());
        return 1;
    }
    uint8_t *dev = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&dev), 2 * size + 2 * gap));
    std::vector<uint8_t> host(2 * size + 2 * gap);
    for (uint64_t i = 0; i < host.size(); ++i) host[i] = ferry::test::peer_pattern(i);
    CUDA_OR_DIE(cudaMemcpy(dev, host.data(), host.size(), cudaMemcpyHostToDevice));
    uint8_t *r0 = dev + gap, *r1 = dev + gap + size + gap;
    for (uint8_t *r : {r0, r1})
        if (auto rc = (*engine)->register_memory(
                r, size, {ferry::MemoryKind::Cuda, device, ferry::kRemoteRead | ferry::kRemoteWrite});
            !rc) {
            std::printf("ERROR %s\n", rc.error().message.c_str());
            return 1;
        }
    std::printf("READY %s %" PRIxPTR " %" PRIxPTR " %" PRIu64 "\n", (*engine)->segment_name().c_str(),
                reinterpret_cast<uintptr_t>(r0), reinterpret_cast<uintptr_t>(r1), size);
    std::fflush(stdout);
    std::string cmd;
    while (std::getline(std::cin, cmd)) {
        if (cmd == "sum") {
            CUDA_OR_DIE(cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost));
            std::vector<uint8_t> both(host.begin() + gap, host.begin() + gap + size);
            both.insert(both.end(), host.begin() + 2 * gap + size, host.begin() + 2 * gap + 2 * size);
            std::printf("SUM %" PRIx64 "\n", ferry::test::fnv1a(both.data(), both.size()));
        } else if (cmd == "quit") {
            break;
        }
        std::fflush(stdout);
    }
    cudaFree(dev);
    return 0;
}
