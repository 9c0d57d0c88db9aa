#include "options.hpp"

#include "plugin_util.hpp"

#include <cerrno>
#include <cstring>

namespace ferry_shm {

namespace {

constexpr const char *kKnownKeys =
    "copy_threads, chunk_size, inline_size, connect_timeout_ms, op_timeout_ms, ptracer_any, adopt_memfd, "
    "max_connections, max_connections_per_user, auth_key";

int bad(ferry_error_t *err, const char *key, const char *value, const char *accepted) {
    return set_error(err, -EINVAL, "shm: invalid value '%s' for option '%s': expected %s", value ? value : "(null)",
                     key, accepted);
}

bool in_range(const char *value, bool sizes, uint64_t lo, uint64_t hi, uint64_t *out) {
    uint64_t v = 0;
    if (!parse_u64(value, sizes, &v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

}  // namespace

int parse_config(const ferry_kv_t *options, size_t n, Config *out, ferry_error_t *err) {
    Config cfg;
    for (size_t i = 0; i < n; ++i) {
        const char *key = options[i].key ? options[i].key : "";
        const char *value = options[i].value;
        uint64_t v = 0;
        if (strcmp(key, "copy_threads") == 0) {
            if (!in_range(value, false, 1, 64, &v)) return bad(err, key, value, "an integer from 1 to 64");
            cfg.copy_threads = static_cast<unsigned>(v);
        } else if (strcmp(key, "chunk_size") == 0) {
            if (!in_range(value, true, 4096, 1ull << 30, &v))
                return bad(err, key, value, "a size from 4k to 1g (suffixes k, m, g)");
            cfg.chunk_size = v;
        } else if (strcmp(key, "inline_size") == 0) {
            if (!in_range(value, true, 0, 16ull << 20, &v))
                return bad(err, key, value, "a size from 0 to 16m (suffixes k, m, g)");
            cfg.inline_size = v;
        } else if (strcmp(key, "connect_timeout_ms") == 0) {
            if (!in_range(value, false, 1, 3600000, &v)) return bad(err, key, value, "milliseconds from 1 to 3600000");
            cfg.connect_timeout_ms = static_cast<unsigned>(v);
        } else if (strcmp(key, "op_timeout_ms") == 0) {
            if (!in_range(value, false, 0, 86400000, &v))
                return bad(err, key, value, "milliseconds from 0 (never) to 86400000");
            cfg.op_timeout_ms = static_cast<unsigned>(v);
        } else if (strcmp(key, "max_connections") == 0) {
            if (!in_range(value, false, 1, 1u << 20, &v)) return bad(err, key, value, "an integer from 1 to 1048576");
            cfg.max_connections = static_cast<unsigned>(v);
        } else if (strcmp(key, "max_connections_per_user") == 0) {
            if (!in_range(value, false, 1, 1u << 20, &v)) return bad(err, key, value, "an integer from 1 to 1048576");
            cfg.max_connections_per_user = static_cast<unsigned>(v);
        } else if (strcmp(key, "adopt_memfd") == 0) {
            if (!parse_bool(value, &cfg.adopt_memfd)) return bad(err, key, value, "true or false");
        } else if (strcmp(key, "auth_key") == 0) {
            // Only its presence matters here (options.hpp); never echoed, it is a secret.
            if (value == nullptr || *value == '\0') return set_error(err, -EINVAL, "shm: option 'auth_key' is empty");
            cfg.same_user_only = true;
        } else if (strcmp(key, "ptracer_any") == 0) {
            if (!parse_bool(value, &cfg.ptracer_any)) return bad(err, key, value, "true or false");
        } else {
            return set_error(err, -EINVAL, "shm: unknown option '%s' (known: %s)", key, kKnownKeys);
        }
    }
    *out = cfg;
    return 0;
}

}  // namespace ferry_shm
