// Copies between GPU memory and pinned host memory, for transports that move host memory only
// (tcp, shm, efa without HMEM): the engine stages a GPU op through a pinned buffer. The GPU
// runtime is found at run time (the CUDA driver API in libcuda.so.1, or the libamdhip64.so.N of
// the ROCm variant runtime_probe chose, the one hip_ipc.so links);
// nothing GPU-specific is compiled into the core.
#pragma once

#include <memory>
#include <string>

#include "ferry/engine.hpp"

namespace ferry {

class GpuStager {
public:
    virtual ~GpuStager() = default;
    // nullptr with `why` set when the runtime for `kind` (FERRY_MEM_CUDA / ROCM) is missing.
    static std::unique_ptr<GpuStager> open(uint32_t kind, std::string &why);

    // Ok when [ptr, ptr+bytes) is device memory of `device`; a clear error otherwise.
    virtual Result<void> check_device_memory(const void *ptr, size_t bytes, int device) = 0;
    virtual Result<void *> alloc_pinned(int device, size_t bytes) = 0;
    virtual void free_pinned(int device, void *ptr) = 0;
    // Synchronous copy in either direction between `device` memory and pinned host memory.
    virtual Result<void> copy(int device, void *dst, const void *src, size_t bytes) = 0;
};

} // namespace ferry
