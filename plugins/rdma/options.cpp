#include "options.hpp"

#include "plugin_util.hpp"

#include "auth_proof.hpp"
#include "hmac_sha256.hpp"

#include <arpa/inet.h>

#include <cerrno>
#include <cstring>

namespace ferry_rdma {

namespace {

using ferry_plugin::OptionValue;
using ferry_plugin::store;

bool is_device_name(const std::string &s) {
    if (s.empty() || s.size() > 63) return false;
    for (char c : s)
        if (!(isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-' || c == '.')) return false;
    return true;
}

// "" clears the list (every device with an active port).
bool store_devices(Config &c, const OptionValue &v) {
    std::vector<std::string> list;
    std::string cur;
    if (*v.text == '\0') return c.devices.clear(), true;
    for (const char *p = v.text;; ++p) {
        if (*p == ',' || *p == '\0') {
            if (!is_device_name(cur)) return false;
            list.push_back(cur);
            cur.clear();
            if (*p == '\0') break;
        } else if (*p != ' ') {
            cur += *p;
        }
    }
    c.devices = std::move(list);
    return true;
}

bool store_gid_index(Config &c, const OptionValue &v) {
    if (strcmp(v.text, "auto") == 0) return c.gid_index = -1, true;
    char *end = nullptr;
    if (*v.text < '0' || *v.text > '9') return false;
    unsigned long n = strtoul(v.text, &end, 10);
    if (*end != '\0' || n > 1023) return false;
    c.gid_index = static_cast<int>(n);
    return true;
}

bool store_mtu(Config &c, const OptionValue &v) {
    if (v.number != 0 && v.number != 256 && v.number != 512 && v.number != 1024 && v.number != 2048 && v.number != 4096)
        return false;
    c.mtu = static_cast<unsigned>(v.number);
    return true;
}

template <std::string Config::*Member>
bool store_ipv4(Config &c, const OptionValue &v) {
    in_addr a{};
    if (inet_pton(AF_INET, v.text, &a) != 1) return false;
    c.*Member = v.text;
    return true;
}

template <std::string Config::*Member>
bool store_path(Config &c, const OptionValue &v) {
    if (*v.text == '\0' || strlen(v.text) >= 4096) return false;
    c.*Member = v.text;
    return true;
}

// The control server's reply deadline follows the connect timeout.
bool store_connect_timeout(Config &c, const OptionValue &v) {
    c.connect_timeout_ms = static_cast<unsigned>(v.number);
    c.control.reply_timeout_ms = c.connect_timeout_ms;
    return true;
}

template <unsigned ControlLimits::*Member>
bool store_control(Config &c, const OptionValue &v) {
    c.control.*Member = static_cast<unsigned>(v.number);
    return true;
}

bool store_max_mr_size(Config &c, const OptionValue &v) {
    if (v.number != 0 && (v.number < 4096 || v.number % 4096 != 0)) return false;
    c.max_mr_size = v.number;
    return true;
}

bool store_auth_key(Config &c, const OptionValue &v) { return ferry_auth::transport_key_from_hex(v.text, c.auth_key); }

}  // namespace

// clang-format off
constexpr ferry_plugin::OptionTable<Config, kOptionCount> kOptions = ferry_plugin::make_options<Config>("rdma",
    ferry_plugin::string_option<Config>("devices", "",
        "a comma-separated list of RDMA device names such as mlx5_0,mlx5_1 (see ibv_devices)",
        "RDMA devices to use; empty: every device with an active port", store_devices),
    ferry_plugin::uint_option<Config>("ib_port", "1", 1, 255, "port of each device", store<&Config::ib_port>,
        "a port number from 1 to 255"),
    ferry_plugin::string_option<Config>("gid_index", "auto", "auto or a GID table index from 0 to 1023 (see show_gids)",
        "auto: the RoCE v2 IPv4-mapped GID if any, else GID 0 (InfiniBand uses the LID)", store_gid_index),
    ferry_plugin::uint_option<Config>("traffic_class", "0", 0, 255, "IP traffic class of RoCE packets",
        store<&Config::traffic_class>, "0 to 255"),
    ferry_plugin::uint_option<Config>("service_level", "0", 0, 15, "InfiniBand service level",
        store<&Config::service_level>, "0 to 15"),
    ferry_plugin::uint_option<Config>("mtu", "0", 0, 4096,
        "path MTU; 0: the ports' active MTU (the smaller of both ends)", store_mtu,
        "0 (the ports' active MTU), 256, 512, 1024, 2048 or 4096"),
    ferry_plugin::string_option<Config>("bind_ip", "127.0.0.1", "an IPv4 address such as 127.0.0.1",
        "address the handshake/control server binds; set it to the management network's for other hosts",
        store_ipv4<&Config::bind_ip>),
    ferry_plugin::string_option<Config>("advertise_ip", "bind_ip", "an IPv4 address such as 127.0.0.1",
        "address written into the endpoint (needed when bind_ip is 0.0.0.0)", store_ipv4<&Config::advertise_ip>),
    ferry_plugin::uint_option<Config>("port", "0", 0, 65535, "control server port (0: any)", store<&Config::port>,
        "a TCP port from 0 (any) to 65535"),
    ferry_plugin::duration_option<Config>("connect_timeout_ms", "5000", 1, 3600000,
        "connecting to a peer's control server and its handshake; also the deadline for one reply",
        store_connect_timeout),
    ferry_plugin::duration_option<Config>("handshake_timeout_ms", "5000", 10, 600000,
        "a served control connection must finish Hello/Auth within this", store_control<&ControlLimits::handshake_timeout_ms>,
        "milliseconds from 10 to 600000 for a control connection's handshake"),
    ferry_plugin::uint_option<Config>("max_control_connections", "1024", 1, 1000000,
        "open control connections, authenticated or not", store_control<&ControlLimits::max_connections>,
        "control connections from 1 to 1000000"),
    ferry_plugin::uint_option<Config>("max_unauthenticated_per_address", "32", 1, 1000000,
        "control connections in their handshake from one peer address",
        store_control<&ControlLimits::max_unauthenticated_per_address>,
        "connections in their handshake per peer address, from 1 to 1000000"),
    ferry_plugin::duration_option<Config>("op_timeout_ms", "30000", 0, 86400000,
        "an op waiting for a queue pair this long fails", store<&Config::op_timeout_ms>,
        "milliseconds from 0 (never) to 86400000"),
    ferry_plugin::size_option<Config>("max_mr_size", "0", 0, UINT64_MAX,
        "split registrations above this; 0: the device's max_mr_size", store_max_mr_size,
        "0 (the device's limit) or a multiple of 4k, at least 4k (suffixes k, m, g)"),
    ferry_plugin::uint_option<Config>("max_wr", "256", 2, 65536, "send queue depth per queue pair (capped by the device)",
        store<&Config::max_wr>, "work requests per queue pair from 2 to 65536"),
    ferry_plugin::uint_option<Config>("signal_interval", "32", 1, 65536,
        "at most this many unsignalled work requests in a row", store<&Config::signal_interval>,
        "1 (signal every work request) to 65536"),
    ferry_plugin::size_option<Config>("stripe_min", "1m", 4096, UINT64_MAX,
        "ops at least twice this are striped over equally near NICs", store<&Config::stripe_min>,
        "a size of at least 4k (suffixes k, m, g)"),
    ferry_plugin::size_option<Config>("max_wr_size", "1g", 4096, 1ull << 31,
        "a work request carries at most this (and the port's max_msg_sz)", store<&Config::max_wr_size>,
        "a size from 4k to 2g (suffixes k, m, g)"),
    ferry_plugin::uint_option<Config>("retry_timeout", "14", 1, 31, "local ACK timeout exponent: 4.096 us * 2^n",
        store<&Config::retry_timeout>, "an exponent from 1 to 31 (4.096 us * 2^n)"),
    ferry_plugin::uint_option<Config>("retry_count", "7", 0, 7, "transport retries before a queue pair fails",
        store<&Config::retry_count>, "0 to 7"),
    ferry_plugin::bool_option<Config>("busy_poll", "false",
        "the progress thread spins instead of sleeping on the completion channels", store<&Config::busy_poll>),
    ferry_plugin::uint_option<Config>("spin_us", "200", 0, 1000000,
        "after any work, keep polling this long (microseconds) before sleeping", store<&Config::spin_us>,
        "microseconds from 0 to 1000000"),
    ferry_plugin::string_option<Config>("sysfs_root", "/sys", "a directory such as /sys",
        "where topology is read from (tests point it at a fake tree)", store_path<&Config::sysfs_root>),
    ferry_plugin::string_option<Config>("cuda_library", "libcuda.so.1", "a library name or path for dlopen",
        "CUDA driver library, dlopen'ed on first use of CUDA memory", store_path<&Config::cuda_library>),
    ferry_plugin::string_option<Config>("hsa_library", "libhsa-runtime64.so.1", "a library name or path for dlopen",
        "ROCm HSA runtime, dlopen'ed on first use of ROCm memory", store_path<&Config::hsa_library>),
    ferry_plugin::secret_option<Config>("auth_key", "at least 32 hex digits (the host derives it from auth_secret)",
        "cluster key set by the host from auth_secret: control connections need the same key at both ends",
        store_auth_key));
// clang-format on

int parse_config(const ferry_kv_t *options, size_t n, Config *out, ferry_error_t *err) {
    Config c;
    if (int rc = kOptions.parse(options, n, c, err)) return rc;
    if (!c.auth_key.empty() && !ferry_crypto::available())
        return set_error(err, -ENOENT, "rdma: option 'auth_key': %s", ferry_crypto::load_error().c_str());
    if (c.advertise_ip.empty()) c.advertise_ip = c.bind_ip;
    if (c.advertise_ip == "0.0.0.0")
        return set_error(
            err, -EINVAL,
            "rdma: bind_ip is 0.0.0.0, so peers need advertise_ip: set rdma.advertise_ip to this host's address");
    *out = std::move(c);
    return 0;
}

}  // namespace ferry_rdma
