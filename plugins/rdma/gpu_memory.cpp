#include "gpu_memory.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>

namespace ferry_rdma {

namespace {

std::string err_text(int e) {
    char buf[128];
    return strerror_r(e, buf, sizeof buf);
}

std::string hex(uint64_t v) {
    char buf[32];
    snprintf(buf, sizeof buf, "0x%llx", static_cast<unsigned long long>(v));
    return buf;
}

std::string dl_error(const char *fallback) {
    const char *e = dlerror();
    return e != nullptr ? e : fallback;
}

constexpr uint64_t kPage = 4096;

}  // namespace

const char *kind_name(uint32_t kind) {
    switch (kind) {
        case FERRY_MEM_CUDA: return "CUDA";
        case FERRY_MEM_ROCM: return "ROCm";
        default: return "host";
    }
}

DmabufVerdict classify_dmabuf_probe(bool symbol_found, int err, const std::string &nic) {
    if (!symbol_found)
        return {DmabufSupport::Unsupported,
                "libibverbs has no ibv_reg_dmabuf_mr@IBVERBS_1.12 (rdma-core older than v34): GPU memory cannot be "
                "registered on " +
                    nic};
    switch (err) {
        case EBADF:
            return {DmabufSupport::Supported,
                    nic + " accepts dma-buf registrations (ibv_reg_dmabuf_mr with fd -1: EBADF)"};
        case EOPNOTSUPP:
        case EPROTONOSUPPORT:
        case ENOSYS:
            return {DmabufSupport::Unsupported,
                    nic + ": ibv_reg_dmabuf_mr is not supported by its driver or the kernel (" + err_text(err) +
                        "); dma-buf needs Linux >= 5.12 and a driver with dma-buf MRs (mlx5, efa, irdma, bnxt_re)"};
        case 0: return {DmabufSupport::Unknown, nic + ": ibv_reg_dmabuf_mr with fd -1 unexpectedly succeeded"};
        default:
            return {DmabufSupport::Unknown, nic + ": ibv_reg_dmabuf_mr with fd -1 failed with " + err_text(err) +
                                                " (expected EBADF when supported)"};
    }
}

RegDmabufMrFn resolve_reg_dmabuf_mr(std::string *why) {
    void *lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_NOLOAD);
    if (lib == nullptr) lib = dlopen("libibverbs.so.1", RTLD_NOW | RTLD_LOCAL);
    if (lib == nullptr) {
        if (why) *why = "libibverbs.so.1: " + dl_error("not found");
        return nullptr;
    }
    void *sym = dlvsym(lib, "ibv_reg_dmabuf_mr", "IBVERBS_1.12");
    // The handle stays open: the symbol is used for the process's lifetime.
    if (sym == nullptr) {
        if (why) *why = "libibverbs.so.1 has no ibv_reg_dmabuf_mr@IBVERBS_1.12 (rdma-core older than v34)";
        return nullptr;
    }
    return reinterpret_cast<RegDmabufMrFn>(sym);
}

std::string describe_dmabuf_reg_failure(int err, const std::string &nic, uint32_t kind, int device, uint64_t addr,
                                        uint64_t len) {
    std::string what = std::string(kind_name(kind)) + " memory of device " + std::to_string(device) + " at " +
                       hex(addr) + " (" + std::to_string(len) + " bytes)";
    std::string head = "ibv_reg_dmabuf_mr on " + nic + " failed for " + what + ": " + err_text(err);
    if (err == EFAULT || err == EINVAL)
        return head +
               "; the NIC driver could not map the GPU pages. Likely causes: the NIC and GPU cannot do PCIe "
               "peer-to-peer (IOMMU in translated mode, or ACS redirecting peer traffic: check the BIOS and "
               "iommu=pt), the GPU driver exports no dma-buf for this memory (NVIDIA needs the open kernel "
               "modules, ROCm needs amdgpu with dma-buf), or the range is not device memory";
    if (err == EOPNOTSUPP || err == EPROTONOSUPPORT)
        return head + "; this NIC's driver has no dma-buf registration (mlx5, efa, irdma and bnxt_re have)";
    if (err == ENOMEM)
        return head + "; the NIC ran out of translation resources or the locked-memory limit (ulimit -l) is too low";
    return head;
}

// ---- CUDA driver ----

