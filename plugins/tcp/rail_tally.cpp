#include "rail_tally.hpp"

#include <algorithm>

namespace ferry_tcp {
namespace {

ferry_plugin::RailCounts read(const RailTally::LaneCounts &c) {
    ferry_plugin::RailCounts r;
    r.read_bytes = c.read_bytes.load(std::memory_order_relaxed);
    r.write_bytes = c.write_bytes.load(std::memory_order_relaxed);
    r.completed = c.completed.load(std::memory_order_relaxed);
    return r;
}

}  // namespace

RailTally::RailTally(std::vector<std::string> names) {
    rails_.resize(names.size());
    for (size_t i = 0; i < names.size(); ++i) rails_[i].name = std::move(names[i]);
}

RailTally::LaneCounts *RailTally::attach(size_t rail) {
    auto counts = std::make_unique<LaneCounts>();
    LaneCounts *raw = counts.get();
    std::lock_guard lk(mu_);
    rails_[rail].live.push_back(std::move(counts));
    return raw;
}

void RailTally::detach(size_t rail, LaneCounts *counts) {
    std::lock_guard lk(mu_);
    auto &live = rails_[rail].live;
    auto it = std::find_if(live.begin(), live.end(), [&](const auto &p) { return p.get() == counts; });
    if (it == live.end()) return;
    rails_[rail].folded += read(**it);
    live.erase(it);
}

void RailTally::failed(size_t rail) {
    std::lock_guard lk(mu_);
    ++rails_[rail].folded.failures;
}

void RailTally::paused(size_t rail) {
    std::lock_guard lk(mu_);
    ++rails_[rail].folded.pauses;
}

std::vector<ferry_plugin::RailCounts> RailTally::totals() const {
    std::lock_guard lk(mu_);
    std::vector<ferry_plugin::RailCounts> out(rails_.size());
    for (size_t i = 0; i < rails_.size(); ++i) {
        out[i] = rails_[i].folded;
        for (const auto &c : rails_[i].live) out[i] += read(*c);
    }
    return out;
}

}  // namespace ferry_tcp
