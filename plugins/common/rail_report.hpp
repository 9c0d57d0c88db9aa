// Per-rail counters in the ABI's form (ferry_rail_stats_t, the rail_stats call of ABI 1.5) for
// plugins that spread traffic over several local paths: tcp.so's rails, rdma.so's NICs. Counts
// are kept per LOCAL rail and summed over peers, so a report has as many entries as the host has
// rails, however many peers it talks to.
#pragma once

#include <ferry/plugin.h>

#include "plugin_util.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <string>
#include <vector>

namespace ferry_plugin {

// What one rail did, in running totals (the parts of ferry_rail_stats_t that only grow).
struct RailCounts {
    uint64_t read_bytes = 0, write_bytes = 0, completed = 0, failures = 0, pauses = 0;

    // A piece of `bytes` of an op with `opcode` completed on the rail.
    void count(uint32_t opcode, uint64_t bytes) {
        (opcode == FERRY_OP_READ ? read_bytes : write_bytes) += bytes;
        ++completed;
    }
    RailCounts &operator+=(const RailCounts &o) {
        read_bytes += o.read_bytes;
        write_bytes += o.write_bytes;
        completed += o.completed;
        failures += o.failures;
        pauses += o.pauses;
        return *this;
    }
};

// One entry: `name` (cut to fit, NUL-terminated) and the counts; the caller fills what holds now
// (paused_peers, queued_bytes, throughput).
inline ferry_rail_stats_t rail_entry(const std::string &name, const RailCounts &c) {
    ferry_rail_stats_t r{};
    const size_t len = std::min(name.size(), sizeof r.name - 1);
    memcpy(r.name, name.data(), len);
    r.read_bytes = c.read_bytes;
    r.write_bytes = c.write_bytes;
    r.completed = c.completed;
    r.failures = c.failures;
    r.pauses = c.pauses;
    return r;
}

// `rails` into the caller's array under rail_stats' convention: *n is the capacity on entry and
// the count on return; -ENOSPC, nothing written and *n the count needed when it is too small.
inline int copy_rail_stats(const std::vector<ferry_rail_stats_t> &rails, ferry_rail_stats_t *out, size_t *n,
                           ferry_error_t *err, const char *plugin) {
    if (*n < rails.size()) {
        *n = rails.size();
        return set_error(err, -ENOSPC, "%s: rail_stats: %zu rails, room for more needed", plugin, rails.size());
    }
    if (!rails.empty()) memcpy(out, rails.data(), rails.size() * sizeof(ferry_rail_stats_t));
    *n = rails.size();
    return 0;
}

}  // namespace ferry_plugin
