// The HIP side of the batch copy kernel: hipRTC compiles the kernel's source (copy_kernel.cu,
// carried in hip_ipc.so as text) for one GPU architecture at run time. hipRTC is opened with
// dlopen like libamdhip64 (hip_loader.hpp), never linked: a host without it still loads the
// plugin, which then copies op by op. hip_runtime.cpp loads the result on a device;
// tests/rocm/hip_kernel_check.cpp compiles for a list of architectures with no GPU at all.
#pragma once

#include <string>
#include <vector>

namespace ferry_gpu {

// copy_kernel.cu's text (plugins/gpu_ipc/embed_text.py writes its definition at build time).
extern const char kCopyKernelSource[];

// The library hipRTC is opened from for the HIP major these headers are: libhiprtc.so.N from
// ROCm 6 on, libamdhip64.so.5 in ROCm 5 (which carries hipRTC inside).
const char *hiprtc_soname();

// Opens hipRTC once, for the life of the process. False with the loader's words and what to
// install in `error`, e.g. "no hipRTC: libhiprtc.so.6: cannot open shared object file: ...;
// install libhiprtc6 ...".
bool load_hiprtc(std::string &error);

// Compiles the copy kernel for `arch`, a target ID as hipDeviceProp_t.gcnArchName gives it
// ("gfx942:sramecc+:xnack-") or a bare processor ("gfx90a"), into an amdgcn code object for
// hipModuleLoadData. 0, or a negative errno with the call and the reason in `error` (the
// compile log when the compiler failed). An architecture hipRTC's compiler (comgr) does not
// list is refused before compiling: hipRTC 5.2 and 6.4 abort the process on one.
int compile_copy_kernel(const std::string &arch, std::vector<char> &code, std::string &error);

// compile_copy_kernel once per architecture for the life of the process, failures included;
// `code` stays valid until exit.
int copy_kernel_code(const std::string &arch, const std::vector<char> *&code, std::string &error);

}  // namespace ferry_gpu
