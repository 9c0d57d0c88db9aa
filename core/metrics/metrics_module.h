/*
 * Between libferry and ferry_metrics.so, the Prometheus endpoint (metrics_exporter.cpp): plain C,
 * so the module's C++ (prometheus-cpp, civetweb) never meets libferry's. libferry loads the
 * module only when metrics_port is set, from <dir of libferry>/ferry/ferry_metrics.so, so a host
 * without prometheus-cpp still loads the core. Both come from one build: the versions must match.
 */
#ifndef FERRY_METRICS_MODULE_H
#define FERRY_METRICS_MODULE_H

#include <stddef.h>
#include <stdint.h>

#include "ferry/ferry.h"

#ifdef __cplusplus
extern "C" {
#endif

#define FERRY_METRICS_MODULE_VERSION 2u
#define FERRY_METRICS_MODULE_SYMBOL "ferry_metrics_module"

/* What a scrape reads: ferry_stats()'s and ferry_rail_stats()'s contracts, on the engine `ctx`,
 * and the latency histogram's bounds (the module calls nothing of libferry: it may be loaded
 * RTLD_LOCAL). Version 2 added rail_stats. */
typedef struct ferry_metrics_source {
    void *ctx;
    int (*stats)(void *ctx, ferry_engine_stats_t *engine, ferry_transport_stats_t *transports, size_t *n);
    const double *latency_bounds; /* FERRY_LATENCY_BUCKETS of them, in seconds */
    int (*rail_stats)(void *ctx, ferry_engine_rail_stats_t *rails, size_t *n);
} ferry_metrics_source_t;

typedef struct ferry_metrics_module {
    uint32_t version; /* FERRY_METRICS_MODULE_VERSION */
    /* Serves GET /metrics (Prometheus text format) on `listen` ("127.0.0.1:9100"; port 0: any
     * free one) until stop. `source` stays valid until stop returns. NULL, with `err` written,
     * on failure. */
    void *(*start)(const char *listen, const ferry_metrics_source_t *source, char *err, size_t err_len);
    int (*port)(void *server); /* the port it listens on */
    void (*stop)(void *server);
} ferry_metrics_module_t;

#ifdef __cplusplus
}
#endif

#endif /* FERRY_METRICS_MODULE_H */
