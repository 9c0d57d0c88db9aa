// What each local rail of one tcp instance carried, summed over its peers (rail_stats, ABI 1.5):
// one entry per local address, however many peers, so a metrics label per rail stays bounded.
// Lanes count their own completed slices (no shared cache line on the data path); a lane's
// counts are folded into its rail's totals when the lane goes, so totals never shrink.
#pragma once

#include "rail_report.hpp"

#include <atomic>
#include <cstdint>
#include <memory>
#include <mutex>
#include <string>
#include <vector>

namespace ferry_tcp {

class RailTally {
public:
    // One lane's counts. Written only by the thread that holds the lane (its lock orders them),
    // so an addition needs no locked instruction; read at any time by rail_stats.
    struct alignas(64) LaneCounts {
        std::atomic<uint64_t> read_bytes{0}, write_bytes{0}, completed{0};

        void count(uint8_t opcode, uint64_t len) {
            auto &bytes = opcode == FERRY_OP_READ ? read_bytes : write_bytes;
            bytes.store(bytes.load(std::memory_order_relaxed) + len, std::memory_order_relaxed);
            completed.store(completed.load(std::memory_order_relaxed) + 1, std::memory_order_relaxed);
        }
        uint64_t done_bytes() const {
            return read_bytes.load(std::memory_order_relaxed) + write_bytes.load(std::memory_order_relaxed);
        }
    };

    // `names`: the local rails, in the order peers' Rail::local indexes them.
    explicit RailTally(std::vector<std::string> names);

    size_t size() const { return rails_.size(); }
    const std::string &name(size_t rail) const { return rails_[rail].name; }

    // A new lane's counts on `rail`: in the rail's totals until detach, then folded into them.
    LaneCounts *attach(size_t rail);
    void detach(size_t rail, LaneCounts *counts);

    void failed(size_t rail);  // a connection of the rail broke or could not be made (a path error)
    void paused(size_t rail);  // the rail was paused for one peer

    // Every rail's totals: what gone lanes folded in plus what live lanes counted.
    std::vector<ferry_plugin::RailCounts> totals() const;

private:
    struct Rail {
        std::string name;
        ferry_plugin::RailCounts folded;
        std::vector<std::unique_ptr<LaneCounts>> live;
    };
    mutable std::mutex mu_;
    std::vector<Rail> rails_;
};

}  // namespace ferry_tcp
