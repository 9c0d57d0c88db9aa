// The GPU IPC copy kernel's own source (plugins/gpu_ipc/copy_kernel.cu) compiled as host C++
// and run on the CPU, one thread of one block at a time: what it writes is what the GPU's
// threads write, since no thread of the kernel reads what another writes. The test runtime's
// launches run it, so the transport's CI tests hold the kernel's chunking, word widths, heads
// and tails byte-exact without a GPU.
#pragma once

#include <cstdint>

namespace ferry_copy_kernel_host {

struct Dim3 {
    unsigned x = 0, y = 0, z = 0;
};
inline thread_local Dim3 threadIdx, blockIdx, blockDim, gridDim;

#define __global__ inline  // one definition in every test file that includes this
#define __device__
#define __launch_bounds__(threads)
#define __grid_constant__
#define FERRY_COPY_KERNEL_ON_HOST
#define FERRY_COPY_KERNEL_INLINE
#include "copy_kernel.cu"
#undef __global__
#undef __device__
#undef __launch_bounds__
#undef __grid_constant__

// Runs `body` as every thread of `blocks` blocks of `threads` threads, one after another.
template <class Body>
void run_grid(uint32_t blocks, uint32_t threads, Body body) {
    gridDim = {blocks, 1, 1};
    blockDim = {threads, 1, 1};
    for (unsigned b = 0; b < blocks; ++b)
        for (unsigned t = 0; t < threads; ++t) {
            blockIdx = {b, 1, 1};
            threadIdx = {t, 1, 1};
            body();
        }
}

// One launch on a table in host memory.
inline void launch(const void *table, uint32_t n, uint64_t chunks, uint32_t blocks, uint32_t threads) {
    run_grid(blocks, threads, [&] { ferry_copy_table(static_cast<const CopyOp *>(table), n, chunks); });
}

// The same for a table carried in the launch (the inline kernels' body, on their entries).
inline void launch_inline(const void *ops, uint32_t n, uint64_t chunks, uint32_t blocks, uint32_t threads) {
    run_grid(blocks, threads, [&] { copy_table(static_cast<const InlineCopyOp *>(ops), n, chunks); });
}

}  // namespace ferry_copy_kernel_host
