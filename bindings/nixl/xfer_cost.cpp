// The NIXL calls beyond moving bytes: estimateXferCost (from the bandwidth measured on completed
// transfers to the same agent, else the configured est_bandwidth_mbps), prepMemView (refused:
// no Ferry transport offers GPU-initiated transfers), prepXfer's customParam, and NIXL's
// progress-thread and sync settings (which do not apply).
#include <cmath>
#include <mutex>
#include <string_view>

#include "common/nixl_log.h"
#include "ferry_backend.hpp"

namespace ferry_nixl {
namespace {

// Smaller transfers measure the per-transfer overhead, not the transport's bandwidth.
constexpr uint64_t kMinSampleBytes = 256 * 1024;
constexpr double kWeight = 0.25;  // moving average: a new sample's share

constexpr std::string_view kTransportParam = "transport=";

nixl_status_t refuse_mem_view() {
    NIXL_ERROR << "FERRY backend: prepMemView (NIXL's GPU-initiated device API) is not supported: no Ferry "
                  "transport lets a GPU kernel post transfers. Post from the host with prepXfer/postXfer "
                  "(VRAM_SEG moves over cuda_ipc, hip_ipc or rdma where they load), or use a backend with "
                  "a device API (UCX) for kernel-initiated transfers";
    return NIXL_ERR_NOT_SUPPORTED;
}

const char *sync_name(nixl_thread_sync_t mode) {
    switch (mode) {
        case nixl_thread_sync_t::NIXL_THREAD_SYNC_NONE: return "NONE";
        case nixl_thread_sync_t::NIXL_THREAD_SYNC_STRICT: return "STRICT";
        case nixl_thread_sync_t::NIXL_THREAD_SYNC_RW: return "RW";
    }
    return "?";
}

}  // namespace

// NIXL's progress-thread and sync settings change nothing here; say so once per process.
void note_unused_settings(const nixlBackendInitParams *init) {
    static std::once_flag once;
    std::call_once(once, [&] {
        NIXL_INFO << "FERRY backend: enableProgTh=" << (init->enableProgTh ? "true" : "false")
                  << " pthrDelay=" << init->pthrDelay << "us syncMode=" << sync_name(init->syncMode)
                  << " do not apply: Ferry's transports complete ops on their own threads (checkXfer"
                     " only reads their status) and the backend locks its own state under every syncMode";
    });
}

nixl_status_t nixlFerryEngine::prepMemView(const nixl_remote_meta_dlist_t &, nixlMemViewH &,
                                           const nixl_opt_b_args_t *) const {
    return refuse_mem_view();
}

nixl_status_t nixlFerryEngine::prepMemView(const nixl_meta_dlist_t &, nixlMemViewH &, const nixl_opt_b_args_t *) const {
    return refuse_mem_view();
}

bool nixlFerryEngine::apply_custom_param(const nixl_opt_b_args_t *opt_args, FerryTransfer &xfer) const {
    if (!opt_args || opt_args->customParam.empty()) return true;
    std::string_view param(opt_args->customParam);
    if (param.substr(0, kTransportParam.size()) == kTransportParam && param.size() > kTransportParam.size() &&
        param.size() - kTransportParam.size() < 32) {
        xfer.forced_transport = std::string(param.substr(kTransportParam.size()));
        return true;
    }
    NIXL_ERROR << "FERRY backend: prepXfer: customParam '" << std::string(param.substr(0, 64))
               << "' is not understood; the FERRY backend takes only 'transport=<name>' (tcp, shm, rdma, ...: "
                  "every op of the transfer over that Ferry transport), or nothing";
    return false;
}

void nixlFerryEngine::record_throughput(const FerryTransfer &xfer) const {
    if (xfer.bytes < kMinSampleBytes || xfer.state != FerryTransfer::State::Posted) return;
    auto elapsed = std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - xfer.posted_at);
    if (elapsed.count() <= 0) return;
    double sample = static_cast<double>(xfer.bytes) / elapsed.count();
    std::lock_guard lock(mutex_);
    Throughput &t = throughput_[xfer.remote_agent];
    if (t.samples == 0) {
        t.bytes_per_us = sample;
        t.deviation = sample / 2;  // one sample says little
    } else {
        t.deviation += kWeight * (std::fabs(sample - t.bytes_per_us) - t.deviation);
        t.bytes_per_us += kWeight * (sample - t.bytes_per_us);
    }
    ++t.samples;
    t.transport = xfer.transport;
}

nixl_status_t nixlFerryEngine::estimateXferCost(const nixl_xfer_op_t &operation, const nixl_meta_dlist_t &local,
                                                const nixl_meta_dlist_t &remote, const std::string &remote_agent,
                                                nixlBackendReqH *const &, std::chrono::microseconds &duration,
                                                std::chrono::microseconds &err_margin, nixl_cost_t &method,
                                                const nixl_opt_args_t *) const {
    if (operation != NIXL_READ && operation != NIXL_WRITE) return NIXL_ERR_INVALID_PARAM;
    (void)remote;
    uint64_t bytes = 0;
    for (int i = 0; i < local.descCount(); ++i) bytes += local[i].len;
    double rate = 0, deviation = 0;
    {
        std::lock_guard lock(mutex_);
        auto it = throughput_.find(remote_agent);
        if (it != throughput_.end() && it->second.samples > 0) {
            rate = it->second.bytes_per_us;
            deviation = it->second.deviation;
        }
    }
    if (rate <= 0 && params_.est_bandwidth_mbps > 0) {
        rate = params_.est_bandwidth_mbps;  // MB/s is bytes per microsecond
        deviation = rate / 2;               // configured, not measured: a wide margin
    }
    if (rate <= 0) {
        NIXL_ERROR << "FERRY backend: estimateXferCost: no transfer of at least " << kMinSampleBytes
                   << " bytes to agent '" << remote_agent << "' has completed yet, and est_bandwidth_mbps is "
                   << "not set (parameter or FERRY_EST_BANDWIDTH_MBPS); move data once or set it";
        return NIXL_ERR_NOT_SUPPORTED;
    }
    double us = static_cast<double>(bytes) / rate;
    // The duration at the slower rate (average - deviation) bounds the error.
    double slow = rate - deviation > rate / 10 ? rate - deviation : rate / 10;
    duration = std::chrono::microseconds(static_cast<int64_t>(std::ceil(us)));
    err_margin = std::chrono::microseconds(static_cast<int64_t>(std::ceil(static_cast<double>(bytes) / slow - us)));
    method = nixl_cost_t::ANALYTICAL_BACKEND;
    return NIXL_SUCCESS;
}

}  // namespace ferry_nixl
