#include "nic_stats.hpp"

namespace ferry_rdma {

void NicStats::finished(ferry_plugin::RailBalancer &b, uint16_t nic, uint32_t opcode, uint64_t bytes, bool ok) {
    b.finish(nic, bytes, ok);
    if (ok && nic < counts_.size()) counts_[nic].count(opcode, bytes);
}

Clock::duration NicStats::path_error(ferry_plugin::RailBalancer &b, uint16_t nic, Clock::time_point now) {
    const auto pause = b.fail(nic, now);
    if (nic < counts_.size()) {
        ++counts_[nic].failures;
        if (pause > Clock::duration::zero()) ++counts_[nic].pauses;
    }
    return pause;
}

std::vector<ferry_rail_stats_t> NicStats::report(const std::vector<std::string> &names,
                                                 const ferry_plugin::RailBalancer &b, Clock::time_point now,
                                                 uint64_t peers) const {
    std::vector<ferry_rail_stats_t> out;
    for (size_t i = 0; i < counts_.size() && i < names.size() && i < b.size(); ++i) {
        ferry_rail_stats_t r = ferry_plugin::rail_entry(names[i], counts_[i]);
        r.paused_peers = b.paused(i, now) ? peers : 0;
        r.queued_bytes = b.queued(i);
        r.throughput = b.rates().rate(i);
        out.push_back(r);
    }
    return out;
}

}  // namespace ferry_rdma
