// CUDA backend of the GPU IPC runtime interface. cudart is linked statically, so this plugin
// needs only the NVIDIA driver (libcuda.so.1) at run time, which cudart loads itself.
#include <cuda.h>  // driver types only: the driver's functions are looked up at run time
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iterator>
#include <map>
#include <vector>

#include "ferry/plugin.h"
#include "gpu_runtime.hpp"

namespace ferry_gpu {
#ifndef FERRY_CUDA_NO_COPY_KERNEL
extern const char kCopyKernelPtx[];        // copy_kernel.cu as PTX (embed_text.py)
extern const char kCopyKernelInlinePtx[];  // its kernels that take their table in the launch
#endif
namespace {

int fail(cudaError_t rc, const char *call, std::string &error) {
    error = std::string(call) + ": " + cudaGetErrorString(rc) + " (CUDA error " + std::to_string(static_cast<int>(rc)) +
            ")";
    cudaGetLastError();  // never leave a non-sticky error for the next call to trip over
    switch (rc) {
        case cudaErrorMemoryAllocation: return -ENOMEM;
        case cudaErrorInvalidValue: return -EINVAL;
        case cudaErrorInsufficientDriver:
        case cudaErrorNoDevice: return -ENODEV;
        case cudaErrorPeerAccessUnsupported: return -ENOTSUP;
        default: return -EIO;
    }
}

#define CHECK(call)                                             \
    do {                                                        \
        cudaError_t rc_ = (call);                               \
        if (rc_ != cudaSuccess) return fail(rc_, #call, error); \
    } while (0)

using GetAddressRange = int (*)(unsigned long long *base, size_t *size, unsigned long long ptr);
// The driver calls the copy kernel needs (the runtime has no call that loads PTX text).
using ModuleLoadDataEx = CUresult (*)(CUmodule *module, const void *image, unsigned n, CUjit_option *options,
                                      void **values);
using ModuleGetFunction = CUresult (*)(CUfunction *fn, CUmodule module, const char *name);
using ModuleUnload = CUresult (*)(CUmodule module);
using LaunchKernel = CUresult (*)(CUfunction fn, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                                  unsigned bz, unsigned shared_bytes, CUstream stream, void **params, void **extra);
using GetErrorString = CUresult (*)(CUresult rc, const char **text);

#if CUDA_VERSION >= 12080
// cuMemcpyBatchAsync as the driver exports it for CUDA 12.8 (13.0 dropped failIdx; asking for
// the 12.8 ABI by version works on every driver that has the call).
using MemcpyBatch = CUresult (*)(CUdeviceptr *dsts, CUdeviceptr *srcs, size_t *sizes, size_t count,
                                 CUmemcpyAttributes *attrs, size_t *attr_idxs, size_t num_attrs, size_t *fail_idx,
                                 CUstream stream);
#endif

class CudaRuntime final : public Runtime {
public:
    const char *name() const override { return "CUDA"; }
    uint32_t memory_kind() const override { return FERRY_MEM_CUDA; }

    void probe(bool &available, std::string &reason) override {
        available = false;
        // The runtime's own answer without a driver is "insufficient driver" (35); the loader's
        // text says what is actually missing.
        if (void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL)) {
            dlclose(driver);
        } else {
            const char *e = dlerror();
            reason = std::string("no NVIDIA driver: ") + (e ? e : "libcuda.so.1 not found");
            return;
        }
        int count = 0;
        cudaError_t rc = cudaGetDeviceCount(&count);
        if (rc == cudaErrorInsufficientDriver) {
            int driver = 0;
            cudaDriverGetVersion(&driver);
            reason = "NVIDIA driver supports CUDA " + std::to_string(driver / 1000) + "." +
                     std::to_string(driver % 1000 / 10) + " but this plugin was built with CUDA " +
                     std::to_string(CUDART_VERSION / 1000) + "; use the cuda" + std::to_string(driver / 1000) +
                     " plugin variant or update the driver";
            cudaGetLastError();
            return;
        }
        if (rc != cudaSuccess || count == 0) {
            reason = rc == cudaSuccess ? "no CUDA device visible"
                                       : std::string("cudaGetDeviceCount: ") + cudaGetErrorString(rc);
            cudaGetLastError();
            return;
        }
        int driver = 0;
        cudaDriverGetVersion(&driver);
        available = true;
        reason = std::to_string(count) + " CUDA device(s), driver CUDA " + std::to_string(driver / 1000) + "." +
                 std::to_string(driver % 1000 / 10);
    }

    int device_count(int &count, std::string &error) override {
        CHECK(cudaGetDeviceCount(&count));
        return 0;
    }
    int current_device(int &device, std::string &error) override {
        CHECK(cudaGetDevice(&device));
        return 0;
    }
    int set_device(int device, std::string &error) override {
        CHECK(cudaSetDevice(device));
        return 0;
    }

    int pointer_device(const void *ptr, int &device, bool &is_device, std::string &error) override {
        cudaPointerAttributes attr{};
        CHECK(cudaPointerGetAttributes(&attr, ptr));
        is_device = attr.type == cudaMemoryTypeDevice;
        device = attr.device;
        return 0;
    }

    int allocation_range(const void *ptr, uintptr_t &base, size_t &size, std::string &error) override {
        if (!get_range_) {
            cudaDriverEntryPointQueryResult status{};
            void *fn = nullptr;
            CHECK(cudaGetDriverEntryPointByVersion("cuMemGetAddressRange", &fn, 12000, cudaEnableDefault, &status));
            if (!fn || status != cudaDriverEntryPointSuccess) {
                error = "the driver has no cuMemGetAddressRange";
                return -ENOTSUP;
            }
            get_range_ = reinterpret_cast<GetAddressRange>(fn);
        }
        unsigned long long b = 0;
        size_t s = 0;
        if (int rc = get_range_(&b, &s, reinterpret_cast<uintptr_t>(ptr)); rc != 0) {
            error = "cuMemGetAddressRange failed with CUDA driver error " + std::to_string(rc) +
                    " (is this memory from cudaMalloc?)";
            return -EINVAL;
        }
        base = b;
        size = s;
        return 0;
    }

    int ipc_export(void *base, IpcHandle &handle, std::string &error) override {
        cudaIpcMemHandle_t h;
        CHECK(cudaIpcGetMemHandle(&h, base));
        static_assert(sizeof h == kIpcHandleBytes);
        memcpy(handle.bytes, &h, sizeof h);
        return 0;
    }
    int ipc_open(const IpcHandle &handle, void *&mapped, std::string &error) override {
        cudaIpcMemHandle_t h;
        memcpy(&h, handle.bytes, sizeof h);
        CHECK(cudaIpcOpenMemHandle(&mapped, h, cudaIpcMemLazyEnablePeerAccess));
        return 0;
    }
    int ipc_close(void *mapped, std::string &error) override {
        CHECK(cudaIpcCloseMemHandle(mapped));
        return 0;
    }

    int enable_peer_access(int device, int peer, std::string &error) override {
        int can = 0;
        CHECK(cudaDeviceCanAccessPeer(&can, device, peer));
        if (!can) {
            error = "CUDA device " + std::to_string(device) + " cannot access device " + std::to_string(peer) +
                    " (no P2P path)";
            return -ENOTSUP;
        }
        CHECK(cudaSetDevice(device));
        cudaError_t rc = cudaDeviceEnablePeerAccess(peer, 0);
        if (rc == cudaErrorPeerAccessAlreadyEnabled) {
            cudaGetLastError();  // sticky until read: clear it, it is not a failure
            return 0;
        }
        if (rc != cudaSuccess) return fail(rc, "cudaDeviceEnablePeerAccess", error);
        return 0;
    }

    int stream_create(Stream &stream, std::string &error) override {
        cudaStream_t s;
        CHECK(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking));
        stream = s;
        return 0;
    }
    void stream_destroy(Stream stream) override { cudaStreamDestroy(static_cast<cudaStream_t>(stream)); }
    int event_create(Event &event, std::string &error) override {
        cudaEvent_t e;
        CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
        event = e;
        return 0;
    }
    void event_destroy(Event event) override { cudaEventDestroy(static_cast<cudaEvent_t>(event)); }
    int event_record(Event event, Stream stream, std::string &error) override {
        CHECK(cudaEventRecord(static_cast<cudaEvent_t>(event), static_cast<cudaStream_t>(stream)));
        return 0;
    }
    int event_query(Event event, std::string &error) override {
        cudaError_t rc = cudaEventQuery(static_cast<cudaEvent_t>(event));
        if (rc == cudaSuccess) return 1;
        if (rc == cudaErrorNotReady) return 0;
        return fail(rc, "cudaEventQuery", error);
    }
    int event_wait(Event event, std::string &error) override {
        CHECK(cudaEventSynchronize(static_cast<cudaEvent_t>(event)));
        return 0;
    }
    int copy_async(void *dst, const void *src, size_t bytes, Stream stream, std::string &error) override {
        CHECK(cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, static_cast<cudaStream_t>(stream)));
        return 0;
    }
    int stream_wait(Stream stream, std::string &error) override {
        CHECK(cudaStreamSynchronize(static_cast<cudaStream_t>(stream)));
        return 0;
    }

#if CUDA_VERSION >= 12080
    bool has_copy_batch() override {
        if (!batch_looked_up_) {
            batch_looked_up_ = true;
            // FERRY_GPU_IPC_BATCH_COPY=0: copy op by op (to compare, or to step around a driver bug).
            const char *env = getenv("FERRY_GPU_IPC_BATCH_COPY");
            cudaDriverEntryPointQueryResult status{};
            void *fn = nullptr;
            if (!(env && strcmp(env, "0") == 0) &&
                cudaGetDriverEntryPointByVersion("cuMemcpyBatchAsync", &fn, 12080, cudaEnableDefault, &status) ==
                    cudaSuccess &&
                status == cudaDriverEntryPointSuccess)
                batch_ = reinterpret_cast<MemcpyBatch>(fn);
            cudaGetLastError();  // a driver older than 12.8 says so here: not an error for later calls
        }
        return batch_ != nullptr;
    }
    int copy_batch(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t n, Stream stream,
                   std::string &error) override {
        if (!has_copy_batch()) return Runtime::copy_batch(dsts, srcs, sizes, n, stream, error);
        dsts_.assign(n, 0);
        srcs_.assign(n, 0);
        sizes_.assign(sizes, sizes + n);
        for (size_t i = 0; i < n; ++i) {
            dsts_[i] = reinterpret_cast<uintptr_t>(dsts[i]);
            srcs_[i] = reinterpret_cast<uintptr_t>(srcs[i]);
        }
        // One attribute set for all: the sources are read in stream order (they may be written
        // by work queued before), no location hints (they only matter for managed memory).
        CUmemcpyAttributes attr{};
        attr.srcAccessOrder = CU_MEMCPY_SRC_ACCESS_ORDER_STREAM;
        size_t attr_idx = 0, fail_idx = 0;
        CUresult rc = batch_(dsts_.data(), srcs_.data(), sizes_.data(), n, &attr, &attr_idx, 1, &fail_idx,
                             static_cast<CUstream>(stream));
        if (rc != CUDA_SUCCESS) {
            error = "cuMemcpyBatchAsync of " + std::to_string(n) + " copies failed with CUDA driver error " +
                    std::to_string(static_cast<int>(rc)) +
                    (fail_idx < n ? " at copy " + std::to_string(fail_idx) : std::string());
            return -EIO;
        }
        return 0;
    }
#endif

