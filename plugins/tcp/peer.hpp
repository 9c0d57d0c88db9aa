// A connected peer: its lanes (grouped by rail, rails.hpp), the regions imported from it, and
// submit (slicing ops over the least-loaded lanes; with several rails, over the lanes that
// will finish them first by their measured throughput: plugins/common/rail_balance.hpp).
#pragma once

#include "lane.hpp"
#include "options.hpp"
#include "plugin_util.hpp"
#include "rail_balance.hpp"
#include "rail_tally.hpp"
#include "region_table.hpp"
#include "wire.hpp"

#include <ferry/plugin.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>
#include <vector>

namespace ferry_tcp {

struct RemoteRegion {
    uint64_t addr = 0;
    uint64_t len = 0;
    uint32_t access = 0;
};

// One rail to the peer: a local address (or none: the kernel's choice) and the peer's address
// its lanes connect to.
struct Rail {
    Endpoint remote;
    sockaddr_storage source{};  // bound before connecting when source_len != 0
    socklen_t source_len = 0;
    std::string name;  // "10.0.1.2 -> 10.0.1.1:7471"
    size_t local = 0;  // the local rail it leaves through (RailTally's index)
};

// One rail to the peer as it is now, for rail_stats.
struct RailNow {
    size_t local = 0;     // RailTally's index
    bool paused = false;  // takes no new slices now
    uint64_t queued = 0;  // bytes queued or in flight on its lanes
    double rate = 0;      // bytes/s its lanes moved while busy, summed; 0: not measured
};

class Peer {
public:
    Peer(uint64_t id, std::vector<Rail> rails, const Config &cfg, const Logger &log, RegionTable &regions,
         WaitSet &waiters, CompletionQueue &cq, RailTally &tally);
    ~Peer();
    Peer(const Peer &) = delete;
    Peer &operator=(const Peer &) = delete;

    uint64_t id() const { return id_; }
    const Endpoint &endpoint() const { return rails_[0].remote; }  // the first rail's, for messages
    const Rail &rail(unsigned r) const { return rails_[r]; }
    unsigned rail_count() const { return static_cast<unsigned>(rails_.size()); }
    const Config &config() const { return cfg_; }
    const Logger &log() const { return log_; }
    RailTally &tally() { return tally_; }

    void add_lane(Reactor &reactor, unsigned rail);  // before connect_lanes()

    // Starts every lane's connection and waits (bounded by connect_timeout_ms) until all
    // answered HELLO or one failed. On failure returns the first error with *why.
    int connect_lanes(std::string *why);
    // Lanes report the end of each handshake (loop threads).
    void on_handshake(unsigned lane, int status, const std::string &why);

    // Fails in-flight ops with `status` / `why`, closes the lanes for good and waits until
    // that is done. Later submits fail with -ENOTCONN.
    void close(int status, const std::string &why);

    int import_region(uint64_t handle, const RemoteRegion &r);
    bool release_region(uint64_t handle);

    int submit(const ferry_xfer_op_t *ops, size_t n_ops, ferry_error_t *err);

    // A lane of `rail` failed with a path error (its loop thread, lane lock held): pauses the
    // rail and hands `slices` to the lanes of rails that are not paused. False (nothing taken)
    // when there is no such rail or the peer is closing: the lane fails them.
    bool reroute(unsigned rail, const std::string &why, std::deque<Slice> &slices);

    // Each rail's pause, queue and measured throughput now (any thread).
    std::vector<RailNow> rails_now(Clock::time_point now);

private:
    // With several rails: which lanes may take new slices now (not paused; all, when every rail
    // is), and each lane's throughput, re-measured from the bytes its slices completed.
    void usable_lanes(Clock::time_point now, std::vector<char> &usable);
    void sample_rates(Clock::time_point now);
    int check_remote(size_t i, const ferry_xfer_op_t &op, ferry_error_t *err);

    const uint64_t id_;
    std::vector<Rail> rails_;
    const Config &cfg_;
    const Logger &log_;
    RegionTable &regions_;
    WaitSet &waiters_;
    CompletionQueue &cq_;  // failures of batches a submitting thread sent itself
    RailTally &tally_;     // what each local rail carried, with the other peers'
    std::vector<std::unique_ptr<Lane>> lanes_;
    std::mutex rails_mu_;               // rails' health; taken by lanes' loop threads in reroute
    std::atomic<bool> closing_{false};  // set under rails_mu_: no slice is rerouted after it
    // Per rail, under rails_mu_: a rail whose lane failed on its path is paused (no new slices),
    // 1 s doubled on each failure in a row up to 30 s.
    RailHealth health_;
    // Per lane, under submit_mu_: bytes/s, measured from the bytes its slices completed.
    RailRates rates_;

    std::mutex submit_mu_;  // serialises submits, and submit against close
    bool closed_ = false;

    std::shared_mutex imp_mu_;
    std::unordered_map<uint64_t, RemoteRegion> imported_;

    std::mutex hs_mu_;
    std::condition_variable hs_cv_;
    unsigned hs_ok_ = 0;
    unsigned hs_answered_ = 0;
    std::vector<char> hs_rail_failed_;
    int hs_status_ = 0;
    std::string hs_why_;
};

}  // namespace ferry_tcp
