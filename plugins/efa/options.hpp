// efa.so options ("efa.<key>" on the host side; the host strips the prefix).
#pragma once

#include <ferry/plugin.h>

#include "option_table.hpp"

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry_efa {

struct Config {
    // libfabric provider: option `provider`, else $FERRY_EFA_PROVIDER, else "efa". "tcp" runs the
    // same code over TCP (tcp;ofi_rxm) on machines without EFA.
    std::string provider = "efa";
    bool provider_chosen = false;  // named by the option or the environment, not the default
    // fi_getinfo node, i.e. the source address to bind: 127.0.0.1 by default for the IP
    // providers (tcp, udp, sockets), nothing for the others (EFA picks its device address).
    std::string node;
    bool node_set = false;               // named by the option (even as ""), not the default
    unsigned connect_timeout_ms = 5000;  // connect() and import_mem() queries
    unsigned op_timeout_ms = 30000;      // an op not done this long fails; 0: never
    uint64_t max_mr_size = 0;            // split registrations above this; 0: the provider's limit
    bool busy_poll = false;              // progress thread spins instead of sleeping on the CQ
    unsigned spin_us = 1000;             // after any work, keep polling this long before sleeping;
                                         // parse_config defaults it to 0 below 4 CPUs (options.cpp)
};

// Every option: parser, messages and what `ferry-info --options efa` prints (options.cpp).
inline constexpr size_t kOptionCount = 7;
extern const ferry_plugin::OptionTable<Config, kOptionCount> kOptions;

// Parses options into cfg (only on success). Unknown keys and malformed values fail with -EINVAL
// and a message naming the key and what is accepted.
int parse_config(const ferry_kv_t *options, size_t n_options, Config *cfg, ferry_error_t *err);

}  // namespace ferry_efa