    ~CudaRuntime() override {
        for (auto &[device, k] : kernels_)
            for (CUmodule m : {k.module, k.inline_module})
                if (m && unload_) unload_(m);
    }

    int copy_kernel_load(int device, std::string &error) override {
#ifdef FERRY_CUDA_NO_COPY_KERNEL
        (void)device;
        error = "this cuda_ipc.so was built without its copy kernel (no nvcc at build time)";
        return -ENOSYS;
#else
        if (auto it = kernels_.find(device); it != kernels_.end() && it->second.fn) return 0;
        if (int rc = driver_calls(error)) return rc;
        CHECK(cudaSetDevice(device));
        CHECK(cudaFree(nullptr));  // the device's primary context, current from here on
        // The JIT's own words on a failure (an older driver than the PTX asks for says so here).
        char log[2048] = "";
        CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
        void *values[] = {log, reinterpret_cast<void *>(static_cast<uintptr_t>(sizeof log))};
        Kernel k;
        if (CUresult rc = load_(&k.module, kCopyKernelPtx, 2, opts, values); rc != CUDA_SUCCESS) {
            int driver = 0;
            cudaDriverGetVersion(&driver);
            error =
                "cuModuleLoadDataEx (JIT-compiling the copy kernel's PTX for device " + std::to_string(device) +
                "): " + driver_error(rc) + (log[0] ? std::string(": ") + log : std::string()) +
                (rc == CUDA_ERROR_UNSUPPORTED_PTX_VERSION
                     ? "; the driver (CUDA " + std::to_string(driver / 1000) + "." +
                           std::to_string(driver % 1000 / 10) + ") is older than the CUDA " +
                           std::to_string(CUDART_VERSION / 1000) + "." + std::to_string(CUDART_VERSION % 1000 / 10) +
                           " this plugin was built with: update the driver"
                     : std::string());
            return -ENOTSUP;
        }
        if (CUresult rc = get_function_(&k.fn, k.module, kCopyKernelName); rc != CUDA_SUCCESS) {
            error = std::string("cuModuleGetFunction(") + kCopyKernelName + "): " + driver_error(rc);
            unload_(k.module);
            return -ENOTSUP;
        }
        load_inline(k);
        kernels_[device] = k;
        return 0;
#endif
    }
    bool copy_kernel_inline(int device, std::string &why) override {
        auto it = kernels_.find(device);
        if (it == kernels_.end() || !it->second.fn) return why = "the copy kernel is not loaded", false;
        why = it->second.inline_error;
        return it->second.inline_fn[0] != nullptr;
    }
    int copy_kernel_launch_inline(int device, const InlineLaunch &launch, uint32_t blocks, Stream stream,
                                  std::string &error) override {
        auto it = kernels_.find(device);
        if (it == kernels_.end() || !it->second.inline_fn[0] || launch.n == 0 || launch.n > kInlineTableOps) {
            error = "no copy kernel for " + std::to_string(launch.n) + " entries in its launch on device " +
                    std::to_string(device);
            return -ENOSYS;
        }
        size_t size = 0;
        while (kInlineTableSizes[size] < launch.n) ++size;
        // The kernel's one parameter: the driver copies the InlineTable<N> prefix of `launch`.
        void *params[] = {const_cast<InlineLaunch *>(&launch)};
        CUresult rc = launch_(it->second.inline_fn[size], blocks, 1, 1, kCopyKernelThreads, 1, 1, 0,
                              static_cast<CUstream>(stream), params, nullptr);
        if (rc != CUDA_SUCCESS) {
            error = "cuLaunchKernel(ferry_copy_inline_" + std::to_string(kInlineTableSizes[size]) + ", " +
                    std::to_string(blocks) + " blocks): " + driver_error(rc);
            return rc == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
        }
        return 0;
    }
    int table_alloc(size_t bytes, void *&host, void *&device_table, std::string &error) override {
        void *h = nullptr, *d = nullptr;
        CHECK(cudaMallocHost(&h, bytes));
        if (cudaError_t rc = cudaMalloc(&d, bytes); rc != cudaSuccess) {
            cudaFreeHost(h);
            return fail(rc, "cudaMalloc", error);
        }
        host = h;
        device_table = d;
        return 0;
    }
    void table_free(void *host, void *device_table) override {
        cudaFreeHost(host);
        cudaFree(device_table);
    }
    int copy_kernel_launch(int device, const void *table, uint32_t n, uint64_t chunks, uint32_t blocks, Stream stream,
                           std::string &error) override {
        auto it = kernels_.find(device);
        if (it == kernels_.end() || !it->second.fn) {
            error = "the copy kernel is not loaded on device " + std::to_string(device);
            return -ENOSYS;
        }
        unsigned long long chunk_count = chunks;
        unsigned count = n;
        void *params[] = {&table, &count, &chunk_count};
        CUresult rc = launch_(it->second.fn, blocks, 1, 1, kCopyKernelThreads, 1, 1, 0, static_cast<CUstream>(stream),
                              params, nullptr);
        if (rc != CUDA_SUCCESS) {
            error = "cuLaunchKernel(" + std::string(kCopyKernelName) + ", " + std::to_string(blocks) +
                    " blocks): " + driver_error(rc);
            return rc == CUDA_ERROR_OUT_OF_MEMORY ? -ENOMEM : -EIO;
        }
        return 0;
    }

private:
    struct Kernel {
        CUmodule module = nullptr;
        CUfunction fn = nullptr;
        // The kernels that take their table in the launch (one per kInlineTableSizes), or why not.
        CUmodule inline_module = nullptr;
        CUfunction inline_fn[std::size(kInlineTableSizes)] = {};
        std::string inline_error;
    };

