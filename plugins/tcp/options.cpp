#include "options.hpp"

#include "plugin_util.hpp"

#include "hmac_sha256.hpp"

#include <arpa/inet.h>
#include <sched.h>
#include <sys/resource.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <limits>

namespace ferry_tcp {

namespace {

constexpr const char *kKnownKeys =
    "bind_ip, advertise_ip, port, lanes, slice_size, io_threads, connect_timeout_ms, "
    "op_timeout_ms, sndbuf, rcvbuf, zerocopy, auth_key, handshake_timeout_ms, max_handshakes, "
    "max_handshakes_per_ip, max_connections, max_connections_per_ip";

bool is_ip_literal(const char *s) {
    unsigned char buf[16];
    return inet_pton(AF_INET, s, buf) == 1 || inet_pton(AF_INET6, s, buf) == 1;
}

// Unsigned decimal, optionally with a binary size suffix (k/K = KiB, m/M = MiB, g/G = GiB)
// when `sizes` is set. Rejects signs, spaces, empty strings and overflow.
bool parse_u64(const char *s, bool sizes, uint64_t *out) {
    if (s == nullptr || *s == '\0') return false;
    uint64_t v = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; ++p) {
        uint64_t d = static_cast<uint64_t>(*p - '0');
        if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
        v = v * 10 + d;
    }
    if (p == s) return false;
    if (*p != '\0') {
        if (!sizes || p[1] != '\0') return false;
        unsigned shift = 0;
        switch (*p) {
            case 'k':
            case 'K': shift = 10; break;
            case 'm':
            case 'M': shift = 20; break;
            case 'g':
            case 'G': shift = 30; break;
            default: return false;
        }
        if (v > (std::numeric_limits<uint64_t>::max() >> shift)) return false;
        v <<= shift;
    }
    *out = v;
    return true;
}

int bad(ferry_error_t *err, const char *key, const char *value, const char *accepted) {
    return set_error(err, -EINVAL, "tcp: invalid value '%s' for option '%s': expected %s", value ? value : "(null)",
                     key, accepted);
}

}  // namespace

int parse_config(const ferry_kv_t *options, size_t n_options, Config *cfg, ferry_error_t *err) {
    Config c;
    if (options == nullptr && n_options != 0)
        return set_error(err, -EINVAL, "tcp: options is NULL but n_options is %zu", n_options);
    for (size_t i = 0; i < n_options; ++i) {
        const char *key = options[i].key;
        const char *val = options[i].value;
        if (key == nullptr) return set_error(err, -EINVAL, "tcp: option #%zu has a NULL key", i);
        uint64_t v = 0;
        auto ranged = [&](uint64_t lo, uint64_t hi, bool sizes, const char *accepted) -> bool {
            if (!parse_u64(val, sizes, &v) || v < lo || v > hi) {
                bad(err, key, val, accepted);
                return false;
            }
            return true;
        };
        if (strcmp(key, "bind_ip") == 0 || strcmp(key, "advertise_ip") == 0) {
            if (val == nullptr || !is_ip_literal(val))
                return bad(err, key, val, "a numeric IPv4 or IPv6 address such as 127.0.0.1");
            (key[0] == 'b' ? c.bind_ip : c.advertise_ip) = val;
        } else if (strcmp(key, "port") == 0) {
            if (!ranged(0, 65535, false, "a TCP port 0..65535 (0 = ephemeral)")) return -EINVAL;
            c.port = static_cast<uint16_t>(v);
        } else if (strcmp(key, "lanes") == 0) {
            if (!ranged(1, 64, false, "an integer 1..64 (connections per peer)")) return -EINVAL;
            c.lanes = static_cast<unsigned>(v);
        } else if (strcmp(key, "slice_size") == 0) {
            if (!ranged(4096, 64ull << 20, true, "a size 4096..64M bytes (suffix k/m allowed)")) return -EINVAL;
            c.slice_size = v;
        } else if (strcmp(key, "io_threads") == 0) {
            if (!ranged(0, 64, false, "an integer 0..64 (0 = auto)")) return -EINVAL;
            c.io_threads = static_cast<unsigned>(v);
        } else if (strcmp(key, "connect_timeout_ms") == 0) {
            if (!ranged(1, 3600000, false, "milliseconds 1..3600000")) return -EINVAL;
            c.connect_timeout_ms = static_cast<unsigned>(v);
        } else if (strcmp(key, "op_timeout_ms") == 0) {
            if (!ranged(0, 86400000, false, "milliseconds 0..86400000 (0 = no timeout)")) return -EINVAL;
            c.op_timeout_ms = static_cast<unsigned>(v);
        } else if (strcmp(key, "handshake_timeout_ms") == 0) {
            if (!ranged(10, 3600000, false, "milliseconds 10..3600000")) return -EINVAL;
            c.handshake_timeout_ms = static_cast<unsigned>(v);
        } else if (strcmp(key, "max_handshakes") == 0 || strcmp(key, "max_handshakes_per_ip") == 0 ||
                   strcmp(key, "max_connections_per_ip") == 0) {
            if (!ranged(1, 65535, false, "an integer 1..65535 (connections)")) return -EINVAL;
            (strcmp(key, "max_handshakes") == 0          ? c.max_handshakes
             : strcmp(key, "max_handshakes_per_ip") == 0 ? c.max_handshakes_per_ip
                                                         : c.max_connections_per_ip) = static_cast<unsigned>(v);
        } else if (strcmp(key, "max_connections") == 0) {
            if (!ranged(0, 65535, false, "an integer 0..65535 (0 = half of RLIMIT_NOFILE)")) return -EINVAL;
            c.max_connections = static_cast<unsigned>(v);
        } else if (strcmp(key, "sndbuf") == 0 || strcmp(key, "rcvbuf") == 0) {
            if (!ranged(0, 1ull << 30, true, "a size 0..1G bytes (0 = kernel autotuning)")) return -EINVAL;
            if (v != 0 && v < 4096) return bad(err, key, val, "0 (kernel autotuning) or at least 4096 bytes");
            (key[0] == 's' ? c.sndbuf : c.rcvbuf) = static_cast<unsigned>(v);
        } else if (strcmp(key, "auth_key") == 0) {
            // Never echoed: it is a secret.
            std::string raw;
            if (val == nullptr || strlen(val) < 32 || !ferry_crypto::from_hex(val, raw))
                return set_error(err, -EINVAL,
                                 "tcp: invalid value for option 'auth_key': expected at least 32 "
                                 "hex digits (the host derives it from auth_secret)");
            c.auth_key = std::move(raw);
            if (!ferry_crypto::available())
                return set_error(err, -ENOENT, "tcp: option 'auth_key': %s", ferry_crypto::load_error().c_str());
        } else if (strcmp(key, "zerocopy") == 0) {
            if (!ranged(0, 1, false, "0 (copy WRITE payloads) or 1 (splice them)")) return -EINVAL;
            c.zerocopy = v != 0;
        } else {
            return set_error(err, -EINVAL, "tcp: unknown option '%s' (accepted: %s)", key, kKnownKeys);
        }
    }
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
