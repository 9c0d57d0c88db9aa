// Raw CUDA batches for gpu_ipc_bench: the baselines, and the variants that take cuda_ipc.so's
// per-batch cost apart (docs/PERFORMANCE.md, "GPU IPC small blocks"). Each runs `batches`
// batches of `batch` copies of `block` bytes, copy i from src + i*block to dst + i*block, one
// batch at a time, and returns GB/s (10^9 bytes copied per second).
//   plain    cudaMemcpyAsync per copy, cudaStreamSynchronize (the baseline)
//   batched  one cuMemcpyBatchAsync per batch (as cuda_ipc.so queues a run), then the same sync
//   handoff  plain copies + one event; a second thread waits for the event (cudaEventSynchronize,
//            as cuda_ipc.so's completion thread does) and signals an eventfd that this thread
//            sleeps on in poll(2), as the engine's wait() does: the cost of that wakeup
#pragma once

#include <cuda.h>
#include <cuda_runtime_api.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <mutex>
#include <thread>
#include <vector>

#include "../tests/gpu/cuda_util.hpp"

namespace gpu_raw {

using Clock = std::chrono::steady_clock;

enum class Variant { Plain, Batched, Handoff };

#if CUDA_VERSION >= 12080
using MemcpyBatch = CUresult (*)(CUdeviceptr *, CUdeviceptr *, size_t *, size_t, CUmemcpyAttributes *, size_t *, size_t,
                                 size_t *, CUstream);
inline MemcpyBatch memcpy_batch() {
    static MemcpyBatch fn = [] {
        void *p = nullptr;
        cudaDriverEntryPointQueryResult q{};
        if (cudaGetDriverEntryPointByVersion("cuMemcpyBatchAsync", &p, 12080, cudaEnableDefault, &q) != cudaSuccess ||
            q != cudaDriverEntryPointSuccess)
            p = nullptr;
        cudaGetLastError();
        return reinterpret_cast<MemcpyBatch>(p);
    }();
    return fn;
}
#endif

// The completion thread of the handoff variant: one event at a time, like cuda_ipc.so's.
class Waker {
public:
    Waker() : efd_(eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)), thread_([this] { loop(); }) {}
    ~Waker() {
        {
            std::lock_guard l(mu_);
            stop_ = true;
        }
        cv_.notify_all();
        thread_.join();
        close(efd_);
    }
    void hand(cudaEvent_t e) {
        {
            std::lock_guard l(mu_);
            event_ = e;
        }
        cv_.notify_all();
    }
    void sleep_until_signalled() {
        pollfd p{efd_, POLLIN, 0};
        while (::poll(&p, 1, 1000) <= 0) {}
        uint64_t v;
        [[maybe_unused]] auto n = ::read(efd_, &v, sizeof v);
    }

private:
    void loop() {
        std::unique_lock l(mu_);
        for (;;) {
            cv_.wait(l, [&] { return stop_ || event_; });
            if (!event_) return;
            cudaEvent_t e = event_;
            event_ = nullptr;
            l.unlock();
            CUDA_OR_DIE(cudaEventSynchronize(e));
            uint64_t one = 1;
            [[maybe_unused]] auto n = ::write(efd_, &one, sizeof one);
            l.lock();
        }
    }
    int efd_;
    std::mutex mu_;
    std::condition_variable cv_;
    cudaEvent_t event_ = nullptr;
    bool stop_ = false;
    std::thread thread_;
};

inline double run(Variant v, uint8_t *dst, const uint8_t *src, uint64_t block, uint64_t batch, uint64_t batches) {
    cudaStream_t s;
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t ev;
    CUDA_OR_DIE(cudaEventCreateWithFlags(&ev, cudaEventDisableTiming));
    std::vector<CUdeviceptr> d(batch), sr(batch);
    std::vector<size_t> sizes(batch, block);
    for (uint64_t i = 0; i < batch; ++i) {
        d[i] = reinterpret_cast<CUdeviceptr>(dst + i * block);
        sr[i] = reinterpret_cast<CUdeviceptr>(src + i * block);
    }
    Waker *waker = v == Variant::Handoff ? new Waker : nullptr;
    auto one_batch = [&] {
        if (v == Variant::Batched) {
#if CUDA_VERSION >= 12080
            CUmemcpyAttributes attr{};
            attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
            size_t idx = 0, fail = 0;
            if (memcpy_batch()(d.data(), sr.data(), sizes.data(), batch, &attr, &idx, 1, &fail, s) != CUDA_SUCCESS) {
                std::fprintf(stderr, "cuMemcpyBatchAsync failed\n");
                std::exit(3);
            }
#endif
        } else {
            for (uint64_t i = 0; i < batch; ++i)
                CUDA_OR_DIE(cudaMemcpyAsync(dst + i * block, src + i * block, block, cudaMemcpyDefault, s));
        }
        if (waker) {
            CUDA_OR_DIE(cudaEventRecord(ev, s));
            waker->hand(ev);
            waker->sleep_until_signalled();
        } else {
            CUDA_OR_DIE(cudaStreamSynchronize(s));
        }
    };
    one_batch();  // warm-up
    auto t0 = Clock::now();
    for (uint64_t k = 0; k < batches; ++k) one_batch();
    double secs = std::chrono::duration<double>(Clock::now() - t0).count();
    delete waker;
    cudaEventDestroy(ev);
    cudaStreamDestroy(s);
    return static_cast<double>(block) * batch * batches / secs / 1e9;
}

inline bool has_batched() {
#if CUDA_VERSION >= 12080
    return memcpy_batch() != nullptr;
#else
    return false;
#endif
}

// One plain batch timed by events around it (GPU time, or the enqueue's if that is slower) and
// the host's time to enqueue its copies: medians of 9, in microseconds.
struct BatchTimes {
    double gpu_us = 0, enqueue_us = 0;
};
inline BatchTimes batch_times(uint8_t *dst, const uint8_t *src, uint64_t block, uint64_t batch) {
    cudaStream_t s;
    CUDA_OR_DIE(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
    cudaEvent_t a, b;
    CUDA_OR_DIE(cudaEventCreate(&a));
    CUDA_OR_DIE(cudaEventCreate(&b));
    std::vector<double> t, h;
    for (int k = 0; k < 10; ++k) {
        CUDA_OR_DIE(cudaEventRecord(a, s));
        auto t0 = Clock::now();
        for (uint64_t i = 0; i < batch; ++i)
            CUDA_OR_DIE(cudaMemcpyAsync(dst + i * block, src + i * block, block, cudaMemcpyDefault, s));
        if (k) h.push_back(std::chrono::duration<double, std::micro>(Clock::now() - t0).count());
        CUDA_OR_DIE(cudaEventRecord(b, s));
        CUDA_OR_DIE(cudaEventSynchronize(b));
        float ms = 0;
        CUDA_OR_DIE(cudaEventElapsedTime(&ms, a, b));
        if (k) t.push_back(ms);
    }
    std::sort(t.begin(), t.end());
    std::sort(h.begin(), h.end());
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    cudaStreamDestroy(s);
    return {t[t.size() / 2] * 1e3, h[h.size() / 2]};
}

}  // namespace gpu_raw
