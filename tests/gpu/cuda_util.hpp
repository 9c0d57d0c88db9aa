// Small CUDA helpers for the GPU tests and benches (they link cudart; the core never does).
#pragma once

#include <cuda_runtime_api.h>
#include <gtest/gtest.h>

#include <chrono>
#include <vector>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "ferry/engine.hpp"

#define CUDA_OR_DIE(call)                                                                                \
    do {                                                                                                 \
        cudaError_t rc_ = (call);                                                                        \
        if (rc_ != cudaSuccess) {                                                                        \
            std::fprintf(stderr, "%s:%d: %s: %s\n", __FILE__, __LINE__, #call, cudaGetErrorString(rc_)); \
            std::exit(3);                                                                                \
        }                                                                                                \
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

// Fixture of the GPU tests: skips (saying why) without a usable device; run() submits, waits
// and frees one batch.
class CudaEngineTest : public ::testing::Test {
protected:
    void SetUp() override {
        std::string why = cuda_unavailable_reason();
        if (!why.empty()) GTEST_SKIP() << "SKIPPED: " << why;
    }
    static Result<void> run(Engine &e, const std::vector<Request> &reqs, std::string *transport = nullptr) {
        auto b = e.submit(reqs);
        if (!b) return std::unexpected(b.error());
        auto w = e.wait(*b, std::chrono::seconds(60));
        if (transport) *transport = e.status(*b, 0)->transport;
        (void)e.free_batch(*b);
        return w;
    }
};

}  // namespace ferry::test
