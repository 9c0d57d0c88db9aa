#include "loader/runtime_probe.hpp"

#include <dlfcn.h>
#include <unistd.h>

#include <cctype>
#include <cstdlib>
#include <fstream>

#include "loader/library_path.hpp"
#include "util/log.hpp"

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

constexpr int kOldestRocm = 5, kNewestRocm = 12;

// Why rocm<major>/ cannot be used, with the fix when an AMD install has the library outside
// the loader's path (/opt/rocm-X.Y.Z/lib is in no default search directory).
std::string missing_hip(const InstalledRuntimes &rt, int major);

void probe_cuda(InstalledRuntimes &rt) {
    std::string error;
    void *lib = open_library(cuda_driver_library(), error);  // $FERRY_LIBCUDA for tests
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

std::optional<int> major_of(const std::string &version_text) {
    size_t i = 0;
    while (i < version_text.size() && std::isspace(static_cast<unsigned char>(version_text[i]))) ++i;
    if (i >= version_text.size() || !std::isdigit(static_cast<unsigned char>(version_text[i]))) return std::nullopt;
    return std::atoi(version_text.c_str() + i);
}

std::string rocm_prefix() {
    const char *root = std::getenv("ROCM_PATH");
    return root && *root ? root : "/opt/rocm";
}

// The installed release: rocm-core's getROCmVersion, else an /opt/rocm install's release file.
void probe_rocm_release(InstalledRuntimes &rt) {
    std::string error;
    if (void *core = open_library("librocm-core.so.1", error)) {
        using GetVersion = int (*)(unsigned *, unsigned *, unsigned *);
        if (auto fn = reinterpret_cast<GetVersion>(dlsym(core, "getROCmVersion"))) {
            unsigned major = 0, minor = 0, patch = 0;
            if (fn(&major, &minor, &patch) == 0) {
                rt.rocm_major = static_cast<int>(major);
                rt.rocm_detail = cat("ROCm ", major, ".", minor, ".", patch);
                rt.rocm_source = "rocm-core";
            }
        }
        dlclose(core);
        if (rt.rocm_major) return;
    }
    std::string info = rocm_prefix() + "/.info/version";
    if (std::ifstream in(info); in) {
        std::string line;
        std::getline(in, line);
        if (auto m = major_of(line)) {
            rt.rocm_major = m;
            rt.rocm_detail = "ROCm " + line;
            rt.rocm_source = info;
        }
    }
}

void probe_rocm(InstalledRuntimes &rt) {
    probe_rocm_release(rt);
    // The HIP runtimes the loader resolves. Looked up, never dlopen'ed: their static
    // initialisers (LLVM inside comgr) abort a process that already holds another LLVM.
    for (int major = kOldestRocm; major <= kNewestRocm; ++major)
        if (auto path = loader_would_find(cat("libamdhip64.so.", major))) rt.hip_libraries[major] = *path;
    if (!rt.rocm_major && !rt.hip_libraries.empty()) {  // Debian's ROCm: the soname is the release
        rt.rocm_major = rt.hip_libraries.rbegin()->first;
        rt.rocm_detail = cat("ROCm ", *rt.rocm_major);
        rt.rocm_source = rt.hip_libraries.rbegin()->second;
    }
    if (!rt.rocm_major) {
        rt.rocm_detail = cat("no ROCm runtime: no rocm-core, no ", rocm_prefix(), "/.info/version, no libamdhip64.so.{",
                             kOldestRocm, "..", kNewestRocm, "} on the loader path");
        rt.rocm_choice = rt.rocm_detail;
        return;
    }
    std::string found = rt.rocm_detail + " (" + rt.rocm_source + ")";
    if (rt.hip_libraries.count(*rt.rocm_major)) {
        rt.rocm_variant = rt.rocm_major;
        rt.rocm_choice = cat(found, ", libamdhip64.so.", *rt.rocm_major, " at ", rt.hip_libraries[*rt.rocm_major]);
    } else if (!rt.hip_libraries.empty()) {
        auto &[major, path] = *rt.hip_libraries.rbegin();
        rt.rocm_variant = major;
        rt.rocm_choice =
            cat(found, " but libamdhip64.so.", *rt.rocm_major, " is not on the loader path; libamdhip64.so.", major,
                " is (", path, "), so rocm", major, "/ is used");
    } else {
        rt.rocm_choice = missing_hip(rt, *rt.rocm_major);
    }
}

}  // namespace

const char *cuda_driver_library() {
    const char *override_name = std::getenv("FERRY_LIBCUDA");
    return override_name && *override_name ? override_name : "libcuda.so.1";
}

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
    auto lib = rt.hip_libraries.find(major);
    if (lib == rt.hip_libraries.end()) {
        why = missing_hip(rt, major);
        return false;
    }
    if (rt.rocm_variant == major) why = rt.rocm_choice;
    else if (rt.rocm_variant)
        why = cat("libamdhip64.so.", major, " at ", lib->second, "; rocm", *rt.rocm_variant,
                  "/ goes first: ", rt.rocm_choice);
    else why = cat("libamdhip64.so.", major, " at ", lib->second);
    return true;
}

int variant_priority(const InstalledRuntimes &rt, const std::string &variant) {
    std::string family;
    int major = 0;
    if (!parse_variant(variant, family, major)) return -1;
    return family == "rocm" && rt.rocm_variant == major ? 1000 : major;
}

namespace {
std::string missing_hip(const InstalledRuntimes &rt, int major) {
    std::string name = cat("libamdhip64.so.", major);
    std::string text = name + " is not on the loader path";
    if (rt.rocm_major == major) text = cat(rt.rocm_detail, " found (", rt.rocm_source, ") but ", text);
    for (const std::string &dir : {rocm_prefix() + "/lib", rocm_prefix() + "/lib64"})
        if (access((dir + "/" + name).c_str(), R_OK) == 0)
            return cat(text, ": add ", dir, " to ld.so.conf (then run ldconfig) or LD_LIBRARY_PATH");
    return text;
}
}  // namespace

}  // namespace ferry
