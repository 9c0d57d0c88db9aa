// rdma.so options ("rdma.<key>" on the host side; the host strips the prefix).
#pragma once

#include <ferry/plugin.h>

#include "option_table.hpp"

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace ferry_rdma {

// The control server's defences against peers that do not follow the protocol (control_server.hpp).
struct ControlLimits {
    unsigned handshake_timeout_ms = 5000;  // from accept to a finished Hello/Auth
    unsigned max_connections = 1024;       // open control connections, authenticated or not
    unsigned max_unauthenticated_per_address = 32;
    unsigned reply_timeout_ms = 5000;  // sending one reply to an authenticated peer
};

struct Config {
    // RDMA devices to use (ibv device names, e.g. mlx5_0); empty: every device with an active port.
    std::vector<std::string> devices;
    unsigned ib_port = 1;  // port of each device
    int gid_index = -1;    // -1: RoCE v2 IPv4-mapped GID if any, else GID 0 (InfiniBand uses the LID)
    unsigned traffic_class = 0;
    unsigned service_level = 0;
    unsigned mtu = 0;  // 0: the ports' active MTU (the smaller of both ends); else 256..4096
    // The handshake/control TCP server: never the wildcard by default. Set bind_ip to the host's
    // address on the management network for peers on other hosts.
    std::string bind_ip = "127.0.0.1";
    std::string advertise_ip;  // address put in the endpoint; empty = bind_ip
    uint16_t port = 0;         // 0 = ephemeral
    unsigned connect_timeout_ms = 5000;
    ControlLimits control;
    unsigned op_timeout_ms = 30000;   // an op waiting for a queue pair this long fails; 0: never
    uint64_t max_mr_size = 0;         // split registrations above this; 0: the device's max_mr_size
    uint32_t max_wr = 256;            // send queue depth per queue pair (capped by the device)
    uint32_t signal_interval = 32;    // at most this many unsignalled work requests in a row
    uint64_t stripe_min = 1u << 20;   // ops at least 2x this are striped over equally near NICs
    uint64_t max_wr_size = 1u << 30;  // a work request carries at most this (and the port's max_msg_sz)
    unsigned retry_timeout = 14;      // local ACK timeout exponent (4.096 us * 2^n)
    unsigned retry_count = 7;
    bool busy_poll = false;  // progress thread spins instead of sleeping on the completion channels
    unsigned spin_us = 200;  // after any work, keep polling this long before sleeping
    // Where topology is read from (tests point it at a fake tree).
    std::string sysfs_root = "/sys";
    // GPU runtimes, dlopen'ed on first use of GPU memory.
    std::string cuda_library = "libcuda.so.1";
    std::string hsa_library = "libhsa-runtime64.so.1";
    // Cluster key (raw bytes) the host derives from its auth_secret; empty: none. Control
    // connections are refused unless both ends hold the same key (control.hpp). Never logged.
    std::string auth_key;
};

// Every option: parser, messages and what `ferry-info --options rdma` prints (options.cpp).
inline constexpr size_t kOptionCount = 27;
extern const ferry_plugin::OptionTable<Config, kOptionCount> kOptions;

// Parses options into cfg (only on success). Unknown keys and malformed values fail with -EINVAL
// and a message naming the key and what is accepted.
int parse_config(const ferry_kv_t *options, size_t n_options, Config *cfg, ferry_error_t *err);

}  // namespace ferry_rdma
