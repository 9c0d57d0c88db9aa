#include "engine/config.hpp"

#include <arpa/inet.h>

#include <cerrno>
#include <charconv>
#include <sstream>

#include <yaml-cpp/yaml.h>

#include "metadata/etcd_client.hpp"
#include "util/file_trust.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

// clang-format off
// The engine's keys, for the unknown-key check and `ferry-info --options engine`: key, default,
// what is accepted, what it does. docs/OPTIONS.md's table of engine keys is checked against it.
constexpr EngineKey kEngineKeys[] = {
    {"metadata", "P2PHANDSHAKE", "P2PHANDSHAKE, etcd://host:2379[,host:2379]/prefix, etcds://..., redis://host:6379[/db] or http://host:8080/metadata", "metadata server: each engine serves its own descriptor, or etcd, Redis or Mooncake's HTTP metadata server"},
    {"metadata_server", "", "as metadata", "alias of metadata"},
    {"local_ip", "127.0.0.1", "an address of this host", "address the control server (descriptors, notifications) binds, and tcp.so's and rdma.so's servers unless <t>.bind_ip"},
    {"rpc_port", "0", "0..65535", "control server port, 0 for any free port"},
    {"local_server_name", "", "P2PHANDSHAKE: ip:port; etcd, Redis, HTTP: a name", "segment name to publish, where the metadata backend names segments"},
    {"host_id", "machine id + boot id", "any text", "host identity override: which peers count as the same host"},
    {"protocols", kDefaultProtocolPriority, "a comma list of transports", "transport priority, best first, e.g. shm,tcp"},
    {"plugin_path", "", "a colon list of directories", "plugin directories searched before FERRY_PLUGIN_PATH"},
    {"plugins", "$FERRY_PLUGINS", "an allow list (tcp,shm) or a deny list (^efa)", "which plugins load"},
    {"plugin_trust", "$FERRY_PLUGIN_TRUST or owner", "strict, owner or any", "which plugin files load: owner: the file and every directory above it owned by root or this process's user, not writable by group or others (sticky directories excepted); strict: owned by root, sticky directories refused too; any: all, reported"},
    {"log_level", "$FERRY_LOG_LEVEL or warn", "error, warn, info, debug or trace", "log level"},
    {"handshake_timeout_ms", "5000", "1..3600000", "timeout for fetching a peer's descriptor or one metadata request"},
    {"metadata_retry_ms", "10000", "0..3600000", "how long to retry an unreachable metadata server at start"},
    {"metadata_poll_ms", "2000", "100..3600000", "Redis, HTTP: how often an engine re-checks its own segment and the segments it opened"},
    {"etcd_lease_ttl_s", "10", "2..3600", "seconds after which a dead engine's segment leaves etcd or Redis"},
    {"etcd_ca_file", "system CA store", "a PEM file", "etcds://: PEM CA certificates that sign etcd's server certificate"},
    {"etcd_cert_file", "", "a PEM file", "etcds://: PEM client certificate, for etcd --client-cert-auth (with etcd_key_file)"},
    {"etcd_key_file", "", "a PEM file (chmod 600)", "etcds://: PEM private key of etcd_cert_file"},
    {"etcd_user", "", "an etcd user name", "etcd user, for etcd with authentication enabled"},
    {"etcd_password", "", "secret (never printed)", "password of etcd_user (prefer etcd_password_file)"},
    {"etcd_password_file", "", "a file", "file holding the password of etcd_user"},
    {"redis_user", "", "a Redis ACL user", "redis://: user to AUTH as (Redis 6+); default: the default user"},
    {"redis_password", "", "secret (never printed)", "redis://: Redis password (prefer redis_password_file)"},
    {"redis_password_file", "", "a file", "redis://: file holding the Redis password"},
    {"redis_db", "0", "0, 1, ...", "redis://: database to SELECT, unless the URL's /db gives it"},
    {"auth_secret", "$FERRY_AUTH_SECRET", "secret of >= 16 bytes (never printed)", "cluster secret: peers must prove they know it"},
    {"auth_secret_file", "$FERRY_AUTH_SECRET_FILE", "a file", "file holding the cluster secret"},
    {"notification_queue_max", "65536", "1..16777216", "notifications received and not yet taken before senders get -ENOBUFS"},
    {"control_max_connections", "1024", "1..1048576", "control connections open at once, in all, before new ones are refused"},
    {"control_max_connections_per_peer", "128", "1..1048576", "control connections open at once from one IP address"},
    {"control_idle_timeout_ms", "120000", "100..86400000", "an authenticated control connection that sends nothing this long is closed"},
    {"control_log_interval_ms", "10000", "100..3600000", "repeated control-server warnings: one line, then one count per interval"},
    {"gpu_staging_max_bytes", "67108864", "0..1099511627776", "pinned host memory GPU staging may lend out at once, both ends (0 disables staging)"},
    {"gpu_staging_slice_bytes", "4194304", "a power of two, 4096..gpu_staging_max_bytes", "bytes one staging copy moves"},
    {"gpu_staging_gather_max_op_bytes", "1048576 or gpu_staging_slice_bytes/4, the smaller", "0..gpu_staging_slice_bytes/2", "GPU ops up to this size to one peer share a pinned slice, gathered into it (and scattered out of it) in one copy-kernel launch (0: a slice per op)"},
    {"metrics_port", "off", "off, or a port 0..65535 (0: any free one)", "serve Prometheus metrics (ops, failures, bytes, latency by transport and operation; staging) at http://<metrics_bind_ip>:<port>/metrics (docs/METRICS.md)"},
    {"metrics_bind_ip", "local_ip", "an address of this host", "address the metrics endpoint binds"},
    {"max_failover_attempts", "2", "0..16", "an op that fails on a broken path (connection reset or refused, a stall, a device down; never a bounds, access or authentication refusal) is posted again on another path to the same peer this many times; 0 fails it at once (docs/FAILOVER.md)"},
    {"failover_deadline_ms", "60000", "1..86400000", "an op is posted again only within this long of its submit; after that its failure is final"},
    {"path_cooldown_ms", "1000", "1..3600000", "a path (transport to one segment) that failed is paused this long before new ops try it again; doubled for each further failure within path_cooldown_max_ms of the previous one"},
    {"path_cooldown_max_ms", "30000", "1..86400000", "the longest pause of a path that keeps failing"},
    {"huge_pages", "off", "off, advise or collapse", "registered host memory: advise asks the kernel for transparent huge pages (MADV_HUGEPAGE) for pages faulted in later, collapse also merges the pages already there (MADV_COLLAPSE, Linux 6.1+); changes the caller's memory, so off by default"},
};
// clang-format on

