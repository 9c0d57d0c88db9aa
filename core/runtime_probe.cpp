#include "runtime_probe.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>
#include <vector>

#include "log.hpp"

namespace ferry {
namespace {

// dlopen that reports the loader's own text on failure.
void *open_library(const char *name, std::string &error) {
    void *h = dlopen(name, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        error = e ? e : "unknown dlopen error";
    }
    return h;
}

void probe_cuda(InstalledRuntimes &rt) {
    std::string error;
    void *lib = open_library("libcuda.so.1", error);
    if (!lib) {
        rt.cuda_detail = "no NVIDIA driver: " + error;
        return;
    }
    using GetVersion = int (*)(int *);
    auto get_version = reinterpret_cast<GetVersion>(dlsym(lib, "cuDriverGetVersion"));
    int version = 0;
    if (!get_version) {
        rt.cuda_detail = "libcuda.so.1 has no cuDriverGetVersion";
    } else if (int rc = get_version(&version); rc != 0) {
        rt.cuda_detail = cat("cuDriverGetVersion failed with CUDA error ", rc);
    } else {
        rt.cuda_major = version / 1000;
        rt.cuda_detail = cat("NVIDIA driver supports CUDA ", version / 1000, ".", (version % 1000) / 10);
    }
    dlclose(lib);
}

// Where the dynamic loader would find `name`, searching LD_LIBRARY_PATH, the ROCm prefix and
// the system directories, without loading it.
std::optional<std::string> find_library_file(const std::string &name) {
    std::vector<std::string> dirs;
    if (const char *env = std::getenv("LD_LIBRARY_PATH")) {
        std::string list = env;
        size_t start = 0;
        while (start <= list.size()) {
            size_t end = list.find(':', start);
            if (end == std::string::npos) end = list.size();
            if (end > start) dirs.push_back(list.substr(start, end - start));
            start = end + 1;
        }
    }
    const char *root = std::getenv("ROCM_PATH");
    std::string rocm = root && *root ? root : "/opt/rocm";
    for (const char *d : {"/lib", "/lib64"}) dirs.push_back(rocm + d);
    for (const char *d : {"/usr/lib/x86_64-linux-gnu", "/lib/x86_64-linux-gnu", "/usr/lib64", "/usr/lib", "/usr/local/lib"})
        dirs.push_back(d);
    for (const auto &d : dirs) {
        std::string path = d + "/" + name;
        if (access(path.c_str(), R_OK) == 0) return path;
    }
    return std::nullopt;
}

std::optional<int> major_of(const std::string &version_text) {
    size_t i = 0;
    while (i < version_text.size() && std::isspace(static_cast<unsigned char>(version_text[i]))) ++i;
    if (i >= version_text.size() || !std::isdigit(static_cast<unsigned char>(version_text[i]))) return std::nullopt;
    return std::atoi(version_text.c_str() + i);
}

void probe_rocm(InstalledRuntimes &rt) {
    // 1. rocm-core's getROCmVersion, the release the runtime libraries belong to.
    std::string error;
    if (void *core = open_library("librocm-core.so.1", error)) {
        using GetVersion = int (*)(unsigned *, unsigned *, unsigned *);
        if (auto fn = reinterpret_cast<GetVersion>(dlsym(core, "getROCmVersion"))) {
            unsigned major = 0, minor = 0, patch = 0;
            if (fn(&major, &minor, &patch) == 0) {
                rt.rocm_major = static_cast<int>(major);
                rt.rocm_detail = cat("ROCm ", major, ".", minor, ".", patch, " (rocm-core)");
            }
        }
        dlclose(core);
        if (rt.rocm_major) return;
    }
    // 2. The release file of an /opt/rocm install.
    const char *root = std::getenv("ROCM_PATH");
    std::string info = std::string(root && *root ? root : "/opt/rocm") + "/.info/version";
    if (std::ifstream in(info); in) {
        std::string line;
        std::getline(in, line);
        if (auto m = major_of(line)) {
            rt.rocm_major = m;
            rt.rocm_detail = "ROCm " + line + " (" + info + ")";
            return;
        }
    }
    // 3. The HIP runtime's soname: libamdhip64.so.N ships with ROCm N (Debian's 5.x too). Look
    //    for the file, never dlopen it: its static initialisers (LLVM inside comgr) abort a
    //    process that already holds another LLVM.
    for (int major : {7, 6, 5}) {
        std::string name = cat("libamdhip64.so.", major);
        if (auto path = find_library_file(name)) {
            rt.rocm_major = major;
            rt.rocm_detail = "HIP runtime " + *path;
            return;
        }
    }
    rt.rocm_detail = "no ROCm runtime: no rocm-core, no " + info + ", no libamdhip64.so.{5,6,7}";
}

} // namespace

InstalledRuntimes probe_installed_runtimes() {
    InstalledRuntimes rt;
    probe_cuda(rt);
    probe_rocm(rt);
    return rt;
}

bool parse_variant(const std::string &name, std::string &family, int &major) {
    for (const char *f : {"cuda", "rocm"}) {
        std::string prefix = f;
        if (name.size() > prefix.size() && name.compare(0, prefix.size(), prefix) == 0) {
            std::string digits = name.substr(prefix.size());
            if (digits.size() > 3) return false;
            for (char c : digits)
                if (!std::isdigit(static_cast<unsigned char>(c))) return false;
            family = prefix;
            major = std::atoi(digits.c_str());
            return true;
        }
    }
    return false;
}

bool variant_matches(const InstalledRuntimes &rt, const std::string &variant, std::string &why) {
    std::string family;
    int major = 0;
    if (!parse_variant(variant, family, major)) {
        why = "not a variant directory";
        return false;
    }
    if (family == "cuda") {
        if (!rt.cuda_major) {
            why = rt.cuda_detail;
            return false;
        }
        if (major > *rt.cuda_major) {
            why = cat("built for CUDA ", major, " but the driver supports CUDA ", *rt.cuda_major, " at most");
            return false;
        }
        why = rt.cuda_detail;
        return true;
    }
    if (!rt.rocm_major) {
        why = rt.rocm_detail;
        return false;
    }
    if (major != *rt.rocm_major) {
        why = cat("built for ROCm ", major, " but ", rt.rocm_detail, " is installed");
        return false;
    }
    why = rt.rocm_detail;
    return true;
}

} // namespace ferry
