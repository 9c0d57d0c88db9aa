// A connected peer: its lanes, the regions imported from it, and submit (slicing ops over
// the least-loaded lanes).
#pragma once

#include "lane.hpp"
#include "options.hpp"
#include "plugin_util.hpp"
#include "region_table.hpp"
#include "wire.hpp"

#include <ferry/plugin.h>

#include <condition_variable>
#include <cstdint>
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

class Peer {
public:
    Peer(uint64_t id, Endpoint ep, const Config &cfg, const Logger &log, RegionTable &regions, WaitSet &waiters,
         CompletionQueue &cq);
    ~Peer();
    Peer(const Peer &) = delete;
    Peer &operator=(const Peer &) = delete;

    uint64_t id() const { return id_; }
    const Endpoint &endpoint() const { return ep_; }
    const Config &config() const { return cfg_; }
    const Logger &log() const { return log_; }

    void add_lane(Reactor &reactor);  // before connect_lanes()

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

private:
    int check_remote(size_t i, const ferry_xfer_op_t &op, ferry_error_t *err);

    const uint64_t id_;
    const Endpoint ep_;
    const Config &cfg_;
    const Logger &log_;
    RegionTable &regions_;
    WaitSet &waiters_;
    CompletionQueue &cq_;  // failures of batches a submitting thread sent itself
    std::vector<std::unique_ptr<Lane>> lanes_;

    std::mutex submit_mu_;  // serialises submits, and submit against close
    bool closed_ = false;

    std::shared_mutex imp_mu_;
    std::unordered_map<uint64_t, RemoteRegion> imported_;

    std::mutex hs_mu_;
    std::condition_variable hs_cv_;
    unsigned hs_ok_ = 0;
    int hs_status_ = 0;
    std::string hs_why_;
};

}  // namespace ferry_tcp