bool is_engine_key(const std::string &key) {
    for (const auto &k : kEngineKeys)
        if (key == k.key) return true;
    return false;
}

void flatten(const YAML::Node &node, const std::string &prefix, Config &out) {
    if (node.IsMap()) {
        for (const auto &kv : node) {
            std::string key = kv.first.as<std::string>();
            flatten(kv.second, prefix.empty() ? key : prefix + "." + key, out);
        }
    } else if (node.IsSequence()) {
        std::string joined;
        for (const auto &item : node) joined += (joined.empty() ? "" : ",") + item.as<std::string>();
        out[prefix] = joined;
    } else if (node.IsScalar()) {
        out[prefix] = node.as<std::string>();
    } else if (node.IsNull()) {
        out[prefix] = "";
    }
}

Result<uint64_t> parse_unsigned(const std::string &key, const std::string &value, uint64_t max) {
    uint64_t v = 0;
    auto [ptr, ec] = std::from_chars(value.data(), value.data() + value.size(), v);
    if (ec != std::errc() || ptr != value.data() + value.size() || v > max)
        return fail(-EINVAL, cat("config key '", key, "' = '", value, "' is not an integer in [0, ", max, "]"));
    return v;
}

// The control server's limits against peers that hold connections open (control_server.hpp).
Result<void> parse_control_limit(const std::string &key, const std::string &value, ControlLimits &out) {
    auto in_range = [&](uint64_t lo, uint64_t hi) -> Result<uint64_t> {
        auto v = parse_unsigned(key, value, hi);
        if (!v || *v < lo) return fail(-EINVAL, cat("config key '", key, "' = '", value, "'; use ", lo, "..", hi));
        return *v;
    };
    Result<uint64_t> v = 0;
    if (key == "control_max_connections") {
        if ((v = in_range(1, 1u << 20))) out.max_connections = *v;
    } else if (key == "control_max_connections_per_peer") {
        if ((v = in_range(1, 1u << 20))) out.max_connections_per_peer = *v;
    } else if (key == "control_idle_timeout_ms") {
        if ((v = in_range(100, 86400000))) out.idle_timeout = std::chrono::milliseconds(*v);
    } else if (key == "control_log_interval_ms") {
        if ((v = in_range(100, 3600000))) out.log_interval = std::chrono::milliseconds(*v);
    }
    if (!v) return std::unexpected(v.error());
    return {};
}

