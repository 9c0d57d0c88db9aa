// gpu_ipc_bench: cuda_ipc.so between two processes on one GPU, next to an in-process
// cudaMemcpyAsync device-to-device copy of the same sizes, in the same run.
//
//   gpu_ipc_bench [--sizes-mib 1,16,64,256 | --sizes-kib 64,256,1024] [--batch 8[,64,256]]
//                 [--bytes-gib 16 | --seconds S] [--rounds 3] [--op write|read] [--breakdown]
//                 [--copy-engines] [--blocks] [--inflight N] [--option cuda_ipc.streams=N]
//                 [--blocks-only S]
//
// Beside them, for blocks the copy kernel takes (cuda_ipc.kernel_max_op_bytes), the ceiling: a
// raw gather kernel (raw_gather_kernel.cu) on the same blocks in one process, one launch per
// batch, on as many thread blocks as cuda_ipc.so's cap (cuda_ipc.kernel_max_blocks) and
// uncapped; with --target-gpu N it writes GPU N's memory from GPU 0 through peer access (the
// link's ceiling). --copy-engines adds a second initiator engine with the kernel off
// (kernel_max_op_bytes=0), the copy-engine path, in the same alternation. --blocks adds the
// same blocks moved through block tables (create_block_table once per cell, then submit_blocks
// of every block by index, in a strided order: a paged cache's blocks are never in sequence),
// the path with no per-op work in the engine, with the same --inflight. --blocks-only S moves
// each cell's blocks through block tables for S seconds and nothing else (the run to profile:
// no baseline shares its samples), printing their GB/s.
//
// --inflight N keeps N batches in flight (the next submitted once the oldest ended and was
// freed), as a serving engine does that overlaps its layers' transfers; the raw gather kernel
// then keeps N launches in flight on its stream. The per-block baseline stays one batch at a
// time (its copies are bound by the launch rate).
//
// The initiator (this process) starts the target as a child process (same binary, --target),
// opens its segment over the P2P handshake, and times batches of `batch` ops from first submit
// to last completion. Throughput is bytes copied per second (10^9), the figure cudaMemcpy's
// baseline uses too; each size moves at least --bytes-gib (or runs --seconds). The baseline is
// the same number of raw batches: `batch` cudaMemcpyAsync calls on one stream, then a sync. Each
// cell is --rounds alternating rounds of both; the table gives the medians.
//
// --breakdown adds, in the same alternation, the raw variants of gpu_raw_batches.hpp on the very
// addresses Ferry copies between (the target's allocation opened through CUDA IPC here too), and
// where a Ferry batch's time goes on the host: submit(), wait() and free_batch() per batch.
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cinttypes>
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "../tests/gpu/cuda_util.hpp"
#include "../tests/peer_process.hpp"
#include "ferry/engine.hpp"
#include "gpu_raw_batches.hpp"
#ifndef FERRY_BENCH_NO_RAW_KERNEL
#include "gpu_raw_kernel.hpp"
#endif

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
    cudaIpcMemHandle_t h;  // for --breakdown's raw copies on the same mapping
    CUDA_OR_DIE(cudaIpcGetMemHandle(&h, dev));
    std::string hex;
    for (size_t i = 0; i < sizeof h; ++i)
        hex += "0123456789abcdef"[reinterpret_cast<uint8_t *>(&h)[i] >> 4],
            hex += "0123456789abcdef"[reinterpret_cast<uint8_t *>(&h)[i] & 15];
    std::printf("READY %s %" PRIxPTR " %" PRIu64 " %s\n", (*engine)->segment_name().c_str(),
                reinterpret_cast<uintptr_t>(dev), bytes, hex.c_str());
    std::fflush(stdout);
    char line[64];
    while (fgets(line, sizeof line, stdin)) {  // until the initiator closes our stdin
    }
    cudaFree(dev);
    return 0;
}

