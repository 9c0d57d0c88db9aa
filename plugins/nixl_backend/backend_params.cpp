#include "backend_params.hpp"

#include <algorithm>
#include <charconv>

#include <ferry/ferry.h>

namespace ferry_nixl {
namespace {

// Keys the backend consumes; everything else belongs to Ferry.
constexpr const char *kConfigFile = "config_file";
constexpr const char *kVramKind = "vram_kind";
constexpr const char *kRemoteAccess = "remote_access";
constexpr const char *kReleaseTimeout = "release_timeout_ms";

std::optional<uint32_t> parse_access(const std::string &value) {
    uint32_t access = 0;
    size_t start = 0;
    while (start <= value.size()) {
        size_t end = value.find(',', start);
        if (end == std::string::npos) end = value.size();
        std::string word = value.substr(start, end - start);
        if (word == "read") access |= FERRY_REMOTE_READ;
        else if (word == "write") access |= FERRY_REMOTE_WRITE;
        else if (!word.empty()) return std::nullopt;
        start = end + 1;
    }
    if (access == 0) return std::nullopt;
    return access;
}

} // namespace

nixl_b_params_t default_backend_params() {
    // Ferry's own defaults; an empty value leaves the key to Ferry (protocols: its priority
    // order, plugin_path: FERRY_PLUGIN_PATH and the installed plugin directory).
    return {
        {"metadata", "P2PHANDSHAKE"},
        {"local_ip", "127.0.0.1"},
        {"rpc_port", "0"},
        {"protocols", ""},
        {"plugin_path", ""},
        {"plugins", ""},
        {"log_level", ""},
        {kConfigFile, ""},
        {kVramKind, "auto"},
        {kRemoteAccess, "read,write"},
        {kReleaseTimeout, "10000"},
    };
}

std::optional<BackendParams> parse_backend_params(const nixl_b_params_t &params, std::string &error) {
    BackendParams out;
    for (const auto &[key, value] : params) {
        if (key == kConfigFile) {
            out.config_file = value;
        } else if (key == kVramKind) {
            if (value == "auto" || value.empty()) out.vram_kind = VramKind::Auto;
            else if (value == "cuda") out.vram_kind = VramKind::Cuda;
            else if (value == "rocm") out.vram_kind = VramKind::Rocm;
            else {
                error = "parameter vram_kind='" + value + "' is not one of auto, cuda, rocm";
                return std::nullopt;
            }
        } else if (key == kRemoteAccess) {
            auto access = parse_access(value);
            if (!access) {
                error = "parameter remote_access='" + value +
                        "' must be read, write or read,write (what peers may do to registered memory)";
                return std::nullopt;
            }
            out.remote_access = *access;
        } else if (key == kReleaseTimeout) {
            int64_t ms = 0;
            auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
            if (ec != std::errc() || end != value.data() + value.size() || ms < 0) {
                error = "parameter release_timeout_ms='" + value + "' must be a number of milliseconds >= 0";
                return std::nullopt;
            }
            out.release_timeout_ms = ms;
        } else if (!value.empty()) {
            out.ferry_config.emplace_back(key, value);
        }
    }
    // A stable order keeps Ferry's messages about the configuration reproducible.
    std::sort(out.ferry_config.begin(), out.ferry_config.end());
    return out;
}

} // namespace ferry_nixl
