// HIP backend of the GPU IPC runtime interface, host code only: g++ with
// -D__HIP_PLATFORM_AMD__ compiles it against the HIP headers, no hipcc needed.
#include <sys/stat.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <vector>

#include "ferry/plugin.h"
#include "gpu_runtime.hpp"
#include "hip_copy_kernel.hpp"
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
    ~HipRuntime() override {
        for (auto &[device, k] : kernels_)
            if (k.module) (void)hipModuleUnload(k.module);
    }

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

    // The copy kernel: hipRTC compiles copy_kernel.cu for the device's architecture (once per
    // architecture per process: hip_copy_kernel.cpp), loaded as a module once per device. A
    // failure is kept too, so a device without the kernel is not compiled for again.
    int copy_kernel_load(int device, std::string &error) override {
        std::lock_guard<std::mutex> lock(kernel_mu_);
        auto [it, added] = kernels_.try_emplace(device);
        Kernel &k = it->second;
        if (added) k.rc = load_kernel(device, k, k.error);
        if (k.rc != 0) error = k.error;
        return k.rc;
    }
    int table_alloc(size_t bytes, void *&host, void *&device_table, std::string &error) override {
        host = device_table = nullptr;
        if (int rc = kernel_api(error); rc != 0) return rc;
        CHECK(hipHostMalloc(&host, bytes, 0));
        hipError_t rc = hipMalloc(&device_table, bytes);
        if (rc != hipSuccess) {
            (void)hipHostFree(host);
            host = device_table = nullptr;
            return fail(rc, "hipMalloc", error);
        }
        return 0;
    }
    void table_free(void *host, void *device_table) override {
        if (device_table) (void)hipFree(device_table);
        if (host) (void)hipHostFree(host);
    }
    int copy_kernel_launch(int device, const void *table, uint32_t n, uint64_t chunks, uint32_t blocks, Stream stream,
                           std::string &error) override {
        hipFunction_t fn = nullptr;
        {
            std::lock_guard<std::mutex> lock(kernel_mu_);
            auto it = kernels_.find(device);
            if (it != kernels_.end() && it->second.rc == 0) fn = it->second.fn;
        }
        if (!fn) {
            error = "hipModuleLaunchKernel: the copy kernel is not loaded on device " + std::to_string(device);
            return -EINVAL;
        }
        // The kernel's parameters: (const CopyOp *table, unsigned n, unsigned long long chunks).
        const void *table_arg = table;
        unsigned n_arg = n;
        unsigned long long chunks_arg = chunks;
        void *args[] = {&table_arg, &n_arg, &chunks_arg};
        hipError_t rc = hipModuleLaunchKernel(fn, blocks, 1, 1, kCopyKernelThreads, 1, 1, 0,
                                              static_cast<hipStream_t>(stream), args, nullptr);
        if (rc == hipSuccess) return 0;
        const std::string call = std::string("hipModuleLaunchKernel(") + kCopyKernelName + ", " +
                                 std::to_string(blocks) + " blocks, " + std::to_string(n) + " ops)";
        return fail(rc, call.c_str(), error);
    }

private:
    struct Kernel {
        int rc = 0;
        std::string error;
        hipModule_t module = nullptr;
        hipFunction_t fn = nullptr;
    };

    // 0 when HIP is loaded with every call the copy kernel needs.
    static int kernel_api(std::string &error) {
        if (!load_hip(error)) return -ENOSYS;
        if (const char *missing = hip_api().kernel_missing) {
            error = std::string("libamdhip64.so." FERRY_HIP_STR(HIP_VERSION_MAJOR) " has no ") + missing;
            return -ENOSYS;
        }
        return 0;
    }

    int load_kernel(int device, Kernel &k, std::string &error) {
        if (int rc = kernel_api(error); rc != 0) return rc;
        hipDeviceProp_t prop{};
        if (hipError_t rc = hip_api().get_device_properties(&prop, device); rc != hipSuccess)
            return fail(rc, kHipGetDevicePropertiesName, error);
        const std::string arch(prop.gcnArchName, strnlen(prop.gcnArchName, sizeof prop.gcnArchName));
        const std::vector<char> *code = nullptr;
        if (int rc = copy_kernel_code(arch, code, error); rc != 0) return rc;
        // The module goes to the current device: make it `device` for the load, then put it back.
        int previous = 0;
        CHECK(hipGetDevice(&previous));
        if (previous != device) CHECK(hipSetDevice(device));
        int rc = 0;
        hipError_t hrc = hipModuleLoadData(&k.module, code->data());
        if (hrc != hipSuccess) {
            k.module = nullptr;
            rc = fail(hrc, ("hipModuleLoadData(" + arch + " code object)").c_str(), error);
        } else if ((hrc = hipModuleGetFunction(&k.fn, k.module, kCopyKernelName)) != hipSuccess) {
            rc = fail(hrc, ("hipModuleGetFunction(" + std::string(kCopyKernelName) + ")").c_str(), error);
            (void)hipModuleUnload(k.module);
            k.module = nullptr;
            k.fn = nullptr;
        }
        if (previous != device) {
            hrc = hipSetDevice(previous);
            if (hrc != hipSuccess && rc == 0) rc = fail(hrc, "hipSetDevice (back)", error);
        }
        return rc;
    }

    // Scratch for the runtime's arrays; copy_batch runs under the transport's lock.
    std::vector<void *> dsts_, srcs_;
    std::vector<size_t> sizes_;
    std::mutex kernel_mu_;
    std::map<int, Kernel> kernels_;  // by device
};

}  // namespace

std::unique_ptr<Runtime> make_runtime() { return std::make_unique<HipRuntime>(); }

}  // namespace ferry_gpu