namespace {

using CUresult = int;
using CUdevice = int;
using CUdeviceptr = unsigned long long;
using CUcontext = void *;
constexpr int kPtrAttrContext = 1;       // CU_POINTER_ATTRIBUTE_CONTEXT
constexpr int kPtrAttrMemoryType = 2;    // CU_POINTER_ATTRIBUTE_MEMORY_TYPE
constexpr int kPtrAttrOrdinal = 9;       // CU_POINTER_ATTRIBUTE_DEVICE_ORDINAL
constexpr int kPtrAttrRangeStart = 11;   // CU_POINTER_ATTRIBUTE_RANGE_START_ADDR
constexpr int kPtrAttrRangeSize = 12;    // CU_POINTER_ATTRIBUTE_RANGE_SIZE
constexpr unsigned kMemTypeDevice = 2;   // CU_MEMORYTYPE_DEVICE
constexpr int kDevAttrDmabuf = 124;      // CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED
constexpr int kRangeHandleDmabufFd = 1;  // CU_MEM_RANGE_HANDLE_TYPE_DMA_BUF_FD

class CudaRuntime final : public GpuRuntime {
public:
    explicit CudaRuntime(std::string library) : library_(std::move(library)) {}
    ~CudaRuntime() override = default;  // the driver stays loaded: unloading CUDA mid-process is unsafe

    const char *name() const override { return "CUDA"; }

    bool available(std::string *why) override {
        std::lock_guard lock(mu_);
        if (!tried_) load();
        if (!ok_ && why) *why = error_;
        return ok_;
    }

    int export_dmabuf(uint64_t addr, uint64_t len, int device, DmabufExport *out, std::string *why) override {
        if (!available(why)) return -ENOTSUP;
        unsigned mem_type = 0;
        if (int rc = get_attr_(&mem_type, kPtrAttrMemoryType, addr); rc != 0 || mem_type != kMemTypeDevice)
            return fail(why, -EINVAL, rc, "cuPointerGetAttribute(MEMORY_TYPE)",
                        hex(addr) + " is not CUDA device memory");
        CUcontext ctx = nullptr;
        CUdeviceptr base = 0;
        size_t size = 0;
        int ordinal = -1;
        if (int rc = get_attr_(&ctx, kPtrAttrContext, addr); rc != 0)
            return fail(why, -EIO, rc, "cuPointerGetAttribute(CONTEXT)", "");
        if (int rc = get_attr_(&ordinal, kPtrAttrOrdinal, addr); rc != 0)
            return fail(why, -EIO, rc, "cuPointerGetAttribute(DEVICE_ORDINAL)", "");
        if (device >= 0 && ordinal != device)
            return fail(why, -EINVAL, 0, "",
                        hex(addr) + " is memory of CUDA device " + std::to_string(ordinal) + ", registered as device " +
                            std::to_string(device));
        if (int rc = get_attr_(&base, kPtrAttrRangeStart, addr); rc != 0)
            return fail(why, -EIO, rc, "cuPointerGetAttribute(RANGE_START_ADDR)", "");
        if (int rc = get_attr_(&size, kPtrAttrRangeSize, addr); rc != 0)
            return fail(why, -EIO, rc, "cuPointerGetAttribute(RANGE_SIZE)", "");
        if (addr + len > base + size)
            return fail(why, -EINVAL, 0, "",
                        "the range spans several CUDA allocations (the one at " + hex(base) + " has " +
                            std::to_string(size) + " bytes): register each allocation separately");
        CUdevice dev = 0;
        int supported = 0;
        if (int rc = device_get_(&dev, ordinal); rc != 0) return fail(why, -EIO, rc, "cuDeviceGet", "");
        if (int rc = dev_attr_(&supported, kDevAttrDmabuf, dev); rc != 0 || supported == 0)
            return fail(why, -ENOTSUP, rc, "cuDeviceGetAttribute(DMA_BUF_SUPPORTED)",
                        "CUDA device " + std::to_string(ordinal) +
                            " cannot export dma-buf (needs CUDA >= 11.7 and the open "
                            "kernel modules on Linux >= 5.12)");
        // Whole pages: cuMemGetHandleForAddressRange rejects unaligned ranges.
        uint64_t aligned = base & ~(kPage - 1), end = (base + size + kPage - 1) & ~(kPage - 1);
        int fd = -1;
        if (ctx_push_ != nullptr) ctx_push_(ctx);
        int rc = get_handle_(&fd, aligned, end - aligned, kRangeHandleDmabufFd, 0);
        if (ctx_pop_ != nullptr) {
            CUcontext dummy = nullptr;
            ctx_pop_(&dummy);
        }
        if (rc != 0) return fail(why, -EIO, rc, "cuMemGetHandleForAddressRange(DMA_BUF_FD)", "");
        char bus[64] = {};
        DmabufExport e;
        e.fd = fd;
        e.base = aligned;
        e.size = end - aligned;
        e.offset = 0;
        e.device = ordinal;
        if (bus_id_ != nullptr && bus_id_(bus, sizeof bus, dev) == 0)
            for (char *p = bus; *p; ++p) e.pci_bus_id += static_cast<char>(tolower(static_cast<unsigned char>(*p)));
        *out = e;
        return 0;
    }

