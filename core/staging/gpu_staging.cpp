#include "staging/gpu_staging.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "ferry/engine.hpp"
#include "loader/runtime_probe.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

template <class Fn>
bool resolve(void *lib, const char *name, Fn &fn, std::string &why) {
    fn = reinterpret_cast<Fn>(dlsym(lib, name));
    if (!fn) why = std::string("missing symbol ") + name;
    return fn != nullptr;
}

// CUDA through the driver API: stable across CUDA majors, so no cudart is needed here.
class CudaStager final : public GpuStager {
public:
    static std::unique_ptr<GpuStager> open(std::string &why) {
        const char *name = cuda_driver_library();
        void *lib = dlopen(name, RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *e = dlerror();
            why = cat("no NVIDIA driver: ", e ? e : cat(name, " not found"));
            return nullptr;
        }
        auto s = std::unique_ptr<CudaStager>(new CudaStager(lib));
        if (!resolve(lib, "cuInit", s->init_, why) || !resolve(lib, "cuDeviceGet", s->device_get_, why) ||
            !resolve(lib, "cuDevicePrimaryCtxRetain", s->retain_, why) ||
            !resolve(lib, "cuCtxPushCurrent_v2", s->push_, why) || !resolve(lib, "cuCtxPopCurrent_v2", s->pop_, why) ||
            !resolve(lib, "cuMemHostAlloc", s->host_alloc_, why) ||
            !resolve(lib, "cuMemFreeHost", s->free_host_, why) ||
            !resolve(lib, "cuMemcpyAsync", s->memcpy_async_, why) ||
            !resolve(lib, "cuGetErrorString", s->error_string_, why) ||
            !resolve(lib, "cuStreamCreate", s->stream_create_, why) ||
            !resolve(lib, "cuStreamDestroy_v2", s->stream_destroy_, why) ||
            !resolve(lib, "cuEventCreate", s->event_create_, why) ||
            !resolve(lib, "cuEventRecord", s->event_record_, why) ||
            !resolve(lib, "cuEventSynchronize", s->event_sync_, why) ||
            !resolve(lib, "cuEventDestroy_v2", s->event_destroy_, why) ||
            !resolve(lib, "cuPointerGetAttribute", s->pointer_attribute_, why) ||
            !resolve(lib, "cuPointerGetAttributes", s->pointer_attributes_, why))
            return nullptr;
        // Only submit_on_stream needs these (CUDA 10+); staging works without them.
        s->launch_host_func_ = reinterpret_cast<decltype(s->launch_host_func_)>(dlsym(lib, "cuLaunchHostFunc"));
        s->stream_get_ctx_ = reinterpret_cast<decltype(s->stream_get_ctx_)>(dlsym(lib, "cuStreamGetCtx"));
        if (int rc = s->init_(0); rc != 0) {
            why = s->text(rc, "cuInit");
            return nullptr;
        }
        return s;
    }
    ~CudaStager() override {
        for (auto &[device, stream] : streams_) {
            Scope scope(*this, device);
            if (scope.ok) stream_destroy_(stream);
        }
        dlclose(lib_);
    }

    Result<void> check_device_memory(const void *ptr, size_t bytes, int device) override {
        unsigned type = 0;
        int ordinal = -1;
        uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
        for (uintptr_t q : {p, p + bytes - 1}) {  // both ends: a range must not run off the allocation
            if (pointer_attribute_(&type, kMemoryType, q) != 0 || type != kMemoryTypeDevice)
                return fail(-EINVAL, cat(hex(q), " is not CUDA device memory; register host memory as host"));
            if (pointer_attribute_(&ordinal, kDeviceOrdinal, q) != 0 || ordinal != device)
                return fail(-EINVAL, cat(hex(q), " is memory of CUDA device ", ordinal, ", not of device ", device));
        }
        return {};
    }

    std::optional<int> device_of(const void *ptr) override {
        // The plural call leaves zeros for memory CUDA does not know instead of failing.
        unsigned type = 0;
        int ordinal = -1;
        int attrs[] = {kMemoryType, kDeviceOrdinal};
        void *data[] = {&type, &ordinal};
        if (pointer_attributes_(2, attrs, data, reinterpret_cast<uintptr_t>(ptr)) != 0 || type != kMemoryTypeDevice)
            return std::nullopt;
        return ordinal;
    }

