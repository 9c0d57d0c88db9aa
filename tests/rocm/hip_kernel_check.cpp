// hip_ipc.so's run-time compile of its copy kernel, without a GPU: the plugin's own
// compile_copy_kernel (plugins/gpu_ipc/hip/hip_copy_kernel.cpp, built here against one ROCm
// major's headers) for each architecture given, and a look at what came out: an amdgcn ELF code
// object (e_machine EM_AMDGPU) for that processor and its features (e_flags), defining the kernel
// ferry_copy_table and its descriptor ferry_copy_table.kd.
//   hip_kernel_check_rocmN ARCH...   ARCH: must compile;  ARCH?: must compile, or be refused
//                                     cleanly as unknown to this compiler;  !ARCH: must be refused
// Ends with "N passed, N failed"; "SKIPPED: <reason>" and exit 77 when hipRTC cannot be opened.
#include <hip/hip_version.h>

#include <chrono>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <map>
#include <string>
#include <vector>

#include "gpu_runtime.hpp"
#include "hip_copy_kernel.hpp"

namespace {

constexpr uint16_t kEmAmdgpu = 224;
// EF_AMDGPU_MACH of the processors named in the tests (LLVM's ELF.h).
const std::map<std::string, unsigned> kMach = {
    {"gfx906", 0x2f},  {"gfx908", 0x30},  {"gfx90a", 0x3f},  {"gfx942", 0x4c},  {"gfx950", 0x4f},  {"gfx1030", 0x36},
    {"gfx1100", 0x41}, {"gfx1101", 0x46}, {"gfx1200", 0x48}, {"gfx1201", 0x4e}, {"gfx1250", 0x49},
};

template <typename T>
bool read(const std::vector<char> &b, size_t off, T &v) {
    if (off > b.size() || b.size() - off < sizeof v) return false;
    memcpy(&v, b.data() + off, sizeof v);
    return true;
}

// What is wrong with `code` as the copy kernel's code object for `arch`; empty when nothing.
std::string inspect(const std::vector<char> &code, const std::string &arch, std::string &info) {
    if (code.size() < 64 || memcmp(code.data(),
                                   "\x7f"
                                   "ELF",
                                   4) != 0)
        return "not an ELF file";
    if (code[4] != 2 || code[5] != 1) return "not a 64-bit little-endian ELF file";
    uint16_t type = 0, machine = 0, shentsize = 0, shnum = 0;
    uint32_t flags = 0;
    uint64_t shoff = 0;
    read(code, 16, type), read(code, 18, machine), read(code, 40, shoff), read(code, 48, flags);
    read(code, 58, shentsize), read(code, 60, shnum);
    char buf[160];
    snprintf(buf, sizeof buf, "%zu-byte ELF, e_type %u, e_machine %u, e_flags 0x%x, ABI version %d", code.size(), type,
             machine, flags, code[8]);
    info = buf;
    if (machine != kEmAmdgpu) return "e_machine " + std::to_string(machine) + ", not EM_AMDGPU (224)";
    if (type != 3) return "e_type " + std::to_string(type) + ", not ET_DYN (hipModuleLoadData loads shared objects)";
    const std::string proc = arch.substr(0, arch.find(':'));
    if (auto it = kMach.find(proc); it != kMach.end() && (flags & 0xff) != it->second) {
        snprintf(buf, sizeof buf, "EF_AMDGPU_MACH 0x%x, not %s's 0x%x", flags & 0xff, proc.c_str(), it->second);
        return buf;
    }
    // Features asked for in the target ID, in the code object v4+ flags.
    const struct {
        const char *feature;
        unsigned mask, on, off;
    } features[] = {{":xnack", 0x300, 0x300, 0x200}, {":sramecc", 0xc00, 0xc00, 0x800}};
    for (const auto &f : features) {
        size_t at = arch.find(f.feature);
        if (at == std::string::npos) continue;
        char sign = arch[at + strlen(f.feature)];
        unsigned want = sign == '+' ? f.on : f.off;
        if ((flags & f.mask) != want) {
            snprintf(buf, sizeof buf, "e_flags 0x%x: %s%c not set (want 0x%x under mask 0x%x)", flags, f.feature + 1,
                     sign, want, f.mask);
            return buf;
        }
    }
    // The symbol tables: the kernel and its descriptor, both defined.
    bool kernel = false, descriptor = false;
    for (uint16_t i = 0; i < shnum; ++i) {
        const size_t sh = shoff + size_t(i) * shentsize;
        uint32_t shtype = 0, link = 0;
        uint64_t off = 0, size = 0, entsize = 0;
        if (!read(code, sh + 4, shtype) || (shtype != 2 && shtype != 11)) continue;  // SYMTAB, DYNSYM
        read(code, sh + 24, off), read(code, sh + 32, size), read(code, sh + 40, link), read(code, sh + 56, entsize);
        uint64_t stroff = 0;
        if (!read(code, shoff + size_t(link) * shentsize + 24, stroff) || entsize < 24) continue;
        for (uint64_t s = off; s + 24 <= off + size && s + 24 <= code.size(); s += entsize) {
            uint32_t name = 0;
            uint16_t shndx = 0;
            uint8_t st_info = 0;
            read(code, s, name), read(code, s + 4, st_info), read(code, s + 6, shndx);
            if (shndx == 0 || stroff + name >= code.size()) continue;
            const char *n = code.data() + stroff + name;
            const size_t max = code.size() - (stroff + name);
            const std::string sym(n, strnlen(n, max));
            if (sym == ferry_gpu::kCopyKernelName && (st_info & 0xf) == 2) kernel = true;  // STT_FUNC
            if (sym == std::string(ferry_gpu::kCopyKernelName) + ".kd") descriptor = true;
        }
    }
    if (!kernel) return std::string("no function ") + ferry_gpu::kCopyKernelName + " defined";
    if (!descriptor) return std::string("no kernel descriptor ") + ferry_gpu::kCopyKernelName + ".kd";
    return "";
}

}  // namespace

