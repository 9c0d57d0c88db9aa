// GpuRuntime over the CUDA driver API or HIP, both dlopen'ed: the bench links no GPU library.
// The driver API, not cudart: it is stable across CUDA majors and comes with the driver, so a
// host that can run a GPU has it.
#include <dlfcn.h>

#include <cerrno>
#include <cstdlib>
#include <map>
#include <mutex>
#include <string>

#include "bench_memory.hpp"

namespace bench {
namespace {

// dlopen's failure as "<name>: why" (its text names the file already, most of the time).
std::string dl_error(const std::string &name) {
    const char *e = dlerror();
    std::string text = e ? e : "does not load";
    return text.find(name) == std::string::npos ? name + ": " + text : text;
}

// The first of `names` the library exports (the _v2 entry points first, as CUDA's headers
// #define them), or nullptr.
template <class Fn>
Fn symbol(void *lib, std::initializer_list<const char *> names) {
    for (const char *n : names)
        if (void *s = dlsym(lib, n)) return reinterpret_cast<Fn>(s);
    return nullptr;
}

class Cuda final : public GpuRuntime {
public:
    static std::unique_ptr<GpuRuntime> open(std::string &why) {
        // FERRY_LIBCUDA: another driver library (CI's fake one), the variable the core reads too.
        const char *env = std::getenv("FERRY_LIBCUDA");
        std::string name = env && *env ? env : "libcuda.so.1";
        void *lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            why = dl_error(name);
            return nullptr;
        }
        std::unique_ptr<Cuda> c(new Cuda(lib));
        c->error_string_ = symbol<int (*)(int, const char **)>(lib, {"cuGetErrorString"});
        c->release_ = symbol<int (*)(int)>(lib, {"cuDevicePrimaryCtxRelease_v2", "cuDevicePrimaryCtxRelease"});
        c->count_ = symbol<int (*)(int *)>(lib, {"cuDeviceGetCount"});
        std::string missing;
        auto need = [&](auto &fn, std::initializer_list<const char *> names) {
            fn = symbol<std::remove_reference_t<decltype(fn)>>(lib, names);
            if (!fn && missing.empty()) missing = *names.begin();
        };
        need(c->init_, {"cuInit"});
        need(c->device_get_, {"cuDeviceGet"});
        need(c->retain_, {"cuDevicePrimaryCtxRetain"});
        need(c->push_, {"cuCtxPushCurrent_v2", "cuCtxPushCurrent"});
        need(c->pop_, {"cuCtxPopCurrent_v2", "cuCtxPopCurrent"});
        need(c->alloc_, {"cuMemAlloc_v2", "cuMemAlloc"});
        need(c->free_, {"cuMemFree_v2", "cuMemFree"});
        c->htod_ = symbol<decltype(c->htod_)>(lib, {"cuMemcpyHtoD_v2", "cuMemcpyHtoD"});
        c->dtoh_ = symbol<decltype(c->dtoh_)>(lib, {"cuMemcpyDtoH_v2", "cuMemcpyDtoH"});
        if (!c->htod_ || !c->dtoh_) need(c->memcpy_, {"cuMemcpy"});  // unified addressing does either
        if (!missing.empty()) {
            why = name + ": has no " + missing;
            return nullptr;
        }
        if (int rc = c->init_(0); rc != 0) {
            why = name + ": " + c->text(rc, "cuInit");
            return nullptr;
        }
        if (c->count_) {
            if (int rc = c->count_(&c->devices_); rc != 0) {
                why = name + ": " + c->text(rc, "cuDeviceGetCount");
                return nullptr;
            }
            if (c->devices_ == 0) {
                why = name + ": no CUDA device";
                return nullptr;
            }
        }
        return c;
    }
    ~Cuda() override {
        for (auto &[dev, ctx] : contexts_)
            if (release_) release_(dev);
        dlclose(lib_);
    }

    ferry::MemoryKind kind() const override { return ferry::MemoryKind::Cuda; }
    int device_count() const override { return devices_; }

