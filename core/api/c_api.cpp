// core/api/: the C API (include/ferry/ferry.h) over the engine.
// May include: engine/, metadata/, control/, staging/, metrics/, loader/, util/
//
// The C API over the C++ engine: status codes, thread-local last-error messages, no exceptions.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>

#include "engine/config.hpp"
#include "ferry/engine.hpp"
#include "ferry/ferry.h"
#include "loader/plugin_loader.hpp"
#include "metrics/transfer_stats.hpp"
#include "util/log.hpp"

struct ferry_engine {
    std::unique_ptr<ferry::Engine> engine;
    std::string metrics_address;  // ferry_metrics_address's, fixed at creation
};

namespace {

thread_local std::string last_error;

int set_error(const ferry::Error &e) {
    last_error = e.message;
    return e.code < 0 ? e.code : -EIO;
}

int set_error(int code, std::string message) {
    last_error = std::move(message);
    return code;
}

template <class T>
int check(const ferry::Result<T> &r) {
    if (!r) return set_error(r.error());
    last_error.clear();
    return 0;
}

// Every entry point runs through here: a C caller never sees a C++ exception.
template <class Fn>
int guarded(const char *what, Fn &&fn) {
    try {
        return fn();
    } catch (const std::bad_alloc &) {
        return set_error(-ENOMEM, std::string(what) + ": out of memory");
    } catch (const std::exception &e) {
        return set_error(-EIO, std::string(what) + ": " + e.what());
    }
}

ferry::Result<ferry::Config> to_config(const char *const *keys, const char *const *values, size_t count) {
    ferry::Config config;
    for (size_t i = 0; i < count; ++i) {
        if (!keys || !values || !keys[i] || !values[i])
            return ferry::fail(-EINVAL, ferry::cat("config entry ", i, " has a NULL key or value"));
        config[keys[i]] = values[i];
    }
    return config;
}

int copy_string(const std::string &s, char *buf, size_t len) {
    if (!buf || len < s.size() + 1)
        return set_error(-ENOSPC, ferry::cat("buffer of ", len, " bytes is too small; ", s.size() + 1, " needed"));
    memcpy(buf, s.c_str(), s.size() + 1);
    return 0;
}

std::vector<ferry::Request> to_requests(const ferry_request_t *requests, size_t count) {
    std::vector<ferry::Request> reqs(count);
    for (size_t i = 0; i < count; ++i) {
        const auto &r = requests[i];
        reqs[i] = {static_cast<ferry::Opcode>(r.opcode),
                   r.local_addr,
                   r.segment,
                   r.remote_addr,
                   r.length,
                   r.transport ? std::string(r.transport) : std::string()};
    }
    return reqs;
}

// One allocation holds the array, then every sender name and message: one free releases all.
int hand_out(const std::vector<ferry::Notification> &taken, ferry_notification_t **out, size_t *count) {
    if (taken.empty()) {
        *out = nullptr;
        *count = 0;
        last_error.clear();
        return 0;
    }
    size_t bytes = taken.size() * sizeof(ferry_notification_t);
    for (const auto &n : taken) bytes += n.from.size() + 1 + n.message.size();
    auto *block = static_cast<ferry_notification_t *>(std::malloc(bytes));
    if (!block) throw std::bad_alloc();  // -ENOMEM, as for any allocation failing here
    char *tail = reinterpret_cast<char *>(block + taken.size());
    for (size_t i = 0; i < taken.size(); ++i) {
        const auto &n = taken[i];
        memcpy(tail, n.from.c_str(), n.from.size() + 1);
        block[i].from = tail;
        tail += n.from.size() + 1;
        block[i].length = n.message.size();
        block[i].data = n.message.empty() ? nullptr : reinterpret_cast<const uint8_t *>(tail);
        if (!n.message.empty()) memcpy(tail, n.message.data(), n.message.size());
        tail += n.message.size();
    }
    *out = block;
    *count = taken.size();
    last_error.clear();
    return 0;
}

#define REQUIRE_ENGINE(e) \
    if (!(e) || !(e)->engine) return set_error(-EINVAL, std::string(__func__) + ": engine is NULL")

}  // namespace

