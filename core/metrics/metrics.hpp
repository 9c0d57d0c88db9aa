// core/metrics/: what the data path measured: the counters the engine writes and their C form
// (transfer_stats.hpp), and the Prometheus endpoint (this file): ferry_metrics.so, built from
// metrics_exporter.cpp alone, behind the C interface of metrics_module.h, checked like a plugin.
// May include: loader/, util/
//
// The Prometheus endpoint of an engine (engine key metrics_port): ferry_metrics.so, loaded from
// <dir of libferry>/ferry/ when the key is set and checked like a plugin (plugin_trust), serves
// the engine's stats (Engine::stats) at each scrape. docs/METRICS.md lists what it reports.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>

#include "ferry/engine.hpp"
#include "loader/shared_library.hpp"
#include "metrics/metrics_module.h"
#include "util/file_trust.hpp"

namespace ferry {

class MetricsExporter {
public:
    // Serves `source` on bind_ip:port (port 0: any free one). Errors name the key, the value and
    // the fix (a port in use, no module, no prometheus-cpp on this host).
    static Result<std::unique_ptr<MetricsExporter>> start(const std::string &bind_ip, uint16_t port, TrustLevel trust,
                                                          std::function<EngineStats()> source);
    ~MetricsExporter();
    MetricsExporter(const MetricsExporter &) = delete;
    MetricsExporter &operator=(const MetricsExporter &) = delete;

    const std::string &address() const { return address_; }  // "127.0.0.1:9100"

private:
    MetricsExporter() = default;
    static int read_stats(void *ctx, ferry_engine_stats_t *engine, ferry_transport_stats_t *transports, size_t *n);
    static int read_rail_stats(void *ctx, ferry_engine_rail_stats_t *rails, size_t *n);

    SharedLibrary library_;
    const ferry_metrics_module_t *module_ = nullptr;
    void *server_ = nullptr;
    std::function<EngineStats()> source_;
    ferry_metrics_source_t c_source_{};
    std::string address_;
};

// Where ferry_metrics.so is looked for: FERRY_METRICS_MODULE, else <dir of libferry>/ferry/.
std::string metrics_module_path();

}  // namespace ferry