// Transports whose servers take bind_ip, with 127.0.0.1 as their own default.
constexpr const char *kBindIpTransports[] = {"tcp", "rdma"};

bool is_wildcard_ip(const std::string &ip) {
    unsigned char a[16] = {};
    if (inet_pton(AF_INET, ip.c_str(), a) == 1) return a[0] == 0 && a[1] == 0 && a[2] == 0 && a[3] == 0;
    if (inet_pton(AF_INET6, ip.c_str(), a) != 1) return false;
    for (unsigned char b : a)
        if (b) return false;
    return true;
}

// local_ip names the node's address for the data path too: a host that sets only local_ip
// (FERRY_LOCAL_IP through the NIXL backend, the Python package's local_ip) would otherwise get a
// handshake server peers can reach and data listeners on 127.0.0.1 that they cannot. An explicit
// <t>.bind_ip wins; a wildcard local_ip is not handed on (those transports then need
// advertise_ip, which only the user knows).
void inherit_bind_ip(EngineSettings &s) {
    if (is_wildcard_ip(s.metadata.local_ip)) return;
    for (const char *t : kBindIpTransports) {
        auto &opts = s.plugin_options[t];
        bool given = false;
        for (auto &[k, v] : opts) given |= k == "bind_ip";
        if (!given) opts.emplace_back("bind_ip", s.metadata.local_ip);
    }
}

}  // namespace

std::span<const EngineKey> engine_keys() { return kEngineKeys; }

std::vector<std::string> split_list(const std::string &text, char sep) {
    std::vector<std::string> out;
    std::istringstream in(text);
    std::string item;
    while (std::getline(in, item, sep)) {
        auto b = item.find_first_not_of(" \t");
        auto e = item.find_last_not_of(" \t");
        if (b != std::string::npos) out.push_back(item.substr(b, e - b + 1));
    }
    return out;
}

Result<Config> parse_yaml_config(std::string_view text, const std::string &name) {
    try {
        YAML::Node root = YAML::Load(std::string(text));
        if (!root.IsMap() && !root.IsNull())
            return fail(-EINVAL, cat("config file ", name, ": the top level must be a mapping of keys"));
        Config out;
        flatten(root, "", out);
        // transports: {tcp: {lanes: 2}} is the same as tcp.lanes: 2
        Config renamed;
        for (auto &[k, v] : out) {
            if (k.rfind("transports.", 0) == 0) renamed[k.substr(11)] = v;
            else renamed[k] = v;
        }
        return renamed;
    } catch (const YAML::Exception &e) {
        return fail(-EINVAL, cat("config file ", name, ": ", e.what()));
    }
}

Result<Config> load_yaml_config(const std::string &path) {
    // A configuration names the plugins to load and where the secrets are: a file other users
    // could change is refused like a plugin they could (file_trust.hpp).
    auto file = open_private_file(path, "config file", "configuration", Secrecy::Public);
    if (!file) return std::unexpected(file.error());
    auto text = read_all(*file, 16u << 20);
    if (!text) return fail(text.error().code, cat("config file ", path, ": cannot read: ", text.error().message));
    return parse_yaml_config(*text, path);
}

