// Engine setup and remote segments. Memory registration lives in registration.cpp, batches in
// batch.cpp.
#include <cerrno>
#include <cinttypes>
#include <cstdio>

#include "control/control_protocol.hpp"
#include "engine/engine_impl.hpp"
#include "metadata/host_identity.hpp"
#include "util/file_trust.hpp"
#include "util/log.hpp"

namespace ferry {

Engine::Impl::~Impl() {
    // Transports stop serving and fail their in-flight ops before the batches those ops point
    // into go away; the metadata server stops first so no peer learns of a dying engine.
    // Batches no CUDA stream reached yet are cancelled first, and the stream worker stops
    // driving the others (their streams wait until the transports are gone: below). Ops waiting
    // for a connect or a descriptor fail next (a connect blocked in a plugin ends by the
    // plugin's own timeout); batch notifications not yet sent are dropped then: both point into
    // batches.
    metrics.reset();  // its scrapes read everything below
    stop_stream_calls();
    stop_connector();
    stop_notifier();
    metadata.reset();
    control.reset();
    // Started GPU copies report first; the pinned slices are freed only after the transports,
    // whose threads may touch lent slices until they are joined.
    if (staging) stop_staging();
    transports.clear();
    release_stream_calls();
    release_staged_ops();
    staging.reset();
}

Engine::Engine(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Engine::~Engine() = default;

Result<std::unique_ptr<Engine>> Engine::create_from_file(const std::string &yaml_path, const Config &overrides) {
    auto config = load_yaml_config(yaml_path);
    if (!config) return std::unexpected(config.error());
    for (const auto &[k, v] : overrides) (*config)[k] = v;
    return create(*config);
}

Result<std::unique_ptr<Engine>> Engine::create(const Config &config) {
    auto settings = parse_engine_settings(config);
    if (!settings) return std::unexpected(settings.error());
    if (!settings->log_level.empty()) {
        log::Level l;
        if (log::parse_level(settings->log_level, l)) log::set_level(l);
    }
    auto impl = std::make_unique<Impl>();
    impl->settings = std::move(*settings);
    auto &s = impl->settings;
    impl->host_id = s.host_id.empty() ? local_host_identity() : s.host_id;

    LoaderOptions loader;
    loader.search_path = default_search_path(s.plugin_path);
    std::string selection = s.plugins;
    if (selection.empty())
        if (const char *env = std::getenv("FERRY_PLUGINS")) selection = env;
    loader.selection = PluginSelection::parse(selection);
    auto trust = resolve_plugin_trust(&s.plugin_trust);
    if (!trust) {
        FERRY_ERROR(trust.error().message);
        return std::unexpected(trust.error());
    }
    loader.trust = *trust;
    for (auto &[name, opts] : s.plugin_options) loader.plugin_options[name] = opts;
    impl->staging = std::make_unique<StagingService>(s.gpu_staging_max_bytes, s.gpu_staging_slice_bytes);
    impl->staging->set_on_release([im = impl.get()] { im->stage_retry_waiters(); });
    impl->plugin_report = load_plugins(loader);
    auto &report = impl->plugin_report;
    // What another user could have written is worth one line per file in the engine's log.
    std::string untrusted;
    for (const auto &rec : report.plugins) {
        if (rec.state == PluginState::Untrusted) {
            warn_once(cat("plugin ", rec.path, " ", rec.reason));
            untrusted += cat("; ", rec.path, " was ", rec.reason);
        }
        if (!rec.trust_note.empty()) warn_once(cat("plugin ", rec.path, " ", rec.trust_note));
    }
    if (!report.errors.empty()) {
        std::string all;
        for (auto &e : report.errors) all += (all.empty() ? "" : "; ") + e;
        FERRY_ERROR(all);
        return fail(-ENOENT, all);
    }

    for (auto &rec : report.plugins) {
        if (rec.state != PluginState::Loaded) continue;
        PluginOptions opts;
        if (auto it = s.plugin_options.find(rec.name); it != s.plugin_options.end()) opts = it->second;
        if (!s.auth.secret.empty()) {
            // Transports that authenticate their connections get a key derived from the secret;
            // the others serve whoever holds their descriptors (docs/DESIGN.md says which).
            // Storage plugins serve no peer: nothing to authenticate.
            if (rec.caps & FERRY_CAP_AUTH_KEY) opts.emplace_back("auth_key", transport_auth_key(s.auth.secret));
            else if (!(rec.caps & FERRY_CAP_STORAGE))
                FERRY_WARN("transport ", rec.name,
                           " does not authenticate its peers with the cluster secret; "
                           "remove it (plugins=^",
                           rec.name,
                           ") where peers may be hostile (see docs/DESIGN.md, "
                           "\"Authentication and access rights\")");
        }
        auto t = Transport::create(rec.plugin, opts, impl->staging.get());
        if (!t) {
            if (loader.selection.requested(rec.name)) {
                FERRY_ERROR(t.error().message);
                return std::unexpected(t.error());
            }
            FERRY_WARN("transport ", rec.name, " skipped: ", t.error().message);
            continue;
        }
        auto endpoint = (*t)->endpoint();
        if (!endpoint) return std::unexpected(endpoint.error());
        impl->endpoints.push_back(std::move(*endpoint));
        impl->transports.push_back(std::move(*t));
        impl->poll_mutexes.push_back(std::make_unique<std::mutex>());
    }
    if (impl->transports.empty()) {
        std::string dirs;
        for (auto &d : report.search_path) dirs += (dirs.empty() ? "" : ":") + d;
        return fail(-ENOENT, cat("no transport plugin could be loaded from the search path (", dirs,
                                 "); run ferry-info to see why, or set FERRY_PLUGIN_PATH", untrusted));
    }
    for (size_t i = 0; i <= impl->transports.size(); ++i)  // and one for ops no transport took
        impl->counters.push_back(std::make_unique<TransportCounters>());
    for (auto &name : s.protocols)
        if (auto i = impl->transport_index(name)) impl->priority.push_back(*i);
    for (size_t i = 0; i < impl->transports.size(); ++i)
        if (std::find(impl->priority.begin(), impl->priority.end(), i) == impl->priority.end())
            impl->priority.push_back(i);

    ControlServerOptions control_options;
    control_options.local_ip = s.metadata.local_ip;
    control_options.port = s.metadata.rpc_port;
    control_options.secret = s.auth.secret;
    control_options.handshake_timeout = s.metadata.timeout;
    control_options.queue_max = s.notification_queue_max;
    control_options.max_connections = s.control.max_connections;
    control_options.max_connections_per_peer = s.control.max_connections_per_peer;
    control_options.idle_timeout = s.control.idle_timeout;
    control_options.log_interval = s.control.log_interval;
    auto control = ControlServer::start(std::move(control_options));
    if (!control) {
        FERRY_ERROR(control.error().message);
        return std::unexpected(control.error());
    }
    impl->control = std::move(*control);
    auto md = make_metadata_backend(s.metadata, *impl->control, s.auth.secret);
    if (!md) return std::unexpected(md.error());
    impl->metadata = std::move(*md);
    impl->segment_name = impl->metadata->segment_name();
    // A peer that re-registers (restarted with new endpoints or keys) is re-read before its
    // next op. The Impl outlives the backend, which it destroys first.
    impl->metadata->on_change([im = impl.get()](const std::string &name) {
        std::lock_guard lock(im->segments_mutex);
        if (auto it = im->segment_ids.find(name); it != im->segment_ids.end())
            if (auto seg = im->segments.find(it->second); seg != im->segments.end()) seg->second->stale = true;
    });
    {
        std::unique_lock lock(impl->regions_mutex);
        impl->on_demand = impl->metadata->serve_on_demand([im = impl.get()] { return im->encoded_descriptor(); });
        if (auto p = impl->publish_locked(); !p) return std::unexpected(p.error());
    }
    if (s.metrics_port) {
        auto bind_ip = s.metrics_bind_ip.empty() ? s.metadata.local_ip : s.metrics_bind_ip;
        auto m =
            MetricsExporter::start(bind_ip, *s.metrics_port, loader.trust, [im = impl.get()] { return im->stats(); });
        if (!m) {
            FERRY_ERROR(m.error().message);
            return std::unexpected(m.error());
        }
        impl->metrics = std::move(*m);
    }
    std::string names;
    for (auto i : impl->priority) names += (names.empty() ? "" : ",") + impl->transports[i]->name();
    FERRY_INFO("engine ", impl->segment_name, " up with transports ", names, "; control channel on ",
               impl->control->address(),
               s.auth.secret.empty() ? " (no cluster secret)" : cat(" (cluster secret from ", s.auth.origin, ")"));
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const std::string &Engine::segment_name() const { return impl_->segment_name; }

StagingStats Engine::staging_stats() const { return impl_->staging->stats(); }

namespace {

// A transport's rails (plugin ABI 1.5), or none when it reports none or its report failed: a
// scrape shows what it can rather than nothing.
std::vector<RailStats> rail_stats(Transport &t) {
    std::vector<RailStats> out;
    auto rails = t.rail_stats();
    if (!rails) {
        FERRY_DEBUG("stats: ", rails.error().message);
        return out;
    }
    for (const auto &r : *rails)
        out.push_back({r.name, r.read_bytes, r.write_bytes, r.completed, r.failures, r.pauses, r.paused_peers,
                       r.queued_bytes, r.throughput});
    return out;
}

}  // namespace

// The data path's counters (transfer_stats.hpp), with each transport's peers, paused paths and
// rails.
EngineStats Engine::Impl::stats() {
    EngineStats out;
    out.batches = next_batch.load(std::memory_order_relaxed) - 1;
    out.staging = staging->stats();
    std::vector<uint64_t> peers(transports.size(), 0), paused(transports.size(), 0);
    const auto now = std::chrono::steady_clock::now();
    {
        std::vector<std::shared_ptr<RemoteSegment>> open;
        {
            std::lock_guard lock(segments_mutex);
            out.segments_open = segments.size();
            for (auto &[id, seg] : segments) open.push_back(seg);
        }
        for (auto &seg : open) {
            std::lock_guard lock(seg->mutex);
            for (size_t t = 0; t < seg->peers.size() && t < peers.size(); ++t)
                if (seg->peers[t]) ++peers[t];
            for (const auto &[t, pause] : seg->paused)
                if (t < paused.size() && pause.until > now) ++paused[t];
        }
    }
    auto add = [&](std::string name, size_t index) {
        TransportStats t;
        t.transport = std::move(name);
        t.read = counters[index]->by_op[0].snapshot();
        t.write = counters[index]->by_op[1].snapshot();
        t.peers = index < peers.size() ? peers[index] : 0;
        t.failovers = counters[index]->failovers.load(std::memory_order_relaxed);
        t.pauses = counters[index]->pauses.load(std::memory_order_relaxed);
        t.paused_paths = index < paused.size() ? paused[index] : 0;
        if (index < transports.size()) t.rails = rail_stats(*transports[index]);
        out.transports.push_back(std::move(t));
    };
    for (auto i : priority) add(transports[i]->name(), i);
    add("none", counters.size() - 1);
    return out;
}

EngineStats Engine::stats() const { return impl_->stats(); }

std::string Engine::metrics_address() const { return impl_->metrics ? impl_->metrics->address() : std::string(); }

std::vector<TransportInfo> Engine::transports() const {
    std::vector<TransportInfo> out;
    for (auto i : impl_->priority) {
        auto &t = impl_->transports[i];
        out.push_back({t->name(), t->path(), t->version(), t->caps()});
    }
    return out;
}

std::optional<size_t> Engine::Impl::transport_index(std::string_view name) const {
    for (size_t i = 0; i < transports.size(); ++i)
        if (transports[i]->name() == name) return i;
    return std::nullopt;
}

Result<SegmentId> Engine::open_segment(std::string_view name) {
    auto &im = *impl_;
    std::string key(name);
    {
        std::lock_guard lock(im.segments_mutex);
        if (auto it = im.segment_ids.find(key); it != im.segment_ids.end()) return it->second;
    }
    // A storage segment is made here, never fetched: no peer can name one (storage.cpp).
    if (is_storage_segment(key)) return im.open_storage_segment(key);
    auto descriptor = im.metadata->fetch(key);
    if (!descriptor) return std::unexpected(descriptor.error());
    auto seg = std::make_shared<RemoteSegment>();
    seg->name = key;
    seg->same_host = descriptor->host_id == im.host_id;
    seg->descriptor = std::move(*descriptor);
    seg->peers.resize(im.transports.size());
    im.reindex(*seg);
    std::lock_guard lock(im.segments_mutex);
    if (auto it = im.segment_ids.find(key); it != im.segment_ids.end()) return it->second;
    seg->id = im.next_segment++;
    im.segment_ids[key] = seg->id;
    im.segments[seg->id] = seg;
    FERRY_DEBUG("opened segment ", key, " (", seg->same_host ? "same host" : "other host", ", ",
                seg->descriptor.regions.size(), " regions)");
    return seg->id;
}

Result<void> Engine::close_segment(SegmentId id) {
    auto &im = *impl_;
    std::shared_ptr<RemoteSegment> seg;
    {
        std::lock_guard lock(im.segments_mutex);
        auto it = im.segments.find(id);
        if (it == im.segments.end()) return fail(-ENOENT, cat("close_segment: segment id ", id, " is not open"));
        seg = it->second;
        im.segments.erase(it);
        im.segment_ids.erase(seg->name);
    }
    std::deque<DeferredOp> dropped;
    {
        std::lock_guard lock(seg->mutex);
        seg->closed = true;  // a connect the connector has in flight is dropped when it returns
        dropped.swap(seg->deferred);
        for (auto &[key, handle] : seg->imported) {
            auto &peer = seg->peers[key.first];
            if (peer) (void)im.transports[key.first]->release_mem(*peer, handle);
        }
        seg->imported.clear();
        seg->rows.clear();
        for (size_t i = 0; i < seg->peers.size(); ++i)
            if (seg->peers[i]) (void)im.transports[i]->disconnect(*seg->peers[i]);
        std::fill(seg->peers.begin(), seg->peers.end(), std::nullopt);
    }
    for (auto &d : dropped)
        im.complete(*d.op, -ECANCELED,
                    cat("submit: op ", d.index, " (", op_name(d.request.opcode), " ", d.request.length,
                        " bytes): close_segment closed segment ", seg->name, " before the op could be posted"));
    return {};
}

Result<std::vector<RemoteRegion>> Engine::segment_regions(SegmentId id) {
    auto seg = impl_->segment(id);
    if (!seg) return fail(-ENOENT, cat("segment_regions: segment id ", id, " is not open"));
    if (auto r = impl_->refresh_segment(*seg); !r) return std::unexpected(r.error());
    std::lock_guard lock(seg->mutex);
    std::vector<RemoteRegion> out;
    for (const auto &r : seg->descriptor.regions)
        out.push_back({r.addr, r.length, static_cast<MemoryKind>(r.kind), r.device, r.access});
    return out;
}

std::shared_ptr<RemoteSegment> Engine::Impl::segment(SegmentId id) {
    std::lock_guard lock(segments_mutex);
    auto it = segments.find(id);
    return it == segments.end() ? nullptr : it->second;
}

// Re-reads a peer's descriptor (it registered or unregistered memory since we opened it) and
// drops imports of regions that changed. The fetch runs without seg.mutex, so submits to the
// segment never wait for it.
Result<void> Engine::Impl::refresh_segment(RemoteSegment &seg) {
    if (seg.storage) return {};  // made by open_storage_segment; there is nothing to re-read
    auto fresh = metadata->fetch(seg.name);
    if (!fresh) return std::unexpected(fresh.error());
    std::lock_guard lock(seg.mutex);
    // A transport whose endpoint changed belongs to a restarted peer: drop the old connection.
    for (size_t t = 0; t < transports.size(); ++t) {
        if (!seg.peers[t]) continue;
        const auto *was = seg.descriptor.endpoint_for(transports[t]->name());
        const auto *now = fresh->endpoint_for(transports[t]->name());
        if (was && now && was->endpoint == now->endpoint) continue;
        for (auto it = seg.imported.begin(); it != seg.imported.end();) {
            if (it->first.first == t) {
                (void)transports[t]->release_mem(*seg.peers[t], it->second);
                it = seg.imported.erase(it);
            } else {
                ++it;
            }
        }
        (void)transports[t]->disconnect(*seg.peers[t]);
        seg.peers[t].reset();
        seg.unusable.erase(t);
        FERRY_INFO("segment ", seg.name, " re-registered: reconnecting ", transports[t]->name());
    }
    for (auto it = seg.imported.begin(); it != seg.imported.end();) {
        auto [transport, addr] = it->first;
        const RegionDescriptor *was = seg.descriptor.find_region(addr, 1);
        const RegionDescriptor *now = fresh->find_region(addr, 1);
        bool same =
            was && now && was->addr == now->addr && was->length == now->length &&
            was->key_for(transports[transport]->name()) && now->key_for(transports[transport]->name()) &&
            was->key_for(transports[transport]->name())->key == now->key_for(transports[transport]->name())->key;
        if (!same) {
            if (seg.peers[transport]) (void)transports[transport]->release_mem(*seg.peers[transport], it->second);
            it = seg.imported.erase(it);
        } else {
            ++it;
        }
    }
    seg.same_host = fresh->host_id == host_id;
    seg.descriptor = std::move(*fresh);
    reindex(seg);
    return {};
}

Result<BatchId> Engine::submit(std::span<const Request> requests) { return impl_->submit(requests); }

Result<BatchId> Engine::submit_on_stream(std::span<const Request> requests, void *stream, StreamBatch batch) {
    return impl_->submit_on_stream(requests, stream, batch == StreamBatch::Detach);
}

Result<OpStatus> Engine::status(BatchId id, size_t index) {
    auto batch = impl_->find_batch(id);
    if (!batch) return fail(-ENOENT, cat("status: batch ", id, " does not exist (never submitted or already freed)"));
    const size_t ops = batch->pairs ? batch->pairs : batch->size;
    if (index >= ops)
        return fail(-EINVAL, cat("status: batch ", id, " has ", ops, " ops; index ", index, " is out of range"));
    auto &op = batch->ops[batch->pairs ? 0 : index];  // a block transfer posted whole: one op for all
    if (op.state.load(std::memory_order_acquire) == static_cast<uint32_t>(OpState::Pending)) impl_->progress(0);
    OpStatus st;
    st.state = static_cast<OpState>(op.state.load(std::memory_order_acquire));
    if (auto t = op.transport.load(std::memory_order_relaxed); t != kNoTransport)
        st.transport = impl_->transports[t]->name();
    if (st.state == OpState::Failed) {
        st.code = op.code;
        st.message = op.message;
    }
    return st;
}

Result<void> Engine::wait(BatchId batch, std::chrono::milliseconds timeout) { return impl_->wait(batch, timeout); }

Result<void> Engine::free_batch(BatchId id) {
    auto &im = *impl_;
    std::lock_guard lock(im.batches_mutex);
    auto it = im.batches.find(id);
    if (it == im.batches.end()) return fail(-ENOENT, cat("free_batch: batch ", id, " does not exist"));
    if (size_t left = it->second->remaining.load(std::memory_order_acquire))
        return fail(-EBUSY, cat("free_batch: batch ", id, " has ", left, " ops in flight",
                                it->second->notification ? " (its notification counts as one until delivered)" : "",
                                it->second->on_stream ? " (ordered on a CUDA stream: until the stream reached it and "
                                                        "every op ended)"
                                                      : "",
                                "; wait for them first"));
    im.batches.erase(it);
    return {};
}

}  // namespace ferry