    void close_dmabuf(int fd) override {
        if (fd >= 0) close(fd);
    }

private:
    int fail(std::string *why, int code, int rc, const std::string &call, const std::string &text) {
        if (why) {
            std::string s = text;
            if (!call.empty()) {
                const char *msg = nullptr;
                if (error_string_ != nullptr) error_string_(rc, &msg);
                std::string c = call + " failed: " + (msg ? msg : "CUDA error") + " (" + std::to_string(rc) + ")";
                s = s.empty() ? c : s + " (" + c + ")";
            }
            *why = s;
        }
        return code;
    }

    template <class F>
    bool sym(F &f, const char *n) {
        f = reinterpret_cast<F>(dlsym(lib_, n));
        return f != nullptr;
    }

    void load() {
        tried_ = true;
        lib_ = dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (lib_ == nullptr) {
            error_ = "unavailable: CUDA driver not found (" + library_ + "): " + dl_error("dlopen failed");
            return;
        }
        using Init = CUresult (*)(unsigned);
        Init init = nullptr;
        if (!sym(init, "cuInit") || !sym(get_attr_, "cuPointerGetAttribute") || !sym(device_get_, "cuDeviceGet") ||
            !sym(dev_attr_, "cuDeviceGetAttribute")) {
            error_ = "unavailable: " + library_ + " lacks the CUDA driver API (cuInit, cuPointerGetAttribute)";
            return;
        }
        if (!sym(get_handle_, "cuMemGetHandleForAddressRange")) {
            error_ = "unavailable: the CUDA driver in " + library_ +
                     " has no cuMemGetHandleForAddressRange (dma-buf export needs a CUDA 11.7 or newer driver)";
            return;
        }
        sym(error_string_, "cuGetErrorString");
        sym(bus_id_, "cuDeviceGetPCIBusId");
        sym(ctx_push_, "cuCtxPushCurrent_v2");
        sym(ctx_pop_, "cuCtxPopCurrent_v2");
        if (int rc = init(0); rc != 0) {
            const char *msg = nullptr;
            if (error_string_) error_string_(rc, &msg);
            error_ = "unavailable: cuInit failed: " + std::string(msg ? msg : "CUDA error") + " (" +
                     std::to_string(rc) + ")";
            return;
        }
        ok_ = true;
    }

    std::string library_;
    std::mutex mu_;
    bool tried_ = false, ok_ = false;
    std::string error_;
    void *lib_ = nullptr;
    CUresult (*get_attr_)(void *, int, CUdeviceptr) = nullptr;
    CUresult (*device_get_)(CUdevice *, int) = nullptr;
    CUresult (*dev_attr_)(int *, int, CUdevice) = nullptr;
    CUresult (*get_handle_)(void *, CUdeviceptr, size_t, int, unsigned long long) = nullptr;
    CUresult (*error_string_)(CUresult, const char **) = nullptr;
    CUresult (*bus_id_)(char *, int, CUdevice) = nullptr;
    CUresult (*ctx_push_)(CUcontext) = nullptr;
    CUresult (*ctx_pop_)(CUcontext *) = nullptr;
};

// ---- ROCm (HSA runtime) ----

using hsa_status = int;
struct HsaAgent {
    uint64_t handle;
};
// hsa_amd_pointer_info_t up to agentOwner: the runtime fills what it knows and sets size.
struct HsaPointerInfo {
    uint32_t size;
    int type;
    void *agent_base;
    void *host_base;
    size_t size_in_bytes;
    void *user_data;
    HsaAgent agent_owner;
};
constexpr int kHsaPointerTypeUnknown = 0;
constexpr int kHsaPointerTypeLocked = 2;  // host memory locked for the GPU: not device memory
constexpr int kHsaAgentInfoBdfid = 0xA006;
constexpr int kHsaAgentInfoDomain = 0xA00F;

class RocmRuntime final : public GpuRuntime {
public:
    explicit RocmRuntime(std::string library) : library_(std::move(library)) {}
    const char *name() const override { return "ROCm"; }

    bool available(std::string *why) override {
        std::lock_guard lock(mu_);
        if (!tried_) load();
        if (!ok_ && why) *why = error_;
        return ok_;
    }