    // Large launch parameters need a CUDA 12.1 driver and a Volta or newer GPU: where the module
    // does not load, the table is copied before each launch instead, and inline_error says why.
    void load_inline(Kernel &k) {
#ifdef FERRY_CUDA_NO_COPY_KERNEL
        k.inline_error = "this cuda_ipc.so was built without its copy kernel";
#else
        char log[2048] = "";
        CUjit_option opts[] = {CU_JIT_ERROR_LOG_BUFFER, CU_JIT_ERROR_LOG_BUFFER_SIZE_BYTES};
        void *values[] = {log, reinterpret_cast<void *>(static_cast<uintptr_t>(sizeof log))};
        if (CUresult rc = load_(&k.inline_module, kCopyKernelInlinePtx, 2, opts, values); rc != CUDA_SUCCESS) {
            k.inline_module = nullptr;
            k.inline_error =
                "cuModuleLoadDataEx (the copy kernels that take their table in the launch's parameters, "
                "which need a CUDA 12.1 driver and a Volta or newer GPU): " +
                driver_error(rc) + (log[0] ? std::string(": ") + log : std::string());
            return;
        }
        for (size_t i = 0; i < std::size(kInlineTableSizes); ++i) {
            const std::string name = "ferry_copy_inline_" + std::to_string(kInlineTableSizes[i]);
            if (CUresult rc = get_function_(&k.inline_fn[i], k.inline_module, name.c_str()); rc != CUDA_SUCCESS) {
                k.inline_error = "cuModuleGetFunction(" + name + "): " + driver_error(rc);
                unload_(k.inline_module);
                k.inline_module = nullptr;
                for (auto &f : k.inline_fn) f = nullptr;
                return;
            }
        }
#endif
    }

