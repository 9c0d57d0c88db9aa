// Instance options ("tcp.<key>" on the host side; the host strips the prefix).
#pragma once

#include <ferry/plugin.h>

#include "option_table.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry_tcp {

struct Config {
    std::string bind_ip = "127.0.0.1";  // never the wildcard by default
    std::string advertise_ip;           // address put in the endpoint; empty = bind_ip
    uint16_t port = 0;                  // 0 = ephemeral
    uint16_t advertise_port = 0;        // port put in the endpoint (a forwarded one); 0 = the bound port
    std::string rails;                  // several local addresses at once (rails.hpp): a list, "auto"; empty = bind_ip
    unsigned lanes = 2;                 // connections per peer
    // Ops are cut into slices of this size, spread over the least-loaded lanes. 1 MiB: large
    // enough that per-slice costs (a 40-byte header, a response, a wake-up) vanish next to the
    // copy, and large enough for the zero-copy path (tx.hpp: >= 512 KiB); small enough that a
    // 4 MiB op still spreads over lanes. 256 KiB..4 MiB measured within noise of each other.
    uint64_t slice_size = 1u << 20;
    // Epoll threads of this instance; 0 = auto: min(lanes, usable CPUs / 2), at least 1.
    // Measured with both instances in one process over loopback:
    // - this 2-core AMD VM (memory-bound, costly cross-core cache transfers): one thread per
    //   instance is best (2 lanes: 2.9 vs 2.5 GB/s median WRITE, 3.6 vs 3.1 READ); two busy
    //   threads (initiator + target) already fill both cores, more only add switches;
    // - 16-core Xeon, pinned to 2 cores: a thread per lane wins (2 lanes, copy path: 6.4-7.1
    //   vs 4.5-5.5 GB/s), since the two streams' copies then run in parallel.
    // Auto gives each instance at most half the CPUs, as both ends may share the host.
    unsigned io_threads = 0;
    unsigned connect_timeout_ms = 5000;
    unsigned op_timeout_ms = 30000;  // 0 = no timeout
    unsigned sndbuf = 0;             // SO_SNDBUF bytes, 0 = kernel autotuning
    unsigned rcvbuf = 0;             // SO_RCVBUF bytes, 0 = kernel autotuning
    // Send large payloads by reference (vmsplice + splice, splice_pipe.hpp) instead of copying
    // them into the socket. Off by default: on loopback it leaves the one copy left to the
    // receiving thread, which then reads the source from main memory alone; with 1 GiB buffers
    // that lost on a 16-core Xeon pinned to 2 CPUs (one lane 3.1 vs 4.1 GB/s) and tied on the
    // 2-core EPYC VM (3.8 vs 4.0), bench/tcp_vs_iperf3.sh, docs/PERFORMANCE.md. It saves the
    // sender's copy, so it can pay on CPU-bound hosts, and its caveat is in docs/OPTIONS.md.
    bool zerocopy = false;
    // Cluster key (option auth_key, hex): peers must prove they know it (handshake.hpp).
    // Empty: no authentication, and peers with a key are refused.
    std::string auth_key;
    // Limits against peers that do not follow the protocol (server.cpp, conn_limits.hpp). A
    // connection that has not completed HELLO/AUTH within handshake_timeout_ms is closed.
    // "Handshakes" are connections not yet authenticated, "connections" authenticated ones;
    // both are capped per peer address and in total, and a peer over a cap is refused with an
    // ERROR that names the option.
    unsigned handshake_timeout_ms = 10000;
    unsigned max_handshakes = 128;
    unsigned max_handshakes_per_ip = 64;  // >= lanes (64 at most) of one honest peer
    unsigned max_connections = 0;         // 0 = auto: half the RLIMIT_NOFILE soft limit, 64..65535
    unsigned max_connections_per_ip = 256;
    // Serving GPU memory (server_staged.cpp): READ and WRITE requests of up to this many bytes
    // that arrive together on a connection share one staging buffer and one host copy. A KV
    // cache's 16-256 KiB blocks otherwise cost a whole buffer, a copy and its completion each,
    // four in flight.
    // Capped at a quarter of the host's staging buffer; 0 = a buffer per request.
    uint64_t staged_pack_max_bytes = 1u << 20;
};

// Every option: parser, messages and what `ferry-info --options tcp` prints (options.cpp).
inline constexpr size_t kOptionCount = 20;
extern const ferry_plugin::OptionTable<Config, kOptionCount> kOptions;

// Parses options into cfg (only on success). Unknown keys and malformed values fail with
// -EINVAL and a message naming the key and what is accepted.
int parse_config(const ferry_kv_t *options, size_t n_options, Config *cfg, ferry_error_t *err);

}  // namespace ferry_tcp
