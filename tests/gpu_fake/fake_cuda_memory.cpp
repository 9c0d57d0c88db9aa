// The fake CUDA driver (fake_cuda.cpp): device allocations in the heap, pinned host memory,
// copies and memset, and what a pointer is (cuPointerGetAttribute[s]).
#include <fcntl.h>
#include <sys/mman.h>

#include <cstring>

#include "fake_cuda_state.hpp"

using namespace fake_cuda;

FAKE_API CUresult cuMemAlloc_v2(CUdeviceptr *p, size_t bytes) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!have_context()) return kInvalidContext;
    std::lock_guard lock(g.m);
    size_t rounded = (bytes + 0xfffff) & ~size_t(0xfffff);  // 1 MiB granules, like cudaMalloc's
    if (bytes == 0 || g.next + rounded > g.heap) return kOutOfMemory;
    *p = reinterpret_cast<uintptr_t>(g.device) + g.next;
    g.allocations[*p] = bytes;
    g.next += rounded;
    return kSuccess;
}

FAKE_API CUresult cuMemFree_v2(CUdeviceptr p) {
    REFUSED_IN_HOST_FN();
    std::lock_guard lock(g.m);
    auto it = g.allocations.find(p);
    if (it == g.allocations.end()) return kInvalidValue;
    off_t off = static_cast<off_t>(p - reinterpret_cast<uintptr_t>(g.device));
    fallocate(g.fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, off, static_cast<off_t>(it->second));
    g.allocations.erase(it);
    return kSuccess;
}

FAKE_API CUresult cuMemHostAlloc(void **p, size_t bytes, unsigned) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!have_context()) return kInvalidContext;
    void *m = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (m == MAP_FAILED) return kOutOfMemory;
    std::lock_guard lock(g.m);
    g.pinned[reinterpret_cast<uintptr_t>(m)] = bytes;
    *p = m;
    return kSuccess;
}

FAKE_API CUresult cuMemAllocHost_v2(void **p, size_t bytes) { return cuMemHostAlloc(p, bytes, 0); }

FAKE_API CUresult cuMemFreeHost(void *p) {
    REFUSED_IN_HOST_FN();
    std::lock_guard lock(g.m);
    auto it = g.pinned.find(reinterpret_cast<uintptr_t>(p));
    if (it == g.pinned.end()) return kInvalidValue;
    munmap(p, it->second);
    g.pinned.erase(it);
    return kSuccess;
}

FAKE_API CUresult cuMemcpy(CUdeviceptr dst, CUdeviceptr src, size_t bytes) {
    return enqueue_copy(dst, src, bytes, nullptr);
}
FAKE_API CUresult cuMemcpyHtoD_v2(CUdeviceptr dst, const void *src, size_t bytes) {
    return enqueue_copy(dst, reinterpret_cast<uintptr_t>(src), bytes, nullptr);
}
FAKE_API CUresult cuMemcpyDtoH_v2(void *dst, CUdeviceptr src, size_t bytes) {
    return enqueue_copy(reinterpret_cast<uintptr_t>(dst), src, bytes, nullptr);
}
FAKE_API CUresult cuMemcpyAsync(CUdeviceptr dst, CUdeviceptr src, size_t bytes, void *stream) {
    return enqueue_copy(dst, src, bytes, stream_of(stream));
}
FAKE_API CUresult cuMemcpyHtoDAsync_v2(CUdeviceptr dst, const void *src, size_t bytes, void *stream) {
    return enqueue_copy(dst, reinterpret_cast<uintptr_t>(src), bytes, stream_of(stream));
}
FAKE_API CUresult cuMemcpyDtoHAsync_v2(void *dst, CUdeviceptr src, size_t bytes, void *stream) {
    return enqueue_copy(reinterpret_cast<uintptr_t>(dst), src, bytes, stream_of(stream));
}

FAKE_API CUresult cuMemsetD8_v2(CUdeviceptr dst, unsigned char value, size_t bytes) {
    REFUSED_IN_HOST_FN();
    if (!have_context()) return kInvalidContext;
    uintptr_t p;
    if (!in_device(dst) || !translate(dst, bytes, p)) return kInvalidValue;
    std::memset(reinterpret_cast<void *>(p), value, bytes);
    return kSuccess;
}

// Unlike cuPointerGetAttribute, the plural call succeeds on memory CUDA does not know, leaving
// zeros (as the real driver documents): how a caller tells host memory apart.
static CUresult attribute(void *data, int attr, CUdeviceptr p, bool strict) {
    bool dev = in_device(p) && device_range(p, 1);
    bool host = !dev && pinned_ptr(p);
    if (!dev && !host) {
        if (strict) return kInvalidValue;
        switch (attr) {
            case kAttrContext:
            case kAttrDevicePointer:
            case kAttrHostPointer: *static_cast<void **>(data) = nullptr; break;
            case kAttrDeviceOrdinal: *static_cast<int *>(data) = -2; break;
            default: *static_cast<unsigned *>(data) = 0;
        }
        return kSuccess;
    }
    switch (attr) {
        case kAttrContext: *static_cast<void **>(data) = kContext; break;
        case kAttrMemoryType: *static_cast<unsigned *>(data) = dev ? kMemTypeDevice : kMemTypeHost; break;
        case kAttrDevicePointer: *static_cast<uintptr_t *>(data) = p; break;
        case kAttrHostPointer: *static_cast<uintptr_t *>(data) = dev ? 0 : p; break;
        case kAttrDeviceOrdinal: *static_cast<int *>(data) = 0; break;
        default: return kInvalidValue;
    }
    return kSuccess;
}

FAKE_API CUresult cuPointerGetAttribute(void *data, int attr, CUdeviceptr p) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    return attribute(data, attr, p, true);
}

FAKE_API CUresult cuPointerGetAttributes(unsigned n, int *attrs, void **data, CUdeviceptr p) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    for (unsigned i = 0; i < n; ++i)
        if (CUresult rc = attribute(data[i], attrs[i], p, false); rc != kSuccess) return rc;
    return kSuccess;
}
