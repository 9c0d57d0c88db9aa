// hipRTC for the copy kernel: opened at run time, asked which architectures its compiler
// knows, then given copy_kernel.cu's text and one --offload-arch. Host code only, like
// hip_runtime.cpp: g++ with -D__HIP_PLATFORM_AMD__ against the HIP headers of one ROCm major.
#include "hip_copy_kernel.hpp"

#include <dlfcn.h>
#include <fcntl.h>
#include <hip/hip_version.h>
#include <hip/hiprtc.h>
#include <link.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <map>
#include <mutex>
#include <string_view>

#define FERRY_HIPRTC_STR2(x) #x
#define FERRY_HIPRTC_STR(x) FERRY_HIPRTC_STR2(x)

namespace ferry_gpu {
namespace {

// clang-format off
#define FERRY_HIPRTC_FUNCTIONS(X)                                                              \
    X(hiprtcCreateProgram) X(hiprtcCompileProgram) X(hiprtcDestroyProgram)                     \
    X(hiprtcGetProgramLogSize) X(hiprtcGetProgramLog) X(hiprtcGetCodeSize) X(hiprtcGetCode)    \
    X(hiprtcGetErrorString)
// clang-format on

struct HiprtcApi {
#define FERRY_HIPRTC_MEMBER(name) decltype(&::name) name = nullptr;
    FERRY_HIPRTC_FUNCTIONS(FERRY_HIPRTC_MEMBER)
#undef FERRY_HIPRTC_MEMBER
};

HiprtcApi &rtc() {
    static HiprtcApi api;
    return api;
}

// A literal given to dlopen as it is (tests/rocm/check_sonames.py reads the sonames from the binary).
#if HIP_VERSION_MAJOR >= 6
constexpr const char *kHiprtcSoname = "libhiprtc.so." FERRY_HIPRTC_STR(HIP_VERSION_MAJOR);
constexpr const char *kHiprtcInstall =
    "install libhiprtc" FERRY_HIPRTC_STR(HIP_VERSION_MAJOR) " (Debian's package), or put the directory holding "
    "ROCm's libhiprtc.so." FERRY_HIPRTC_STR(HIP_VERSION_MAJOR) " on the loader path";
#else
constexpr const char *kHiprtcSoname = "libamdhip64.so." FERRY_HIPRTC_STR(HIP_VERSION_MAJOR);
constexpr const char *kHiprtcInstall = "ROCm 5 carries hipRTC in libamdhip64.so.5: install libamdhip64-5";
#endif

std::string rtc_result(hiprtcResult rc) {
    const char *text = rtc().hiprtcGetErrorString ? rtc().hiprtcGetErrorString(rc) : nullptr;
    return std::string(text ? text : "hipRTC error") + " (" + std::to_string(static_cast<int>(rc)) + ")";
}

int rtc_errno(hiprtcResult rc) {
    switch (rc) {
        case HIPRTC_ERROR_OUT_OF_MEMORY: return -ENOMEM;
        case HIPRTC_ERROR_INVALID_INPUT:
        case HIPRTC_ERROR_INVALID_OPTION: return -EINVAL;
        default: return -EIO;
    }
}

// The comgr soname a hipRTC library dlopens: the "libamd_comgr.so.N" literal in its file
// (.so.2 in ROCm 5, .so.3 in Debian's 6.4 and in 7). Empty when it names none.
std::string comgr_literal(const char *path) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return "";
    struct stat st;
    void *map = fstat(fd, &st) == 0 && st.st_size > 0
                    ? mmap(nullptr, static_cast<size_t>(st.st_size), PROT_READ, MAP_PRIVATE, fd, 0)
                    : MAP_FAILED;
    close(fd);
    if (map == MAP_FAILED) return "";
    const std::string_view file(static_cast<const char *>(map), static_cast<size_t>(st.st_size));
    constexpr std::string_view kStem = "libamd_comgr.so.";
    std::string found;
    for (size_t at = file.find(kStem); at != std::string_view::npos && found.empty(); at = file.find(kStem, at + 1)) {
        size_t end = at + kStem.size();
        while (end < file.size() && file[end] >= '0' && file[end] <= '9') ++end;
        if (end > at + kStem.size() && end < file.size() && file[end] == '\0') found = file.substr(at, end - at);
    }
    munmap(map, static_cast<size_t>(st.st_size));
    return found;
}

// Opens the comgr hipRTC will open, before hipRTC does: hipRTC 7.2's hiprtcCreateProgram
// dereferences a null pointer when it cannot. 0 when it opens, or when hipRTC names none.
int open_comgr(std::string &error) {
    static std::string failure;
    static const int rc = [] {
        Dl_info info{};
        void *create = reinterpret_cast<void *>(rtc().hiprtcCreateProgram);
        if (!dladdr(create, &info) || !info.dli_fname) return 0;
        const std::string soname = comgr_literal(info.dli_fname);
        if (soname.empty() || dlopen(soname.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE)) return 0;
        const char *e = dlerror();
        const std::string major = soname.substr(soname.rfind('.') + 1);
        failure = "no comgr, which hipRTC (" + std::string(info.dli_fname) +
                  ") compiles with: " + (e ? std::string(e) : soname + ": dlopen failed") + "; install libamd-comgr" +
                  major + " (Debian's package), or put the directory holding ROCm's " + soname + " on the loader path";
        return -ENOSYS;
    }();
    if (rc != 0) error = failure;
    return rc;
}

// The comgr hipRTC loaded (hiprtcCreateProgram loads it), found among the loaded objects so
// that the question goes to the library that will compile. Empty when none is loaded.
std::string loaded_comgr() {
    std::string path;
    dl_iterate_phdr(
        [](dl_phdr_info *info, size_t, void *data) {
            const char *name = info->dlpi_name ? strrchr(info->dlpi_name, '/') : nullptr;
            if (!name || strncmp(name + 1, "libamd_comgr.so", 15) != 0) return 0;
            *static_cast<std::string *>(data) = info->dlpi_name;
            return 1;
        },
        &path);
    return path;
}

// "gfx942" of "gfx942:sramecc+:xnack-", and of comgr's "amdgcn-amd-amdhsa--gfx942".
std::string processor(const std::string &target) {
    size_t start = target.rfind("--");
    start = start == std::string::npos ? 0 : start + 2;
    return target.substr(start, target.find(':', start) - start);
}

// 0 when comgr lists arch's processor; -ENOTSUP naming what it knows when it does not (hipRTC
// 5.2 and 6.4 free an invalid pointer and abort on an unknown --offload-arch, where 7.2 returns
// HIPRTC_ERROR_COMPILATION with an empty log). Nothing to ask: 0, and hipRTC answers itself.
int check_isa(const std::string &arch, std::string &error) {
    const std::string path = loaded_comgr();
    if (path.empty()) return 0;
    void *lib = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NOLOAD);
    if (!lib) return 0;
    using Count = int (*)(size_t *);
    using Name = int (*)(size_t, const char **);
    auto count = reinterpret_cast<Count>(dlsym(lib, "amd_comgr_get_isa_count"));
    auto name = reinterpret_cast<Name>(dlsym(lib, "amd_comgr_get_isa_name"));
    size_t n = 0;
    int rc = 0;
    if (count && name && count(&n) == 0) {
        const std::string want = processor(arch);
        std::string known;
        bool found = false;
        for (size_t i = 0; i < n && !found; ++i) {
            const char *isa = nullptr;
            if (name(i, &isa) != 0 || !isa) continue;
            const std::string p = processor(isa);
            found = p == want;
            known += (known.empty() ? "" : " ") + p;
        }
        if (!found) {
            error = "hipRTC's compiler (" + path + ") does not know " + want + " (it knows " + known +
                    "), so this ROCm cannot build code for it";
            rc = -ENOTSUP;
        }
    }
    dlclose(lib);
    return rc;
}

