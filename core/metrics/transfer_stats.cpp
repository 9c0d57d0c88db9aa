// Snapshots of the data path's counters (transfer_stats.hpp), and their C form (ferry.h), which
// the C API and the metrics module read.
#include "metrics/transfer_stats.hpp"

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry {

size_t OpCounters::bucket_of(uint64_t ns) {
    static constexpr auto kBoundsNs = [] {
        std::array<uint64_t, kLatencyBuckets> b{};
        for (size_t k = 0; k < kLatencyBuckets; ++k) b[k] = static_cast<uint64_t>(kLatencyBoundsSeconds[k] * 1e9 + 0.5);
        return b;
    }();
    return static_cast<size_t>(std::lower_bound(kBoundsNs.begin(), kBoundsNs.end(), ns) - kBoundsNs.begin());
}

OpStats OpCounters::snapshot() const {
    OpStats s;
    s.done = done.load(std::memory_order_relaxed);
    s.failed = failed.load(std::memory_order_relaxed);
    s.bytes = bytes.load(std::memory_order_relaxed);
    s.latency_sum_seconds = static_cast<double>(latency_ns.load(std::memory_order_relaxed)) / 1e9;
    for (size_t k = 0; k <= kLatencyBuckets; ++k) s.latency_buckets[k] = buckets[k].load(std::memory_order_relaxed);
    return s;
}

namespace {

void to_c(const OpStats &s, ferry_op_stats_t &c) {
    c.done = s.done;
    c.failed = s.failed;
    c.bytes = s.bytes;
    c.latency_sum_seconds = s.latency_sum_seconds;
    std::copy(s.latency_buckets.begin(), s.latency_buckets.end(), c.latency_buckets);
}

}  // namespace

int stats_to_c(const EngineStats &s, ferry_engine_stats_t *engine, ferry_transport_stats_t *transports, size_t *n) {
    static_assert(FERRY_LATENCY_BUCKETS == kLatencyBuckets);
    static_assert(sizeof(ferry_op_stats_t::latency_buckets) == (kLatencyBuckets + 1) * sizeof(uint64_t));
    const size_t capacity = *n;
    *n = s.transports.size();
    if (capacity < s.transports.size()) return -ENOSPC;
    const auto &st = s.staging;
    *engine = ferry_engine_stats_t{s.batches,
                                   s.segments_open,
                                   {st.max_bytes, st.slice_bytes, st.lent_bytes, st.peak_lent_bytes, st.acquire_refused,
                                    st.copies, st.copy_failures}};
    for (size_t i = 0; i < s.transports.size(); ++i) {
        auto &c = transports[i];
        c = ferry_transport_stats_t{};
        std::strncpy(c.transport, s.transports[i].transport.c_str(), sizeof c.transport - 1);
        to_c(s.transports[i].read, c.read);
        to_c(s.transports[i].write, c.write);
        c.peers = s.transports[i].peers;
        c.failovers = s.transports[i].failovers;
        c.pauses = s.transports[i].pauses;
        c.paused_paths = s.transports[i].paused_paths;
    }
    return 0;
}

int rails_to_c(const EngineStats &s, ferry_engine_rail_stats_t *rails, size_t *n) {
    size_t count = 0;
    for (const auto &t : s.transports) count += t.rails.size();
    const size_t capacity = *n;
    *n = count;
    if (capacity < count) return -ENOSPC;
    size_t i = 0;
    for (const auto &t : s.transports)
        for (const auto &r : t.rails) {
            auto &c = rails[i++];
            c = ferry_engine_rail_stats_t{};
            std::strncpy(c.transport, t.transport.c_str(), sizeof c.transport - 1);
            std::strncpy(c.rail, r.rail.c_str(), sizeof c.rail - 1);
            c.read_bytes = r.read_bytes;
            c.write_bytes = r.write_bytes;
            c.completed = r.completed;
            c.failures = r.failures;
            c.pauses = r.pauses;
            c.paused_peers = r.paused_peers;
            c.queued_bytes = r.queued_bytes;
            c.throughput = r.throughput;
        }
    return 0;
}

}  // namespace ferry
