#include "options.hpp"

#include "plugin_util.hpp"

#include "hmac_sha256.hpp"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

namespace ferry_rdma {

namespace {

constexpr const char *kKnownKeys =
    "devices, ib_port, gid_index, traffic_class, service_level, mtu, bind_ip, advertise_ip, port, "
    "connect_timeout_ms, handshake_timeout_ms, max_control_connections, max_unauthenticated_per_address, "
    "op_timeout_ms, max_mr_size, max_wr, signal_interval, stripe_min, max_wr_size, "
    "retry_timeout, retry_count, busy_poll, spin_us, sysfs_root, cuda_library, hsa_library, auth_key";

int bad(ferry_error_t *err, const char *key, const char *value, const char *accepted) {
    return set_error(err, -EINVAL, "rdma: invalid value '%s' for option '%s': expected %s", value ? value : "(null)",
                     key, accepted);
}

bool in_range(const char *value, bool sizes, uint64_t lo, uint64_t hi, uint64_t *out) {
    uint64_t v = 0;
    if (!parse_u64(value, sizes, &v) || v < lo || v > hi) return false;
    *out = v;
    return true;
}

bool is_device_name(const std::string &s) {
    if (s.empty() || s.size() > 63) return false;
    for (char c : s)
        if (!(isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
    return true;
}

bool split_devices(const char *value, std::vector<std::string> *out) {
    if (value == nullptr) return false;
    std::vector<std::string> list;
    std::string cur;
    for (const char *p = value;; ++p) {
        if (*p == ',' || *p == '\0') {
            if (!is_device_name(cur)) return false;
            list.push_back(cur);
            cur.clear();
            if (*p == '\0') break;
        } else if (*p != ' ') {
            cur += *p;
        }
    }
    *out = std::move(list);
    return true;
}

bool is_ipv4(const char *s) {
    in_addr a{};
    return s != nullptr && inet_pton(AF_INET, s, &a) == 1;
}

bool is_path(const char *s) { return s != nullptr && *s != '\0' && strlen(s) < 4096; }

}  // namespace

int parse_config(const ferry_kv_t *options, size_t n, Config *out, ferry_error_t *err) {
    Config c;
    for (size_t i = 0; i < n; ++i) {
        const char *key = options[i].key ? options[i].key : "";
        const char *value = options[i].value;
        uint64_t v = 0;
        if (strcmp(key, "devices") == 0) {
            if (value != nullptr && *value == '\0') c.devices.clear();
            else if (!split_devices(value, &c.devices))
                return bad(err, key, value,
                           "a comma-separated list of RDMA device names such as mlx5_0,mlx5_1 (see ibv_devices)");
        } else if (strcmp(key, "ib_port") == 0) {
            if (!in_range(value, false, 1, 255, &v)) return bad(err, key, value, "a port number from 1 to 255");
            c.ib_port = static_cast<unsigned>(v);
        } else if (strcmp(key, "gid_index") == 0) {
            if (value != nullptr && strcmp(value, "auto") == 0) c.gid_index = -1;
            else if (!in_range(value, false, 0, 1023, &v))
                return bad(err, key, value, "auto or a GID table index from 0 to 1023 (see show_gids)");
            else c.gid_index = static_cast<int>(v);
        } else if (strcmp(key, "traffic_class") == 0) {
            if (!in_range(value, false, 0, 255, &v)) return bad(err, key, value, "0 to 255");
            c.traffic_class = static_cast<unsigned>(v);
        } else if (strcmp(key, "service_level") == 0) {
            if (!in_range(value, false, 0, 15, &v)) return bad(err, key, value, "0 to 15");
            c.service_level = static_cast<unsigned>(v);
        } else if (strcmp(key, "mtu") == 0) {
            if (!in_range(value, false, 0, 4096, &v) ||
                (v != 0 && v != 256 && v != 512 && v != 1024 && v != 2048 && v != 4096))
                return bad(err, key, value, "0 (the ports' active MTU), 256, 512, 1024, 2048 or 4096");
            c.mtu = static_cast<unsigned>(v);
        } else if (strcmp(key, "bind_ip") == 0 || strcmp(key, "advertise_ip") == 0) {
            if (!is_ipv4(value)) return bad(err, key, value, "an IPv4 address such as 127.0.0.1");
            (key[0] == 'b' ? c.bind_ip : c.advertise_ip) = value;
        } else if (strcmp(key, "port") == 0) {
            if (!in_range(value, false, 0, 65535, &v)) return bad(err, key, value, "a TCP port from 0 (any) to 65535");
            c.port = static_cast<uint16_t>(v);
        } else if (strcmp(key, "connect_timeout_ms") == 0) {
            if (!in_range(value, false, 1, 3600000, &v)) return bad(err, key, value, "milliseconds from 1 to 3600000");
            c.connect_timeout_ms = static_cast<unsigned>(v);
            c.control.reply_timeout_ms = c.connect_timeout_ms;
        } else if (strcmp(key, "handshake_timeout_ms") == 0) {
            if (!in_range(value, false, 10, 600000, &v))
                return bad(err, key, value, "milliseconds from 10 to 600000 for a control connection's handshake");
            c.control.handshake_timeout_ms = static_cast<unsigned>(v);
        } else if (strcmp(key, "max_control_connections") == 0) {
            if (!in_range(value, false, 1, 1000000, &v))
                return bad(err, key, value, "control connections from 1 to 1000000");
            c.control.max_connections = static_cast<unsigned>(v);
        } else if (strcmp(key, "max_unauthenticated_per_address") == 0) {
            if (!in_range(value, false, 1, 1000000, &v))
                return bad(err, key, value, "connections in their handshake per peer address, from 1 to 1000000");
            c.control.max_unauthenticated_per_address = static_cast<unsigned>(v);
        } else if (strcmp(key, "op_timeout_ms") == 0) {
            if (!in_range(value, false, 0, 86400000, &v))
                return bad(err, key, value, "milliseconds from 0 (never) to 86400000");
            c.op_timeout_ms = static_cast<unsigned>(v);
        } else if (strcmp(key, "max_mr_size") == 0) {
            if (!in_range(value, true, 0, UINT64_MAX, &v) || (v != 0 && (v < 4096 || v % 4096 != 0)))
                return bad(err, key, value,
                           "0 (the device's limit) or a multiple of 4k, at least 4k (suffixes k, m, g)");
            c.max_mr_size = v;
        } else if (strcmp(key, "max_wr") == 0) {
            if (!in_range(value, false, 2, 65536, &v))
                return bad(err, key, value, "work requests per queue pair from 2 to 65536");
            c.max_wr = static_cast<uint32_t>(v);
        } else if (strcmp(key, "signal_interval") == 0) {
            if (!in_range(value, false, 1, 65536, &v))
                return bad(err, key, value, "1 (signal every work request) to 65536");
            c.signal_interval = static_cast<uint32_t>(v);
        } else if (strcmp(key, "stripe_min") == 0) {
            if (!in_range(value, true, 4096, UINT64_MAX, &v))
                return bad(err, key, value, "a size of at least 4k (suffixes k, m, g)");
            c.stripe_min = v;
        } else if (strcmp(key, "max_wr_size") == 0) {
            if (!in_range(value, true, 4096, 1ull << 31, &v))
                return bad(err, key, value, "a size from 4k to 2g (suffixes k, m, g)");
            c.max_wr_size = v;
        } else if (strcmp(key, "retry_timeout") == 0) {
            if (!in_range(value, false, 1, 31, &v))
                return bad(err, key, value, "an exponent from 1 to 31 (4.096 us * 2^n)");
            c.retry_timeout = static_cast<unsigned>(v);
        } else if (strcmp(key, "retry_count") == 0) {
            if (!in_range(value, false, 0, 7, &v)) return bad(err, key, value, "0 to 7");
            c.retry_count = static_cast<unsigned>(v);
        } else if (strcmp(key, "busy_poll") == 0) {
            if (!parse_bool(value, &c.busy_poll)) return bad(err, key, value, "true or false");
        } else if (strcmp(key, "spin_us") == 0) {
            if (!in_range(value, false, 0, 1000000, &v)) return bad(err, key, value, "microseconds from 0 to 1000000");
            c.spin_us = static_cast<unsigned>(v);
        } else if (strcmp(key, "sysfs_root") == 0) {
            if (!is_path(value)) return bad(err, key, value, "a directory such as /sys");
            c.sysfs_root = value;
        } else if (strcmp(key, "cuda_library") == 0 || strcmp(key, "hsa_library") == 0) {
            if (!is_path(value)) return bad(err, key, value, "a library name or path for dlopen");
            (key[0] == 'c' ? c.cuda_library : c.hsa_library) = value;
        } else if (strcmp(key, "auth_key") == 0) {
            // The value is a secret: never echoed.
            std::string raw;
            if (value == nullptr || strlen(value) < 32 || !ferry_crypto::from_hex(value, raw))
                return set_error(err, -EINVAL,
                                 "rdma: invalid value for option 'auth_key': expected at least 32 hex digits "
                                 "(the host derives it from auth_secret)");
            c.auth_key = std::move(raw);
            if (!ferry_crypto::available())
                return set_error(err, -ENOENT, "rdma: option 'auth_key': %s", ferry_crypto::load_error().c_str());
        } else {
            return set_error(err, -EINVAL, "rdma: unknown option '%s' (known: %s)", key, kKnownKeys);
        }
    }
    if (c.advertise_ip.empty()) c.advertise_ip = c.bind_ip;
    if (c.advertise_ip == "0.0.0.0")
        return set_error(
            err, -EINVAL,
            "rdma: bind_ip is 0.0.0.0, so peers need advertise_ip: set rdma.advertise_ip to this host's address");
    *out = std::move(c);
    return 0;
}

}  // namespace ferry_rdma