    Result<void *> alloc_pinned(int device, size_t bytes) override {
        Scope scope(*this, device);
        if (!scope.ok) return fail(-ENODEV, scope.error);
        void *p = nullptr;
        constexpr unsigned kPortable = 1;  // usable from every context, like cudaHostAllocPortable
        if (int rc = host_alloc_(&p, bytes, kPortable); rc != 0) return fail(-ENOMEM, text(rc, "cuMemHostAlloc"));
        return p;
    }
    void free_pinned(int device, void *ptr) override {
        Scope scope(*this, device);
        free_host_(ptr);
    }
    Result<void *> copy_async(int device, std::span<const CopyRange> copies) override {
        Scope scope(*this, device);
        if (!scope.ok) return fail(-ENODEV, scope.error);
        void *stream = stream_for(device);
        if (!stream) return fail(-ENODEV, scope.error.empty() ? "cuStreamCreate failed" : scope.error);
        for (const CopyRange &c : copies)
            if (int rc = memcpy_async_(c.dst, c.src, c.length, stream); rc != 0)
                return fail(-EIO, text(rc, "cuMemcpyAsync"));
        void *event = nullptr;
        constexpr unsigned kDisableTiming = 2;
        if (int rc = event_create_(&event, kDisableTiming); rc != 0) return fail(-EIO, text(rc, "cuEventCreate"));
        if (int rc = event_record_(event, stream); rc != 0) {
            event_destroy_(event);
            return fail(-EIO, text(rc, "cuEventRecord"));
        }
        return event;
    }
    Result<void> wait(int device, void *event) override {
        Scope scope(*this, device);
        int rc = event_sync_(event);
        event_destroy_(event);
        if (rc != 0) return fail(-EIO, text(rc, "copying between GPU and pinned memory"));
        return {};
    }

    Result<void> launch_host_func(void *stream, HostFn fn, void *user) override {
        if (!launch_host_func_ || !stream_get_ctx_)
            return fail(-ENOSYS,
                        cat("the CUDA driver ", cuda_driver_library(),
                            " has no cuLaunchHostFunc or cuStreamGetCtx; a driver of CUDA 10 or later has both"));
        // The stream's own context is made current for the call, so a thread that holds another
        // context (or none) can pass a stream created elsewhere; 0 and the per-thread default
        // stream mean the calling thread's current context.
        CUctx ctx = nullptr;
        if (int rc = stream_get_ctx_(stream, &ctx); rc != 0 || !ctx)
            return fail(-EINVAL,
                        cat(text(rc, "cuStreamGetCtx"), " for stream ", hex(reinterpret_cast<uintptr_t>(stream)),
                            ": pass a stream this process created, or make a CUDA context current on this "
                            "thread for the default stream (0)"));
        if (int rc = push_(ctx); rc != 0) return fail(-EINVAL, text(rc, "cuCtxPushCurrent"));
        int rc = launch_host_func_(stream, fn, user);
        CUctx popped;
        pop_(&popped);
        if (rc != 0) return fail(-EIO, text(rc, "cuLaunchHostFunc"));
        return {};
    }

private:
    using CUctx = void *;
    static constexpr int kMemoryType = 2, kDeviceOrdinal = 9;
    static constexpr unsigned kMemoryTypeDevice = 2;
    // Makes the device's primary context current for one call and restores the caller's.
    struct Scope {
        Scope(CudaStager &s, int device) : s_(s) {
            int dev = 0;
            CUctx ctx = nullptr;
            if (int rc = s.device_get_(&dev, device); rc != 0) {
                error = s.text(rc, "cuDeviceGet");
                return;
            }
            {
                std::lock_guard lock(s.mutex_);
                auto it = s.contexts_.find(dev);
                if (it == s.contexts_.end()) {  // retained once per device, kept for the stager's life
                    if (int rc = s.retain_(&ctx, dev); rc != 0) {
                        error = s.text(rc, "cuDevicePrimaryCtxRetain");
                        return;
                    }
                    it = s.contexts_.emplace(dev, ctx).first;
                }
                ctx = it->second;
            }
            ok = s.push_(ctx) == 0;
            if (!ok) error = "cuCtxPushCurrent failed";
        }
        ~Scope() {
            CUctx popped;
            if (ok) s_.pop_(&popped);
        }
        CudaStager &s_;
        bool ok = false;
        std::string error;
    };

    explicit CudaStager(void *lib) : lib_(lib) {}
    std::string text(int rc, const char *call) {
        const char *s = nullptr;
        if (error_string_) error_string_(rc, &s);
        return cat(call, ": ", s ? s : "unknown error", " (CUDA driver error ", rc, ")");
    }
    // One non-blocking stream per device, created with its context current.
    void *stream_for(int device) {
        std::lock_guard lock(mutex_);
        auto it = streams_.find(device);
        if (it != streams_.end()) return it->second;
        void *stream = nullptr;
        constexpr unsigned kNonBlocking = 1;
        if (stream_create_(&stream, kNonBlocking) != 0) return nullptr;
        streams_.emplace(device, stream);
        return stream;
    }

