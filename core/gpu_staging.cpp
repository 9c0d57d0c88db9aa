#include "gpu_staging.hpp"

#include <dlfcn.h>

#include <cerrno>
#include <map>
#include <mutex>

#include "log.hpp"
#include "runtime_probe.hpp"

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
        void *lib = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *e = dlerror();
            why = std::string("no NVIDIA driver: ") + (e ? e : "libcuda.so.1 not found");
            return nullptr;
        }
        auto s = std::unique_ptr<CudaStager>(new CudaStager(lib));
        if (!resolve(lib, "cuInit", s->init_, why) || !resolve(lib, "cuDeviceGet", s->device_get_, why) ||
            !resolve(lib, "cuDevicePrimaryCtxRetain", s->retain_, why) ||
            !resolve(lib, "cuCtxPushCurrent_v2", s->push_, why) || !resolve(lib, "cuCtxPopCurrent_v2", s->pop_, why) ||
            !resolve(lib, "cuMemAllocHost_v2", s->alloc_host_, why) || !resolve(lib, "cuMemFreeHost", s->free_host_, why) ||
            !resolve(lib, "cuMemcpy", s->memcpy_, why) || !resolve(lib, "cuGetErrorString", s->error_string_, why) ||
            !resolve(lib, "cuPointerGetAttribute", s->pointer_attribute_, why))
            return nullptr;
        if (int rc = s->init_(0); rc != 0) {
            why = s->text(rc, "cuInit");
            return nullptr;
        }
        return s;
    }
    ~CudaStager() override { dlclose(lib_); }

    Result<void> check_device_memory(const void *ptr, size_t bytes, int device) override {
        constexpr int kMemoryType = 2, kDeviceOrdinal = 9, kMemoryTypeDevice = 2;
        unsigned type = 0;
        int ordinal = -1;
        uintptr_t p = reinterpret_cast<uintptr_t>(ptr);
        for (uintptr_t q : {p, p + bytes - 1}) { // both ends: a range must not run off the allocation
            if (pointer_attribute_(&type, kMemoryType, q) != 0 || type != kMemoryTypeDevice)
                return fail(-EINVAL, cat(hex(q), " is not CUDA device memory; register host memory as host"));
            if (pointer_attribute_(&ordinal, kDeviceOrdinal, q) != 0 || ordinal != device)
                return fail(-EINVAL, cat(hex(q), " is memory of CUDA device ", ordinal, ", not of device ", device));
        }
        return {};
    }

    Result<void *> alloc_pinned(int device, size_t bytes) override {
        Scope scope(*this, device);
        if (!scope.ok) return fail(-ENODEV, scope.error);
        void *p = nullptr;
        if (int rc = alloc_host_(&p, bytes); rc != 0) return fail(-ENOMEM, text(rc, "cuMemAllocHost"));
        return p;
    }
    void free_pinned(int device, void *ptr) override {
        Scope scope(*this, device);
        free_host_(ptr);
    }
    Result<void> copy(int device, void *dst, const void *src, size_t bytes) override {
        Scope scope(*this, device);
        if (!scope.ok) return fail(-ENODEV, scope.error);
        if (int rc = memcpy_(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), bytes); rc != 0)
            return fail(-EIO, text(rc, "cuMemcpy"));
        return {};
    }

private:
    using CUctx = void *;
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
                if (it == s.contexts_.end()) { // retained once per device, kept for the stager's life
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

    void *lib_;
    std::mutex mutex_;
    std::map<int, CUctx> contexts_;
    int (*init_)(unsigned) = nullptr;
    int (*device_get_)(int *, int) = nullptr;
    int (*retain_)(CUctx *, int) = nullptr;
    int (*push_)(CUctx) = nullptr;
    int (*pop_)(CUctx *) = nullptr;
    int (*alloc_host_)(void **, size_t) = nullptr;
    int (*free_host_)(void *) = nullptr;
    int (*memcpy_)(uintptr_t, uintptr_t, size_t) = nullptr;
    int (*error_string_)(int, const char **) = nullptr;
    int (*pointer_attribute_)(void *, int, uintptr_t) = nullptr;
};

class HipStager final : public GpuStager {
public:
    static std::unique_ptr<GpuStager> open(std::string &why) {
        // The HIP runtime of the variant the plugin loader chose (the one hip_ipc.so links), so
        // the process never holds two HIP majors.
        InstalledRuntimes rt = probe_installed_runtimes();
        if (!rt.rocm_variant) {
            why = "no HIP runtime: " + rt.rocm_choice;
            return nullptr;
        }
        std::string name = cat("libamdhip64.so.", *rt.rocm_variant);
        void *lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            const char *e = dlerror();
            why = cat("no HIP runtime: ", name, " (", rt.rocm_choice, ") does not load: ", e ? e : "unknown dlopen error");
            return nullptr;
        }
        auto s = std::unique_ptr<HipStager>(new HipStager(lib));
        if (!resolve(lib, "hipGetDevice", s->get_device_, why) || !resolve(lib, "hipSetDevice", s->set_device_, why) ||
            !resolve(lib, "hipHostMalloc", s->host_malloc_, why) || !resolve(lib, "hipHostFree", s->host_free_, why) ||
            !resolve(lib, "hipMemcpy", s->memcpy_, why) || !resolve(lib, "hipGetErrorString", s->error_string_, why))
            return nullptr;
        return s;
    }
    ~HipStager() override { dlclose(lib_); }

    Result<void> check_device_memory(const void *, size_t, int) override {
        // hipPointerAttribute_t changed layout between ROCm 5 and 6; hip_ipc.so checks this
        // with the headers of its own ROCm, the stager trusts the registration.
        return {};
    }

    Result<void *> alloc_pinned(int device, size_t bytes) override {
        Scope scope(*this, device);
        void *p = nullptr;
        if (int rc = host_malloc_(&p, bytes, 0); rc != 0) return fail(-ENOMEM, text(rc, "hipHostMalloc"));
        return p;
    }
    void free_pinned(int device, void *ptr) override {
        Scope scope(*this, device);
        host_free_(ptr);
    }
    Result<void> copy(int device, void *dst, const void *src, size_t bytes) override {
        Scope scope(*this, device);
        constexpr int kHipMemcpyDefault = 4;
        if (int rc = memcpy_(dst, src, bytes, kHipMemcpyDefault); rc != 0) return fail(-EIO, text(rc, "hipMemcpy"));
        return {};
    }

private:
    struct Scope { // restores the caller's current device
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
    explicit HipStager(void *lib) : lib_(lib) {}
    std::string text(int rc, const char *call) {
        const char *s = error_string_ ? error_string_(rc) : nullptr;
        return cat(call, ": ", s ? s : "unknown error", " (HIP error ", rc, ")");
    }
    void *lib_;
    int (*get_device_)(int *) = nullptr;
    int (*set_device_)(int) = nullptr;
    int (*host_malloc_)(void **, size_t, unsigned) = nullptr;
    int (*host_free_)(void *) = nullptr;
    int (*memcpy_)(void *, const void *, size_t, int) = nullptr;
    const char *(*error_string_)(int) = nullptr;
};

} // namespace

std::unique_ptr<GpuStager> GpuStager::open(uint32_t kind, std::string &why) {
    if (kind == static_cast<uint32_t>(MemoryKind::Cuda)) return CudaStager::open(why);
    if (kind == static_cast<uint32_t>(MemoryKind::Rocm)) return HipStager::open(why);
    why = "host memory needs no staging";
    return nullptr;
}

} // namespace ferry