    ferry::Result<void *> alloc(int device, uint64_t bytes) override {
        Scope s(*this, device);
        if (!s.ok) return ferry::fail(-ENODEV, s.error);
        uint64_t p = 0;
        if (int rc = alloc_(&p, bytes); rc != 0)
            return ferry::fail(-ENOMEM, "cannot allocate " + std::to_string(bytes) + " bytes on CUDA device " +
                                            std::to_string(device) + ": " + text(rc, "cuMemAlloc") +
                                            "; lower --buffer_size");
        return reinterpret_cast<void *>(p);
    }
    void free(int device, void *ptr) override {
        Scope s(*this, device);
        if (s.ok) free_(reinterpret_cast<uintptr_t>(ptr));
    }
    ferry::Result<void> to_device(int device, void *dst, const void *src, uint64_t bytes) override {
        Scope s(*this, device);
        if (!s.ok) return ferry::fail(-ENODEV, s.error);
        int rc = htod_ ? htod_(reinterpret_cast<uintptr_t>(dst), src, bytes)
                       : memcpy_(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), bytes);
        if (rc != 0) return ferry::fail(-EIO, text(rc, htod_ ? "cuMemcpyHtoD" : "cuMemcpy"));
        return {};
    }
    ferry::Result<void> to_host(int device, void *dst, const void *src, uint64_t bytes) override {
        Scope s(*this, device);
        if (!s.ok) return ferry::fail(-ENODEV, s.error);
        int rc = dtoh_ ? dtoh_(dst, reinterpret_cast<uintptr_t>(src), bytes)
                       : memcpy_(reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), bytes);
        if (rc != 0) return ferry::fail(-EIO, text(rc, dtoh_ ? "cuMemcpyDtoH" : "cuMemcpy"));
        return {};
    }

private:
    using Ctx = void *;
    // The device's primary context current for one call; the caller's restored after it.
    struct Scope {
        Scope(Cuda &c, int device) : c_(c) {
            int dev = 0;
            if (int rc = c.device_get_(&dev, device); rc != 0) {
                error = c.text(rc, "cuDeviceGet(" + std::to_string(device) + ")");
                return;
            }
            Ctx ctx = nullptr;
            {
                std::lock_guard lock(c.mutex_);
                auto it = c.contexts_.find(dev);
                if (it == c.contexts_.end()) {  // retained once per device, released with the runtime
                    if (int rc = c.retain_(&ctx, dev); rc != 0) {
                        error = c.text(rc, "cuDevicePrimaryCtxRetain");
                        return;
                    }
                    it = c.contexts_.emplace(dev, ctx).first;
                }
                ctx = it->second;
            }
            if (int rc = c.push_(ctx); rc != 0) error = c.text(rc, "cuCtxPushCurrent");
            else ok = true;
        }
        ~Scope() {
            Ctx popped;
            if (ok) c_.pop_(&popped);
        }
        Cuda &c_;
        bool ok = false;
        std::string error;
    };

    explicit Cuda(void *lib) : lib_(lib) {}
    std::string text(int rc, const std::string &call) const {
        const char *s = nullptr;
        if (error_string_) error_string_(rc, &s);
        return call + ": " + (s ? s : "error") + " (CUDA error " + std::to_string(rc) + ")";
    }

    void *lib_;
    int devices_ = -1;  // -1: the library cannot say (no cuDeviceGetCount)
    std::mutex mutex_;
    std::map<int, Ctx> contexts_;
    int (*init_)(unsigned) = nullptr;
    int (*count_)(int *) = nullptr;
    int (*device_get_)(int *, int) = nullptr;
    int (*retain_)(Ctx *, int) = nullptr;
    int (*release_)(int) = nullptr;
    int (*push_)(Ctx) = nullptr;
    int (*pop_)(Ctx *) = nullptr;
    int (*alloc_)(uint64_t *, size_t) = nullptr;
    int (*free_)(uint64_t) = nullptr;
    int (*htod_)(uint64_t, const void *, size_t) = nullptr;
    int (*dtoh_)(void *, uint64_t, size_t) = nullptr;
    int (*memcpy_)(uint64_t, uint64_t, size_t) = nullptr;
    int (*error_string_)(int, const char **) = nullptr;
};

// "value" of `"key":"value"` in the engine's plugin report (JSON it writes without spaces), or
// empty when the key is absent or null.
std::string json_string(const std::string &json, const std::string &key) {
    auto at = json.find("\"" + key + "\":\"");
    if (at == std::string::npos) return {};
    at += key.size() + 4;
    std::string out;
    for (; at < json.size() && json[at] != '"'; ++at) {
        if (json[at] == '\\' && at + 1 < json.size()) ++at;
        out += json[at];
    }
    return out;
}

