// gpu_ipc_bench: cuda_ipc.so between two processes on one GPU, next to an in-process
// cudaMemcpyAsync device-to-device copy of the same sizes, in the same run.
//
//   gpu_ipc_bench [--sizes-mib 1,16,64,256] [--bytes-gib 16] [--batch 8] [--op write|read]
//
// The initiator (this process) starts the target as a child process (same binary, --target),
// opens its segment over the P2P handshake, and times batches of `batch` ops from first submit
// to last completion. Throughput is bytes copied per second (10^9), the figure cudaMemcpy's
// baseline uses too; each size moves at least --bytes-gib.
#include <unistd.h>

#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../tests/gpu/cuda_util.hpp"
#include "../tests/peer_process.hpp"
#include "ferry/engine.hpp"

namespace {

using Clock = std::chrono::steady_clock;

int run_target(uint64_t bytes, int gpu) {
    CUDA_OR_DIE(cudaSetDevice(gpu));
    auto engine = ferry::Engine::create({{"plugins", "cuda_ipc"}});
    if (!engine) {
        std::printf("ERROR %s\n", engine.error().message.c_str());
        return 1;
    }
    void *dev = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&dev), bytes));
    CUDA_OR_DIE(cudaMemset(dev, 0x5a, bytes));
    if (auto r = (*engine)->register_memory(dev, bytes,
                                            {ferry::MemoryKind::Cuda, gpu, ferry::kRemoteRead | ferry::kRemoteWrite});
        !r) {
        std::printf("ERROR %s\n", r.error().message.c_str());
        return 1;
    }
    std::printf("READY %s %" PRIxPTR " %" PRIu64 "\n", (*engine)->segment_name().c_str(),
                reinterpret_cast<uintptr_t>(dev), bytes);
    std::fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {  // until the initiator closes our stdin
    }
    cudaFree(dev);
    return 0;
}

// dst on device `dst_gpu`, src on device 0: a plain D2D copy, or cudaMemcpyPeerAsync across GPUs.
double baseline_gbps(void *dst, int dst_gpu, void *src, uint64_t block, uint64_t copies) {
    cudaStream_t s;
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto copy = [&] {
        if (dst_gpu == 0) CUDA_OR_DIE(cudaMemcpyAsync(dst, src, block, cudaMemcpyDeviceToDevice, s));
        else CUDA_OR_DIE(cudaMemcpyPeerAsync(dst, dst_gpu, src, 0, block, s));
    };
    copy();  // warm-up
    CUDA_OR_DIE(cudaStreamSynchronize(s));
    auto t0 = Clock::now();
    for (uint64_t i = 0; i < copies; ++i) copy();
    CUDA_OR_DIE(cudaStreamSynchronize(s));
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    cudaStreamDestroy(s);
    return static_cast<double>(block) * copies / secs / 1e9;
}

}  // namespace