// Raw copies in one process, batched as the engine's ops are: `batch` copies of `block` bytes
// on one stream to distinct destinations (dst on device `dst_gpu`, src on device 0: a plain D2D
// copy, or cudaMemcpyPeerAsync across GPUs), then a stream synchronize; `batches` times.
double baseline_gbps(uint8_t *dst, int dst_gpu, const uint8_t *src, uint64_t block, uint64_t batch, uint64_t batches) {
    cudaStream_t s;
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    auto one_batch = [&] {
        for (uint64_t i = 0; i < batch; ++i) {
            if (dst_gpu == 0)
                CUDA_OR_DIE(cudaMemcpyAsync(dst + i * block, src + i * block, block, cudaMemcpyDeviceToDevice, s));
            else CUDA_OR_DIE(cudaMemcpyPeerAsync(dst + i * block, dst_gpu, src + i * block, 0, block, s));
        }
        CUDA_OR_DIE(cudaStreamSynchronize(s));
    };
    one_batch();  // warm-up
    auto t0 = Clock::now();
    for (uint64_t k = 0; k < batches; ++k) one_batch();
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    cudaStreamDestroy(s);
    return static_cast<double>(block) * batch * batches / secs / 1e9;
}

std::vector<uint64_t> parse_list(char *arg, uint64_t unit) {
    std::vector<uint64_t> v;
    for (char *t = strtok(arg, ","); t; t = strtok(nullptr, ",")) v.push_back(std::strtoull(t, nullptr, 0) * unit);
    return v;
}

}  // namespace

