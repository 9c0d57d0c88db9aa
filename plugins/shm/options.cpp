#include "options.hpp"

#include "plugin_util.hpp"

#include <cerrno>
#include <cstring>

namespace ferry_shm {

namespace {

using ferry_plugin::OptionValue;
using ferry_plugin::store;

// Only its presence matters here (options.hpp).
bool store_auth_key(Config &c, const OptionValue &) {
    c.same_user_only = true;
    return true;
}

}  // namespace

// clang-format off
constexpr ferry_plugin::OptionTable<Config, kOptionCount> kOptions = ferry_plugin::make_options<Config>("shm",
    ferry_plugin::uint_option<Config>("copy_threads", "2", 1, 64, "serving-side copy workers",
        store<&Config::copy_threads>),
    ferry_plugin::size_option<Config>("chunk_size", "1m", 4096, 1ull << 30,
        "a larger op is copied in pieces of this size, spread over the workers", store<&Config::chunk_size>),
    ferry_plugin::size_option<Config>("inline_size", "64k", 0, 16ull << 20,
        "ops up to this size are copied by the I/O thread itself", store<&Config::inline_size>),
    ferry_plugin::duration_option<Config>("connect_timeout_ms", "5000", 1, 3600000,
        "connect(): handshake and access probe; also a served connection's time to say Hello",
        store<&Config::connect_timeout_ms>),
    ferry_plugin::duration_option<Config>("op_timeout_ms", "30000", 0, 86400000,
        "an op unanswered this long fails with -ETIMEDOUT", store<&Config::op_timeout_ms>,
        "milliseconds from 0 (never) to 86400000"),
    ferry_plugin::bool_option<Config>("ptracer_any", "false",
        "Yama ptrace_scope=1: PR_SET_PTRACER_ANY on this process, so peers may attach", store<&Config::ptracer_any>),
    ferry_plugin::bool_option<Config>("adopt_memfd", "false",
        "move registered anonymous regions into memfds, and map initiators' memfds when they offer theirs",
        store<&Config::adopt_memfd>),
    ferry_plugin::uint_option<Config>("max_connections", "1024", 1, 1u << 20,
        "serving side: connections at once, all initiators", store<&Config::max_connections>),
    ferry_plugin::uint_option<Config>("max_connections_per_user", "128", 1, 1u << 20,
        "serving side: connections at once from the processes of one uid", store<&Config::max_connections_per_user>),
    ferry_plugin::secret_option<Config>("auth_key", "a non-empty value (the host derives it from auth_secret)",
        "set by the host when the cluster has a secret: serve only processes of our own user", store_auth_key));
// clang-format on

int parse_config(const ferry_kv_t *options, size_t n, Config *out, ferry_error_t *err) {
    Config cfg;
    if (int rc = kOptions.parse(options, n, cfg, err)) return rc;
    *out = cfg;
    return 0;
}

}  // namespace ferry_shm
