// Engine settings from the flat key/value Config (which YAML files flatten into).
#pragma once

#include <algorithm>
#include <chrono>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "control/auth.hpp"
#include "engine/transport.hpp"
#include "ferry/engine.hpp"
#include "metadata/metadata.hpp"

namespace ferry {

inline constexpr const char *kDefaultProtocolPriority = "cuda_ipc,hip_ipc,shm,rdma,efa,tcp";

// Limits of the control server against peers that hold connections open.
struct ControlLimits {
    size_t max_connections = 1024;
    size_t max_connections_per_peer = 128;
    std::chrono::milliseconds idle_timeout{120000};
    std::chrono::milliseconds log_interval{10000};
};

struct EngineSettings {
    MetadataSettings metadata;
    std::string host_id;                                  // empty: probe it
    std::vector<std::string> protocols;                   // transport priority, best first
    std::vector<std::string> plugin_path;                 // searched before FERRY_PLUGIN_PATH
    std::string plugins;                                  // allow/deny list; empty: FERRY_PLUGINS
    std::string plugin_trust;                             // strict, owner, any; empty: FERRY_PLUGIN_TRUST
    std::string log_level;                                // empty: FERRY_LOG_LEVEL
    std::map<std::string, PluginOptions> plugin_options;  // "tcp.lanes" -> {"tcp": {"lanes", ..}}
    AuthSettings auth;                                    // cluster secret (config, then environment)
    size_t notification_queue_max = 65536;                // notifications waiting to be taken
    ControlLimits control;
    // GPU staging through pinned host memory (stage_service.hpp): the bound on pinned memory
    // lent out at once (0 disables staging) and the slice one copy moves.
    uint64_t gpu_staging_max_bytes = 64ull << 20;
    uint64_t gpu_staging_slice_bytes = 4ull << 20;
    // GPU ops up to this size to one peer share slices, gathered and scattered in one copy
    // (0: a slice per op). Unset: 1 MiB, or a quarter of the slice when that is less.
    std::optional<uint64_t> gpu_staging_gather_max_op_bytes;
    uint64_t gather_max_op_bytes() const {
        return gpu_staging_gather_max_op_bytes.value_or(std::min<uint64_t>(1ull << 20, gpu_staging_slice_bytes / 4));
    }
    // Registered host memory: ask for transparent huge pages (advise), and merge the pages
    // already there into huge pages now (collapse). Off: the caller's memory is left alone.
    enum class HugePages { Off, Advise, Collapse } huge_pages = HugePages::Off;
    // The Prometheus endpoint (metrics.hpp): off unless set; 0 takes any free port. It binds
    // metrics_bind_ip, else local_ip (a wildcard local_ip too: set metrics_bind_ip to narrow it).
    std::optional<uint16_t> metrics_port;
    std::string metrics_bind_ip;
    // Failover (failover.cpp): how often an op that failed on a broken path is posted again on
    // another, and until when after its submit; how long a failed path is paused (doubled on
    // each failure in a row, up to the maximum).
    unsigned max_failover_attempts = 2;
    std::chrono::milliseconds failover_deadline{60000};
    std::chrono::milliseconds path_cooldown{1000};
    std::chrono::milliseconds path_cooldown_max{30000};
};

// One engine key as `ferry-info --options engine` documents it.
struct EngineKey {
    const char *key;
    const char *default_text;
    const char *accepted;
    const char *help;
};
std::span<const EngineKey> engine_keys();

// Rejects unknown keys and bad values with a message naming the key.
Result<EngineSettings> parse_engine_settings(const Config &config);

std::vector<std::string> split_list(const std::string &text, char sep = ',');

// The YAML text of a configuration file, flattened (load_yaml_config reads and checks the file
// first). `name` names it in messages.
Result<Config> parse_yaml_config(std::string_view text, const std::string &name);

}  // namespace ferry
