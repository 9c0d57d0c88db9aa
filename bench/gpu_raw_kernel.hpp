// gpu_ipc_bench's ceiling for small blocks: raw_gather_kernel.cu (its PTX embedded at build
// time) launched in this process on the same blocks, through the driver API, one launch per
// batch and a stream synchronize after each, as the per-block baseline does; with `inflight`
// above 1, that many launches in flight on the stream (an event behind each, the oldest waited
// for before the next launch), as gpu_ipc_bench keeps Ferry's batches and cuda_ipc.so queues
// its launches (one stream per device).
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <cstdio>
#include <string>
#include <vector>

#include "../tests/gpu/cuda_util.hpp"

namespace gpu_raw {
extern const char kRawGatherPtx[];  // raw_gather_kernel.cu as PTX (embed_text.py)

class GatherKernel {
public:
    // Empty error when loaded; else why not (the bench leaves the column out and says so).
    GatherKernel() {
        auto entry = [&](const char *name, auto &fn) {
            void *p = nullptr;
            cudaDriverEntryPointQueryResult q{};
            if (cudaGetDriverEntryPointByVersion(name, &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
                q != cudaDriverEntryPointSuccess || !p) {
                cudaGetLastError();
                if (error.empty()) error = std::string("the driver has no ") + name;
                return;
            }
            fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(p);
        };
        entry("cuModuleLoadData", load_);
        entry("cuModuleGetFunction", get_);
        entry("cuLaunchKernel", launch_);
        if (!error.empty()) return;
        cudaFree(nullptr);  // the primary context, current
        CUmodule m = nullptr;
        if (int rc = load_(&m, kRawGatherPtx); rc != 0) {
            error = "cuModuleLoadData(raw_gather) failed: CUDA driver error " + std::to_string(rc);
            return;
        }
        if (int rc = get_(&fn_, m, "raw_gather"); rc != 0)
            error = "cuModuleGetFunction(raw_gather) failed: CUDA driver error " + std::to_string(rc);
        if (get_(&fn_in_launch_, m, "raw_gather_in_launch") != 0) fn_in_launch_ = nullptr;
    }
    std::string error;

    // GB/s of `batches` launches copying `batch` blocks of `block` bytes, src + i*block to
    // dst + i*block, on `blocks` thread blocks (0: one per block copied), `inflight` at a time.
    // in_launch: the table travels in each launch's parameters (raw_gather_in_launch; batches
    // of up to 256 blocks), not in device memory; 0 GB/s where that kernel is missing.
    double run(uint8_t *dst, const uint8_t *src, uint64_t block, uint64_t batch, uint64_t batches, uint32_t blocks,
               unsigned inflight = 1, bool in_launch = false) {
        struct RawOp {
            uint64_t src, dst, bytes;
        };
        struct RawTable256 {
            RawOp ops[256];
            uint32_t n;
        };
        if (in_launch && (!fn_in_launch_ || batch > 256)) return 0;
        std::vector<RawOp> ops(batch);
        for (uint64_t i = 0; i < batch; ++i)
            ops[i] = {reinterpret_cast<uintptr_t>(src + i * block), reinterpret_cast<uintptr_t>(dst + i * block),
                      block};
        void *table = nullptr;
        CUDA_OR_DIE(cudaMalloc(&table, ops.size() * sizeof(RawOp)));
        CUDA_OR_DIE(cudaMemcpy(table, ops.data(), ops.size() * sizeof(RawOp), cudaMemcpyHostToDevice));
        inflight = std::max(1u, inflight);
        cudaStream_t stream;
        CUDA_OR_DIE(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking));
        std::vector<cudaEvent_t> events(inflight);
        for (auto &e : events) CUDA_OR_DIE(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        unsigned n = static_cast<unsigned>(batch);
        const unsigned grid = blocks ? std::min<unsigned>(blocks, n) : n;
        void *params[] = {&table, &n};
        RawTable256 inline_table{};
        if (in_launch) {
            std::copy(ops.begin(), ops.end(), inline_table.ops);
            inline_table.n = n;
            params[0] = &inline_table;
        }
        CUfunction fn = in_launch ? fn_in_launch_ : fn_;
        // Launch k once launch k - inflight has ended.
        auto one = [&](uint64_t k) {
            unsigned i = static_cast<unsigned>(k % inflight);
            CUDA_OR_DIE(cudaEventSynchronize(events[i]));  // never recorded: returns at once
            if (int rc = launch_(fn, grid, 1, 1, 512, 1, 1, 0, stream, params, nullptr); rc != 0) {
                std::fprintf(stderr, "cuLaunchKernel(raw_gather): CUDA driver error %d\n", rc);
                std::exit(3);
            }
            CUDA_OR_DIE(cudaEventRecord(events[i], stream));
            if (inflight == 1) CUDA_OR_DIE(cudaEventSynchronize(events[i]));
        };
        one(0);  // warm-up
        CUDA_OR_DIE(cudaDeviceSynchronize());
        auto t0 = std::chrono::steady_clock::now();
        for (uint64_t k = 0; k < batches; ++k) one(k);
        CUDA_OR_DIE(cudaDeviceSynchronize());
        double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        for (auto e : events) cudaEventDestroy(e);
        cudaStreamDestroy(stream);
        cudaFree(table);
        return static_cast<double>(block) * batch * batches / secs / 1e9;
    }

private:
    CUresult (*load_)(CUmodule *, const void *) = nullptr;
    CUresult (*get_)(CUfunction *, CUmodule, const char *) = nullptr;
    CUresult (*launch_)(CUfunction, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, CUstream,
                        void **, void **) = nullptr;
    CUfunction fn_ = nullptr;
    CUfunction fn_in_launch_ = nullptr;
};

}  // namespace gpu_raw