int main(int argc, char **argv) {
    std::vector<uint64_t> sizes = {1 << 20, 16 << 20, 64 << 20, 256 << 20}, batches_list = {8};
    uint64_t bytes_gib = 16;
    double seconds = 0;
    std::string op = "write";
    int target_gpu = 0, rounds = 3;
    unsigned inflight = 1;
    bool breakdown = false, copy_engines = false, blocks = false;
    double blocks_only = 0;
    ferry::Config options = {{"plugins", "cuda_ipc"}};
    for (int i = 1; i < argc; ++i) {
        std::string a = argv[i];
        if (a == "--target" && i + 2 < argc) {
            uint64_t bytes = std::strtoull(argv[i + 1], nullptr, 0);
            return run_target(bytes, std::atoi(argv[i + 2]));
        }
        if (a == "--target-gpu" && i + 1 < argc) target_gpu = std::atoi(argv[++i]);
        else if (a == "--sizes-mib" && i + 1 < argc) sizes = parse_list(argv[++i], 1 << 20);
        else if (a == "--sizes-kib" && i + 1 < argc) sizes = parse_list(argv[++i], 1 << 10);
        else if (a == "--bytes-gib" && i + 1 < argc) bytes_gib = std::strtoull(argv[++i], nullptr, 0);
        else if (a == "--seconds" && i + 1 < argc) seconds = std::atof(argv[++i]);
        else if (a == "--batch" && i + 1 < argc) batches_list = parse_list(argv[++i], 1);
        else if (a == "--op" && i + 1 < argc) op = argv[++i];
        else if (a == "--rounds" && i + 1 < argc) rounds = std::max(1, std::atoi(argv[++i]));
        else if (a == "--breakdown") breakdown = true;
        else if (a == "--copy-engines") copy_engines = true;
        else if (a == "--blocks") blocks = true;
        else if (a == "--blocks-only" && i + 1 < argc) blocks = true, blocks_only = std::atof(argv[++i]);
        else if (a == "--inflight" && i + 1 < argc) inflight = static_cast<unsigned>(std::max(1, std::atoi(argv[++i])));
        else if (a == "--option" && i + 1 < argc && strchr(argv[i + 1], '=')) {
            std::string kv = argv[++i];
            options[kv.substr(0, kv.find('='))] = kv.substr(kv.find('=') + 1);
        } else {
            std::fprintf(
                stderr,
                "usage: gpu_ipc_bench [--sizes-mib 1,16,64,256 | --sizes-kib 64,256,1024] [--batch 8[,64,...]]\n"
                "                     [--bytes-gib 16 | --seconds S] [--rounds 3] [--op write|read] [--target-gpu N]\n"
                "                     [--breakdown (raw variants on the same mapping, Ferry's host time)]\n"
                "                     [--copy-engines (also Ferry with its copy kernel off)]\n"
                "                     [--blocks (also Ferry through block tables: submit_blocks by index)]\n"
                "                     [--blocks-only S (block tables alone, S seconds a cell: to profile)]\n"
                "                     [--inflight N (batches in flight; the raw kernel's launches too)]\n"
                "                     [--option key=value (initiator engine, e.g. cuda_ipc.streams=1)]\n");
            return 2;
        }
    }
    std::string why = ferry::test::cuda_unavailable_reason();
    if (!why.empty()) {
        std::fprintf(stderr, "gpu_ipc_bench: %s\n", why.c_str());
        return 1;
    }
    uint64_t max_block = 0, max_batch = 0;
    for (auto b : sizes) max_block = std::max(max_block, b);
    for (auto b : batches_list) max_batch = std::max(max_batch, b);
    const uint64_t span = max_block * max_batch;

    char self[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 1;
    self[n] = '\0';
    ferry::test::PeerProcess target({"--target", std::to_string(span), std::to_string(target_gpu)}, self);
    uint64_t remote = 0;
    cudaIpcMemHandle_t handle{};
    {
        char seg[256], hex[2 * sizeof handle + 1] = "";
        unsigned long long bytes = 0;
        if (sscanf(target.ready_line.c_str(), "READY %255s %" SCNxPTR " %llu %128s", seg, &remote, &bytes, hex) < 2) {
            std::fprintf(stderr, "target failed: %s\n", target.ready_line.c_str());
            return 1;
        }
        for (size_t i = 0; i < sizeof handle && hex[2 * i] && hex[2 * i + 1]; ++i) {
            char b[3] = {hex[2 * i], hex[2 * i + 1], 0};
            reinterpret_cast<uint8_t *>(&handle)[i] = static_cast<uint8_t>(std::strtoul(b, nullptr, 16));
        }
        target.segment = seg;
    }
    auto engine = ferry::Engine::create(options);
    if (!engine) {
        std::fprintf(stderr, "%s\n", engine.error().message.c_str());
        return 1;
    }
    // The copy kernel's settings as the plugin reads them (its defaults where not given).
    auto option = [&](const char *key, const char *def) {
        auto it = options.find(key);
        char *end = nullptr;
        uint64_t v = std::strtoull(it == options.end() ? def : it->second.c_str(), &end, 0);
        switch (end && *end ? *end | 0x20 : 0) {
            case 'k': return v << 10;
            case 'm': return v << 20;
            case 'g': return v << 30;
            default: return v;
        }
    };
    const uint64_t kernel_max_op = option("cuda_ipc.kernel_max_op_bytes", "1m");
    const auto kernel_cap = static_cast<uint32_t>(option("cuda_ipc.kernel_max_blocks", "16"));
    std::unique_ptr<ferry::Engine> ce;  // --copy-engines: the kernel off
    if (copy_engines) {
        ferry::Config ce_options = options;
        ce_options["cuda_ipc.kernel_max_op_bytes"] = "0";
        auto r = ferry::Engine::create(ce_options);
        if (!r) {
            std::fprintf(stderr, "%s\n", r.error().message.c_str());
            return 1;
        }
        ce = std::move(*r);
    }
    uint8_t *local = nullptr, *scratch = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&local), span));
    CUDA_OR_DIE(cudaSetDevice(target_gpu));  // the baseline's destination sits where the target's memory does
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&scratch), span));
    CUDA_OR_DIE(cudaSetDevice(0));
    // Across GPUs the raw gather kernel writes the target GPU's buffer through peer access.
    bool peer_access = target_gpu == 0;
    if (target_gpu != 0) {
        cudaError_t rc = cudaDeviceEnablePeerAccess(target_gpu, 0);
        peer_access = rc == cudaSuccess || rc == cudaErrorPeerAccessAlreadyEnabled;
        cudaGetLastError();
    }
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
    ferry::SegmentId ce_seg{};
    if (ce) {
        auto r = ce->register_memory(local, span, {ferry::MemoryKind::Cuda, 0, ferry::kRemoteRead});
        auto sg = r ? ce->open_segment(target.segment) : ferry::Result<ferry::SegmentId>(std::unexpected(r.error()));
        if (!sg) {
            std::fprintf(stderr, "%s\n", sg.error().message.c_str());
            return 1;
        }
        ce_seg = *sg;
    }
