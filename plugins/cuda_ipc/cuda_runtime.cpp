// CUDA backend of the GPU IPC runtime interface. cudart is linked statically, so this plugin
// needs only the NVIDIA driver (libcuda.so.1) at run time, which cudart loads itself.
#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <cerrno>
#include <cstring>

#include "ferry/plugin.h"
#include "gpu_runtime.hpp"

namespace ferry_gpu {
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

private:
    GetAddressRange get_range_ = nullptr;
};

}  // namespace

std::unique_ptr<Runtime> make_runtime() { return std::make_unique<CudaRuntime>(); }

}  // namespace ferry_gpu
