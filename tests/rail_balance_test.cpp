// plugins/common/rail_balance: throughput measured from completed bytes, the earliest-finish
// choice, splits that finish together, and pauses with their cooldown, on a simulated clock
// with simulated rails of known speeds.
#include "rail_balance.hpp"

#include <gtest/gtest.h>

#include <numeric>

namespace ferry_plugin {
namespace {

using std::chrono::milliseconds;
using std::chrono::seconds;

constexpr uint64_t kKiB = 1024, kMiB = 1024 * kKiB;

// A simulated clock well after the epoch (Clock::time_point{} is "never" to the balancer).
Clock::time_point at(milliseconds t) { return Clock::time_point{} + std::chrono::hours(1) + t; }

// Rails that move `speed[i]` bytes per simulated millisecond, fed by a producer that keeps about
// `backlog` bytes queued overall. Counts what each rail was given after `warmup`.
struct Sim {
    std::vector<double> speed;  // bytes per ms
    RailBalancer bal;
    std::vector<uint64_t> given;
    milliseconds t{0};

    explicit Sim(std::vector<double> s) : speed(std::move(s)), bal(speed.size()), given(speed.size(), 0) {}

    uint64_t queued() const {
        uint64_t q = 0;
        for (size_t i = 0; i < bal.size(); ++i) q += bal.queued(i);
        return q;
    }
    // One millisecond: `feed` tops the queues up, then every rail works, then rates are sampled.
    template <class Feed>
    void step(Feed &&feed, bool count) {
        auto now = at(t);
        feed(now, count);
        for (size_t i = 0; i < bal.size(); ++i)
            bal.finish(i, std::min<uint64_t>(bal.queued(i), static_cast<uint64_t>(speed[i])), true);
        t += milliseconds(1);
        bal.sample(at(t));
    }
    std::vector<double> shares() const {
        double sum = std::accumulate(given.begin(), given.end(), 0.0);
        std::vector<double> out;
        for (uint64_t g : given) out.push_back(static_cast<double>(g) / sum);
        return out;
    }
};

void expect_shares_follow_speeds(const Sim &sim, double tolerance) {
    double total = std::accumulate(sim.speed.begin(), sim.speed.end(), 0.0);
    auto got = sim.shares();
    for (size_t i = 0; i < got.size(); ++i)
        EXPECT_NEAR(got[i], sim.speed[i] / total, tolerance) << "rail " << i << " of speed " << sim.speed[i];
}

TEST(RailBalance, SlicesToTheEarliestFinishConvergeToTheSpeeds) {
    // 1 and 3 GB/s, 64 KiB slices, about 8 MiB kept queued.
    Sim sim({1e6, 3e6});
    auto feed = [&](Clock::time_point now, bool count) {
        while (sim.queued() < 8 * kMiB) {
            auto loads = sim.bal.loads(now);
            size_t i = earliest_finish(loads, 64 * kKiB);
            sim.bal.queue(i, 64 * kKiB);
            if (count) sim.given[i] += 64 * kKiB;
        }
    };
    for (int k = 0; k < 2000; ++k) sim.step(feed, k >= 1000);
    expect_shares_follow_speeds(sim, 0.03);
    EXPECT_NEAR(sim.bal.rates().rate(0), 1e9, 0.1e9);
    EXPECT_NEAR(sim.bal.rates().rate(1), 3e9, 0.3e9);
    // The speeds swap (another flow on the link, a renegotiated port): the shares follow.
    sim.speed = {3e6, 1e6};
    sim.given.assign(2, 0);
    for (int k = 0; k < 2000; ++k) sim.step(feed, k >= 1000);
    expect_shares_follow_speeds(sim, 0.03);
}

TEST(RailBalance, SplitsOfLargeWorkConvergeToTheSpeeds) {
    // 1, 2 and 5 GB/s, 8 MiB ops split into page-aligned parts of at least 1 MiB.
    Sim sim({1e6, 2e6, 5e6});
    const SplitRules rules{kMiB, SIZE_MAX, 4096};
    auto feed = [&](Clock::time_point now, bool count) {
        while (sim.queued() < 16 * kMiB) {
            auto parts = split_by_finish(sim.bal.loads(now), 8 * kMiB, rules);
            EXPECT_EQ(std::accumulate(parts.begin(), parts.end(), uint64_t{0}), 8 * kMiB);
            for (size_t i = 0; i < parts.size(); ++i) {
                sim.bal.queue(i, parts[i]);
                if (count) sim.given[i] += parts[i];
            }
        }
    };
    for (int k = 0; k < 2000; ++k) sim.step(feed, k >= 1000);
    expect_shares_follow_speeds(sim, 0.03);
}

TEST(RailBalance, EqualRatesGiveEqualPagesTheLastTakesTheRest) {
    std::vector<RailLoad> rails(3, RailLoad{0, 5e9, true});
    auto parts = split_by_finish(rails, 5 * kMiB + 3, {kMiB, SIZE_MAX, 4096});
    // ceil((5 MiB + 3) / 3) rounded up to whole pages, twice; the rest last.
    EXPECT_EQ(parts, (std::vector<uint64_t>{1748992, 1748992, 5 * kMiB + 3 - 2 * 1748992}));
    parts = split_by_finish(rails, 12 * kMiB, {kMiB, SIZE_MAX, 4096});
    EXPECT_EQ(parts, (std::vector<uint64_t>{4 * kMiB, 4 * kMiB, 4 * kMiB}));
    // Unknown rates are equal rates.
    for (auto &r : rails) r.rate = 0;
    EXPECT_EQ(split_by_finish(rails, 12 * kMiB, {kMiB, SIZE_MAX, 4096}),
              (std::vector<uint64_t>{4 * kMiB, 4 * kMiB, 4 * kMiB}));
    // Measured rates that differ by rounding only still split equally.
    rails = {{0, 1e9 / 3, true}, {0, 1e9 / 3 * (1 + 1e-15), true}};
    EXPECT_EQ(split_by_finish(rails, 8 * kMiB, {kMiB, SIZE_MAX, 4096}), (std::vector<uint64_t>{4 * kMiB, 4 * kMiB}));
}

TEST(RailBalance, SplitWeighsRatesAndQueues) {
    // 1 and 3 GB/s, idle: a quarter and three quarters.
    std::vector<RailLoad> rails{{0, 1e9, true}, {0, 3e9, true}};
    auto parts = split_by_finish(rails, 8 * kMiB, {});
    EXPECT_EQ(parts, (std::vector<uint64_t>{2 * kMiB, 6 * kMiB}));
    // Equal rates, 2 MiB already queued on the first: both finish together.
    rails = {{2 * kMiB, 1e9, true}, {0, 1e9, true}};
    EXPECT_EQ(split_by_finish(rails, 8 * kMiB, {}), (std::vector<uint64_t>{3 * kMiB, 5 * kMiB}));
    // Queued past the time the others finish: nothing.
    rails = {{64 * kMiB, 1e9, true}, {0, 1e9, true}, {0, 1e9, true}};
    EXPECT_EQ(split_by_finish(rails, 8 * kMiB, {}), (std::vector<uint64_t>{0, 4 * kMiB, 4 * kMiB}));
    // A part below min_part is dropped and the others finish together without it.
    rails = {{0, 1e9, true}, {0, 10e9, true}, {0, 10e9, true}};
    EXPECT_EQ(split_by_finish(rails, 8 * kMiB, {kMiB, SIZE_MAX, 1}), (std::vector<uint64_t>{0, 4 * kMiB, 4 * kMiB}));
    // max_parts: the smallest parts go; on equal ones the later rails.
    rails.assign(4, RailLoad{0, 1e9, true});
    EXPECT_EQ(split_by_finish(rails, 8 * kMiB, {kMiB, 2, 4096}), (std::vector<uint64_t>{4 * kMiB, 4 * kMiB, 0, 0}));
    EXPECT_EQ(split_by_finish(rails, 8 * kMiB, {kMiB, 1, 4096}), (std::vector<uint64_t>{8 * kMiB, 0, 0, 0}));
    // An unusable rail gets nothing.
    rails[0].usable = false;
    EXPECT_EQ(split_by_finish(rails, 6 * kMiB, {kMiB, SIZE_MAX, 4096}),
              (std::vector<uint64_t>{0, 2 * kMiB, 2 * kMiB, 2 * kMiB}));
    EXPECT_EQ(split_by_finish(rails, 0, {}), (std::vector<uint64_t>{0, 0, 0, 0}));
    EXPECT_TRUE(split_by_finish({}, 8 * kMiB, {}).empty());
}

TEST(RailBalance, EarliestFinishWeighsQueueOverRate) {
    std::vector<RailLoad> rails{{4 * kMiB, 3e9, true}, {0, 1e9, true}};
    EXPECT_EQ(earliest_finish(rails, kMiB), 1u);  // 5 MiB at 3 GB/s is later than 1 MiB at 1 GB/s
    rails[1].queued = 2 * kMiB;
    EXPECT_EQ(earliest_finish(rails, kMiB), 0u);  // 3 MiB at 1 GB/s is later than 5 MiB at 3 GB/s
    rails[0].usable = false;
    EXPECT_EQ(earliest_finish(rails, kMiB), 1u);
    // Ties: the lowest index.
    rails = {{0, 1e9, true}, {0, 1e9, true}};
    EXPECT_EQ(earliest_finish(rails, kMiB), 0u);
    EXPECT_EQ(earliest_finish({}, kMiB), SIZE_MAX);
}

TEST(RailBalance, ZeroAndUnknownRates) {
    // Nothing known: the queues decide.
    std::vector<RailLoad> rails{{3 * kMiB, 0, true}, {kMiB, 0, true}, {2 * kMiB, -1, true}};
    EXPECT_EQ(earliest_finish(rails, kMiB), 1u);
    // An unknown rate counts as the mean of the known ones (2 GB/s here): rail 0, idle, wins a
    // tie-free race against a loaded 3 GB/s rail and loses against an idle one.
    rails = {{0, 0, true}, {kMiB, 3e9, true}, {kMiB, 1e9, true}};
    EXPECT_EQ(earliest_finish(rails, kMiB), 0u);
    rails[1].queued = 0;
    EXPECT_EQ(earliest_finish(rails, kMiB), 1u);
    auto parts = split_by_finish({{0, 0, true}, {0, 3e9, true}, {0, 1e9, true}}, 6 * kMiB, {});
    EXPECT_EQ(parts, (std::vector<uint64_t>{2 * kMiB, 3 * kMiB, kMiB}));

    // RailRates: unknown until a busy interval completes bytes; idle intervals do not count.
    RailRates r(3, {milliseconds(2), 0.5});
    EXPECT_EQ(r.rate(0), 0);
    EXPECT_EQ(r.expected(0), 1) << "nothing measured: every rail alike";
    std::vector<RailRates::Observed> seen{{0, true}, {0, false}, {0, true}};
    auto look = [&](size_t i) { return seen[i]; };
    EXPECT_TRUE(r.sample(at(milliseconds(0)), look));  // the starting point
    seen = {{2'000'000, true}, {1'000'000, false}, {0, true}};
    EXPECT_FALSE(r.sample(at(milliseconds(1)), look)) << "within the interval";
    EXPECT_TRUE(r.sample(at(milliseconds(2)), look));
    EXPECT_DOUBLE_EQ(r.rate(0), 1e9);
    EXPECT_EQ(r.rate(1), 0) << "it was idle when the interval began";
    EXPECT_EQ(r.rate(2), 0) << "busy but moved nothing: a stalled rail is not measured as 0";
    EXPECT_DOUBLE_EQ(r.expected(2), 1e9);
    seen = {{4'000'000, false}, {3'000'000, false}, {0, false}};
    EXPECT_TRUE(r.sample(at(milliseconds(4)), look));
    EXPECT_DOUBLE_EQ(r.rate(0), 1e9);  // 0.5 * 1e9 + 0.5 * 1e9
    EXPECT_EQ(r.rate(1), 0);
    seen = {{5'000'000, false}, {3'000'000, false}, {0, false}};
    EXPECT_TRUE(r.sample(at(milliseconds(6)), look));
    EXPECT_DOUBLE_EQ(r.rate(0), 1e9) << "idle at the interval's start: the rate it had stays";
}

TEST(RailBalance, APausedRailGetsNothingUntilItsCooldownEndsThenIsProbed) {
    RailBalancer bal(2);
    auto t0 = at(milliseconds(0));
    EXPECT_EQ(bal.fail(1, t0), milliseconds(1000));
    for (auto t : {t0, t0 + milliseconds(500), t0 + milliseconds(999)}) {
        auto loads = bal.loads(t);
        EXPECT_FALSE(loads[1].usable);
        bal.queue(0, 64 * kMiB);  // rail 0 is busy, rail 1 idle: it would win, were it usable
        EXPECT_EQ(earliest_finish(loads, kMiB), 0u);
        EXPECT_EQ(split_by_finish(bal.loads(t), 8 * kMiB, {}), (std::vector<uint64_t>{8 * kMiB, 0}));
    }
    auto t1 = t0 + milliseconds(1000);
    EXPECT_FALSE(bal.paused(1, t1));
    EXPECT_EQ(earliest_finish(bal.loads(t1), kMiB), 1u) << "the probe";
    EXPECT_EQ(split_by_finish(bal.loads(t1), 8 * kMiB, {})[1], 8 * kMiB);
}

TEST(RailBalance, CooldownDoublesOnFailuresInARowAndIsCapped) {
    RailHealth h(2);
    auto t = at(milliseconds(0));
    EXPECT_EQ(h.fail(0, t), milliseconds(1000));
    EXPECT_EQ(h.fail(0, t + milliseconds(10)), Clock::duration::zero()) << "the same outage, counted once";
    std::vector<long> pauses;
    for (int k = 0; k < 7; ++k) {
        t = h.paused_until(0);  // fails again as soon as it is probed
        pauses.push_back(std::chrono::duration_cast<milliseconds>(h.fail(0, t)).count());
    }
    EXPECT_EQ(pauses, (std::vector<long>{2000, 4000, 8000, 16000, 30000, 30000, 30000}));
    EXPECT_EQ(h.failures_in_a_row(0), 8u);
    EXPECT_FALSE(h.paused(1, t)) << "rails are paused one by one";
    // A failure more than cooldown_max after the previous one starts over.
    t = h.paused_until(0) + seconds(31);
    EXPECT_EQ(h.fail(0, t), milliseconds(1000));
    EXPECT_EQ(h.failures_in_a_row(0), 1u);
    // pause(): the first cooldown without counting a failure.
    RailHealth g(1, {milliseconds(200), milliseconds(1000)});
    g.pause(0, t);
    EXPECT_TRUE(g.paused(0, t + milliseconds(199)));
    EXPECT_FALSE(g.paused(0, t + milliseconds(200)));
    EXPECT_EQ(g.failures_in_a_row(0), 0u);
    EXPECT_EQ(g.fail(0, t + milliseconds(200)), milliseconds(200));
    EXPECT_EQ(g.fail(0, t + milliseconds(400)), milliseconds(400));
    EXPECT_EQ(g.fail(0, t + milliseconds(800)), milliseconds(800));
    EXPECT_EQ(g.fail(0, t + milliseconds(1600)), milliseconds(1000));
}

TEST(RailBalance, EveryRailPausedStillPicksOne) {
    RailBalancer bal(3);
    auto t = at(milliseconds(0));
    bal.queue(0, 4 * kMiB);
    bal.queue(2, 2 * kMiB);
    for (size_t i = 0; i < 3; ++i) bal.fail(i, t);
    auto loads = bal.loads(t + milliseconds(1));
    for (const auto &l : loads) EXPECT_TRUE(l.usable) << "all paused: all are tried";
    EXPECT_EQ(earliest_finish(loads, kMiB), 1u);
    auto parts = split_by_finish(loads, 8 * kMiB, {});
    EXPECT_EQ(std::accumulate(parts.begin(), parts.end(), uint64_t{0}), 8 * kMiB);
    // The pure choices on their own: nothing usable in the list means everything is.
    std::vector<RailLoad> none{{kMiB, 1e9, false}, {0, 1e9, false}};
    EXPECT_EQ(earliest_finish(none, kMiB), 1u);
    EXPECT_EQ(split_by_finish(none, 3 * kMiB, {}), (std::vector<uint64_t>{kMiB, 2 * kMiB}));
    // Later rails 1 and 2 are back and rail 0 fails again: only those two.
    bal.fail(0, t + seconds(2));
    loads = bal.loads(t + seconds(2));
    EXPECT_FALSE(loads[0].usable);
    EXPECT_TRUE(loads[1].usable && loads[2].usable);
}

TEST(RailBalance, BalancerCountsQueuedAndCompletedBytes) {
    RailBalancer bal(2);
    bal.queue(0, 10);
    bal.finish(0, 4, true);
    bal.finish(0, 4, false);
    EXPECT_EQ(bal.queued(0), 2u);
    EXPECT_EQ(bal.done(0), 4u) << "failed bytes are not throughput";
    bal.finish(0, 100, false);
    EXPECT_EQ(bal.queued(0), 0u) << "never below zero";
}

}  // namespace
}  // namespace ferry_plugin
