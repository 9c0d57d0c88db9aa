// ferry_metrics.so: an engine's stats in Prometheus' text format at GET /metrics, served by
// prometheus-cpp's Exposer (civetweb) on the address libferry passes (metrics_module.h). Built
// only where prometheus-cpp is (Debian's prometheus-cpp-dev), loaded only when metrics_port is
// set. Each scrape reads the engine's counters afresh (a Collectable); nothing is kept here.
// Labels carry transport and operation names, and the rails' names: this host's own addresses
// or NICs ("10.0.1.2", "mlx5_0:1"), one series per local rail however many peers there are; no
// memory addresses, keys or peers' names.
#include <prometheus/collectable.h>
#include <prometheus/exposer.h>
#include <prometheus/metric_family.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <exception>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "ferry/ferry.h"
#include "metrics/metrics_module.h"

namespace {

using prometheus::ClientMetric;
using prometheus::MetricFamily;
using prometheus::MetricType;

MetricFamily family(const char *name, const char *help, MetricType type) {
    MetricFamily f;
    f.name = name;
    f.help = help;
    f.type = type;
    return f;
}

// The engine's rails (ferry_rail_stats), one series per transport and local rail.
std::vector<MetricFamily> rail_families(const ferry_metrics_source_t &source) {
    std::vector<ferry_engine_rail_stats_t> rails(16);
    size_t n = rails.size();
    int rc = source.rail_stats(source.ctx, rails.data(), &n);
    if (rc == -ENOSPC) {
        rails.resize(n);
        rc = source.rail_stats(source.ctx, rails.data(), &n);
    }
    if (rc != 0) return {};
    rails.resize(n);
    MetricFamily bytes =
        family("ferry_rail_bytes_total",
               "Bytes a local rail of the transport carried (summed over peers), by operation", MetricType::Counter);
    MetricFamily completed =
        family("ferry_rail_completions_total", "Pieces a local rail completed: tcp slices, rdma work requests",
               MetricType::Counter);
    MetricFamily failures = family(
        "ferry_rail_failures_total",
        "Path failures on a local rail (a connection that broke, timed out or could not be made)", MetricType::Counter);
    MetricFamily pauses =
        family("ferry_rail_pauses_total",
               "Times a local rail was paused after a path failure (for one peer, or for all)", MetricType::Counter);
    MetricFamily paused = family("ferry_rail_paused_peers", "Peers a local rail is paused for now", MetricType::Gauge);
    MetricFamily throughput = family("ferry_rail_throughput_bytes_per_second",
                                     "Bytes per second a local rail moved while busy, as the transport measured it to "
                                     "balance work (0: not measured)",
                                     MetricType::Gauge);
    MetricFamily queued =
        family("ferry_rail_queued_bytes", "Bytes given to a local rail and not completed yet", MetricType::Gauge);
    for (const auto &r : rails) {
        const std::vector<ClientMetric::Label> labels = {
            {"rail", std::string(r.rail, strnlen(r.rail, sizeof r.rail))},
            {"transport", std::string(r.transport, strnlen(r.transport, sizeof r.transport))}};
        auto add = [&](MetricFamily &f, double v) {
            ClientMetric m;
            m.label = labels;
            if (f.type == MetricType::Counter) m.counter.value = v;
            else m.gauge.value = v;
            f.metric.push_back(std::move(m));
        };
        for (int k = 0; k < 2; ++k) {
            ClientMetric m;
            m.label = {{"op", k == 0 ? "read" : "write"}, labels[0], labels[1]};
            m.counter.value = static_cast<double>(k == 0 ? r.read_bytes : r.write_bytes);
            bytes.metric.push_back(std::move(m));
        }
        add(completed, static_cast<double>(r.completed));
        add(failures, static_cast<double>(r.failures));
        add(pauses, static_cast<double>(r.pauses));
        add(paused, static_cast<double>(r.paused_peers));
        add(throughput, r.throughput);
        add(queued, static_cast<double>(r.queued_bytes));
    }
    return {std::move(bytes),  std::move(completed),  std::move(failures), std::move(pauses),
            std::move(paused), std::move(throughput), std::move(queued)};
}

// The answer to one scrape.
class EngineCollector final : public prometheus::Collectable {
public:
    explicit EngineCollector(const ferry_metrics_source_t &source) : source_(source) {}

