// libamdhip64, opened at run time instead of linked: loading it pulls in the HSA runtime and
// comgr's LLVM (~14 ms, and an abort in a process that already holds another LLVM), which a host
// without an AMD GPU should never pay just to be told "no /dev/kfd". The probe opens it after
// finding /dev/kfd; the rest of hip_runtime.cpp calls the HIP API by its usual names, which the
// macros below send through the table (only reached once the probe said available).
#pragma once

#include <dlfcn.h>
#include <hip/hip_runtime_api.h>
#include <hip/hip_version.h>

#include <string>

#define FERRY_HIP_STR2(x) #x
#define FERRY_HIP_STR(x) FERRY_HIP_STR2(x)

namespace ferry_gpu {

// clang-format cannot settle on a layout for an X-macro list.
// clang-format off
#define FERRY_HIP_FUNCTIONS(X)                                                                         \
    X(hipDeviceCanAccessPeer) X(hipDeviceEnablePeerAccess)                                             \
    X(hipEventCreateWithFlags) X(hipEventDestroy) X(hipEventQuery) X(hipEventRecord)                   \
    X(hipEventSynchronize) X(hipGetDevice) X(hipGetDeviceCount) X(hipGetErrorString)                   \
    X(hipGetLastError) X(hipIpcCloseMemHandle) X(hipIpcGetMemHandle) X(hipIpcOpenMemHandle)            \
    X(hipMemGetAddressRange) X(hipMemcpyAsync) X(hipPointerGetAttributes) X(hipSetDevice)              \
    X(hipStreamCreateWithFlags) X(hipStreamDestroy) X(hipStreamSynchronize)
// clang-format on

// The copy kernel's calls (hip_runtime.cpp's copy_kernel_*), looked up apart from the ones above:
// a libamdhip64 without one of them still loads, and the transport copies op by op.
// clang-format off
#define FERRY_HIP_KERNEL_FUNCTIONS(X)                                                                  \
    X(hipFree) X(hipHostFree) X(hipModuleGetFunction) X(hipModuleLaunchKernel) X(hipModuleLoadData)    \
    X(hipModuleUnload)
// clang-format on

// hipGetDeviceProperties is a macro for hipGetDevicePropertiesR0600 in ROCm 6+ headers (and
// hipDeviceProp_t one for hipDeviceProp_tR0600): the library keeps the plain name for the
// smaller ROCm 5 struct, so the name looked up is the one the macro gives with these headers.
using HipGetDeviceProperties = hipError_t (*)(hipDeviceProp_t *prop, int device);
inline constexpr const char *kHipGetDevicePropertiesName = FERRY_HIP_STR(hipGetDeviceProperties);

// hipMemcpyBatchAsync's copy attributes (ROCm 7+; laid out as CUDA's CUmemcpyAttributes). The
// headers a plugin is built with may predate it, so it is declared here and looked up optionally.
struct HipMemcpyAttributes {
    int src_access_order;  // hipMemcpySrcAccessOrderStream = 1
    int src_loc_type, src_loc_id;
    int dst_loc_type, dst_loc_id;
    unsigned flags;
};
using HipMemcpyBatchAsync = hipError_t (*)(void **dsts, void **srcs, size_t *sizes, size_t count,
                                           HipMemcpyAttributes *attrs, size_t *attr_idxs, size_t num_attrs,
                                           size_t *fail_idx, hipStream_t stream);

struct HipApi {
#define FERRY_HIP_MEMBER(name) decltype(&::name) name = nullptr;
    FERRY_HIP_FUNCTIONS(FERRY_HIP_MEMBER)
#undef FERRY_HIP_MEMBER
    HipMemcpyBatchAsync hipMemcpyBatchAsync = nullptr;  // null where this libamdhip64 has none
    // The copy kernel's calls: null where this libamdhip64 lacks them. hipMalloc and
    // hipHostMalloc are spelled out: the headers overload them with templates in C++.
#define FERRY_HIP_MEMBER(name) decltype(&::name) name = nullptr;
    FERRY_HIP_KERNEL_FUNCTIONS(FERRY_HIP_MEMBER)
#undef FERRY_HIP_MEMBER
    hipError_t (*hipMalloc)(void **ptr, size_t size) = nullptr;
    hipError_t (*hipHostMalloc)(void **ptr, size_t size, unsigned int flags) = nullptr;
    HipGetDeviceProperties get_device_properties = nullptr;
    // Once loaded: the first copy kernel call this libamdhip64 lacks, or null when it has them all.
    const char *kernel_missing = nullptr;
};

inline HipApi &hip_api() {
    static HipApi api;
    return api;
}

// Opens libamdhip64.so.<the major these headers are> once, for the life of the process (HIP is
// not made to be unloaded). False with the loader's words in `error` when it cannot.
inline bool load_hip(std::string &error) {
    static std::string failure;
    static const bool loaded = [] {
        // A literal given to dlopen as it is: tests/rocm/check_sonames.py reads it from the binary.
        static constexpr const char *kSoname = "libamdhip64.so." FERRY_HIP_STR(HIP_VERSION_MAJOR);
        const std::string soname = kSoname;
        void *lib = dlopen(kSoname, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (!lib) {
            const char *e = dlerror();
            failure = e ? e : soname + ": dlopen failed";
            return false;
        }
        HipApi &api = hip_api();
#define FERRY_HIP_LOAD(name)                                                     \
    if (!(api.name = reinterpret_cast<decltype(api.name)>(dlsym(lib, #name)))) { \
        failure = soname + " has no " #name;                                     \
        return false;                                                            \
    }
        FERRY_HIP_FUNCTIONS(FERRY_HIP_LOAD)
#undef FERRY_HIP_LOAD
        api.hipMemcpyBatchAsync = reinterpret_cast<HipMemcpyBatchAsync>(dlsym(lib, "hipMemcpyBatchAsync"));
        api.kernel_missing = nullptr;
#define FERRY_HIP_LOAD_OPTIONAL(member, symbol)                                                            \
    if (!(api.member = reinterpret_cast<decltype(api.member)>(dlsym(lib, symbol))) && !api.kernel_missing) \
        api.kernel_missing = symbol;
#define FERRY_HIP_LOAD_KERNEL(name) FERRY_HIP_LOAD_OPTIONAL(name, #name)
        FERRY_HIP_KERNEL_FUNCTIONS(FERRY_HIP_LOAD_KERNEL)
        FERRY_HIP_LOAD_OPTIONAL(hipMalloc, "hipMalloc")
        FERRY_HIP_LOAD_OPTIONAL(hipHostMalloc, "hipHostMalloc")
        FERRY_HIP_LOAD_OPTIONAL(get_device_properties, kHipGetDevicePropertiesName)
#undef FERRY_HIP_LOAD_KERNEL
#undef FERRY_HIP_LOAD_OPTIONAL
        return true;
    }();
    if (!loaded) error = failure;
    return loaded;
}

}  // namespace ferry_gpu

// The HIP API by its usual names, through the table.
#define hipDeviceCanAccessPeer(...) ::ferry_gpu::hip_api().hipDeviceCanAccessPeer(__VA_ARGS__)
#define hipDeviceEnablePeerAccess(...) ::ferry_gpu::hip_api().hipDeviceEnablePeerAccess(__VA_ARGS__)
#define hipEventCreateWithFlags(...) ::ferry_gpu::hip_api().hipEventCreateWithFlags(__VA_ARGS__)
#define hipEventDestroy(...) ::ferry_gpu::hip_api().hipEventDestroy(__VA_ARGS__)
#define hipEventQuery(...) ::ferry_gpu::hip_api().hipEventQuery(__VA_ARGS__)
#define hipEventRecord(...) ::ferry_gpu::hip_api().hipEventRecord(__VA_ARGS__)
#define hipEventSynchronize(...) ::ferry_gpu::hip_api().hipEventSynchronize(__VA_ARGS__)
#define hipGetDevice(...) ::ferry_gpu::hip_api().hipGetDevice(__VA_ARGS__)
#define hipGetDeviceCount(...) ::ferry_gpu::hip_api().hipGetDeviceCount(__VA_ARGS__)
#define hipGetErrorString(...) ::ferry_gpu::hip_api().hipGetErrorString(__VA_ARGS__)
#define hipGetLastError(...) ::ferry_gpu::hip_api().hipGetLastError(__VA_ARGS__)
#define hipIpcCloseMemHandle(...) ::ferry_gpu::hip_api().hipIpcCloseMemHandle(__VA_ARGS__)
#define hipIpcGetMemHandle(...) ::ferry_gpu::hip_api().hipIpcGetMemHandle(__VA_ARGS__)
#define hipIpcOpenMemHandle(...) ::ferry_gpu::hip_api().hipIpcOpenMemHandle(__VA_ARGS__)
#define hipMemGetAddressRange(...) ::ferry_gpu::hip_api().hipMemGetAddressRange(__VA_ARGS__)
#define hipMemcpyAsync(...) ::ferry_gpu::hip_api().hipMemcpyAsync(__VA_ARGS__)
#define hipPointerGetAttributes(...) ::ferry_gpu::hip_api().hipPointerGetAttributes(__VA_ARGS__)
#define hipSetDevice(...) ::ferry_gpu::hip_api().hipSetDevice(__VA_ARGS__)
#define hipStreamCreateWithFlags(...) ::ferry_gpu::hip_api().hipStreamCreateWithFlags(__VA_ARGS__)
#define hipStreamDestroy(...) ::ferry_gpu::hip_api().hipStreamDestroy(__VA_ARGS__)
#define hipStreamSynchronize(...) ::ferry_gpu::hip_api().hipStreamSynchronize(__VA_ARGS__)
// The copy kernel's: callable once hip_api().kernel_missing is null (hip_runtime.cpp checks).
#define hipFree(...) ::ferry_gpu::hip_api().hipFree(__VA_ARGS__)
#define hipHostFree(...) ::ferry_gpu::hip_api().hipHostFree(__VA_ARGS__)
#define hipHostMalloc(...) ::ferry_gpu::hip_api().hipHostMalloc(__VA_ARGS__)
#define hipMalloc(...) ::ferry_gpu::hip_api().hipMalloc(__VA_ARGS__)
#define hipModuleGetFunction(...) ::ferry_gpu::hip_api().hipModuleGetFunction(__VA_ARGS__)
#define hipModuleLaunchKernel(...) ::ferry_gpu::hip_api().hipModuleLaunchKernel(__VA_ARGS__)
#define hipModuleLoadData(...) ::ferry_gpu::hip_api().hipModuleLoadData(__VA_ARGS__)
#define hipModuleUnload(...) ::ferry_gpu::hip_api().hipModuleUnload(__VA_ARGS__)
