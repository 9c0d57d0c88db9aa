#include "rail_balance.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>

namespace ferry_plugin {
namespace {

// The rate a choice assumes for an unknown one: the mean of the known rates in the list, else 1
// (every rate unknown: the queues alone decide).
double fallback_rate(const std::vector<RailLoad> &rails) {
    double sum = 0;
    size_t known = 0;
    for (const auto &r : rails)
        if (r.rate > 0) sum += r.rate, ++known;
    return known ? sum / static_cast<double>(known) : 1;
}

bool any_usable(const std::vector<RailLoad> &rails) {
    return std::any_of(rails.begin(), rails.end(), [](const RailLoad &r) { return r.usable; });
}

// Water filling over `active`: the time T at which every rail that gets a part finishes, and
// each one's part rate * T - queued (0 for rails still busy at T).
void fill(const std::vector<RailLoad> &rails, const std::vector<double> &rate, const std::vector<size_t> &active,
          uint64_t total, std::vector<double> &share) {
    std::vector<size_t> by_free(active);  // by the time each becomes free, queued / rate
    auto free_at = [&](size_t i) { return static_cast<double>(rails[i].queued) / rate[i]; };
    std::stable_sort(by_free.begin(), by_free.end(), [&](size_t a, size_t b) { return free_at(a) < free_at(b); });
    double queued = 0, speed = 0, t = 0;
    size_t k = 0;
    while (k < by_free.size()) {
        queued += static_cast<double>(rails[by_free[k]].queued);
        speed += rate[by_free[k]];
        ++k;
        t = (static_cast<double>(total) + queued) / speed;
        if (k == by_free.size() || t <= free_at(by_free[k])) break;
    }
    for (size_t i : active) share[i] = 0;
    for (size_t j = 0; j < k; ++j) {
        size_t i = by_free[j];
        share[i] = std::max(0.0, rate[i] * t - static_cast<double>(rails[i].queued));
    }
}

}  // namespace

size_t earliest_finish(const std::vector<RailLoad> &rails, uint64_t bytes) {
    const double fallback = fallback_rate(rails);
    const bool only_usable = any_usable(rails);
    size_t best = SIZE_MAX;
    double best_t = 0;
    for (size_t i = 0; i < rails.size(); ++i) {
        if (only_usable && !rails[i].usable) continue;
        double t = static_cast<double>(rails[i].queued + bytes) / (rails[i].rate > 0 ? rails[i].rate : fallback);
        if (best == SIZE_MAX || t < best_t) best = i, best_t = t;
    }
    return best;
}

std::vector<uint64_t> split_by_finish(const std::vector<RailLoad> &rails, uint64_t total, const SplitRules &rules) {
    std::vector<uint64_t> parts(rails.size(), 0);
    if (rails.empty() || total == 0) return parts;
    const double fallback = fallback_rate(rails);
    const bool only_usable = any_usable(rails);
    std::vector<double> rate(rails.size());
    std::vector<size_t> active;
    for (size_t i = 0; i < rails.size(); ++i) {
        rate[i] = rails[i].rate > 0 ? rails[i].rate : fallback;
        if (!only_usable || rails[i].usable) active.push_back(i);
    }
    const size_t max_parts = std::max<size_t>(rules.max_parts, 1);
    if (max_parts == 1) {
        parts[earliest_finish(rails, total)] = total;
        return parts;
    }
    std::vector<double> share(rails.size(), 0);
    for (;;) {
        fill(rails, rate, active, total, share);
        // Rails queued past T get nothing: out. Then, while a part is too small or there are too
        // many, the smallest goes (the later rail on a tie: earlier ones are preferred).
        std::erase_if(active, [&](size_t i) { return share[i] <= 0; });
        if (active.size() <= 1) break;
        size_t smallest = active[0];
        for (size_t i : active)
            if (share[i] <= share[smallest]) smallest = i;
        if (active.size() <= max_parts && share[smallest] >= static_cast<double>(rules.min_part)) break;
        std::erase(active, smallest);
    }
    if (active.size() <= 1) {
        // One rail (or, through rounding of doubles, none left): it takes everything.
        if (active.empty()) active.push_back(earliest_finish(rails, total));
        parts[active[0]] = total;
        return parts;
    }
    // Parts in index order, each rounded up to the alignment; the last takes the rest. The
    // shares are exact only up to rounding of doubles: a thousandth of a byte is forgiven before
    // rounding up, so equal shares stay equal.
    const uint64_t align = std::max<uint64_t>(rules.align, 1);
    uint64_t left = total;
    for (size_t k = 0; k < active.size(); ++k) {
        size_t i = active[k];
        uint64_t n = left;
        if (k + 1 < active.size()) {
            n = static_cast<uint64_t>(std::max(0.0, std::ceil(share[i] - 1e-3)));
            n = (n + align - 1) / align * align;
            n = std::min(n, left);
        }
        parts[i] = n;
        left -= n;
    }
    return parts;
}

void RailRates::resize(size_t rails) {
    rate_.assign(rails, 0);
    done_.assign(rails, 0);
    busy_.assign(rails, 0);
    sampled_at_ = {};
    mean_ = 1;
}

void RailRates::update(size_t i, uint64_t moved, double dt) {
    if (!busy_[i] || moved == 0 || dt <= 0) return;
    const double now_rate = static_cast<double>(moved) / dt;
    rate_[i] = rate_[i] > 0 ? (1 - tuning_.weight) * rate_[i] + tuning_.weight * now_rate : now_rate;
}

void RailRates::refresh_mean() {
    double sum = 0;
    size_t known = 0;
    for (double r : rate_)
        if (r > 0) sum += r, ++known;
    mean_ = known ? sum / static_cast<double>(known) : 1;
}

Clock::duration RailHealth::fail(size_t i, Clock::time_point now) {
    Rail &r = rails_[i];
    if (r.until > now) return Clock::duration::zero();
    if (now - r.last_failure > tuning_.cooldown_max) r.strikes = 0;
    r.last_failure = now;
    ++r.strikes;
    auto pause = tuning_.cooldown;
    for (unsigned k = 1; k < r.strikes && pause < tuning_.cooldown_max; ++k) pause *= 2;
    pause = std::min(pause, tuning_.cooldown_max);
    r.until = now + pause;
    return pause;
}

void RailHealth::pause(size_t i, Clock::time_point now) { rails_[i].until = now + tuning_.cooldown; }

std::vector<char> RailHealth::usable(Clock::time_point now) const {
    std::vector<char> out(rails_.size(), 0);
    bool any = false;
    for (size_t i = 0; i < rails_.size(); ++i) {
        out[i] = !paused(i, now);
        any = any || out[i];
    }
    if (!any) std::fill(out.begin(), out.end(), 1);
    return out;
}

void RailBalancer::finish(size_t i, uint64_t bytes, bool ok) {
    queued_[i] -= std::min(bytes, queued_[i]);
    if (ok) done_[i] += bytes;
}

bool RailBalancer::sample(Clock::time_point now) {
    return rates_.sample(now, [&](size_t i) { return RailRates::Observed{done_[i], queued_[i] > 0}; });
}

std::vector<RailLoad> RailBalancer::loads(Clock::time_point now) const {
    std::vector<char> usable = health_.usable(now);
    std::vector<RailLoad> out(size());
    for (size_t i = 0; i < out.size(); ++i) out[i] = {queued_[i], rates_.expected(i), usable[i] != 0};
    return out;
}

}  // namespace ferry_plugin
