// What each local NIC carried, for rail_stats (ABI 1.5): bytes and work requests completed, path
// errors and the pauses they started, counted as work requests finish; queue, throughput and
// pause read from the NIC balancer (plugins/common/rail_balance.hpp). Pure logic under the
// transport's lock, unit-tested without a NIC (tests/rdma/rdma_nic_stats_test.cpp).
#pragma once

#include "rail_balance.hpp"
#include "rail_report.hpp"

#include <cstdint>
#include <string>
#include <vector>

namespace ferry_rdma {

class NicStats {
public:
    explicit NicStats(size_t nics = 0) : counts_(nics) {}

    // A work request of `bytes` of an op with `opcode` left its queue pair on `nic`: completed
    // (ok) or not (failed, flushed, cancelled: no bytes). Takes it off the balancer's queue too.
    void finished(ferry_plugin::RailBalancer &b, uint16_t nic, uint32_t opcode, uint64_t bytes, bool ok);
    // A path error on `nic`: the balancer pauses it (the pause returned; zero when it was paused
    // already, the same outage) and it counts as a failure, and as a pause when one started.
    Clock::duration path_error(ferry_plugin::RailBalancer &b, uint16_t nic, Clock::time_point now);

    // One entry per NIC, named names[i] ("mlx5_0:1"). A NIC pauses for every peer at once, so a
    // paused one counts all `peers` connected now.
    std::vector<ferry_rail_stats_t> report(const std::vector<std::string> &names, const ferry_plugin::RailBalancer &b,
                                           Clock::time_point now, uint64_t peers) const;

private:
    std::vector<ferry_plugin::RailCounts> counts_;
};

}  // namespace ferry_rdma