Result<EngineSettings> parse_engine_settings(const Config &config) {
    EngineSettings s;
    s.protocols = split_list(kDefaultProtocolPriority);
    const std::string *auth_secret = nullptr, *auth_secret_file = nullptr;
    for (const auto &[key, value] : config) {
        if (auto dot = key.find('.'); dot != std::string::npos) {
            if (dot == 0 || dot + 1 == key.size())
                return fail(-EINVAL, cat("config key '", key, "' must look like <transport>.<option>"));
            s.plugin_options[key.substr(0, dot)].emplace_back(key.substr(dot + 1), value);
            continue;
        }
        if (!is_engine_key(key)) {
            std::string known;
            for (const auto &k : kEngineKeys) known += (known.empty() ? "" : ", ") + std::string(k.key);
            return fail(-EINVAL, cat("unknown config key '", key, "'; engine keys are: ", known,
                                     "; transport options are written <transport>.<option>"));
        }
        if (key == "metadata" || key == "metadata_server") s.metadata.url = value;
        else if (key == "local_ip") s.metadata.local_ip = value;
        else if (key == "rpc_port") {
            auto v = parse_unsigned(key, value, 65535);
            if (!v) return std::unexpected(v.error());
            s.metadata.rpc_port = static_cast<uint16_t>(*v);
        } else if (key == "local_server_name") s.metadata.local_server_name = value;
        else if (key == "host_id") s.host_id = value;
        else if (key == "protocols") {
            s.protocols = split_list(value);
            if (s.protocols.empty())
                return fail(-EINVAL, "config key 'protocols' is empty; list transports, e.g. shm,tcp");
        } else if (key == "plugin_path") s.plugin_path = split_list(value, ':');
        else if (key == "plugins") s.plugins = value;
        else if (key == "plugin_trust") {
            if (!value.empty() && !parse_trust_level(value))
                return fail(-EINVAL, cat("config key 'plugin_trust' = '", value,
                                         "'; use strict, owner (the default) or any (docs/DESIGN.md, \"What the "
                                         "loader trusts\")"));
            s.plugin_trust = value;
        } else if (key == "log_level") {
            log::Level l;
            if (!log::parse_level(value, l))
                return fail(-EINVAL,
                            cat("config key 'log_level' = '", value, "'; use error, warn, info, debug or trace"));
            s.log_level = value;
        } else if (key == "handshake_timeout_ms") {
            auto v = parse_unsigned(key, value, 3600000);
            if (!v || *v == 0)
                return fail(-EINVAL, cat("config key 'handshake_timeout_ms' = '", value, "'; use 1..3600000"));
            s.metadata.timeout = std::chrono::milliseconds(*v);
        } else if (key == "metadata_retry_ms") {
            auto v = parse_unsigned(key, value, 3600000);
            if (!v) return std::unexpected(v.error());
            s.metadata.retry_for = std::chrono::milliseconds(*v);
        } else if (key == "etcd_lease_ttl_s") {
            auto v = parse_unsigned(key, value, 3600);
            if (!v || *v < 2)
                return fail(-EINVAL, cat("config key 'etcd_lease_ttl_s' = '", value, "'; use 2..3600 seconds"));
            s.metadata.lease_ttl_s = static_cast<int>(*v);
        } else if (key == "metadata_poll_ms") {
            auto v = parse_unsigned(key, value, 3600000);
            if (!v || *v < 100)
                return fail(-EINVAL, cat("config key 'metadata_poll_ms' = '", value, "'; use 100..3600000"));
            s.metadata.poll = std::chrono::milliseconds(*v);
        } else if (std::string *etcd_field = etcd_security_field(s.metadata.etcd, key)) {
            *etcd_field = value;
        } else if (std::string *redis_field = redis_setting_field(s.metadata.redis, key)) {
            *redis_field = value;
        } else if (key == "auth_secret") auth_secret = &value;
        else if (key == "auth_secret_file") auth_secret_file = &value;
        else if (key == "notification_queue_max") {
            auto v = parse_unsigned(key, value, 1u << 24);
            if (!v || *v == 0)
                return fail(-EINVAL, cat("config key 'notification_queue_max' = '", value, "'; use 1..16777216"));
            s.notification_queue_max = *v;
        } else if (key == "gpu_staging_max_bytes") {
            auto v = parse_unsigned(key, value, 1ull << 40);
            if (!v)
                return fail(-EINVAL, cat("config key 'gpu_staging_max_bytes' = '", value,
                                         "'; use 0 (no staging) or a byte count up to 1 TiB, e.g. 67108864"));
            s.gpu_staging_max_bytes = *v;
        } else if (key == "gpu_staging_slice_bytes") {
            auto v = parse_unsigned(key, value, 1ull << 30);
            if (!v || *v < 4096 || (*v & (*v - 1)) != 0)
                return fail(-EINVAL, cat("config key 'gpu_staging_slice_bytes' = '", value,
                                         "'; use a power of two from 4096 to 1073741824, e.g. 4194304"));
            s.gpu_staging_slice_bytes = *v;
        } else if (key == "gpu_staging_gather_max_op_bytes") {
            auto v = parse_unsigned(key, value, 1ull << 29);
            if (!v)
                return fail(-EINVAL, cat("config key 'gpu_staging_gather_max_op_bytes' = '", value,
                                         "'; use 0 (a slice per op) or a byte count up to half of "
                                         "gpu_staging_slice_bytes, e.g. 1048576"));
            s.gpu_staging_gather_max_op_bytes = *v;
        } else if (key == "metrics_port") {
            if (value != "off") {
                auto v = parse_unsigned(key, value, 65535);
                if (!v)
                    return fail(-EINVAL, cat("config key 'metrics_port' = '", value,
                                             "'; use off (the default), a port such as 9100, or 0 for any free port"));
                s.metrics_port = static_cast<uint16_t>(*v);
            }
        } else if (key == "metrics_bind_ip") {
            s.metrics_bind_ip = value;
        } else if (key == "max_failover_attempts") {
            auto v = parse_unsigned(key, value, 16);
            if (!v)
                return fail(-EINVAL, cat("config key 'max_failover_attempts' = '", value,
                                         "'; use 0 (no failover) to 16, e.g. 2 (the default)"));
            s.max_failover_attempts = static_cast<unsigned>(*v);
        } else if (key == "failover_deadline_ms" || key == "path_cooldown_ms" || key == "path_cooldown_max_ms") {
            uint64_t max = key == "path_cooldown_ms" ? 3600000 : 86400000;
            auto v = parse_unsigned(key, value, max);
            if (!v || *v == 0)
                return fail(-EINVAL, cat("config key '", key, "' = '", value, "'; use milliseconds 1..", max));
            std::chrono::milliseconds ms(*v);
            (key == "failover_deadline_ms" ? s.failover_deadline
             : key == "path_cooldown_ms"   ? s.path_cooldown
                                           : s.path_cooldown_max) = ms;
        } else if (key == "huge_pages") {
            if (value == "off") s.huge_pages = EngineSettings::HugePages::Off;
            else if (value == "advise") s.huge_pages = EngineSettings::HugePages::Advise;
            else if (value == "collapse") s.huge_pages = EngineSettings::HugePages::Collapse;
            else
                return fail(-EINVAL, cat("config key 'huge_pages' = '", value,
                                         "'; use off (the default), advise or collapse (docs/PERFORMANCE.md, \"Host "
                                         "buffers and huge pages\")"));
        } else if (auto c = parse_control_limit(key, value, s.control); !c) {
            return std::unexpected(c.error());
        }
    }
    if (s.gpu_staging_max_bytes != 0 && s.gpu_staging_slice_bytes > s.gpu_staging_max_bytes)
        return fail(-EINVAL, cat("gpu_staging_slice_bytes (", s.gpu_staging_slice_bytes,
                                 ") is larger than gpu_staging_max_bytes (", s.gpu_staging_max_bytes,
                                 "): no slice could ever be lent; raise the bound or shrink the slice"));
    if (s.gpu_staging_gather_max_op_bytes && *s.gpu_staging_gather_max_op_bytes > s.gpu_staging_slice_bytes / 2)
        return fail(-EINVAL, cat("gpu_staging_gather_max_op_bytes (", *s.gpu_staging_gather_max_op_bytes,
                                 ") is more than half of gpu_staging_slice_bytes (", s.gpu_staging_slice_bytes,
                                 "): no two such ops would share a slice; lower it or grow the slice"));
    if (s.path_cooldown > s.path_cooldown_max)
        return fail(-EINVAL,
                    cat("path_cooldown_ms (", s.path_cooldown.count(), ") is longer than path_cooldown_max_ms (",
                        s.path_cooldown_max.count(), "); raise the maximum or shorten the first pause"));
    if (auto etcd = resolve_etcd_security(s.metadata); !etcd) return std::unexpected(etcd.error());
    if (auto redis = resolve_redis_settings(s.metadata); !redis) return std::unexpected(redis.error());
    auto auth = resolve_auth_secret(auth_secret, auth_secret_file);
    if (!auth) return std::unexpected(auth.error());
    s.auth = std::move(*auth);
    // local_server_name "ip:port" also sets where the P2P handshake listens.
    if (!s.metadata.local_server_name.empty() && (s.metadata.url.empty() || s.metadata.url == "P2PHANDSHAKE")) {
        auto colon = s.metadata.local_server_name.rfind(':');
        if (colon != std::string::npos && config.count("local_ip") == 0) {
            s.metadata.local_ip = s.metadata.local_server_name.substr(0, colon);
            if (config.count("rpc_port") == 0) {
                auto v = parse_unsigned("local_server_name", s.metadata.local_server_name.substr(colon + 1), 65535);
                if (!v) return std::unexpected(v.error());
                s.metadata.rpc_port = static_cast<uint16_t>(*v);
            }
        }
    }
    if (s.metadata.local_ip != MetadataSettings{}.local_ip) inherit_bind_ip(s);
    return s;
}

}  // namespace ferry