    void *lib_;
    std::mutex mutex_;
    std::map<int, CUctx> contexts_;
    std::map<int, void *> streams_;
    int (*init_)(unsigned) = nullptr;
    int (*device_get_)(int *, int) = nullptr;
    int (*retain_)(CUctx *, int) = nullptr;
    int (*push_)(CUctx) = nullptr;
    int (*pop_)(CUctx *) = nullptr;
    int (*host_alloc_)(void **, size_t, unsigned) = nullptr;
    int (*free_host_)(void *) = nullptr;
    int (*memcpy_async_)(uintptr_t, uintptr_t, size_t, void *) = nullptr;
    int (*stream_create_)(void **, unsigned) = nullptr;
    int (*stream_destroy_)(void *) = nullptr;
    int (*event_create_)(void **, unsigned) = nullptr;
    int (*event_record_)(void *, void *) = nullptr;
    int (*event_sync_)(void *) = nullptr;
    int (*event_destroy_)(void *) = nullptr;
    int (*error_string_)(int, const char **) = nullptr;
    int (*pointer_attribute_)(void *, int, uintptr_t) = nullptr;
    int (*pointer_attributes_)(unsigned, int *, void **, uintptr_t) = nullptr;
    int (*launch_host_func_)(void *, HostFn, void *) = nullptr;
    int (*stream_get_ctx_)(void *, CUctx *) = nullptr;
};

class HipStager final : public GpuStager {
public:
    static std::unique_ptr<GpuStager> open(std::string &why) {
        // The HIP runtime of the variant the plugin loader chose (the one hip_ipc.so links), so
        // the process never holds two HIP majors.
        // Without the amdgpu driver's /dev/kfd there is no HIP device memory to stage, and
        // loading HIP (and its LLVM) would cost every engine on such a host ~15 ms, as hip_ipc's
        // probe avoids. FERRY_TEST_KFD names another node, for tests with a fake runtime.
        const char *kfd_override = std::getenv("FERRY_TEST_KFD");
        std::string kfd = kfd_override && *kfd_override ? kfd_override : "/dev/kfd";
        if (::access(kfd.c_str(), F_OK) != 0) {
            why = "no HIP device: " + kfd + " does not exist (the amdgpu kernel driver is not loaded)";
            return nullptr;
        }
        InstalledRuntimes rt = probe_installed_runtimes();
        if (!rt.rocm_variant) {
            why = "no HIP runtime: " + rt.rocm_choice;
            return nullptr;
        }
        std::string name = cat("libamdhip64.so.", *rt.rocm_variant);
        void *lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *e = dlerror();
            why = cat("no HIP runtime: ", name, " (", rt.rocm_choice,
                      ") does not load: ", e ? e : "unknown dlopen error");
            return nullptr;
        }
        auto s = std::unique_ptr<HipStager>(new HipStager(lib, *rt.rocm_variant));
        if (!resolve(lib, "hipGetDevice", s->get_device_, why) || !resolve(lib, "hipSetDevice", s->set_device_, why) ||
            !resolve(lib, "hipHostMalloc", s->host_malloc_, why) || !resolve(lib, "hipHostFree", s->host_free_, why) ||
            !resolve(lib, "hipMemcpyAsync", s->memcpy_async_, why) ||
            !resolve(lib, "hipStreamCreateWithFlags", s->stream_create_, why) ||
            !resolve(lib, "hipStreamDestroy", s->stream_destroy_, why) ||
            !resolve(lib, "hipEventCreateWithFlags", s->event_create_, why) ||
            !resolve(lib, "hipEventRecord", s->event_record_, why) ||
            !resolve(lib, "hipEventSynchronize", s->event_sync_, why) ||
            !resolve(lib, "hipEventDestroy", s->event_destroy_, why) ||
            !resolve(lib, "hipPointerGetAttributes", s->pointer_attributes_, why) ||
            !resolve(lib, "hipGetErrorString", s->error_string_, why))
            return nullptr;
        return s;
    }
    ~HipStager() override {
        for (auto &[device, stream] : streams_) {
            Scope scope(*this, device);
            stream_destroy_(stream);
        }
        dlclose(lib_);
    }

    Result<void> check_device_memory(const void *, size_t, int) override {
        // hipPointerAttribute_t changed between ROCm 5 and 6; hip_ipc.so checks this with the
        // headers of its own ROCm, the stager trusts the registration.
        return {};
    }

    std::optional<int> device_of(const void *ptr) override {
        // hipPointerAttribute_t starts {memory type, int device} in ROCm 5 and 6 alike; the
        // type's values changed (ROCm 6: device 2, managed 3; ROCm 5: device 1, managed 4?).
        alignas(8) unsigned char attr[128] = {};
        if (pointer_attributes_(attr, ptr) != 0) return std::nullopt;
        int type, device;
        std::memcpy(&type, attr, sizeof type);
        std::memcpy(&device, attr + 4, sizeof device);
        bool on_device = major_ >= 6 ? (type == 2 || type == 3) : type == 1;
        if (!on_device) return std::nullopt;
        return device;
    }

    Result<void *> alloc_pinned(int device, size_t bytes) override {
        Scope scope(*this, device);
        void *p = nullptr;
        constexpr unsigned kPortable = 1;
        if (int rc = host_malloc_(&p, bytes, kPortable); rc != 0) return fail(-ENOMEM, text(rc, "hipHostMalloc"));
        return p;
    }
    void free_pinned(int device, void *ptr) override {
        Scope scope(*this, device);
        host_free_(ptr);
    }
    Result<void *> copy_async(int device, std::span<const CopyRange> copies) override {
        Scope scope(*this, device);
        void *stream = stream_for(device);
        if (!stream) return fail(-ENODEV, "hipStreamCreateWithFlags failed");
        constexpr int kHipMemcpyDefault = 4;
        for (const CopyRange &c : copies)
            if (int rc = memcpy_async_(reinterpret_cast<void *>(c.dst), reinterpret_cast<const void *>(c.src), c.length,
                                       kHipMemcpyDefault, stream);
                rc != 0)
                return fail(-EIO, text(rc, "hipMemcpyAsync"));
        void *event = nullptr;
        constexpr unsigned kDisableTiming = 2;
        if (int rc = event_create_(&event, kDisableTiming); rc != 0)
            return fail(-EIO, text(rc, "hipEventCreateWithFlags"));
        if (int rc = event_record_(event, stream); rc != 0) {
            event_destroy_(event);
            return fail(-EIO, text(rc, "hipEventRecord"));
        }
        return event;
    }
    Result<void> wait(int device, void *event) override {
        Scope scope(*this, device);
        int rc = event_sync_(event);
        event_destroy_(event);
        if (rc != 0) return fail(-EIO, text(rc, "copying between GPU and pinned memory"));
        return {};
    }
    Result<void> launch_host_func(void *, HostFn, void *) override {
        return fail(-ENOTSUP,
                    "ordering a batch on a HIP stream is not implemented; synchronise the stream, then submit");
    }

