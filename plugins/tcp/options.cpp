#include "options.hpp"

#include "plugin_util.hpp"

#include "auth_proof.hpp"
#include "hmac_sha256.hpp"

#include <arpa/inet.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry_tcp {

namespace {

using ferry_plugin::OptionValue;
using ferry_plugin::store;

bool is_ip_literal(const char *s) {
    unsigned char buf[16];
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

template <std::string Config::*Member>
bool store_ip(Config &c, const OptionValue &v) {
    if (!is_ip_literal(v.text)) return false;
    c.*Member = v.text;
    return true;
}

template <unsigned Config::*Member>
bool store_sockbuf(Config &c, const OptionValue &v) {
    if (v.number != 0 && v.number < 4096) return false;
    c.*Member = static_cast<unsigned>(v.number);
    return true;
}

bool store_rails(Config &c, const OptionValue &v) {
    // Checked against the host's addresses when the instance starts (rails.cpp): a value the
    // host cannot serve is refused there with its addresses listed.
    const std::string text = v.text;
    if (!text.empty() && text != "auto")
        for (size_t start = 0; start <= text.size();) {
            size_t end = text.find(',', start);
            if (end == std::string::npos) end = text.size();
            if (!is_ip_literal(text.substr(start, end - start).c_str())) return false;
            start = end + 1;
        }
    c.rails = text;
    return true;
}

bool store_auth_key(Config &c, const OptionValue &v) { return ferry_auth::transport_key_from_hex(v.text, c.auth_key); }

constexpr const char *kIpAccepted = "a numeric IPv4 or IPv6 address such as 127.0.0.1";
constexpr const char *kSockbufAccepted = "0 (kernel autotuning) or a size from 4096 to 1g bytes (suffixes k, m, g)";

}  // namespace

// clang-format off
constexpr ferry_plugin::OptionTable<Config, kOptionCount> kOptions = ferry_plugin::make_options<Config>("tcp",
    ferry_plugin::string_option<Config>("bind_ip", "127.0.0.1", kIpAccepted,
        "address the listener binds; a wildcard (0.0.0.0, ::) needs advertise_ip", store_ip<&Config::bind_ip>),
    ferry_plugin::string_option<Config>("advertise_ip", "bind_ip", kIpAccepted,
        "address written into the endpoint peers connect to", store_ip<&Config::advertise_ip>),
    ferry_plugin::uint_option<Config>("port", "0", 0, 65535, "listening port (0: ephemeral)", store<&Config::port>,
        "a TCP port 0..65535 (0 = ephemeral)"),
    ferry_plugin::uint_option<Config>("advertise_port", "0", 0, 65535,
        "port written into the endpoint, where a NAT, container or relay forwards another one to the listener "
        "(0: the listening port)", store<&Config::advertise_port>, "a TCP port 0..65535 (0 = the listening port)"),
    ferry_plugin::string_option<Config>("rails", "", "a comma list of this host's addresses, or auto",
        "use several interfaces at once: a listener and lanes per address, slices spread by each rail's measured "
        "speed, a failed rail's slices moved to the others (empty: bind_ip alone)", store_rails),
    ferry_plugin::uint_option<Config>("lanes", "2", 1, 64, "connections per peer; ops are sliced over them",
        store<&Config::lanes>),
    ferry_plugin::size_option<Config>("slice_size", "1m", 4096, 64ull << 20,
        "ops are cut into slices of this size, spread over the least-loaded lanes", store<&Config::slice_size>),
    ferry_plugin::uint_option<Config>("io_threads", "0", 0, 64,
        "epoll threads of this instance; 0 = auto: min(lanes, usable CPUs), at least 1", store<&Config::io_threads>,
        "an integer 0..64 (0 = auto)"),
    ferry_plugin::duration_option<Config>("connect_timeout_ms", "5000", 1, 3600000,
        "connecting a lane and its HELLO exchange", store<&Config::connect_timeout_ms>),
    ferry_plugin::duration_option<Config>("op_timeout_ms", "30000", 0, 86400000,
        "no progress on a busy connection this long fails its ops", store<&Config::op_timeout_ms>,
        "milliseconds 0..86400000 (0 = no timeout)"),
    ferry_plugin::size_option<Config>("sndbuf", "0", 0, 1ull << 30, "SO_SNDBUF of each connection (0: kernel autotuning)",
        store_sockbuf<&Config::sndbuf>, kSockbufAccepted),
    ferry_plugin::size_option<Config>("rcvbuf", "0", 0, 1ull << 30, "SO_RCVBUF of each connection (0: kernel autotuning)",
        store_sockbuf<&Config::rcvbuf>, kSockbufAccepted),
    ferry_plugin::uint_option<Config>("zerocopy", "0", 0, 1,
        "splice large WRITE payloads by reference instead of copying them (slower on loopback, docs/PERFORMANCE.md)",
        store<&Config::zerocopy>, "0 (copy WRITE payloads) or 1 (splice them)"),
    ferry_plugin::secret_option<Config>("auth_key",
        "at least 32 hex digits (the host derives it from auth_secret)",
        "cluster key set by the host from auth_secret: both ends prove it before any request is served",
        store_auth_key),
    ferry_plugin::duration_option<Config>("handshake_timeout_ms", "10000", 10, 3600000,
        "a served connection that has not finished HELLO/AUTH by then is closed", store<&Config::handshake_timeout_ms>),
    ferry_plugin::uint_option<Config>("max_handshakes", "128", 1, 65535,
        "served connections not yet authenticated, in total", store<&Config::max_handshakes>),
    ferry_plugin::uint_option<Config>("max_handshakes_per_ip", "64", 1, 65535,
        "of those, from one peer address (>= lanes of one honest peer)", store<&Config::max_handshakes_per_ip>),
    ferry_plugin::uint_option<Config>("max_connections", "0", 0, 65535,
        "authenticated served connections, in total; 0 = auto: half of RLIMIT_NOFILE, 64..65535",
        store<&Config::max_connections>, "an integer 0..65535 (0 = half of RLIMIT_NOFILE)"),
    ferry_plugin::uint_option<Config>("max_connections_per_ip", "256", 1, 65535,
        "of those, from one peer address", store<&Config::max_connections_per_ip>),
    ferry_plugin::size_option<Config>("staged_pack_max_bytes", "1m", 0, 64ull << 20,
        "serving GPU memory: READ and WRITE requests up to this size that arrive together share one staging "
        "buffer and one copy (at most a quarter of the buffer; 0: a buffer per request)", store<&Config::staged_pack_max_bytes>));
// clang-format on

int parse_config(const ferry_kv_t *options, size_t n_options, Config *cfg, ferry_error_t *err) {
    Config c;
    if (int rc = kOptions.parse(options, n_options, c, err)) return rc;
    if (!c.auth_key.empty() && !ferry_crypto::available())
        return set_error(err, -ENOENT, "tcp: option 'auth_key': %s", ferry_crypto::load_error().c_str());
    if (c.io_threads == 0) {
        cpu_set_t set;
        unsigned cpus = 1;
        if (sched_getaffinity(0, sizeof set, &set) == 0) cpus = static_cast<unsigned>(CPU_COUNT(&set));
        // One reactor per lane, up to the CPUs we may run on: a lane's receive copy is the
        // bottleneck of a stream, so two lanes on one reactor are no faster than one (loopback
        // on 2 CPUs of a Xeon, 1 MiB writes: 2 lanes 2.9-3.7 GB/s on one reactor, 4.9-5.2 on two).
        c.io_threads = std::clamp(std::min(c.lanes, cpus), 1u, 64u);
    }
    if (c.max_connections == 0) {
        // Authenticated connections may use half the descriptors this process may open; the
        // rest stay for the host, the handshakes and this instance's own lanes.
        rlimit rl{};
        uint64_t soft = getrlimit(RLIMIT_NOFILE, &rl) == 0 ? rl.rlim_cur : 1024;
        c.max_connections = static_cast<unsigned>(std::clamp<uint64_t>(soft / 2, 64, 65535));
    }
    *cfg = std::move(c);
    return 0;
}

}  // namespace ferry_tcp
