#include "options.hpp"

#include "plugin_util.hpp"

#include <sched.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace ferry_efa {

namespace {

constexpr const char *kKnownKeys = "provider, node, connect_timeout_ms, op_timeout_ms, max_mr_size, busy_poll, spin_us";

int bad(ferry_error_t *err, const char *key, const char *value, const char *accepted) {
    return set_error(err, -EINVAL, "efa: invalid value '%s' for option '%s': expected %s", value ? value : "(null)",
                     key, accepted);
}

bool in_range(const char *value, bool sizes, uint64_t lo, uint64_t hi, uint64_t *out) {
    uint64_t v = 0;
    if (!parse_u64(value, sizes, &v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool is_name(const char *s) {
    if (s == nullptr || *s == '\0' || strlen(s) > 64) return false;
    for (; *s; ++s)
        if (!(isalnum(static_cast<unsigned char>(*s)) || *s == '_' || *s == '-' || *s == ';')) return false;
    return true;
}

bool ip_provider(const std::string &p) {
    return p == "tcp" || p == "udp" || p == "sockets" || p.rfind("tcp;", 0) == 0 || p.rfind("udp;", 0) == 0;
}

}  // namespace

// The progress thread's spin after work pays off only with a CPU to spare: the application's
// thread, this progress thread and, on one host, the peer's pair all want one. Below 4 CPUs it
// steals the peer's (issue 23, 2 vCPUs: spin_us=0 gave 4.3/4.8/3.4 GB/s against 2.3/1.9/4.1).
static unsigned default_spin_us() {
    cpu_set_t set;
    CPU_ZERO(&set);
    int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
    return cpus >= 4 ? 1000 : 0;
}

int parse_config(const ferry_kv_t *options, size_t n, Config *out, ferry_error_t *err) {
    Config cfg;
    cfg.spin_us = default_spin_us();
    if (const char *env = std::getenv("FERRY_EFA_PROVIDER"); env != nullptr && *env != '\0') {
        if (!is_name(env)) return set_error(err, -EINVAL, "efa: FERRY_EFA_PROVIDER='%s' is not a provider name", env);
        cfg.provider = env;
        cfg.provider_chosen = true;
    }
    bool node_set = false;
    for (size_t i = 0; i < n; ++i) {
        const char *key = options[i].key ? options[i].key : "";
        const char *value = options[i].value;
        uint64_t v = 0;
        if (strcmp(key, "provider") == 0) {
            if (!is_name(value)) return bad(err, key, value, "a libfabric provider name such as efa or tcp");
            cfg.provider = value;
            cfg.provider_chosen = true;
        } else if (strcmp(key, "node") == 0) {
            if (value == nullptr || strlen(value) > 255)
                return bad(err, key, value, "an address for fi_getinfo, e.g. 127.0.0.1");
            cfg.node = value;
            node_set = true;
        } else if (strcmp(key, "connect_timeout_ms") == 0) {
            if (!in_range(value, false, 1, 3600000, &v)) return bad(err, key, value, "milliseconds from 1 to 3600000");
            cfg.connect_timeout_ms = static_cast<unsigned>(v);
        } else if (strcmp(key, "op_timeout_ms") == 0) {
            if (!in_range(value, false, 0, 86400000, &v))
                return bad(err, key, value, "milliseconds from 0 (never) to 86400000");
            cfg.op_timeout_ms = static_cast<unsigned>(v);
        } else if (strcmp(key, "max_mr_size") == 0) {
            if (!in_range(value, true, 0, UINT64_MAX, &v) || (v != 0 && v < 4096))
                return bad(err, key, value, "0 (the provider's limit) or a size of at least 4k (suffixes k, m, g)");
            cfg.max_mr_size = v;
        } else if (strcmp(key, "spin_us") == 0) {
            if (!in_range(value, false, 0, 1000000, &v)) return bad(err, key, value, "microseconds from 0 to 1000000");
            cfg.spin_us = static_cast<unsigned>(v);
        } else if (strcmp(key, "busy_poll") == 0) {
            if (!parse_bool(value, &cfg.busy_poll)) return bad(err, key, value, "true or false");
        } else {
            return set_error(err, -EINVAL, "efa: unknown option '%s' (known: %s)", key, kKnownKeys);
        }
    }
    if (!node_set && ip_provider(cfg.provider)) cfg.node = "127.0.0.1";
    *out = cfg;
    return 0;
}

}  // namespace ferry_efa
