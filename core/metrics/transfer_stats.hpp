// What the data path did, per transport and operation: ops that ended (done and failed), bytes
// moved, and how long ops took from submit to completion (a histogram). Written with relaxed
// atomics by whichever thread completes ops (a drain counts a run of one batch's ops at once),
// read by Engine::stats() and the metrics exporter at any time; counts only grow.
#pragma once

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstddef>
#include <cstdint>

#include "ferry/engine.hpp"
#include "ferry/ferry.h"

namespace ferry {

struct OpCounters {
    std::atomic<uint64_t> done{0}, failed{0}, bytes{0}, latency_ns{0};
    // Non-cumulative: bucket k counts latencies in (bound k-1, bound k]; the last one those
    // above the last bound.
    std::array<std::atomic<uint64_t>, kLatencyBuckets + 1> buckets{};

    // `n` ops that ended together after `latency`, `failed` of them failed, `bytes` moved by
    // the others.
    void record(uint64_t n, uint64_t failed_ops, uint64_t moved, std::chrono::nanoseconds latency) {
        if (n > failed_ops) done.fetch_add(n - failed_ops, std::memory_order_relaxed);
        if (failed_ops) failed.fetch_add(failed_ops, std::memory_order_relaxed);
        if (moved) bytes.fetch_add(moved, std::memory_order_relaxed);
        auto ns = static_cast<uint64_t>(std::max<int64_t>(0, latency.count()));
        latency_ns.fetch_add(ns * n, std::memory_order_relaxed);
        buckets[bucket_of(ns)].fetch_add(n, std::memory_order_relaxed);
    }
    OpStats snapshot() const;
    static size_t bucket_of(uint64_t ns);
};

// Per transport index, READ and WRITE.
struct TransportCounters {
    OpCounters by_op[2];  // Opcode::Read, Opcode::Write
    // Ops that failed on it and were posted again elsewhere (not counted as failed), and the
    // times one of its paths was paused (failover.cpp).
    std::atomic<uint64_t> failovers{0}, pauses{0};
    OpCounters &of(Opcode op) { return by_op[op == Opcode::Read ? 0 : 1]; }
};

// EngineStats in ferry_stats()'s C form and contract (*n: capacity in, count out; -ENOSPC).
int stats_to_c(const EngineStats &s, ferry_engine_stats_t *engine, ferry_transport_stats_t *transports, size_t *n);
// Every transport's rails in ferry_rail_stats()'s C form and contract (the same convention).
int rails_to_c(const EngineStats &s, ferry_engine_rail_stats_t *rails, size_t *n);

}  // namespace ferry
