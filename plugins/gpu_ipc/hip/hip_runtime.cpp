// HIP backend of the GPU IPC runtime interface, host code only: g++ with
// -D__HIP_PLATFORM_AMD__ compiles it against the HIP headers, no hipcc needed.
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "ferry/plugin.h"
#include "gpu_runtime.hpp"
#include "hip_loader.hpp"

namespace ferry_gpu {
namespace {

int fail(hipError_t rc, const char *call, std::string &error) {
    error =
        std::string(call) + ": " + hipGetErrorString(rc) + " (HIP error " + std::to_string(static_cast<int>(rc)) + ")";
    (void)hipGetLastError();
    switch (rc) {
        case hipErrorOutOfMemory: return -ENOMEM;
        case hipErrorInvalidValue: return -EINVAL;
        case hipErrorNoDevice:
        case hipErrorInsufficientDriver: return -ENODEV;
        default: return -EIO;
    }
}

#define CHECK(call)                                            \
    do {                                                       \
        hipError_t rc_ = (call);                               \
        if (rc_ != hipSuccess) return fail(rc_, #call, error); \
    } while (0)

class HipRuntime final : public Runtime {
public:
    const char *name() const override { return "HIP"; }
    uint32_t memory_kind() const override { return FERRY_MEM_ROCM; }

    void probe(bool &available, std::string &reason) override {
        available = false;
        struct stat st;
        if (stat("/dev/kfd", &st) != 0) {
            reason = "no /dev/kfd: the amdgpu kernel driver is not loaded (no AMD GPU on this host)";
            return;
        }
        if (std::string error; !load_hip(error)) {
            reason = "cannot load the HIP runtime: " + error;
            return;
        }
        int count = 0;
        hipError_t rc = hipGetDeviceCount(&count);
        if (rc != hipSuccess || count == 0) {
            reason = rc == hipSuccess ? "no HIP device visible"
                                      : std::string("hipGetDeviceCount: ") + hipGetErrorString(rc) + " (HIP error " +
                                            std::to_string(static_cast<int>(rc)) + ")";
            (void)hipGetLastError();
            return;
        }
        available = true;
        reason = std::to_string(count) + " HIP device(s), HIP " + std::to_string(HIP_VERSION_MAJOR) + "." +
                 std::to_string(HIP_VERSION_MINOR);
    }

    int device_count(int &count, std::string &error) override {
        CHECK(hipGetDeviceCount(&count));
        return 0;
    }
    int current_device(int &device, std::string &error) override {
        CHECK(hipGetDevice(&device));
        return 0;
    }
    int set_device(int device, std::string &error) override {
        CHECK(hipSetDevice(device));
        return 0;
    }

    int pointer_device(const void *ptr, int &device, bool &is_device, std::string &error) override {
        hipPointerAttribute_t attr{};
        CHECK(hipPointerGetAttributes(&attr, ptr));
#if HIP_VERSION_MAJOR >= 6
        is_device = attr.type == hipMemoryTypeDevice;
#else
        is_device = attr.memoryType == hipMemoryTypeDevice;
#endif
        device = attr.device;
        return 0;
    }

    int allocation_range(const void *ptr, uintptr_t &base, size_t &size, std::string &error) override {
        hipDeviceptr_t b = nullptr;
        CHECK(hipMemGetAddressRange(&b, &size, const_cast<void *>(ptr)));
        base = reinterpret_cast<uintptr_t>(b);
        return 0;
    }

    int ipc_export(void *base, IpcHandle &handle, std::string &error) override {
        hipIpcMemHandle_t h;
        CHECK(hipIpcGetMemHandle(&h, base));
        static_assert(sizeof h == kIpcHandleBytes);
        memcpy(handle.bytes, &h, sizeof h);
        return 0;
    }
    int ipc_open(const IpcHandle &handle, void *&mapped, std::string &error) override {
        hipIpcMemHandle_t h;
        memcpy(&h, handle.bytes, sizeof h);
        CHECK(hipIpcOpenMemHandle(&mapped, h, hipIpcMemLazyEnablePeerAccess));
        return 0;
    }
    int ipc_close(void *mapped, std::string &error) override {
        CHECK(hipIpcCloseMemHandle(mapped));
        return 0;
    }

    int enable_peer_access(int device, int peer, std::string &error) override {
        int can = 0;
        CHECK(hipDeviceCanAccessPeer(&can, device, peer));
        if (!can) {
            error = "HIP device " + std::to_string(device) + " cannot access device " + std::to_string(peer) +
                    " (no P2P path)";
            return -ENOTSUP;
        }
        CHECK(hipSetDevice(device));
        hipError_t rc = hipDeviceEnablePeerAccess(peer, 0);
        if (rc == hipErrorPeerAccessAlreadyEnabled) {
            (void)hipGetLastError();  // sticky: clear it, it is not a failure
            return 0;
        }
        if (rc != hipSuccess) return fail(rc, "hipDeviceEnablePeerAccess", error);
        return 0;
    }

    int stream_create(Stream &stream, std::string &error) override {
        hipStream_t s;
        CHECK(hipStreamCreateWithFlags(&s, hipStreamNonBlocking));
        stream = s;
        return 0;
    }
    void stream_destroy(Stream stream) override { (void)hipStreamDestroy(static_cast<hipStream_t>(stream)); }
    int event_create(Event &event, std::string &error) override {
        hipEvent_t e;
        CHECK(hipEventCreateWithFlags(&e, hipEventDisableTiming));
        event = e;
        return 0;
    }
    void event_destroy(Event event) override { (void)hipEventDestroy(static_cast<hipEvent_t>(event)); }
    int event_record(Event event, Stream stream, std::string &error) override {
        CHECK(hipEventRecord(static_cast<hipEvent_t>(event), static_cast<hipStream_t>(stream)));
        return 0;
    }
    int event_query(Event event, std::string &error) override {
        hipError_t rc = hipEventQuery(static_cast<hipEvent_t>(event));
        if (rc == hipSuccess) return 1;
        if (rc == hipErrorNotReady) return 0;
        return fail(rc, "hipEventQuery", error);
    }
    int event_wait(Event event, std::string &error) override {
        CHECK(hipEventSynchronize(static_cast<hipEvent_t>(event)));
        return 0;
    }
    int copy_async(void *dst, const void *src, size_t bytes, Stream stream, std::string &error) override {
        CHECK(hipMemcpyAsync(dst, src, bytes, hipMemcpyDefault, static_cast<hipStream_t>(stream)));
        return 0;
    }
    int stream_wait(Stream stream, std::string &error) override {
        CHECK(hipStreamSynchronize(static_cast<hipStream_t>(stream)));
        return 0;
    }
    bool has_copy_batch() override {
        // FERRY_GPU_IPC_BATCH_COPY=0: copy op by op (to compare, or to step around a runtime bug).
        const char *env = getenv("FERRY_GPU_IPC_BATCH_COPY");
        return hip_api().hipMemcpyBatchAsync && !(env && strcmp(env, "0") == 0);
    }
    int copy_batch(void *const *dsts, const void *const *srcs, const size_t *sizes, size_t n, Stream stream,
                   std::string &error) override {
        if (!has_copy_batch()) return Runtime::copy_batch(dsts, srcs, sizes, n, stream, error);
        dsts_.assign(dsts, dsts + n);
        srcs_.clear();
        for (size_t i = 0; i < n; ++i) srcs_.push_back(const_cast<void *>(srcs[i]));
        sizes_.assign(sizes, sizes + n);
        HipMemcpyAttributes attr{};
        attr.src_access_order = 1;  // sources read in stream order
        size_t attr_idx = 0, fail_idx = 0;
        CHECK(hip_api().hipMemcpyBatchAsync(dsts_.data(), srcs_.data(), sizes_.data(), n, &attr, &attr_idx, 1,
                                            &fail_idx, static_cast<hipStream_t>(stream)));
        return 0;
    }

private:
    // Scratch for the runtime's arrays; copy_batch runs under the transport's lock.
    std::vector<void *> dsts_, srcs_;
    std::vector<size_t> sizes_;
};

}  // namespace

std::unique_ptr<Runtime> make_runtime() { return std::make_unique<HipRuntime>(); }

}  // namespace ferry_gpu
