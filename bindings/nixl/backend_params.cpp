#include "backend_params.hpp"

#include <algorithm>
#include <charconv>
#include <cstdlib>

#include <ferry/ferry.h>

namespace ferry_nixl {
namespace {

// Keys the backend consumes; everything else belongs to Ferry.
constexpr const char *kConfigFile = "config_file";
constexpr const char *kVramKind = "vram_kind";
constexpr const char *kRemoteAccess = "remote_access";
constexpr const char *kReleaseTimeout = "release_timeout_ms";
constexpr const char *kEstBandwidth = "est_bandwidth_mbps";

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

}  // namespace

nixl_b_params_t default_backend_params() {
    // An empty value leaves the key to the environment (FERRY_<KEY>), then FERRY_CONFIG's file,
    // then Ferry's default (metadata P2PHANDSHAKE, local_ip 127.0.0.1, rpc_port 0, protocols in
    // Ferry's priority order): hosts pass these defaults back, and a value here would hide the
    // environment.
    return {
        {"metadata", ""},
        {"local_ip", ""},
        {"rpc_port", ""},
        {"protocols", ""},
        {"plugin_path", ""},
        {"plugins", ""},
        {"plugin_trust", ""},
        {"log_level", ""},
        {kConfigFile, ""},
        {kVramKind, "auto"},
        {kRemoteAccess, "read,write"},
        {kReleaseTimeout, "10000"},
        {kEstBandwidth, ""},
        {kNoteProgressThread,
         "does not apply: Ferry's transports complete ops on their own threads and "
         "checkXfer only reads their status, so enableProgTh and pthrDelay change nothing"},
        {kNoteSyncMode, "does not apply: the backend locks its own state, so it is safe under every syncMode"},
    };
}

std::optional<BackendParams> parse_backend_params(const std::map<std::string, std::string> &values,
                                                  const std::map<std::string, std::string> &origin,
                                                  std::string &error) {
    BackendParams out;
    auto from = [&](const std::string &key) {
        auto it = origin.find(key);
        return it == origin.end() || it->second == "parameter" ? std::string("parameter")
                                                               : "environment variable " + it->second;
    };
    for (const auto &[key, value] : values) {
        if (key.rfind("note.", 0) == 0) continue;  // getPluginParams' explanations, passed back
        if (key == kConfigFile) {
            out.config_file = value;
        } else if (key == kEstBandwidth) {
            char *end = nullptr;
            double mbps = std::strtod(value.c_str(), &end);
            if (value.empty() || *end != '\0' || !(mbps > 0)) {
                error = from(key) + " est_bandwidth_mbps='" + value + "' must be a bandwidth in MB/s > 0";
                return std::nullopt;
            }
            out.est_bandwidth_mbps = mbps;
        } else if (key == kVramKind) {
            if (value == "auto" || value.empty()) out.vram_kind = VramKind::Auto;
            else if (value == "cuda") out.vram_kind = VramKind::Cuda;
            else if (value == "rocm") out.vram_kind = VramKind::Rocm;
            else {
                error = from(key) + " vram_kind='" + value + "' is not one of auto, cuda, rocm";
                return std::nullopt;
            }
        } else if (key == kRemoteAccess) {
            auto access = parse_access(value);
            if (!access) {
                error = from(key) + " remote_access='" + value +
                        "' must be read, write or read,write (what peers may do to registered memory)";
                return std::nullopt;
            }
            out.remote_access = *access;
        } else if (key == kReleaseTimeout) {
            int64_t ms = 0;
            auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), ms);
            if (ec != std::errc() || end != value.data() + value.size() || ms < 0) {
                error = from(key) + " release_timeout_ms='" + value + "' must be a number of milliseconds >= 0";
                return std::nullopt;
            }
            out.release_timeout_ms = ms;
        } else if (!value.empty()) {
            out.ferry_config.emplace_back(key, value);
        }
    }
    return out;  // std::map order: Ferry's messages about the configuration stay reproducible
}

}  // namespace ferry_nixl