int main(int argc, char **argv) {
    std::string error;
    if (!ferry_gpu::load_hiprtc(error)) {
        printf("SKIPPED: %s\n", error.c_str());
        return 77;
    }
    printf("ROCm %d.%d headers, hipRTC from %s\n", HIP_VERSION_MAJOR, HIP_VERSION_MINOR, ferry_gpu::hiprtc_soname());
    int passed = 0, failed = 0;
    for (int i = 1; i < argc; ++i) {
        std::string arch = argv[i];
        const bool refuse = arch[0] == '!', optional = arch.back() == '?';
        if (refuse) arch.erase(0, 1);
        if (optional) arch.pop_back();
        std::vector<char> code;
        const auto start = std::chrono::steady_clock::now();
        const int rc = ferry_gpu::compile_copy_kernel(arch, code, error);
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
        std::string problem, info;
        const bool unknown = rc != 0 && error.find("does not know") != std::string::npos;
        if (rc == 0) {
            problem = refuse ? "compiled, expected to be refused" : inspect(code, arch, info);
        } else if (!refuse && !(optional && unknown)) {
            problem = "compile failed (" + std::to_string(rc) + "): " + error;
        } else if (!unknown) {
            problem = "refused without naming the unknown architecture (" + std::to_string(rc) + "): " + error;
        }
        if (problem.empty()) {
            ++passed;
            printf("ok: %s: %s (%.2f s)\n", arch.c_str(), rc == 0 ? info.c_str() : ("refused: " + error).c_str(), s);
        } else {
            ++failed;
            printf("FAILED: %s: %s%s%s\n", arch.c_str(), problem.c_str(), info.empty() ? "" : "; ", info.c_str());
        }
    }
    printf("%d passed, %d failed\n", passed, failed);
    return failed ? 1 : 0;
}
