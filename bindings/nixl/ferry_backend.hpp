// nixlFerryEngine: a NIXL backend engine over Ferry's C API (ferry.h). One Ferry engine per
// NIXL backend instance; a NIXL agent is a Ferry segment, a NIXL transfer request a Ferry batch,
// a NIXL notification a Ferry control-channel notification.
#pragma once

#include <chrono>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include <ferry/ferry.h>

#include "backend/backend_engine.h"
#include "backend_params.hpp"

namespace ferry_nixl {

struct EngineDeleter {
    void operator()(ferry_engine_t *engine) const { ferry_engine_destroy(engine); }
};
using EnginePtr = std::unique_ptr<ferry_engine_t, EngineDeleter>;

// Metadata of a region registered here (what registerMem returns).
class LocalRegion : public nixlBackendMD {
public:
    LocalRegion(uint64_t addr, uint64_t length, uint32_t kind, int32_t device)
        : nixlBackendMD(true), addr(addr), length(length), memory_kind(kind), device(device) {}
    const uint64_t addr;
    const uint64_t length;
    const uint32_t memory_kind;
    const int32_t device;
};

// A region another agent (or this one, for local transfers) registered: where to send requests.
class TargetRegion : public nixlBackendMD {
public:
    TargetRegion(ferry_segment_id_t segment, uint64_t addr, uint64_t length)
        : nixlBackendMD(false), segment(segment), addr(addr), length(length) {}
    const ferry_segment_id_t segment;
    const uint64_t addr;
    const uint64_t length;
};

// One prepared NIXL transfer: the Ferry requests, and the batch while it is posted.
class FerryTransfer : public nixlBackendReqH {
public:
    enum class State { Prepared, Posted, Done, Failed };
    std::vector<ferry_request_t> requests;
    std::string remote_agent;
    State state = State::Prepared;
    ferry_batch_id_t batch = 0;
    bool has_batch = false;
    size_t next_unfinished = 0;  // ops before it are known to be done
    bool notify = false;         // send `notif_message` once every op is done
    std::string notif_message;
    nixl_status_t failure = NIXL_SUCCESS;
    std::string forced_transport;  // customParam "transport=<name>": every op over it
    uint64_t bytes = 0;            // payload of all ops, for the measured bandwidth
    std::chrono::steady_clock::time_point posted_at;
    std::string transport;  // what carried the last op (Ferry's status)
};

// Measured throughput of completed transfers to one agent (estimateXferCost).
struct Throughput {
    double bytes_per_us = 0;  // moving average over transfers of at least kMinSampleBytes
    double deviation = 0;     // moving average of |sample - average|, for the error margin
    uint64_t samples = 0;
    std::string transport;
};

// Logs once per process that enableProgTh, pthrDelay and syncMode change nothing (xfer_cost.cpp).
void note_unused_settings(const nixlBackendInitParams *init);

class nixlFerryEngine : public nixlBackendEngine {
public:
    explicit nixlFerryEngine(const nixlBackendInitParams *init_params);
    ~nixlFerryEngine() override;

    bool supportsRemote() const override { return true; }
    bool supportsLocal() const override { return true; }
    bool supportsNotif() const override { return true; }
    nixl_mem_list_t getSupportedMems() const override { return {DRAM_SEG, VRAM_SEG}; }

    nixl_status_t registerMem(const nixlBlobDesc &mem, const nixl_mem_t &nixl_mem, nixlBackendMD *&out) override;
    nixl_status_t deregisterMem(nixlBackendMD *meta) override;

    nixl_status_t getConnInfo(std::string &str) const override;
    nixl_status_t loadRemoteConnInfo(const std::string &remote_agent, const std::string &remote_conn_info) override;
    nixl_status_t connect(const std::string &remote_agent) override;
    nixl_status_t disconnect(const std::string &remote_agent) override;

    nixl_status_t getPublicData(const nixlBackendMD *meta, std::string &str) const override;
    nixl_status_t loadRemoteMD(const nixlBlobDesc &input, const nixl_mem_t &nixl_mem, const std::string &remote_agent,
                               nixlBackendMD *&output) override;
    nixl_status_t loadLocalMD(nixlBackendMD *input, nixlBackendMD *&output) override;
    nixl_status_t unloadMD(nixlBackendMD *input) override;

    nixl_status_t prepXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote, const std::string &remote_agent, nixlBackendReqH *&handle,
                           const nixl_opt_b_args_t *opt_args = nullptr) const override;
    nixl_status_t postXfer(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                           const nixl_meta_dlist_t &remote, const std::string &remote_agent, nixlBackendReqH *&handle,
                           const nixl_opt_b_args_t *opt_args = nullptr) const override;
    nixl_status_t checkXfer(nixlBackendReqH *handle) const override;
    nixl_status_t releaseReqH(nixlBackendReqH *handle) const override;

    // GPU-initiated transfers (NIXL's device API): no Ferry transport offers them; refused
    // with the alternative named (xfer_cost.cpp).
    nixl_status_t prepMemView(const nixl_remote_meta_dlist_t &, nixlMemViewH &,
                              const nixl_opt_b_args_t * = nullptr) const override;
    nixl_status_t prepMemView(const nixl_meta_dlist_t &, nixlMemViewH &,
                              const nixl_opt_b_args_t * = nullptr) const override;
    void releaseMemView(nixlMemViewH) const override {}

    // From the bandwidth measured on completed transfers to the agent, else the configured
    // est_bandwidth_mbps (xfer_cost.cpp).
    nixl_status_t estimateXferCost(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                                   const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                                   nixlBackendReqH *const &handle, std::chrono::microseconds &duration,
                                   std::chrono::microseconds &err_margin, nixl_cost_t &method,
                                   const nixl_opt_args_t *extra_params = nullptr) const override;

    nixl_status_t getNotifs(notif_list_t &notif_list) override;
    nixl_status_t genNotif(const std::string &remote_agent, const std::string &msg) const override;

private:
    // Segment serving `agent` (this agent's own for local transfers); false when unknown.
    bool agent_segment(const std::string &agent, ferry_segment_id_t &segment) const;
    nixl_status_t send_notification(const std::string &remote_agent, const std::string &msg) const;
    nixl_status_t finish(FerryTransfer &xfer) const;
    uint32_t vram_memory_kind();
    // customParam of prepXfer: "" or "transport=<name>"; false (logged) for anything else.
    bool apply_custom_param(const nixl_opt_b_args_t *opt_args, FerryTransfer &xfer) const;
    void record_throughput(const FerryTransfer &xfer) const;

    BackendParams params_;
    EnginePtr engine_;
    std::string segment_name_;

    mutable std::mutex mutex_;  // guards the maps and queues below
    std::unordered_map<std::string, ferry_segment_id_t> agent_segments_;
    bool has_self_segment_ = false;
    ferry_segment_id_t self_segment_ = 0;
    mutable std::deque<std::pair<std::string, std::string>> self_notifications_;  // genNotif to itself
    mutable std::unordered_map<std::string, Throughput> throughput_;              // by remote agent
    bool vram_kind_known_ = false;
    uint32_t vram_kind_ = FERRY_MEMORY_CUDA;
};

}  // namespace ferry_nixl
