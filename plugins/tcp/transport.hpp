// One tcp transport instance: options, I/O threads, listener, peers, registered memory and
// the completion queue. Methods implement the ferry_plugin_v1_t entry points (the kit's
// plugin_entry.hpp, instantiated in plugin.cpp, adds argument checks and the exception boundary).
#pragma once

#include "listener.hpp"
#include "options.hpp"
#include "peer.hpp"
#include "plugin_util.hpp"
#include "rail_tally.hpp"
#include "reactor.hpp"
#include "region_table.hpp"
#include "wait_set.hpp"

#include "staged_device.hpp"

#include <ferry/plugin.h>

#include <atomic>
#include <memory>
#include <shared_mutex>
#include <unordered_map>
#include <vector>

namespace ferry_tcp {

class Transport {
public:
    static constexpr const char *kName = "tcp";
    static int probe(const ferry_kv_t *options, size_t n_options, ferry_probe_result_t *result);
    static int create(const ferry_kv_t *options, size_t n_options, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err);
    ~Transport();  // fails in-flight ops, stops serving, joins the I/O threads

    int export_endpoint(void *buf, size_t *len, ferry_error_t *err);
    int register_mem(const ferry_mem_region_t *region, uint64_t *handle, ferry_error_t *err);
    int deregister_mem(uint64_t handle, ferry_error_t *err);
    int export_mem(uint64_t handle, void *buf, size_t *len, ferry_error_t *err);
    int connect(const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err);
    int disconnect(uint64_t peer, ferry_error_t *err);
    int import_mem(uint64_t peer, const ferry_mem_region_t *region, const void *desc, size_t len, uint64_t *remote_mem,
                   ferry_error_t *err);
    int release_mem(uint64_t peer, uint64_t remote_mem, ferry_error_t *err);
    int submit(uint64_t peer, const ferry_xfer_op_t *ops, size_t n_ops, ferry_error_t *err);
    int poll(ferry_completion_t *out, size_t max);
    int completion_fd() const { return waiters_.fd(); }
    // ABI 1.5: per local rail (tcp.rails' addresses, else bind_ip), summed over peers.
    int rail_stats(ferry_rail_stats_t *out, size_t *n, ferry_error_t *err);

private:
    Transport(const Config &cfg, const ferry_host_api_t *host);
    int start(ferry_error_t *err);
    std::shared_ptr<Peer> find_peer(uint64_t id);

    const Config cfg_;
    const Logger log_;
    CompletionQueue cq_;
    WaitSet waiters_{cq_.fd()};  // the completion fd: cq_'s eventfd and waiter-mode lanes
    RegionTable regions_;
    ferry_staged::Stager stager_;  // device regions: served through the host's staging calls
    ConnLimits limits_;
    RateLimitedLog peer_log_;
    ServerContext server_ctx_;
    std::vector<std::unique_ptr<Reactor>> reactors_;
    std::vector<std::unique_ptr<Listener>> listeners_;  // one per rail
    std::vector<std::string> rails_;                    // tcp.rails resolved (rails.hpp); empty: bind_ip alone
    std::unique_ptr<RailTally> tally_;                  // per local rail; outlives every peer's lanes
    std::vector<uint8_t> endpoint_;
    std::string endpoint_name_;

    std::shared_mutex peers_mu_;
    std::unordered_map<uint64_t, std::shared_ptr<Peer>> peers_;
    uint64_t next_peer_ = 1;
    std::atomic<uint64_t> next_import_{1};
    std::atomic<unsigned> next_lane_reactor_{0};
};

}  // namespace ferry_tcp
