// Copies between GPU memory and pinned host memory, for transports that move host memory only
// (tcp, shm, efa without HMEM): the engine stages a GPU op through pinned buffers. The GPU
// runtime is found at run time (the CUDA driver API in libcuda.so.1, or $FERRY_LIBCUDA when set,
// for tests; or the libamdhip64.so.N of the ROCm variant runtime_probe chose, the one hip_ipc.so
// links); nothing GPU-specific is compiled into the core.
#pragma once

#include <memory>
#include <optional>
#include <span>
#include <string>

#include "ferry/plugin.h"
#include "ferry/result.hpp"

namespace ferry {

class GpuStager {
public:
    virtual ~GpuStager() = default;
    // nullptr with `why` set when the runtime for `kind` (FERRY_MEM_CUDA / ROCM) is missing.
    static std::unique_ptr<GpuStager> open(uint32_t kind, std::string &why);

    // Ok when [ptr, ptr+bytes) is device memory of `device`; a clear error otherwise.
    virtual Result<void> check_device_memory(const void *ptr, size_t bytes, int device) = 0;
    // The device ordinal when `ptr` is device memory of this runtime, nullopt when it is not.
    virtual std::optional<int> device_of(const void *ptr) = 0;
    virtual Result<void *> alloc_pinned(int device, size_t bytes) = 0;
    virtual void free_pinned(int device, void *ptr) = 0;
    // One copy: `length` bytes from `src` to `dst` (the plugin ABI's copy_local entry, so a
    // pack's copies go to a GPU transport or to the runtime as they are).
    using CopyRange = ferry_local_copy_t;
    // Starts copies (either direction, device memory <-> pinned host memory) on the device's
    // non-blocking stream and records one event after the last; returns the event. Copies
    // started on one device run in the order they were started.
    virtual Result<void *> copy_async(int device, std::span<const CopyRange> copies) = 0;
    Result<void *> copy_async(int device, void *dst, const void *src, size_t bytes) {
        CopyRange c{reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), bytes};
        return copy_async(device, std::span(&c, 1));
    }
    // Blocks until the event's copies are done, then frees the event: ok or the runtime's error.
    virtual Result<void> wait(int device, void *event) = 0;

    // Enqueues fn(user) on the caller's `stream` (cuLaunchHostFunc): the runtime calls it once
    // the work queued on the stream before it is done, and holds back the work queued after it
    // until it returns. fn must make no call into the runtime. CUDA only.
    using HostFn = void (*)(void *user);
    virtual Result<void> launch_host_func(void *stream, HostFn fn, void *user) = 0;
};

}  // namespace ferry
