#include "options.hpp"

#include "plugin_util.hpp"

#include <sched.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>

namespace ferry_efa {

namespace {

using ferry_plugin::OptionValue;
using ferry_plugin::store;

bool is_name(const char *s) {
    if (s == nullptr || *s == '\0' || strlen(s) > 64) return false;
    for (; *s; ++s)
        if (!(isalnum(static_cast<unsigned char>(*s)) || *s == '_' || *s == '-' || *s == ';')) return false;
    return true;
}

bool ip_provider(const std::string &p) {
    return p == "tcp" || p == "udp" || p == "sockets" || p.rfind("tcp;", 0) == 0 || p.rfind("udp;", 0) == 0;
}

bool store_provider(Config &c, const OptionValue &v) {
    if (!is_name(v.text)) return false;
    c.provider = v.text;
    c.provider_chosen = true;
    return true;
}

// node_set: an empty Config::node after parsing means "not given" only if no option named it.
bool store_node(Config &c, const OptionValue &v) {
    if (strlen(v.text) > 255) return false;
    c.node = v.text;
    c.node_set = true;
    return true;
}

bool store_max_mr_size(Config &c, const OptionValue &v) {
    if (v.number != 0 && v.number < 4096) return false;
    c.max_mr_size = v.number;
    return true;
}

}  // namespace

// clang-format off
constexpr ferry_plugin::OptionTable<Config, kOptionCount> kOptions = ferry_plugin::make_options<Config>("efa",
    ferry_plugin::string_option<Config>("provider", "$FERRY_EFA_PROVIDER or efa",
        "a libfabric provider name such as efa or tcp",
        "libfabric provider; tcp runs the same code over TCP (tcp;ofi_rxm) without EFA", store_provider),
    ferry_plugin::string_option<Config>("node", "127.0.0.1 for IP providers, else none",
        "an address for fi_getinfo, e.g. 127.0.0.1", "fi_getinfo node: the source address to bind", store_node),
    ferry_plugin::duration_option<Config>("connect_timeout_ms", "5000", 1, 3600000,
        "connect() and import_mem() queries to a peer", store<&Config::connect_timeout_ms>),
    ferry_plugin::duration_option<Config>("op_timeout_ms", "30000", 0, 86400000, "an op not done this long fails",
        store<&Config::op_timeout_ms>, "milliseconds from 0 (never) to 86400000"),
    ferry_plugin::size_option<Config>("max_mr_size", "0", 0, UINT64_MAX,
        "split registrations above this; 0: the provider's limit", store_max_mr_size,
        "0 (the provider's limit) or a size of at least 4k (suffixes k, m, g)"),
    ferry_plugin::bool_option<Config>("busy_poll", "false",
        "the progress thread spins instead of sleeping on the completion queue", store<&Config::busy_poll>),
    ferry_plugin::uint_option<Config>("spin_us", "auto: 1000 with >= 4 CPUs, else 0", 0, 1000000,
        "after any work, keep polling this long (microseconds) before sleeping", store<&Config::spin_us>,
        "microseconds from 0 to 1000000"));
// clang-format on

// The progress thread's spin after work pays off only with a CPU to spare: the application's
// thread, this progress thread and, on one host, the peer's pair all want one. Below 4 CPUs it
// steals the peer's (measured on 2 vCPUs: spin_us=0 gave 4.3/4.8/3.4 GB/s against 2.3/1.9/4.1).
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
    if (int rc = kOptions.parse(options, n, cfg, err)) return rc;
    if (!cfg.node_set && ip_provider(cfg.provider)) cfg.node = "127.0.0.1";
    *out = cfg;
    return 0;
}

}  // namespace ferry_efa
