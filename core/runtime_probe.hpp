// Which GPU runtimes are installed, probed at run time (never compile-time flags), so the
// loader can prefer plugin variant directories such as cuda13/ or rocm6/.
#pragma once

#include <optional>
#include <string>

namespace ferry {

struct InstalledRuntimes {
    std::optional<int> cuda_major; // from the driver: cuDriverGetVersion() / 1000
    std::string cuda_detail;       // what was found, or why nothing was
    std::optional<int> rocm_major; // ROCm release major
    std::string rocm_detail;
};

InstalledRuntimes probe_installed_runtimes();

// For a variant directory name like "cuda12" or "rocm6": does an installed runtime serve it?
// A CUDA driver runs plugins built for its own or an older CUDA major; ROCm needs an exact
// major. `why` says what decided.
bool variant_matches(const InstalledRuntimes &rt, const std::string &variant, std::string &why);

// "cuda13" -> {"cuda", 13}; false for names that are not variant directories.
bool parse_variant(const std::string &name, std::string &family, int &major);

} // namespace ferry
