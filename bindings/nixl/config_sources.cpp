#include "config_sources.hpp"

#include <algorithm>
#include <array>
#include <cctype>
#include <cstring>
#include <string_view>

namespace ferry_nixl {
namespace {

constexpr std::string_view kPrefix = "FERRY_";

// Engine keys a host may set through FERRY_<KEY> (docs/OPTIONS.md). Ferry's core has no
// call that lists its keys, so they are named here; a key Ferry gains later is still reachable
// through the config_file parameter or FERRY_CONFIG. Ferry reads plugin_path (FERRY_PLUGIN_PATH),
// plugins (FERRY_PLUGINS), plugin_trust (FERRY_PLUGIN_TRUST), log_level (FERRY_LOG_LEVEL),
// host_id (FERRY_HOST_ID) and the cluster secret (FERRY_AUTH_SECRET, FERRY_AUTH_SECRET_FILE)
// from the environment itself, in its own order, so they are not listed.
constexpr std::array<std::string_view, 22> kEnvKeys = {
    "metadata",
    "metadata_server",
    "local_ip",
    "rpc_port",
    "local_server_name",
    "protocols",
    "handshake_timeout_ms",
    "metadata_retry_ms",
    "etcd_lease_ttl_s",
    "etcd_ca_file",
    "etcd_cert_file",
    "etcd_key_file",
    "etcd_user",
    "etcd_password",
    "etcd_password_file",
    "notification_queue_max",
    "control_max_connections",
    "control_max_connections_per_peer",
    "control_idle_timeout_ms",
    "control_log_interval_ms",
    // The backend's own keys (backend_params.cpp).
    "vram_kind",
    "remote_access",
};
constexpr std::string_view kReleaseTimeout = "release_timeout_ms";
constexpr std::string_view kEstBandwidth = "est_bandwidth_mbps";

bool env_key(std::string_view key) {
    return key == kReleaseTimeout || key == kEstBandwidth ||
           std::find(kEnvKeys.begin(), kEnvKeys.end(), key) != kEnvKeys.end();
}

}  // namespace

std::string env_name(const std::string &key) {
    if (key == "config_file") return "FERRY_CONFIG";
    std::string out(kPrefix);
    for (char c : key) {
        if (c == '.') out += "__";
        else out += static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
    }
    return out;
}

std::optional<std::string> key_for_env(const std::string &name) {
    if (name.size() <= kPrefix.size() || name.compare(0, kPrefix.size(), kPrefix) != 0) return std::nullopt;
    std::string key;
    for (size_t i = kPrefix.size(); i < name.size(); ++i) {
        char c = name[i];
        if (c == '_' && i + 1 < name.size() && name[i + 1] == '_') {
            key += '.';
            ++i;
        } else if (std::isupper(static_cast<unsigned char>(c)) || std::isdigit(static_cast<unsigned char>(c)) ||
                   c == '_') {
            key += static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
        } else {
            return std::nullopt;  // lower case or punctuation: not a name this scheme produces
        }
    }
    bool dotted = key.find('.') != std::string::npos;
    if (dotted) {
        // <transport>.<key>, both parts non-empty.
        size_t dot = key.find('.');
        if (dot == 0 || dot + 1 >= key.size() || key.back() == '.') return std::nullopt;
        return key;
    }
    if (env_key(key)) return key;
    return std::nullopt;
}

LayeredConfig layer_config(const std::vector<std::pair<std::string, std::string>> &host,
                           const char *const *environ_entries) {
    LayeredConfig out;
    // Environment first, then host parameters over it.
    for (const char *const *e = environ_entries; e && *e; ++e) {
        const char *eq = std::strchr(*e, '=');
        if (!eq || eq[1] == '\0') continue;  // unset or empty: not given
        std::string name(*e, static_cast<size_t>(eq - *e));
        if (name == "FERRY_CONFIG") {
            out.config_file = eq + 1;
            out.config_file_origin = name;
            continue;
        }
        if (auto key = key_for_env(name)) {
            out.values[*key] = eq + 1;
            out.origin[*key] = name;
        }
    }
    for (const auto &[key, value] : host) {
        if (value.empty()) continue;
        if (key == "config_file") {
            out.config_file = value;
            out.config_file_origin = "parameter config_file";
            continue;
        }
        out.values[key] = value;
        out.origin[key] = "parameter";
    }
    return out;
}

std::string LayeredConfig::describe() const {
    std::string params, env;
    for (const auto &[key, from] : origin) {
        if (from == "parameter") params += (params.empty() ? "" : ",") + key;
        else env += (env.empty() ? "" : ",") + from;
    }
    std::string out = "parameters: " + (params.empty() ? std::string("none") : params);
    out += "; environment: " + (env.empty() ? std::string("none") : env);
    out += "; file: " + (config_file.empty() ? std::string("none") : config_file + " (" + config_file_origin + ")");
    return out;
}

}  // namespace ferry_nixl
