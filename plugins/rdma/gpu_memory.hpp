// GPU memory for rdma.so through dma-buf, resolved entirely at run time: the CUDA driver
// (libcuda.so.1: cuMemGetHandleForAddressRange) and the ROCm runtime (libhsa-runtime64.so.1:
// hsa_amd_portable_export_dmabuf) are dlopen'ed on first use, and ibv_reg_dmabuf_mr is looked up
// with dlvsym at IBVERBS_1.12, so the plugin builds and loads without either runtime and on
// rdma-core older than v34. Nothing here is chosen by compile flags.
#pragma once

#include <ferry/plugin.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>

struct ibv_pd;
struct ibv_mr;

namespace ferry_rdma {

// ---- dma-buf support of a NIC (pure classification, unit-tested) ----

enum class DmabufSupport { Supported, Unsupported, Unknown };

struct DmabufVerdict {
    DmabufSupport support = DmabufSupport::Unknown;
    std::string why;
};

// What ibv_reg_dmabuf_mr(pd, 0, 0, 0, fd = -1, 0) failing with `err` (errno) says about NIC
// `nic`, the check RCCL and NCCL make: the kernel looks the fd up only after it accepted the
// request, so EBADF means dma-buf registration is supported; EOPNOTSUPP / EPROTONOSUPPORT /
// ENOSYS mean the driver or kernel has none. A call that succeeded (err 0) is treated as
// unknown. `symbol_found` false: libibverbs has no ibv_reg_dmabuf_mr at all.
DmabufVerdict classify_dmabuf_probe(bool symbol_found, int err, const std::string &nic);

using RegDmabufMrFn = ibv_mr *(*)(ibv_pd *, uint64_t offset, size_t length, uint64_t iova, int fd, int access);
// ibv_reg_dmabuf_mr@IBVERBS_1.12 from the libibverbs this process loaded, or nullptr with *why.
RegDmabufMrFn resolve_reg_dmabuf_mr(std::string *why);

// The message for a dma-buf registration that failed with errno `err` on NIC `nic`: EFAULT and
// EINVAL mean the NIC driver could not map the GPU pages, and the text says the likely causes.
std::string describe_dmabuf_reg_failure(int err, const std::string &nic, uint32_t kind, int device, uint64_t addr,
                                        uint64_t len);

const char *kind_name(uint32_t kind);  // "host", "CUDA", "ROCm"

// ---- GPU runtimes ----

// One exported allocation: the dma-buf fd covers [base, base+size); offset is where base lies
// in the fd (ROCm may report a non-zero one). The fd is shared by every NIC's registration.
struct DmabufExport {
    int fd = -1;
    uint64_t base = 0, size = 0, offset = 0;
    int device = -1;
    std::string pci_bus_id;  // "0000:3b:00.0", lowercase; empty when unknown
};

class GpuRuntime {
public:
    virtual ~GpuRuntime() = default;
    virtual const char *name() const = 0;  // "CUDA" or "ROCm"
    // Loads the library and initialises. false with *why ("unavailable: CUDA driver not found: ...").
    virtual bool available(std::string *why) = 0;
    // Exports the allocation holding [addr, addr+len) as a dma-buf. The range must lie in one
    // allocation. Returns 0 or a negative errno with *why naming the call and the runtime's code.
    virtual int export_dmabuf(uint64_t addr, uint64_t len, int device, DmabufExport *out, std::string *why) = 0;
    virtual void close_dmabuf(int fd) = 0;
};

// library: dlopen name or path (options cuda_library / hsa_library).
std::unique_ptr<GpuRuntime> make_cuda_runtime(const std::string &library);
std::unique_ptr<GpuRuntime> make_rocm_runtime(const std::string &library);

}  // namespace ferry_rdma