extern "C" {

int ferry_engine_create(const char *const *keys, const char *const *values, size_t count, ferry_engine_t **out) {
    return guarded(__func__, [&] {
        if (!out) return set_error(-EINVAL, "ferry_engine_create: output pointer is NULL");
        auto config = to_config(keys, values, count);
        if (!config) return set_error(config.error());
        auto engine = ferry::Engine::create(*config);
        if (!engine) return set_error(engine.error());
        *out = new ferry_engine{std::move(*engine), {}};
        (*out)->metrics_address = (*out)->engine->metrics_address();
        return 0;
    });
}

int ferry_engine_create_from_file(const char *path, const char *const *keys, const char *const *values, size_t count,
                                  ferry_engine_t **out) {
    return guarded(__func__, [&] {
        if (!out || !path) return set_error(-EINVAL, "ferry_engine_create_from_file: path or output pointer is NULL");
        auto config = to_config(keys, values, count);
        if (!config) return set_error(config.error());
        auto engine = ferry::Engine::create_from_file(path, *config);
        if (!engine) return set_error(engine.error());
        *out = new ferry_engine{std::move(*engine), {}};
        (*out)->metrics_address = (*out)->engine->metrics_address();
        return 0;
    });
}

void ferry_engine_destroy(ferry_engine_t *engine) { delete engine; }

int ferry_engine_segment_name(ferry_engine_t *e, char *buf, size_t len) {
    REQUIRE_ENGINE(e);
    return copy_string(e->engine->segment_name(), buf, len);
}

int ferry_register(ferry_engine_t *e, void *addr, uint64_t length, uint32_t kind, int32_t device, uint32_t access) {
    REQUIRE_ENGINE(e);
    return guarded(__func__, [&] {
        ferry::MemoryOptions o{static_cast<ferry::MemoryKind>(kind), device, access};
        return check(e->engine->register_memory(addr, length, o));
    });
}

int ferry_register_batch(ferry_engine_t *e, const ferry_memory_range_t *ranges, size_t count) {
    REQUIRE_ENGINE(e);
    if (!ranges && count > 0) return set_error(-EINVAL, "ferry_register_batch: ranges is NULL");
    return guarded(__func__, [&] {
        std::vector<ferry::MemoryRange> rs(count);
        for (size_t i = 0; i < count; ++i) {
            const auto &r = ranges[i];
            if (r.reserved != 0)
                return set_error(-EINVAL,
                                 ferry::cat("ferry_register_batch: range ", i, " of ", count,
                                            " has reserved = ", r.reserved, " (must be 0); nothing was registered"));
            rs[i] = {r.addr, r.length,
                     ferry::MemoryOptions{static_cast<ferry::MemoryKind>(r.memory_kind), r.device, r.access}};
        }
        return check(e->engine->register_memory_batch(rs));
    });
}

int ferry_unregister_batch(ferry_engine_t *e, void *const *addrs, size_t count) {
    REQUIRE_ENGINE(e);
    if (!addrs && count > 0) return set_error(-EINVAL, "ferry_unregister_batch: addrs is NULL");
    return guarded(__func__, [&] { return check(e->engine->unregister_memory_batch({addrs, count})); });
}

int ferry_alloc_shared(ferry_engine_t *e, uint64_t length, uint32_t access, void **addr) {
    REQUIRE_ENGINE(e);
    if (!addr) return set_error(-EINVAL, "ferry_alloc_shared: addr is NULL");
    return guarded(__func__, [&] {
        auto r = e->engine->alloc_shared(length, access);
        int rc = check(r);
        if (rc == 0) *addr = *r;
        return rc;
    });
}

int ferry_free_shared(ferry_engine_t *e, void *addr) {
    REQUIRE_ENGINE(e);
    return guarded(__func__, [&] { return check(e->engine->free_shared(addr)); });
}

int ferry_staging_stats(ferry_engine_t *e, ferry_staging_stats_t *out) {
    REQUIRE_ENGINE(e);
    if (!out) return set_error(-EINVAL, "ferry_staging_stats: out is NULL");
    auto st = e->engine->staging_stats();
    *out = ferry_staging_stats_t{st.max_bytes,       st.slice_bytes, st.lent_bytes,   st.peak_lent_bytes,
                                 st.acquire_refused, st.copies,      st.copy_failures};
    return 0;
}

int ferry_stats(ferry_engine_t *e, ferry_engine_stats_t *out, ferry_transport_stats_t *transports, size_t *n) {
    REQUIRE_ENGINE(e);
    if (!out || !n || (*n && !transports))
        return set_error(-EINVAL, "ferry_stats: out, n or (with *n > 0) transports is NULL");
    size_t count = *n;
    int rc = ferry::stats_to_c(e->engine->stats(), out, transports, &count);
    *n = count;
    if (rc == -ENOSPC)
        return set_error(rc, ferry::cat("ferry_stats: room for ", count, " transports needed; *n is set to that"));
    return rc;
}

int ferry_rail_stats(ferry_engine_t *e, ferry_engine_rail_stats_t *out, size_t *n) {
    REQUIRE_ENGINE(e);
    if (!n || (*n && !out)) return set_error(-EINVAL, "ferry_rail_stats: n or (with *n > 0) out is NULL");
    size_t count = *n;
    int rc = ferry::rails_to_c(e->engine->stats(), out, &count);
    *n = count;
    if (rc == -ENOSPC)
        return set_error(rc, ferry::cat("ferry_rail_stats: room for ", count, " rails needed; *n is set to that"));
    return rc;
}

const double *ferry_latency_bounds(void) { return ferry::kLatencyBoundsSeconds; }

const char *ferry_metrics_address(ferry_engine_t *e) { return e ? e->metrics_address.c_str() : ""; }

int ferry_unregister(ferry_engine_t *e, void *addr) {
    REQUIRE_ENGINE(e);
    return guarded(__func__, [&] { return check(e->engine->unregister_memory(addr)); });
}

int ferry_open_segment(ferry_engine_t *e, const char *name, ferry_segment_id_t *out) {
    REQUIRE_ENGINE(e);
    if (!name || !out) return set_error(-EINVAL, "ferry_open_segment: name or output pointer is NULL");
    return guarded(__func__, [&] {
        auto r = e->engine->open_segment(name);
        if (!r) return set_error(r.error());
        *out = *r;
        return 0;
    });
}

int ferry_close_segment(ferry_engine_t *e, ferry_segment_id_t segment) {
    REQUIRE_ENGINE(e);
    return guarded(__func__, [&] { return check(e->engine->close_segment(segment)); });
}

int ferry_submit(ferry_engine_t *e, const ferry_request_t *requests, size_t count, ferry_batch_id_t *out) {
    REQUIRE_ENGINE(e);
    if (!out || (!requests && count)) return set_error(-EINVAL, "ferry_submit: requests or output pointer is NULL");
    return guarded(__func__, [&] {
        auto b = e->engine->submit(to_requests(requests, count));
        if (!b) return set_error(b.error());
        *out = *b;
        return 0;
    });
}

int ferry_create_block_table(ferry_engine_t *e, ferry_segment_id_t segment, const uint64_t *addrs, size_t count,
                             const uint64_t *lengths, size_t count_lengths, ferry_block_table_t *out) {
    REQUIRE_ENGINE(e);
    if (!out || (!addrs && count) || (!lengths && count_lengths))
        return set_error(-EINVAL, "ferry_create_block_table: addrs, lengths or output pointer is NULL");
    return guarded(__func__, [&] {
        auto t = e->engine->create_block_table(segment, {addrs, count}, {lengths, count_lengths});
        if (!t) return set_error(t.error());
        *out = *t;
        return 0;
    });
}

int ferry_destroy_block_table(ferry_engine_t *e, ferry_block_table_t table) {
    REQUIRE_ENGINE(e);
    return guarded(__func__, [&] {
        auto r = e->engine->destroy_block_table(table);
        return r ? 0 : set_error(r.error());
    });
}

int ferry_submit_blocks(ferry_engine_t *e, uint32_t opcode, ferry_block_table_t local, const uint32_t *local_index,
                        ferry_block_table_t remote, const uint32_t *remote_index, size_t count, ferry_batch_id_t *out) {
    REQUIRE_ENGINE(e);
    if (!out || ((!local_index || !remote_index) && count))
        return set_error(-EINVAL, "ferry_submit_blocks: an index array or the output pointer is NULL");
    if (opcode != FERRY_READ && opcode != FERRY_WRITE)
        return set_error(-EINVAL, "ferry_submit_blocks: opcode is neither FERRY_READ nor FERRY_WRITE");
    return guarded(__func__, [&] {
        auto b = e->engine->submit_blocks(static_cast<ferry::Opcode>(opcode), local, {local_index, count}, remote,
                                          {remote_index, count});
        if (!b) return set_error(b.error());
        *out = *b;
        return 0;
    });
}

int ferry_submit_with_notification(ferry_engine_t *e, const ferry_request_t *requests, size_t count,
                                   ferry_segment_id_t target, const void *data, size_t length, ferry_batch_id_t *out) {
    REQUIRE_ENGINE(e);
    if (!out || (!requests && count))
        return set_error(-EINVAL, "ferry_submit_with_notification: requests or output pointer is NULL");
    if (!data && length) return set_error(-EINVAL, "ferry_submit_with_notification: data is NULL but length is not 0");
    return guarded(__func__, [&] {
        auto b = e->engine->submit_with_notification(to_requests(requests, count), target,
                                                     {static_cast<const uint8_t *>(data), length});
        if (!b) return set_error(b.error());
        *out = *b;
        return 0;
    });
}

int ferry_submit_on_stream(ferry_engine_t *e, const ferry_request_t *requests, size_t count, void *stream,
                           ferry_batch_id_t *out) {
    REQUIRE_ENGINE(e);
    if (!requests && count) return set_error(-EINVAL, "ferry_submit_on_stream: requests is NULL");
    return guarded(__func__, [&] {
        auto b = e->engine->submit_on_stream(to_requests(requests, count), stream,
                                             out ? ferry::StreamBatch::Keep : ferry::StreamBatch::Detach);
        if (!b) return set_error(b.error());
        if (out) *out = *b;
        return 0;
    });
}

int ferry_get_status(ferry_engine_t *e, ferry_batch_id_t batch, size_t index, ferry_op_status_t *out) {
    REQUIRE_ENGINE(e);
    if (!out) return set_error(-EINVAL, "ferry_get_status: output pointer is NULL");
    return guarded(__func__, [&] {
        auto s = e->engine->status(batch, index);
        if (!s) return set_error(s.error());
        ferry_op_status_t st{};
        st.state = static_cast<uint32_t>(s->state);
        st.error = s->code;
        snprintf(st.transport, sizeof st.transport, "%s", s->transport.c_str());
        snprintf(st.message, sizeof st.message, "%s", s->message.c_str());
        *out = st;
        return 0;
    });
}

int ferry_wait_batch(ferry_engine_t *e, ferry_batch_id_t batch, int64_t timeout_ms) {
    REQUIRE_ENGINE(e);
    return guarded(__func__, [&] { return check(e->engine->wait(batch, std::chrono::milliseconds(timeout_ms))); });
}

// Version 1 behaviour: a wait that timed out is -ETIMEDOUT (ambiguous with an op's -ETIMEDOUT).
int ferry_wait(ferry_engine_t *e, ferry_batch_id_t batch, int64_t timeout_ms) {
    int rc = ferry_wait_batch(e, batch, timeout_ms);
    return rc == ferry::kWaitPending ? -ETIMEDOUT : rc;
}

int ferry_free_batch(ferry_engine_t *e, ferry_batch_id_t batch) {
    REQUIRE_ENGINE(e);
    return guarded(__func__, [&] { return check(e->engine->free_batch(batch)); });
}

int ferry_segment_regions(ferry_engine_t *e, ferry_segment_id_t segment, ferry_remote_region_t *regions,
                          size_t *count) {
    REQUIRE_ENGINE(e);
    if (!count || (!regions && *count)) return set_error(-EINVAL, "ferry_segment_regions: regions or count is NULL");
    return guarded(__func__, [&] {
        auto r = e->engine->segment_regions(segment);
        if (!r) return set_error(r.error());
        if (r->size() > *count) {
            *count = r->size();
            return set_error(-ENOSPC, ferry::cat("segment has ", r->size(), " regions; pass room for that many"));
        }
        for (size_t i = 0; i < r->size(); ++i) {
            const auto &g = (*r)[i];
            regions[i] = ferry_remote_region_t{g.addr, g.length, static_cast<uint32_t>(g.kind), g.device, g.access, 0};
        }
        *count = r->size();
        last_error.clear();
        return 0;
    });
}

int ferry_send_notification(ferry_engine_t *e, ferry_segment_id_t segment, const void *data, size_t length) {
    REQUIRE_ENGINE(e);
    if (!data && length) return set_error(-EINVAL, "ferry_send_notification: data is NULL but length is not 0");
    return guarded(__func__, [&] {
        return check(e->engine->send_notification(segment, {static_cast<const uint8_t *>(data), length}));
    });
}

int ferry_take_notifications(ferry_engine_t *e, ferry_notification_t **out, size_t *count) {
    REQUIRE_ENGINE(e);
    if (!out || !count) return set_error(-EINVAL, "ferry_take_notifications: output pointer is NULL");
    return guarded(__func__, [&] { return hand_out(e->engine->take_notifications(), out, count); });
}

int ferry_wait_notifications(ferry_engine_t *e, int64_t timeout_ms, ferry_notification_t **out, size_t *count) {
    REQUIRE_ENGINE(e);
    if (!out || !count) return set_error(-EINVAL, "ferry_wait_notifications: output pointer is NULL");
    return guarded(__func__, [&] {
        auto taken = e->engine->wait_notifications(std::chrono::milliseconds(timeout_ms));
        if (!taken) return set_error(taken.error());
        return hand_out(*taken, out, count);
    });
}

int ferry_notification_fd(ferry_engine_t *e, int *fd) {
    REQUIRE_ENGINE(e);
    if (!fd) return set_error(-EINVAL, "ferry_notification_fd: output pointer is NULL");
    *fd = e->engine->notification_fd();
    last_error.clear();
    return 0;
}

void ferry_free_notifications(ferry_notification_t *notifications, size_t) { std::free(notifications); }

const char *ferry_last_error(void) { return last_error.c_str(); }

const char *ferry_version(void) { return FERRY_VERSION; }

int ferry_plugin_report_json(char *buf, size_t *len) {
    if (!len) return set_error(-EINVAL, "ferry_plugin_report_json: len is NULL");
    return guarded(__func__, [&] {
        ferry::LoaderOptions options;
        options.search_path = ferry::default_search_path();
        const char *sel = std::getenv("FERRY_PLUGINS");
        options.selection = ferry::PluginSelection::parse(sel ? sel : "");
        auto trust = ferry::resolve_plugin_trust(nullptr);
        if (!trust) return set_error(trust.error());
        options.trust = *trust;
        std::string json = ferry::load_plugins(options).to_json();
        if (!buf || *len < json.size() + 1) {
            *len = json.size() + 1;
            return set_error(-ENOSPC, "buffer too small for the plugin report");
        }
        memcpy(buf, json.c_str(), json.size() + 1);
        *len = json.size() + 1;
        return 0;
    });
}

}  // extern "C"
