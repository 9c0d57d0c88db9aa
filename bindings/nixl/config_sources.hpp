// Where the FERRY backend's configuration comes from when a NIXL host passes few or no
// parameters (vLLM's NixlConnector passes none): host parameters > environment > the YAML file
// named by FERRY_CONFIG (or the config_file parameter) > Ferry's defaults. No NIXL types here,
// so the layering is tested without NIXL.
#pragma once

#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace ferry_nixl {

// The environment variable for a key: FERRY_ + the key in capitals, '.' written as "__"
// (as the Python package's tcp__lanes=2 keywords): local_ip -> FERRY_LOCAL_IP,
// tcp.lanes -> FERRY_TCP__LANES, config_file -> FERRY_CONFIG.
std::string env_name(const std::string &key);

// The key an environment variable names, when it names one this backend takes from the
// environment: an engine key Ferry does not read from the environment itself, a backend key,
// or a dotted transport key (FERRY_<TRANSPORT>__<KEY>). Others (FERRY_PLUGIN_PATH, which Ferry
// reads itself, FERRY_LIBRARY, ...) give nullopt.
std::optional<std::string> key_for_env(const std::string &name);

struct LayeredConfig {
    std::map<std::string, std::string> values;  // key -> value, host over environment
    std::map<std::string, std::string> origin;  // key -> "parameter" or the variable's name
    std::string config_file;                    // the YAML below both ("" when none)
    std::string config_file_origin;             // "parameter config_file" or "FERRY_CONFIG"
    // One line for logs and getBackendParams: what came from where.
    std::string describe() const;
};

// Host parameters with empty values count as not given (getPluginParams lists empty defaults,
// and hosts pass them back). `environ_entries` is "NAME=value" strings (environ).
LayeredConfig layer_config(const std::vector<std::pair<std::string, std::string>> &host,
                           const char *const *environ_entries);

}  // namespace ferry_nixl
