// Which GPU runtimes are installed, probed at run time (never compile-time flags), so the
// loader can prefer plugin variant directories such as cuda13/ or rocm6/.
#pragma once

#include <map>
#include <optional>
#include <string>

namespace ferry {

// The CUDA driver library to load: $FERRY_LIBCUDA when set (tests' fake runtime), else libcuda.so.1.
const char *cuda_driver_library();

struct InstalledRuntimes {
    std::optional<int> cuda_major;  // from the driver: cuDriverGetVersion() / 1000
    std::string cuda_detail;        // what was found, or why nothing was

    std::optional<int> rocm_major;             // the installed ROCm release's major, from rocm_source
    std::string rocm_detail;                   // "ROCm 7.2.4", or why no release was found
    std::string rocm_source;                   // "rocm-core", ".../.info/version" or the libamdhip64 path
    std::map<int, std::string> hip_libraries;  // libamdhip64.so.N the loader resolves: N -> file
    // The rocm<N>/ variant to use: rocm_major when its libamdhip64.so.N resolves, else the
    // newest N that does; nullopt when none does. rocm_choice says why, in words.
    std::optional<int> rocm_variant;
    std::string rocm_choice;
};

InstalledRuntimes probe_installed_runtimes();

// For a variant directory name like "cuda12" or "rocm6": does an installed runtime serve it?
// A CUDA driver runs plugins built for its own or an older CUDA major; rocm<N>/ needs
// libamdhip64.so.N on the loader's path. `why` says what decided.
bool variant_matches(const InstalledRuntimes &rt, const std::string &variant, std::string &why);

// Order among matching variant directories, highest first: the newest CUDA major; the chosen
// ROCm variant, then the other ROCm majors whose runtime resolves, newest first.
int variant_priority(const InstalledRuntimes &rt, const std::string &variant);

// "cuda13" -> {"cuda", 13}; false for names that are not variant directories.
bool parse_variant(const std::string &name, std::string &family, int &major);

}  // namespace ferry