private:
    struct Scope {  // restores the caller's current device
        Scope(HipStager &s, int device) : s_(s) {
            ok = s.get_device_(&saved) == 0;
            s.set_device_(device);
        }
        ~Scope() {
            if (ok) s_.set_device_(saved);
        }
        HipStager &s_;
        int saved = 0;
        bool ok = false;
    };
    HipStager(void *lib, int major) : lib_(lib), major_(major) {}
    std::string text(int rc, const char *call) {
        const char *s = error_string_ ? error_string_(rc) : nullptr;
        return cat(call, ": ", s ? s : "unknown error", " (HIP error ", rc, ")");
    }
    void *stream_for(int device) {
        std::lock_guard lock(mutex_);
        auto it = streams_.find(device);
        if (it != streams_.end()) return it->second;
        void *stream = nullptr;
        constexpr unsigned kNonBlocking = 1;
        if (stream_create_(&stream, kNonBlocking) != 0) return nullptr;
        streams_.emplace(device, stream);
        return stream;
    }
    void *lib_;
    int major_;
    std::mutex mutex_;
    std::map<int, void *> streams_;
    int (*get_device_)(int *) = nullptr;
    int (*set_device_)(int) = nullptr;
    int (*host_malloc_)(void **, size_t, unsigned) = nullptr;
    int (*host_free_)(void *) = nullptr;
    int (*memcpy_async_)(void *, const void *, size_t, int, void *) = nullptr;
    int (*stream_create_)(void **, unsigned) = nullptr;
    int (*stream_destroy_)(void *) = nullptr;
    int (*event_create_)(void **, unsigned) = nullptr;
    int (*event_record_)(void *, void *) = nullptr;
    int (*event_sync_)(void *) = nullptr;
    int (*event_destroy_)(void *) = nullptr;
    int (*pointer_attributes_)(void *, const void *) = nullptr;
    const char *(*error_string_)(int) = nullptr;
};

}  // namespace

std::unique_ptr<GpuStager> GpuStager::open(uint32_t kind, std::string &why) {
    if (kind == static_cast<uint32_t>(MemoryKind::Cuda)) return CudaStager::open(why);
    if (kind == static_cast<uint32_t>(MemoryKind::Rocm)) return HipStager::open(why);
    why = "host memory needs no staging";
    return nullptr;
}

}  // namespace ferry
