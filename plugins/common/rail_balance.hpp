// Spreading one peer's work over several paths ("rails": tcp.so's rails and their lanes,
// rdma.so's NICs) by how fast each one really moves bytes, and steering around a path that
// failed. Pure logic: no sockets, no verbs, no clock reads. Every call that depends on time takes
// `now` from the caller (Clock::now() in the plugins, a simulated clock in the tests), and the
// caller keeps its own locking.
//
//   RailRates       each rail's throughput: an EWMA of the bytes it completed over intervals
//                   it was busy
//   RailHealth      pauses a rail after a path failure: 1 s, doubled on each failure in a row,
//                   at most 30 s; when every rail is paused they are all tried (the probe that
//                   brings one back)
//   RailLoad        what a choice needs of one rail: bytes queued, throughput, usable
//   earliest_finish the rail that would finish `bytes` more first
//   split_by_finish one large piece of work cut into parts that all finish at the same time
//   RailBalancer    the above for a caller that counts queued and completed bytes here, one
//                   entry per rail (rdma.so's NICs)
//
// tcp.so measures lanes and pauses rails (several lanes per rail), so it uses the parts
// separately; rdma.so uses RailBalancer.
#pragma once

#include "plugin_util.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry_plugin {

// What a choice needs to know of one rail.
struct RailLoad {
    uint64_t queued = 0;  // bytes queued on it or in flight
    double rate = 0;      // bytes/s it moves; <= 0: unknown (the mean of the known ones is assumed)
    bool usable = true;   // false: paused, it takes no new work
};

// Index of the usable rail that would have finished `bytes` more first, (queued + bytes) / rate;
// ties go to the lowest index (callers order the rails by preference: rotation, nearness).
// Unknown rates count as the mean of the known ones, or as 1 when none is known (then the
// queues alone decide). When no rail is usable they all are (the caller's last resort).
// SIZE_MAX only for an empty list.
size_t earliest_finish(const std::vector<RailLoad> &rails, uint64_t bytes);

struct SplitRules {
    uint64_t min_part = 1;        // no part smaller (but the one rounding leaves last)
    size_t max_parts = SIZE_MAX;  // at most this many rails get a part
    uint64_t align = 1;           // part boundaries at multiples of this from the start (a power of 2)
};

// `total` bytes cut into one part per rail (same index; 0: none) so that every rail that gets one
// finishes at the same time, counting what it has queued already: rail i gets rate_i * T -
// queued_i, T chosen so the parts add up to total ("water filling"). Rails queued beyond T get
// nothing; while a part is below min_part or more than max_parts rails would get one, the
// smallest part (the later rail on a tie) is dropped and T found again. Equal rates and queues
// give equal parts to the first rails, in index order. Parts are rounded up to `align` in index
// order; the last part takes what is left. Rates and usability as for earliest_finish.
std::vector<uint64_t> split_by_finish(const std::vector<RailLoad> &rails, uint64_t total, const SplitRules &rules);

// Throughput of each rail in bytes/s, sampled from the bytes it completed. An interval counts
// for a rail only when it had work at the interval's start and completed bytes during it: an idle
// rail's rate is not its speed, and a rail that never carried anything stays unknown (0).
class RailRates {
public:
    struct Tuning {
        std::chrono::nanoseconds interval = std::chrono::milliseconds(2);  // samples at least this far apart
        double weight = 0.3;                                               // of each sample in the average
    };
    struct Observed {
        uint64_t done = 0;  // bytes the rail completed since it was set up (a running total)
        bool busy = false;  // it has work queued or in flight now
    };

    explicit RailRates(size_t rails = 0) : RailRates(rails, Tuning{}) {}
    RailRates(size_t rails, Tuning tuning) : tuning_(tuning) { resize(rails); }

    size_t size() const { return rate_.size(); }
    void resize(size_t rails);  // forgets everything measured

    // Re-measures every rail from observe(i) -> Observed, at most once per interval (false when
    // the interval has not passed: observe is not called). The first call only takes the
    // starting point.
    template <class Observe>
    bool sample(Clock::time_point now, Observe &&observe) {
        const bool first = sampled_at_ == Clock::time_point{};
        if (!first && now - sampled_at_ < tuning_.interval) return false;
        const double dt = std::chrono::duration<double>(now - sampled_at_).count();
        for (size_t i = 0; i < rate_.size(); ++i) {
            const Observed o = observe(i);
            if (!first) update(i, o.done - done_[i], dt);
            done_[i] = o.done;
            busy_[i] = o.busy;
        }
        sampled_at_ = now;
        refresh_mean();
        return true;
    }