struct Program {
    hiprtcProgram prog = nullptr;
    ~Program() {
        if (prog) (void)rtc().hiprtcDestroyProgram(&prog);
    }
};

std::string program_log(hiprtcProgram prog) {
    size_t size = 0;
    if (rtc().hiprtcGetProgramLogSize(prog, &size) != HIPRTC_SUCCESS || size <= 1) return "";
    std::string log(size, '\0');
    if (rtc().hiprtcGetProgramLog(prog, log.data()) != HIPRTC_SUCCESS) return "";
    log.resize(strnlen(log.c_str(), log.size()));
    while (!log.empty() && (log.back() == '\n' || log.back() == ' ')) log.pop_back();
    return log;
}

}  // namespace

const char *hiprtc_soname() { return kHiprtcSoname; }

bool load_hiprtc(std::string &error) {
    static std::string failure;
    static const bool loaded = [] {
        const std::string soname = kHiprtcSoname;
        void *lib = dlopen(kHiprtcSoname, RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
        if (!lib) {
            const char *e = dlerror();
            failure = "no hipRTC: " + (e ? std::string(e) : soname + ": dlopen failed") + "; " + kHiprtcInstall;
            return false;
        }
        HiprtcApi &api = rtc();
#define FERRY_HIPRTC_LOAD(name)                                                  \
    if (!(api.name = reinterpret_cast<decltype(api.name)>(dlsym(lib, #name)))) { \
        failure = "no hipRTC: " + soname + " has no " #name;                     \
        return false;                                                            \
    }
        FERRY_HIPRTC_FUNCTIONS(FERRY_HIPRTC_LOAD)
#undef FERRY_HIPRTC_LOAD
        return true;
    }();
    if (!loaded) error = failure;
    return loaded;
}

int compile_copy_kernel(const std::string &arch, std::vector<char> &code, std::string &error) {
    code.clear();
    if (!load_hiprtc(error)) return -ENOSYS;
    if (arch.empty() || arch.find_first_of(" \t\n") != std::string::npos) {
        error = "copy kernel: no usable GPU architecture name (\"" + arch + "\")";
        return -EINVAL;
    }
    if (int r = open_comgr(error); r != 0) return r;
    Program p;
    hiprtcResult rc = rtc().hiprtcCreateProgram(&p.prog, kCopyKernelSource, "copy_kernel.cu", 0, nullptr, nullptr);
    if (rc != HIPRTC_SUCCESS) {
        error = std::string("hiprtcCreateProgram: ") + rtc_result(rc);
        return rtc_errno(rc);
    }
    if (int r = check_isa(arch, error); r != 0) return r;
    const std::string offload = "--offload-arch=" + arch;
    const char *options[] = {offload.c_str(), "-O3"};
    rc = rtc().hiprtcCompileProgram(p.prog, 2, options);
    if (rc != HIPRTC_SUCCESS) {
        const std::string log = program_log(p.prog);
        error = "hiprtcCompileProgram(" + offload + " -O3): " + rtc_result(rc) + "; " +
                (log.empty() ? "no compile log" : "compile log:\n" + log);
        return rtc_errno(rc);
    }
    size_t size = 0;
    rc = rtc().hiprtcGetCodeSize(p.prog, &size);
    if (rc != HIPRTC_SUCCESS || size == 0) {
        error = "hiprtcGetCodeSize(" + offload + "): " + (rc != HIPRTC_SUCCESS ? rtc_result(rc) : "no code");
        return rc != HIPRTC_SUCCESS ? rtc_errno(rc) : -EIO;
    }
    code.resize(size);
    rc = rtc().hiprtcGetCode(p.prog, code.data());
    if (rc != HIPRTC_SUCCESS) {
        code.clear();
        error = "hiprtcGetCode(" + offload + "): " + rtc_result(rc);
        return rtc_errno(rc);
    }
    return 0;
}

int copy_kernel_code(const std::string &arch, const std::vector<char> *&code, std::string &error) {
    struct Entry {
        int rc = 0;
        std::string error;
        std::vector<char> code;
    };
    static std::mutex mu;
    static std::map<std::string, Entry> cache;  // nodes stay put: `code` may point into them
    std::lock_guard<std::mutex> lock(mu);
    auto [it, added] = cache.try_emplace(arch);
    Entry &e = it->second;
    if (added) e.rc = compile_copy_kernel(arch, e.code, e.error);
    if (e.rc != 0) {
        error = e.error;
        code = nullptr;
    } else {
        code = &e.code;
    }
    return e.rc;
}

}  // namespace ferry_gpu