    int export_dmabuf(uint64_t addr, uint64_t len, int device, DmabufExport *out, std::string *why) override {
        if (!available(why)) return -ENOTSUP;
        HsaPointerInfo info{};
        info.size = sizeof info;
        if (int rc = pointer_info_(reinterpret_cast<void *>(addr), &info, nullptr, nullptr, nullptr); rc != 0)
            return fail(why, -EIO, rc, "hsa_amd_pointer_info", "");
        if (info.type == kHsaPointerTypeUnknown || info.type == kHsaPointerTypeLocked)
            return fail(why, -EINVAL, 0, "", hex(addr) + " is not ROCm device memory");
        uint64_t base = reinterpret_cast<uint64_t>(info.agent_base);
        if (addr < base || addr + len > base + info.size_in_bytes)
            return fail(why, -EINVAL, 0, "",
                        "the range spans several ROCm allocations (the one at " + hex(base) + " has " +
                            std::to_string(info.size_in_bytes) + " bytes): register each allocation separately");
        int fd = -1;
        uint64_t offset = 0;
        if (int rc = export_(info.agent_base, info.size_in_bytes, &fd, &offset); rc != 0)
            return fail(why, rc == 0x1001 /* HSA_STATUS_ERROR_INVALID_ARGUMENT */ ? -EINVAL : -EIO, rc,
                        "hsa_amd_portable_export_dmabuf", "");
        DmabufExport e;
        e.fd = fd;
        e.base = base;
        e.size = info.size_in_bytes;
        e.offset = offset;
        e.device = device;
        uint32_t bdf = 0, domain = 0;
        if (agent_info_ != nullptr && agent_info_(info.agent_owner, kHsaAgentInfoBdfid, &bdf) == 0) {
            agent_info_(info.agent_owner, kHsaAgentInfoDomain, &domain);
            char bus[32];
            snprintf(bus, sizeof bus, "%04x:%02x:%02x.%x", domain, (bdf >> 8) & 0xff, (bdf >> 3) & 0x1f, bdf & 7);
            e.pci_bus_id = bus;
        }
        *out = e;
        return 0;
    }

    void close_dmabuf(int fd) override {
        if (fd < 0) return;
        if (close_ != nullptr && close_(fd) == 0) return;
        close(fd);
    }

private:
    int fail(std::string *why, int code, int rc, const std::string &call, const std::string &text) {
        if (why) {
            std::string s = text;
            if (!call.empty()) {
                const char *msg = nullptr;
                if (status_string_ != nullptr) status_string_(rc, &msg);
                std::string c =
                    call + " failed: " + (msg ? msg : "HSA error") + " (" + hex(static_cast<uint32_t>(rc)) + ")";
                s = s.empty() ? c : s + " (" + c + ")";
            }
            *why = s;
        }
        return code;
    }

    template <class F>
    bool sym(F &f, const char *n) {
        f = reinterpret_cast<F>(dlsym(lib_, n));
        return f != nullptr;
    }

    void load() {
        tried_ = true;
        lib_ = dlopen(library_.c_str(), RTLD_NOW | RTLD_LOCAL);
        if (lib_ == nullptr) {
            error_ = "unavailable: ROCm runtime not found (" + library_ + "): " + dl_error("dlopen failed");
            return;
        }
        using Init = hsa_status (*)();
        Init init = nullptr;
        if (!sym(init, "hsa_init") || !sym(pointer_info_, "hsa_amd_pointer_info")) {
            error_ = "unavailable: " + library_ + " lacks hsa_init / hsa_amd_pointer_info";
            return;
        }
        if (!sym(export_, "hsa_amd_portable_export_dmabuf")) {
            error_ = "unavailable: the ROCm runtime in " + library_ +
                     " has no hsa_amd_portable_export_dmabuf (dma-buf export needs ROCm 5.6 or newer)";
            return;
        }
        sym(close_, "hsa_amd_portable_close_dmabuf");
        sym(agent_info_, "hsa_agent_get_info");
        sym(status_string_, "hsa_status_string");
        if (int rc = init(); rc != 0) {
            const char *msg = nullptr;
            if (status_string_) status_string_(rc, &msg);
            error_ = "unavailable: hsa_init failed: " + std::string(msg ? msg : "HSA error") + " (" +
                     hex(static_cast<uint32_t>(rc)) + "): no usable AMD GPU";
            return;
        }
        ok_ = true;
    }

    std::string library_;
    std::mutex mu_;
    bool tried_ = false, ok_ = false;
    std::string error_;
    void *lib_ = nullptr;
    hsa_status (*pointer_info_)(void *, HsaPointerInfo *, void *(*)(size_t), uint32_t *, HsaAgent **) = nullptr;
    hsa_status (*export_)(const void *, size_t, int *, uint64_t *) = nullptr;
    hsa_status (*close_)(int) = nullptr;
    hsa_status (*agent_info_)(HsaAgent, int, void *) = nullptr;
    hsa_status (*status_string_)(hsa_status, const char **) = nullptr;
};

}  // namespace

std::unique_ptr<GpuRuntime> make_cuda_runtime(const std::string &library) {
    return std::make_unique<CudaRuntime>(library);
}
std::unique_ptr<GpuRuntime> make_rocm_runtime(const std::string &library) {
    return std::make_unique<RocmRuntime>(library);
}

}  // namespace ferry_rdma