    std::vector<MetricFamily> Collect() const override {
        ferry_engine_stats_t engine{};
        std::vector<ferry_transport_stats_t> transports(8);
        size_t n = transports.size();
        int rc = source_.stats(source_.ctx, &engine, transports.data(), &n);
        if (rc == -ENOSPC) {
            transports.resize(n);
            rc = source_.stats(source_.ctx, &engine, transports.data(), &n);
        }
        if (rc != 0) return {};
        transports.resize(n);

        MetricFamily ops =
            family("ferry_ops_total", "Ops that succeeded, by transport and operation", MetricType::Counter);
        MetricFamily failures =
            family("ferry_op_failures_total", "Ops that failed, by transport and operation", MetricType::Counter);
        MetricFamily bytes = family(
            "ferry_bytes_total", "Bytes moved by ops that succeeded, by transport and operation", MetricType::Counter);
        MetricFamily latency =
            family("ferry_op_latency_seconds", "Time from submit to completion of ops, by transport and operation",
                   MetricType::Histogram);
        MetricFamily peers =
            family("ferry_peers", "Segments this engine is connected to, by transport", MetricType::Gauge);
        MetricFamily failovers = family("ferry_failovers_total",
                                        "Ops that failed on a broken path of this transport and were posted again on "
                                        "another path (not counted as failures)",
                                        MetricType::Counter);
        MetricFamily pauses =
            family("ferry_path_pauses_total",
                   "Times a path of this transport (to one segment) was paused after a failure", MetricType::Counter);
        MetricFamily paused = family("ferry_paused_paths", "Paths of this transport paused now", MetricType::Gauge);
        const double *bounds = source_.latency_bounds;
        for (const auto &t : transports) {
            const std::string name(t.transport, strnlen(t.transport, sizeof t.transport));
            for (int k = 0; k < 2; ++k) {
                const ferry_op_stats_t &s = k == 0 ? t.read : t.write;
                std::vector<ClientMetric::Label> labels = {{"op", k == 0 ? "read" : "write"}, {"transport", name}};
                auto counter = [&](MetricFamily &f, double v) {
                    ClientMetric m;
                    m.label = labels;
                    m.counter.value = v;
                    f.metric.push_back(std::move(m));
                };
                counter(ops, static_cast<double>(s.done));
                counter(failures, static_cast<double>(s.failed));
                counter(bytes, static_cast<double>(s.bytes));
                ClientMetric h;
                h.label = labels;
                uint64_t cumulative = 0;
                for (size_t b = 0; b < FERRY_LATENCY_BUCKETS; ++b) {
                    cumulative += s.latency_buckets[b];
                    h.histogram.bucket.push_back({cumulative, bounds[b]});
                }
                cumulative += s.latency_buckets[FERRY_LATENCY_BUCKETS];
                h.histogram.bucket.push_back({cumulative, std::numeric_limits<double>::infinity()});
                h.histogram.sample_count = cumulative;
                h.histogram.sample_sum = s.latency_sum_seconds;
                latency.metric.push_back(std::move(h));
            }
            if (name != "none") {
                ClientMetric m;
                m.label = {{"transport", name}};
                m.gauge.value = static_cast<double>(t.peers);
                peers.metric.push_back(m);
                m.gauge.value = static_cast<double>(t.paused_paths);
                paused.metric.push_back(m);
                m.gauge = {};
                m.counter.value = static_cast<double>(t.failovers);
                failovers.metric.push_back(m);
                m.counter.value = static_cast<double>(t.pauses);
                pauses.metric.push_back(std::move(m));
            }
        }
        auto single = [&](const char *name, const char *help, MetricType type, double v) {
            MetricFamily f = family(name, help, type);
            ClientMetric m;
            if (type == MetricType::Counter) m.counter.value = v;
            else m.gauge.value = v;
            f.metric.push_back(std::move(m));
            return f;
        };
        const auto &st = engine.staging;
        std::vector<MetricFamily> out = {
            std::move(ops),
            std::move(failures),
            std::move(bytes),
            std::move(latency),
            std::move(peers),
            std::move(failovers),
            std::move(pauses),
            std::move(paused),
            single("ferry_batches_total", "Batches submitted", MetricType::Counter,
                   static_cast<double>(engine.batches)),
            single("ferry_segments_open", "Segments open now", MetricType::Gauge,
                   static_cast<double>(engine.segments_open)),
            single("ferry_staging_max_bytes", "Pinned host memory GPU staging may lend at once (0: off)",
                   MetricType::Gauge, static_cast<double>(st.max_bytes)),
            single("ferry_staging_lent_bytes", "Pinned host memory GPU staging lends now", MetricType::Gauge,
                   static_cast<double>(st.lent_bytes)),
            single("ferry_staging_peak_lent_bytes", "Most pinned host memory lent at once", MetricType::Gauge,
                   static_cast<double>(st.peak_lent_bytes)),
            single("ferry_staging_refused_total", "Staging slices refused at the bound", MetricType::Counter,
                   static_cast<double>(st.acquire_refused)),
            single("ferry_staging_copies_total", "GPU <-> pinned host copies started", MetricType::Counter,
                   static_cast<double>(st.copies)),
            single("ferry_staging_copy_failures_total", "GPU <-> pinned host copies that failed", MetricType::Counter,
                   static_cast<double>(st.copy_failures)),
        };
        for (auto &f : rail_families(source_)) out.push_back(std::move(f));
        return out;
    }

private:
    ferry_metrics_source_t source_;
};

struct Server {
    std::shared_ptr<EngineCollector> collector;
    std::unique_ptr<prometheus::Exposer> exposer;
};

void *start(const char *listen, const ferry_metrics_source_t *source, char *err, size_t err_len) {
    try {
        auto s = std::make_unique<Server>();
        s->collector = std::make_shared<EngineCollector>(*source);
        // A connection holds one of 16 threads until it sent its request, 2 s at most: a scraper
        // stalling fewer than 16 connections delays nobody, more delay others by 2 s per 16.
        s->exposer = std::make_unique<prometheus::Exposer>(
            std::vector<std::string>{"listening_ports", listen, "num_threads", "16", "request_timeout_ms", "2000",
                                     "linger_timeout_ms", "0", "enable_keep_alive", "no"});
        s->exposer->RegisterCollectable(s->collector);
        return s.release();
    } catch (const std::exception &e) {
        std::snprintf(err, err_len, "%s", e.what());
        return nullptr;
    }
}

int port(void *server) {
    auto ports = static_cast<Server *>(server)->exposer->GetListeningPorts();
    return ports.empty() ? 0 : ports.front();
}

void stop(void *server) { delete static_cast<Server *>(server); }

}  // namespace

extern "C" __attribute__((visibility("default")))
const ferry_metrics_module_t ferry_metrics_module = {FERRY_METRICS_MODULE_VERSION, start, port, stop};