#ifndef FERRY_BENCH_NO_RAW_KERNEL
    gpu_raw::GatherKernel gather;
    if (!gather.error.empty()) std::printf("raw gather kernel unavailable: %s\n", gather.error.c_str());
    const bool have_gather = gather.error.empty() && peer_access;
    if (gather.error.empty() && !peer_access)
        std::printf("raw gather kernel left out: no peer access from GPU 0 to GPU %d\n", target_gpu);
#else
    const bool have_gather = false;
    std::printf("raw gather kernel: not built (no nvcc)\n");
#endif
    cudaDeviceProp prop{};
    cudaGetDeviceProperties(&prop, 0);
    int runtime = 0, driver = 0;
    cudaRuntimeGetVersion(&runtime);
    cudaDriverGetVersion(&driver);
    const char *batch_env = getenv("FERRY_GPU_IPC_BATCH_COPY");
    std::printf(
        "GPU: %s; CUDA runtime %d, driver %d; initiator on GPU 0, target on GPU %d; op: %s; "
        "FERRY_GPU_IPC_BATCH_COPY=%s; GB/s = 10^9 bytes copied per second\n",
        prop.name, runtime, driver, target_gpu, op.c_str(), batch_env ? batch_env : "(unset)");
    // --breakdown: the target's allocation opened here too (the driver hands out the mapping
    // cuda_ipc.so opened, reference counted), so the raw variants copy between the same addresses.
    uint8_t *mapped = nullptr;
    if (breakdown) {
        if (target_gpu != 0) breakdown = false, std::printf("--breakdown: one GPU only; left out\n");
        else if (cudaError_t rc =
                     cudaIpcOpenMemHandle(reinterpret_cast<void **>(&mapped), handle, cudaIpcMemLazyEnablePeerAccess);
                 rc != cudaSuccess)
            breakdown = false, cudaGetLastError(),
            std::printf("--breakdown: cudaIpcOpenMemHandle: %s; left out\n", cudaGetErrorString(rc));
    }
    const bool batched = gpu_raw::has_batched();
    std::printf("batches in flight: %u (--inflight)\n", inflight);
    std::printf("copy kernel: ops of up to %" PRIu64 " bytes, at most %s thread blocks per launch\n", kernel_max_op,
                kernel_cap ? std::to_string(kernel_cap).c_str() : "(uncapped)");
    std::string kernel_head, kernel_rule;
    if (have_gather) {
        std::string cap = kernel_cap ? std::to_string(kernel_cap) + " blocks" : "uncapped";
        kernel_head += " raw gather kernel, " + cap +
                       " (1 process) GB/s | Ferry / raw kernel | raw gather kernel, "
                       "uncapped GB/s | Ferry / uncapped |";
        kernel_rule += "---|---|---|---|";
    }
    if (blocks) {
        kernel_head += " cuda_ipc.so, block tables GB/s | blocks / raw kernel uncapped |";
        kernel_rule += "---|---|";
    }
    if (ce) {
        kernel_head += " cuda_ipc.so, copy engines (kernel off) GB/s | Ferry / copy engines |";
        kernel_rule += "---|---|";
    }
    std::printf(
        "| block | batch | cuda_ipc.so (2 processes) GB/s | kops/s | %s batches (1 process) GB/s | kops/s | ratio |%s%s\n"
        "|---|---|---|---|---|---|---|%s%s\n",
        target_gpu ? "cudaMemcpyPeerAsync" : "cudaMemcpyAsync D2D", kernel_head.c_str(),
        breakdown
            ? " raw on the IPC mapping GB/s | raw batched (cuMemcpyBatchAsync) | raw + event + completion thread + "
              "eventfd | Ferry us/batch | raw us/batch | submit us | wait us | free us | GPU us (events) | "
              "enqueue us |"
            : "",
        kernel_rule.c_str(), breakdown ? "---|---|---|---|---|---|---|---|---|---|" : "");
    const ferry::Opcode opcode = op == "read" ? ferry::Opcode::Read : ferry::Opcode::Write;
    auto median = [](std::vector<double> v) {
        if (v.empty()) return 0.0;
        std::sort(v.begin(), v.end());
        return v.size() % 2 ? v[v.size() / 2] : (v[v.size() / 2 - 1] + v[v.size() / 2]) / 2;
    };
    for (uint64_t batch : batches_list) {
        for (uint64_t block : sizes) {
            std::vector<ferry::Request> reqs, ce_reqs;
            for (uint64_t i = 0; i < batch; ++i) {
                reqs.push_back({opcode, local + i * block, *seg, remote + i * block, block, "cuda_ipc"});
                ce_reqs.push_back({opcode, local + i * block, ce_seg, remote + i * block, block, "cuda_ipc"});
            }
            double submit_us = 0, wait_us = 0, free_us = 0;
            auto one_batch_on = [&](ferry::Engine &e, const std::vector<ferry::Request> &rs) {
                auto t0 = Clock::now();
                auto b = e.submit(rs);
                auto t1 = Clock::now();
                if (!b || !e.wait(*b)) {
                    std::fprintf(stderr, "transfer failed\n");
                    std::exit(1);
                }
                auto t2 = Clock::now();
                (void)e.free_batch(*b);
                auto t3 = Clock::now();
                submit_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
                wait_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
                free_us += std::chrono::duration<double, std::micro>(t3 - t2).count();
            };
            // --inflight: batches submitted, not yet waited for, oldest first.
            std::vector<ferry::BatchId> flying;
            auto settle = [&](ferry::Engine &e, size_t keep) {
                while (flying.size() > keep) {
                    auto t1 = Clock::now();
                    if (!e.wait(flying.front())) {
                        std::fprintf(stderr, "transfer failed\n");
                        std::exit(1);
                    }
                    auto t2 = Clock::now();
                    (void)e.free_batch(flying.front());
                    auto t3 = Clock::now();
                    wait_us += std::chrono::duration<double, std::micro>(t2 - t1).count();
                    free_us += std::chrono::duration<double, std::micro>(t3 - t2).count();
                    flying.erase(flying.begin());
                }
            };
            auto one_batch = [&] {
                if (inflight == 1) return one_batch_on(**engine, reqs);
                settle(**engine, inflight - 1);
                auto t0 = Clock::now();
                auto b = (*engine)->submit(reqs);
                submit_us += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
                if (!b) {
                    std::fprintf(stderr, "submit failed: %s\n", b.error().message.c_str());
                    std::exit(1);
                }
                flying.push_back(*b);
            };
            // --blocks: the same blocks as two block tables, moved in a strided order.
            ferry::BlockTableId local_table = 0, remote_table = 0;
            std::vector<uint32_t> local_index, remote_index;
            std::vector<ferry::BatchId> block_flying;
            // Where the host's time goes per block transfer (--blocks-only): submitting, waiting
            // for the oldest in flight, freeing it.
            double blocks_submit_us = 0, blocks_wait_us = 0, blocks_free_us = 0;
            auto blocks_batch = [&] {
                while (block_flying.size() >= inflight) {
                    auto t0 = Clock::now();
                    if (!(*engine)->wait(block_flying.front())) {
                        std::fprintf(stderr, "block transfer failed\n");
                        std::exit(1);
                    }
                    auto t1 = Clock::now();
                    (void)(*engine)->free_batch(block_flying.front());
                    blocks_wait_us += std::chrono::duration<double, std::micro>(t1 - t0).count();
                    blocks_free_us += std::chrono::duration<double, std::micro>(Clock::now() - t1).count();
                    block_flying.erase(block_flying.begin());
                }
                auto t0 = Clock::now();
                auto b = (*engine)->submit_blocks(opcode, local_table, local_index, remote_table, remote_index);
                blocks_submit_us += std::chrono::duration<double, std::micro>(Clock::now() - t0).count();
                if (!b) {
                    std::fprintf(stderr, "submit_blocks failed: %s\n", b.error().message.c_str());
                    std::exit(1);
                }
                block_flying.push_back(*b);
            };
            auto blocks_settle = [&] {
                for (auto b : block_flying)
                    if (!(*engine)->wait(b) || !(*engine)->free_batch(b)) {
                        std::fprintf(stderr, "block transfer failed\n");
                        std::exit(1);
                    }
                block_flying.clear();
            };
            if (blocks) {
                std::vector<uint64_t> la, ra;
                for (uint64_t i = 0; i < batch; ++i) la.push_back(reinterpret_cast<uintptr_t>(local) + i * block);
                for (uint64_t i = 0; i < batch; ++i) ra.push_back(remote + i * block);
                const uint64_t len[] = {block};
                auto lt = (*engine)->create_block_table(ferry::kLocalMemory, la, len);
                auto rt = lt ? (*engine)->create_block_table(*seg, ra, len) : lt;
                if (!rt) {
                    std::fprintf(stderr, "create_block_table: %s\n", rt.error().message.c_str());
                    return 1;
                }
                local_table = *lt, remote_table = *rt;
                // Pair i: local block i, remote block (i * 7) mod batch (a permutation when
                // batch is not a multiple of 7; else i).
                for (uint64_t i = 0; i < batch; ++i) {
                    local_index.push_back(static_cast<uint32_t>(i));
                    remote_index.push_back(static_cast<uint32_t>(batch % 7 ? i * 7 % batch : i));
                }
                blocks_batch();  // the first goes as ops and prepares the tables' path
                blocks_batch();
                blocks_settle();
                if (blocks_only > 0) {
                    uint64_t n = 0;
                    blocks_submit_us = blocks_wait_us = blocks_free_us = 0;
                    auto b0 = Clock::now();
                    while (std::chrono::duration<double>(Clock::now() - b0).count() < blocks_only) blocks_batch(), ++n;
                    blocks_settle();
                    double bs = std::chrono::duration<double>(Clock::now() - b0).count();
                    std::printf(
                        "| %" PRIu64 " KiB | %" PRIu64
                        " | block tables only: %.1f GB/s, %.2f us a batch (submit %.2f, wait %.2f, free %.2f) |\n",
                        block >> 10, batch, static_cast<double>(block) * batch * n / bs / 1e9, bs * 1e6 / n,
                        blocks_submit_us / n, blocks_wait_us / n, blocks_free_us / n);
#ifndef FERRY_BENCH_NO_RAW_KERNEL
                    // The raw kernel on the same cap and inflight, its table in device memory and
                    // in the launch: what the launch form costs apart from the engine.
                    if (have_gather)
                        std::printf("| %" PRIu64 " KiB | %" PRIu64
                                    " | raw kernel: %.1f GB/s; its table in the launch: %.1f GB/s |\n",
                                    block >> 10, batch,
                                    gather.run(scratch, local, block, batch, n, kernel_cap, inflight),
                                    gather.run(scratch, local, block, batch, n, kernel_cap, inflight, true));
#endif
                    std::fflush(stdout);
                    (void)(*engine)->destroy_block_table(local_table),
                        (void)(*engine)->destroy_block_table(remote_table);
                    continue;
                }
            }
            one_batch();  // warm-up: maps the peer's allocation, creates streams and events
            if (ce) one_batch_on(*ce, ce_reqs);
            submit_us = wait_us = free_us = 0;
            // Rounds of Ferry and the raw batches alternating; the medians are reported, so a
            // clock or load change during the run does not favour either side.
            uint64_t batches = std::max<uint64_t>(3, (bytes_gib << 30) / (block * batch) / rounds);
            uint64_t total = 0;
            std::vector<double> f, r, ri, rb, rh, kc, ku, fce, fb;
            // The raw variants' addresses: the same as the Ferry ops' (READ: mapping -> local).
            uint8_t *dst = opcode == ferry::Opcode::Read ? local : mapped;
            const uint8_t *src = opcode == ferry::Opcode::Read ? mapped : local;
            for (int round = 0; round < rounds; ++round) {
                auto t0 = Clock::now();
                uint64_t done = 0;
                if (seconds > 0) {
                    while (std::chrono::duration<double>(Clock::now() - t0).count() < seconds / rounds)
                        one_batch(), ++done;
                    batches = done;
                } else {
                    for (uint64_t k = 0; k < batches; ++k) one_batch();
                }
                settle(**engine, 0);
                total += batches;
                double secs = std::chrono::duration<double>(Clock::now() - t0).count();
                f.push_back(static_cast<double>(block) * batch * batches / secs / 1e9);
                r.push_back(baseline_gbps(scratch, target_gpu, local, block, batch, batches));
#ifndef FERRY_BENCH_NO_RAW_KERNEL
                if (have_gather) {
                    kc.push_back(gather.run(scratch, local, block, batch, batches, kernel_cap, inflight));
                    ku.push_back(gather.run(scratch, local, block, batch, batches, 0, inflight));
                }
#endif
                if (blocks) {
                    auto b0 = Clock::now();
                    for (uint64_t k = 0; k < batches; ++k) blocks_batch();
                    blocks_settle();
                    double bs = std::chrono::duration<double>(Clock::now() - b0).count();
                    fb.push_back(static_cast<double>(block) * batch * batches / bs / 1e9);
                }
                if (ce) {
                    const double kept[] = {submit_us, wait_us, free_us};  // --breakdown's are Ferry's own
                    auto c0 = Clock::now();
                    for (uint64_t k = 0; k < batches; ++k) one_batch_on(*ce, ce_reqs);
                    double cs = std::chrono::duration<double>(Clock::now() - c0).count();
                    submit_us = kept[0], wait_us = kept[1], free_us = kept[2];
                    fce.push_back(static_cast<double>(block) * batch * batches / cs / 1e9);
                }
                if (!breakdown) continue;
                ri.push_back(gpu_raw::run(gpu_raw::Variant::Plain, dst, src, block, batch, batches));
                if (batched) rb.push_back(gpu_raw::run(gpu_raw::Variant::Batched, dst, src, block, batch, batches));
                rh.push_back(gpu_raw::run(gpu_raw::Variant::Handoff, dst, src, block, batch, batches));
            }
            double ferry_gbps = median(f), base = median(r);
            auto kops = [&](double gbps) { return gbps * 1e9 / static_cast<double>(block) / 1e3; };
            std::printf("| %" PRIu64 " KiB | %" PRIu64 " | %.1f | %.1f | %.1f | %.1f | %.3f |", block >> 10, batch,
                        ferry_gbps, kops(ferry_gbps), base, kops(base), ferry_gbps / base);
            if (have_gather)
                std::printf(" %.1f | %.3f | %.1f | %.3f |", median(kc), ferry_gbps / median(kc), median(ku),
                            ferry_gbps / median(ku));
            if (blocks) std::printf(" %.1f | %.3f |", median(fb), have_gather ? median(fb) / median(ku) : 0.0);
            if (ce) std::printf(" %.1f | %.3f |", median(fce), ferry_gbps / median(fce));
            if (blocks)
                (void)(*engine)->destroy_block_table(local_table), (void)(*engine)->destroy_block_table(remote_table);
            if (breakdown) {
                auto us = [&](double gbps) { return static_cast<double>(block) * batch / gbps / 1e3; };
                auto bt = gpu_raw::batch_times(dst, src, block, batch);
                std::printf(" %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f | %.1f |", median(ri),
                            median(rb), median(rh), us(ferry_gbps), us(base), submit_us / total, wait_us / total,
                            free_us / total, bt.gpu_us, bt.enqueue_us);
            }
            std::printf("\n");
            std::fflush(stdout);
        }
    }
    if (mapped) cudaIpcCloseMemHandle(mapped);
    cudaFree(local);
    cudaFree(scratch);
    return 0;
}