    template <typename Fn>
    int driver_call(const char *name, Fn &out, std::string &error) {
        cudaDriverEntryPointQueryResult status{};
        void *fn = nullptr;
        CHECK(cudaGetDriverEntryPointByVersion(name, &fn, 12000, cudaEnableDefault, &status));
        if (!fn || status != cudaDriverEntryPointSuccess) {
            error = std::string("the driver has no ") + name;
            return -ENOTSUP;
        }
        out = reinterpret_cast<Fn>(fn);
        return 0;
    }
    int driver_calls(std::string &error) {
        if (launch_) return 0;
        if (int rc = driver_call("cuModuleLoadDataEx", load_, error)) return rc;
        if (int rc = driver_call("cuModuleGetFunction", get_function_, error)) return rc;
        if (int rc = driver_call("cuModuleUnload", unload_, error)) return rc;
        if (int rc = driver_call("cuGetErrorString", error_string_, error)) return rc;
        return driver_call("cuLaunchKernel", launch_, error);
    }
    std::string driver_error(CUresult rc) const {
        const char *text = nullptr;
        if (error_string_) error_string_(rc, &text);
        return std::string(text ? text : "unknown error") + " (CUDA driver error " +
               std::to_string(static_cast<int>(rc)) + ")";
    }

    GetAddressRange get_range_ = nullptr;
    ModuleLoadDataEx load_ = nullptr;
    ModuleGetFunction get_function_ = nullptr;
    ModuleUnload unload_ = nullptr;
    LaunchKernel launch_ = nullptr;
    GetErrorString error_string_ = nullptr;
    std::map<int, Kernel> kernels_;  // device -> the kernel loaded there
#if CUDA_VERSION >= 12080
    bool batch_looked_up_ = false;
    MemcpyBatch batch_ = nullptr;
    // Scratch for the driver's arrays; copy_batch runs under the transport's lock.
    std::vector<CUdeviceptr> dsts_, srcs_;
    std::vector<size_t> sizes_;
#endif
};

}  // namespace

std::unique_ptr<Runtime> make_runtime() { return std::make_unique<CudaRuntime>(); }

}  // namespace ferry_gpu