class Hip final : public GpuRuntime {
public:
    static std::unique_ptr<GpuRuntime> open(std::string &why) {
        // The libamdhip64.so.N of the ROCm variant the engine's loader chose, so this process
        // never holds two HIP majors (their LLVMs abort each other).
        std::string report = ferry::describe_plugins().json;
        std::string variant = json_string(report, "rocm_variant");
        if (variant.rfind("rocm", 0) != 0) {
            std::string choice = json_string(report, "rocm_choice");
            why = "libamdhip64: " + (choice.empty() ? std::string("no ROCm variant found") : choice);
            return nullptr;
        }
        std::string name = "libamdhip64.so." + variant.substr(4);
        void *lib = dlopen(name.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (!lib) {
            why = dl_error(name);
            return nullptr;
        }
        std::unique_ptr<Hip> h(new Hip(lib));
        h->error_string_ = symbol<const char *(*)(int)>(lib, {"hipGetErrorString"});
        std::string missing;
        auto need = [&](auto &fn, const char *n) {
            fn = symbol<std::remove_reference_t<decltype(fn)>>(lib, {n});
            if (!fn && missing.empty()) missing = n;
        };
        need(h->count_, "hipGetDeviceCount");
        need(h->get_device_, "hipGetDevice");
        need(h->set_device_, "hipSetDevice");
        need(h->malloc_, "hipMalloc");
        need(h->free_, "hipFree");
        need(h->memcpy_, "hipMemcpy");
        if (!missing.empty()) {
            why = name + ": has no " + missing;
            return nullptr;
        }
        if (int rc = h->count_(&h->devices_); rc != 0 || h->devices_ == 0) {
            why = name + ": " + (rc ? h->text(rc, "hipGetDeviceCount") : "no HIP device");
            return nullptr;
        }
        return h;
    }
    ~Hip() override { dlclose(lib_); }

    ferry::MemoryKind kind() const override { return ferry::MemoryKind::Rocm; }
    int device_count() const override { return devices_; }

    ferry::Result<void *> alloc(int device, uint64_t bytes) override {
        Scope s(*this, device);
        if (!s.error.empty()) return ferry::fail(-ENODEV, s.error);
        void *p = nullptr;
        if (int rc = malloc_(&p, bytes); rc != 0)
            return ferry::fail(-ENOMEM, "cannot allocate " + std::to_string(bytes) + " bytes on HIP device " +
                                            std::to_string(device) + ": " + text(rc, "hipMalloc") +
                                            "; lower --buffer_size");
        return p;
    }
    void free(int device, void *ptr) override {
        Scope s(*this, device);
        free_(ptr);
    }
    ferry::Result<void> to_device(int device, void *dst, const void *src, uint64_t bytes) override {
        return copy(device, dst, src, bytes, kHostToDevice);
    }
    ferry::Result<void> to_host(int device, void *dst, const void *src, uint64_t bytes) override {
        return copy(device, dst, src, bytes, kDeviceToHost);
    }

private:
    static constexpr int kHostToDevice = 1, kDeviceToHost = 2;  // hipMemcpyKind
    struct Scope {  // `device` current for one call; the caller's restored after it
        Scope(Hip &h, int device) : h_(h) {
            restore = h.get_device_(&saved) == 0;
            if (int rc = h.set_device_(device); rc != 0)
                error = h.text(rc, "hipSetDevice(" + std::to_string(device) + ")");
        }
        ~Scope() {
            if (restore) h_.set_device_(saved);
        }
        Hip &h_;
        int saved = 0;
        bool restore = false;
        std::string error;
    };
    ferry::Result<void> copy(int device, void *dst, const void *src, uint64_t bytes, int kind) {
        Scope s(*this, device);
        if (!s.error.empty()) return ferry::fail(-ENODEV, s.error);
        if (int rc = memcpy_(dst, src, bytes, kind); rc != 0) return ferry::fail(-EIO, text(rc, "hipMemcpy"));
        return {};
    }
    explicit Hip(void *lib) : lib_(lib) {}
    std::string text(int rc, const std::string &call) const {
        const char *s = error_string_ ? error_string_(rc) : nullptr;
        return call + ": " + (s ? s : "error") + " (HIP error " + std::to_string(rc) + ")";
    }

    void *lib_;
    int devices_ = 0;
    int (*count_)(int *) = nullptr;
    int (*get_device_)(int *) = nullptr;
    int (*set_device_)(int) = nullptr;
    int (*malloc_)(void **, size_t) = nullptr;
    int (*free_)(void *) = nullptr;
    int (*memcpy_)(void *, const void *, size_t, int) = nullptr;
    const char *(*error_string_)(int) = nullptr;
};

}  // namespace

std::unique_ptr<GpuRuntime> GpuRuntime::open(std::string &why) {
    std::string cuda_why, hip_why;
    if (auto c = Cuda::open(cuda_why)) return c;
    if (auto h = Hip::open(hip_why)) return h;
    why = cuda_why + "; " + hip_why;
    return nullptr;
}

}  // namespace bench