int main(int argc, char **argv) {
    std::vector<uint64_t> sizes_mib = {1, 16, 64, 256};
    uint64_t bytes_gib = 16, batch = 8;
    std::string op = "write";
    int target_gpu = 0;
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--target" && i + 2 < argc) {
            uint64_t bytes = std::strtoull(argv[i + 1], nullptr, 0);
            return run_target(bytes, std::atoi(argv[i + 2]));
        }
        if (a == "--target-gpu" && i + 1 < argc) {
            target_gpu = std::atoi(argv[++i]);
            continue;
        }
        if (a == "--sizes-mib" && i + 1 < argc) {
            sizes_mib.clear();
            for (char *t = strtok(argv[++i], ","); t; t = strtok(nullptr, ","))
                sizes_mib.push_back(std::strtoull(t, nullptr, 0));
        } else if (a == "--bytes-gib" && i + 1 < argc) bytes_gib = std::strtoull(argv[++i], nullptr, 0);
        else if (a == "--batch" && i + 1 < argc) batch = std::strtoull(argv[++i], nullptr, 0);
        else if (a == "--op" && i + 1 < argc) op = argv[++i];
        else {
            std::fprintf(
                stderr,
                "usage: gpu_ipc_bench [--sizes-mib 1,16,64,256] [--bytes-gib 16] [--batch 8] [--op write|read] [--target-gpu N]\n");
            return 2;
        }
    }
    std::string why = ferry::test::cuda_unavailable_reason();
    if (!why.empty()) {
        std::fprintf(stderr, "gpu_ipc_bench: %s\n", why.c_str());
        return 1;
    }
    uint64_t max_block = 0;
    for (auto m : sizes_mib) max_block = std::max(max_block, m << 20);
    const uint64_t span = max_block * batch;

    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    ferry::test::PeerProcess target({"--target", std::to_string(span), std::to_string(target_gpu)}, self);
    uint64_t remote = 0;
    {
        char seg[256];
        if (sscanf(target.ready_line.c_str(), "READY %255s %" SCNxPTR, seg, &remote) != 2) {
            std::fprintf(stderr, "target failed: %s\n", target.ready_line.c_str());
            return 1;
        }
        target.segment = seg;
    }
    auto engine = ferry::Engine::create({{"plugins", "cuda_ipc"}});
    if (!engine) {
        std::fprintf(stderr, "%s\n", engine.error().message.c_str());
        return 1;
    }
    uint8_t *local = nullptr, *scratch = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&local), span));
    CUDA_OR_DIE(cudaSetDevice(target_gpu));  // the baseline's destination sits where the target's memory does
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&scratch), max_block));
    CUDA_OR_DIE(cudaSetDevice(0));
    if (target_gpu != 0) cudaDeviceEnablePeerAccess(target_gpu, 0), cudaGetLastError();
    CUDA_OR_DIE(cudaMemset(local, 1, span));
    if (auto r = (*engine)->register_memory(local, span, {ferry::MemoryKind::Cuda, 0, ferry::kRemoteRead}); !r) {
        std::fprintf(stderr, "%s\n", r.error().message.c_str());
        return 1;
    }
    auto seg = (*engine)->open_segment(target.segment);
    if (!seg) {
        std::fprintf(stderr, "%s\n", seg.error().message.c_str());
        return 1;
    }
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    std::printf("GPU: %s; initiator on GPU 0, target on GPU %d; op: %s; batch: %" PRIu64 " ops; >= %" PRIu64
                " GiB per size; GB/s = 10^9 bytes copied per second\n",
                prop.name, target_gpu, op.c_str(), batch, bytes_gib);
    std::printf("| block | cuda_ipc.so (2 processes) | %s (1 process) | ratio |\n|---|---|---|---|\n",
                target_gpu ? "cudaMemcpyPeerAsync" : "cudaMemcpyAsync D2D");
    const ferry::Opcode opcode = op == "read" ? ferry::Opcode::Read : ferry::Opcode::Write;
    for (uint64_t mib : sizes_mib) {
        const uint64_t block = mib << 20;
        std::vector<ferry::Request> reqs;
        for (uint64_t i = 0; i < batch; ++i)
            reqs.push_back({opcode, local + i * block, *seg, remote + i * block, block, "cuda_ipc"});
        auto one_batch = [&] {
            auto b = (*engine)->submit(reqs);
            if (!b || !(*engine)->wait(*b)) {
                std::fprintf(stderr, "transfer failed\n");
                std::exit(1);
            }
            (void)(*engine)->free_batch(*b);
        };
        one_batch();  // warm-up: maps the peer's allocation, creates streams and events
        uint64_t batches = std::max<uint64_t>(3, (bytes_gib << 30) / (block * batch));
        auto t0 = Clock::now();
        for (uint64_t k = 0; k < batches; ++k) one_batch();
        double secs = std::chrono::duration<double>(Clock::now() - t0).count();
        double ferry_gbps = static_cast<double>(block) * batch * batches / secs / 1e9;
        double base = baseline_gbps(scratch, target_gpu, local, block, batches * batch);
        std::printf("| %" PRIu64 " MiB | %.1f | %.1f | %.3f |\n", mib, ferry_gbps, base, ferry_gbps / base);
        std::fflush(stdout);
    }
    cudaFree(local);
    cudaFree(scratch);
    return 0;
}