    double rate(size_t i) const { return rate_[i]; }  // 0: unknown
    // The rate a choice assumes: the measured one, else the mean of the measured ones, else 1.
    double expected(size_t i) const { return rate_[i] > 0 ? rate_[i] : mean_; }

private:
    void update(size_t i, uint64_t moved, double dt);
    void refresh_mean();

    Tuning tuning_;
    std::vector<double> rate_;
    std::vector<uint64_t> done_;  // at the last sample
    std::vector<char> busy_;      // at the last sample
    Clock::time_point sampled_at_{};
    double mean_ = 1;
};

// Which rails may take new work. A rail that failed on its path is paused: the first cooldown,
// doubled for each further failure within cooldown_max of the previous one, at most
// cooldown_max. A failure while paused is the same outage (work posted before the pause
// failing too): counted once. Once the cooldown is over the rail takes work again, and that work
// is the probe: if it fails, the next pause is twice as long. When every rail is paused, every
// rail is usable, so work still goes somewhere and the first to recover is found.
class RailHealth {
public:
    struct Tuning {
        std::chrono::milliseconds cooldown = std::chrono::milliseconds(1000);
        std::chrono::milliseconds cooldown_max = std::chrono::milliseconds(30000);
    };

    explicit RailHealth(size_t rails = 0) : RailHealth(rails, Tuning{}) {}
    RailHealth(size_t rails, Tuning tuning) : tuning_(tuning), rails_(rails) {}

    size_t size() const { return rails_.size(); }
    void resize(size_t rails) { rails_.assign(rails, {}); }

    // A path failure of rail i: the pause it starts, or zero when the rail was paused already.
    Clock::duration fail(size_t i, Clock::time_point now);
    // Pauses rail i for the first cooldown without counting a failure in a row (a rail that
    // never came up: its first real failure starts from the first cooldown).
    void pause(size_t i, Clock::time_point now);

    bool paused(size_t i, Clock::time_point now) const { return rails_[i].until > now; }
    Clock::time_point paused_until(size_t i) const { return rails_[i].until; }
    unsigned failures_in_a_row(size_t i) const { return rails_[i].strikes; }
    // Per rail, 1 when it may take new work now: not paused, or every rail is.
    std::vector<char> usable(Clock::time_point now) const;

private:
    struct Rail {
        Clock::time_point until{};         // paused until then
        Clock::time_point last_failure{};  // of the current run of failures
        unsigned strikes = 0;              // failures in a row
    };
    Tuning tuning_;
    std::vector<Rail> rails_;
};

// One entry per rail, for a caller that counts each rail's queued and completed bytes here
// (under its own lock): rates from those counts, health, and the loads a choice reads.
class RailBalancer {
public:
    explicit RailBalancer(size_t rails = 0) : RailBalancer(rails, RailRates::Tuning{}, RailHealth::Tuning{}) {}
    RailBalancer(size_t rails, RailRates::Tuning rates, RailHealth::Tuning health)
        : rates_(rails, rates), health_(rails, health), queued_(rails, 0), done_(rails, 0) {}

    size_t size() const { return queued_.size(); }

    // Work of `bytes` given to rail i; and taken back from it, as completed (ok) or not.
    void queue(size_t i, uint64_t bytes) { queued_[i] += bytes; }
    void finish(size_t i, uint64_t bytes, bool ok);
    uint64_t queued(size_t i) const { return queued_[i]; }
    uint64_t done(size_t i) const { return done_[i]; }

    bool sample(Clock::time_point now);  // RailRates::sample over the counts
    Clock::duration fail(size_t i, Clock::time_point now) { return health_.fail(i, now); }
    bool paused(size_t i, Clock::time_point now) const { return health_.paused(i, now); }

    // Every rail's queue, expected rate and usability now.
    std::vector<RailLoad> loads(Clock::time_point now) const;

    const RailRates &rates() const { return rates_; }
    const RailHealth &health() const { return health_; }

private:
    RailRates rates_;
    RailHealth health_;
    std::vector<uint64_t> queued_, done_;
};

}  // namespace ferry_plugin
