// The fake CUDA driver (fake_cuda.cpp): initialisation (the device heap, the fault injection read
// from the environment), error strings, its one device and the context stack of each thread.
#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include "fake_cuda_state.hpp"

using namespace fake_cuda;

FAKE_API CUresult cuInit(unsigned) {
    std::lock_guard lock(g.m);
    if (g.initialised) return kSuccess;
    g.heap = env_u64("FERRY_FAKE_CUDA_HEAP_MB", 2048) << 20;
    g.fail_copy = env_u64("FERRY_FAKE_CUDA_FAIL_COPY", 0);
    g.delay_us = static_cast<unsigned>(env_u64("FERRY_FAKE_CUDA_COPY_DELAY_US", 0));
    g.linger_us = static_cast<unsigned>(env_u64("FERRY_FAKE_CUDA_EVENT_LINGER_US", 0));
    g.fd = memfd_create("fake-cuda-heap", MFD_CLOEXEC);
    if (g.fd < 0 || ftruncate(g.fd, static_cast<off_t>(g.heap)) != 0) return kOutOfMemory;
    void *d = mmap(nullptr, g.heap, PROT_NONE, MAP_SHARED | MAP_NORESERVE, g.fd, 0);
    void *a = mmap(nullptr, g.heap, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_NORESERVE, g.fd, 0);
    if (d == MAP_FAILED || a == MAP_FAILED) return kOutOfMemory;
    g.device = static_cast<char *>(d);
    g.alias = static_cast<char *>(a);
    g.initialised = true;
    return kSuccess;
}

FAKE_API CUresult cuDriverGetVersion(int *v) {
    *v = 12040;
    return kSuccess;
}

FAKE_API CUresult cuGetErrorString(CUresult rc, const char **s) {
    switch (rc) {
        case kSuccess: *s = "no error"; break;
        case kInvalidValue: *s = "invalid argument"; break;
        case kOutOfMemory: *s = "out of memory"; break;
        case kNotInitialized: *s = "initialization error"; break;
        case kInvalidDevice: *s = "invalid device ordinal"; break;
        case kInvalidContext: *s = "invalid device context"; break;
        case kInvalidHandle: *s = "invalid resource handle"; break;
        case kNotReady: *s = "device not ready"; break;
        case kIllegalAddress: *s = "an illegal memory access was encountered"; break;
        case kNotPermitted: *s = "operation not permitted"; break;
        default: *s = nullptr; return kInvalidValue;
    }
    return kSuccess;
}

FAKE_API CUresult cuDeviceGetCount(int *n) {
    if (!g.initialised) return kNotInitialized;
    *n = 1;
    return kSuccess;
}

FAKE_API CUresult cuDeviceGet(int *dev, int ordinal) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (ordinal != 0) return kInvalidDevice;
    *dev = 0;
    return kSuccess;
}

FAKE_API CUresult cuDevicePrimaryCtxRetain(void **ctx, int dev) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (dev != 0) return kInvalidDevice;
    *ctx = kContext;
    return kSuccess;
}

FAKE_API CUresult cuDevicePrimaryCtxRelease_v2(int) { return kSuccess; }

FAKE_API CUresult cuCtxPushCurrent_v2(void *ctx) {
    REFUSED_IN_HOST_FN();
    if (ctx != kContext) return kInvalidContext;
    t_contexts.push_back(ctx);
    return kSuccess;
}

FAKE_API CUresult cuCtxPopCurrent_v2(void **ctx) {
    REFUSED_IN_HOST_FN();
    if (t_contexts.empty()) return kInvalidContext;
    if (ctx) *ctx = t_contexts.back();
    t_contexts.pop_back();
    return kSuccess;
}

FAKE_API CUresult cuCtxSetCurrent(void *ctx) {
    if (!t_contexts.empty()) t_contexts.pop_back();
    if (ctx) t_contexts.push_back(ctx);
    return kSuccess;
}

FAKE_API CUresult cuCtxGetCurrent(void **ctx) {
    *ctx = t_contexts.empty() ? nullptr : t_contexts.back();
    return kSuccess;
}
