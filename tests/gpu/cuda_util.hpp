// Small CUDA helpers for the GPU tests and benches (they link cudart; the core never does).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdio>
#include <cstdlib>
#include <string>

#define CUDA_OR_DIE(call)                                                                           \
    do {                                                                                            \
        cudaError_t rc_ = (call);                                                                   \
        if (rc_ != cudaSuccess) {                                                                   \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(rc_)); \
            std::exit(3);                                                                           \
        }                                                                                           \
    } while (0)

namespace ferry::test {

// Empty when a CUDA device is usable, else why not (for GTEST_SKIP messages).
inline std::string cuda_unavailable_reason() {
    int n = 0;
    cudaError_t rc = cudaGetDeviceCount(&n);
    if (rc != cudaSuccess) {
        cudaGetLastError();
        return std::string("no usable CUDA device: cudaGetDeviceCount says ") + cudaGetErrorString(rc);
    }
    return n > 0 ? "" : "no CUDA device visible";
}

} // namespace ferry::test
