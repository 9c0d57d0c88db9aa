// shm.so options ("shm.<key>" on the host side; the host strips the prefix).
#pragma once

#include <ferry/plugin.h>

#include "option_table.hpp"

#include <cstddef>
#include <cstdint>

namespace ferry_shm {

struct Config {
    unsigned copy_threads = 2;                // serving-side copy workers
    uint64_t chunk_size = 1ull << 20;         // a larger op is copied in pieces, spread over the workers
    uint64_t inline_size = 64ull << 10;       // ops up to this size are copied by the I/O thread itself
    unsigned connect_timeout_ms = 5000;       // connect(): handshake and access probe
    unsigned op_timeout_ms = 30000;           // an op unanswered this long fails with -ETIMEDOUT; 0: never
    bool ptracer_any = false;                 // Yama ptrace_scope=1: PR_SET_PTRACER_ANY on this process
    bool adopt_memfd = false;                 // move registered anonymous regions into memfds, and map
                                              // initiators' memfds when they offer theirs (memfd.hpp)
    unsigned max_connections = 1024;          // serving side: connections at once, all initiators
    unsigned max_connections_per_user = 128;  // ... and from the processes of one uid
    // Set by the host's auth_key (the cluster has a secret): serve only processes of our own
    // user. Those can read our memory through the kernel anyway, so a key exchange would add
    // nothing; anyone else (an unprivileged user against a root engine) is refused.
    bool same_user_only = false;
};

// Every option: parser, messages and what `ferry-info --options shm` prints (options.cpp).
inline constexpr size_t kOptionCount = 10;
extern const ferry_plugin::OptionTable<Config, kOptionCount> kOptions;

// Parses options into cfg (only on success). Unknown keys and malformed values fail with -EINVAL
// and a message naming the key and what is accepted.
int parse_config(const ferry_kv_t *options, size_t n_options, Config *cfg, ferry_error_t *err);

}  // namespace ferry_shm
