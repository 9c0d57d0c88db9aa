// Engine setup, memory registration and remote segments. Batches live in batch.cpp.
#include <cerrno>
#include <cinttypes>
#include <cstdio>

#include "control_protocol.hpp"
#include "engine_impl.hpp"
#include "host_identity.hpp"
#include "log.hpp"

namespace ferry {
namespace {

const char *kind_name(uint32_t kind) {
    switch (kind) {
        case FERRY_MEM_HOST: return "host";
        case FERRY_MEM_CUDA: return "cuda";
        case FERRY_MEM_ROCM: return "rocm";
    }
    return "unknown";
}

}  // namespace

Engine::Impl::~Impl() {
    // Transports stop serving and fail their in-flight ops before the batches those ops point
    // into go away; the metadata server stops first so no peer learns of a dying engine.
    // Ops waiting for a connect or a descriptor fail first (a connect blocked in a plugin ends
    // by the plugin's own timeout); batch notifications not yet sent are dropped next: both
    // point into batches.
    stop_connector();
    stop_notifier();
    metadata.reset();
    control.reset();
    // Started GPU copies report first; the pinned slices are freed only after the transports,
    // whose threads may touch lent slices until they are joined.
    if (staging) stop_staging();
    transports.clear();
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
    for (auto &[name, opts] : s.plugin_options) loader.plugin_options[name] = opts;
    impl->staging = std::make_unique<StagingService>(s.gpu_staging_max_bytes, s.gpu_staging_slice_bytes);
    impl->staging->set_on_release([im = impl.get()] { im->stage_retry_waiters(); });
    impl->plugin_report = load_plugins(loader);
    auto &report = impl->plugin_report;
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
            if (rec.caps & FERRY_CAP_AUTH_KEY) opts.emplace_back("auth_key", transport_auth_key(s.auth.secret));
            else
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
                                 "); run ferry-info to see why, or set FERRY_PLUGIN_PATH"));
    }
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
    std::string names;
    for (auto i : impl->priority) names += (names.empty() ? "" : ",") + impl->transports[i]->name();
    FERRY_INFO("engine ", impl->metadata->segment_name(), " up with transports ", names, "; control channel on ",
               impl->control->address(),
               s.auth.secret.empty() ? " (no cluster secret)" : cat(" (cluster secret from ", s.auth.origin, ")"));
    return std::unique_ptr<Engine>(new Engine(std::move(impl)));
}

const std::string &Engine::segment_name() const { return impl_->metadata->segment_name(); }

StagingStats Engine::staging_stats() const { return impl_->staging->stats(); }

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

RegionDescriptor Engine::Impl::region_descriptor(const LocalRegion &r) const {
    RegionDescriptor rd{r.addr, r.length, r.kind, r.device, r.access, {}};
    for (size_t i = 0; i < transports.size(); ++i)
        if (r.handles[i]) rd.keys.push_back({transports[i]->name(), r.keys[i]});
    return rd;
}

SegmentDescriptor Engine::Impl::descriptor_locked() const {
    SegmentDescriptor d;
    d.name = metadata->segment_name();
    d.host_id = host_id;
    d.generation = generation;
    d.control = control->address();
    for (size_t i = 0; i < transports.size(); ++i) d.transports.push_back({transports[i]->name(), endpoints[i]});
    d.regions.reserve(regions.size());
    for (const auto &[addr, r] : regions.map()) d.regions.push_back(region_descriptor(r));
    return d;
}

Result<void> Engine::Impl::publish_locked() {
    ++generation;
    if (on_demand) return {};
    return metadata->publish(descriptor_locked());
}

uint64_t Engine::Impl::queue_change_locked(RegionChange change) {
    ++generation;
    if (on_demand) return 0;
    std::lock_guard lock(queue_mutex);
    queued.push_back(std::move(change));
    queued_generation = generation;
    return ++queued_seq;
}

Result<void> Engine::Impl::publish_queued(uint64_t seq) {
    if (seq == 0) return {};
    std::lock_guard lock(publish_mutex);
    if (published_seq >= seq) return {};  // another register's publish carried it
    std::vector<RegionChange> changes;
    uint64_t upto, gen;
    {
        std::lock_guard q(queue_mutex);
        changes.swap(queued);
        upto = queued_seq;
        gen = queued_generation;
    }
    auto r = metadata->publish_changes(gen, changes);
    published_seq = upto;
    return r;
}

// What a peer's GET_DESCRIPTOR gets: every region registered before it asked. Encoded once per
// generation, so many peers opening an unchanged segment cost one encoding.
std::shared_ptr<const std::vector<uint8_t>> Engine::Impl::encoded_descriptor() {
    std::shared_lock lock(regions_mutex);
    std::lock_guard cache(encoded_mutex);
    if (!encoded || encoded_generation != generation) {
        encoded = std::make_shared<const std::vector<uint8_t>>(encode_descriptor(descriptor_locked()));
        encoded_generation = generation;
    }
    return encoded;
}

// MemoryKind::Auto: which memory `addr` is, as the GPU runtimes say (CUDA first, then HIP).
static Result<MemoryOptions> detect_memory(Engine::Impl &im, void *addr, uint64_t length, MemoryOptions options) {
    uint64_t a = reinterpret_cast<uintptr_t>(addr);
    std::string asked;
    bool cuda_loaded = false;
    for (uint32_t kind : {uint32_t{FERRY_MEM_CUDA}, uint32_t{FERRY_MEM_ROCM}}) {
        std::string why;
        // HIP only where no CUDA driver loads: both runtimes in one process abort (two LLVMs).
        if (kind == FERRY_MEM_ROCM && cuda_loaded) break;
        GpuStager *s = im.stager(kind, why);
        if (!s) {
            asked += cat(asked.empty() ? "" : "; ", kind_name(kind), ": ", why);
            continue;
        }
        cuda_loaded |= kind == FERRY_MEM_CUDA;
        auto device = s->device_of(addr);
        if (!device) {
            asked += cat(asked.empty() ? "" : "; ", kind_name(kind), ": not its memory");
            continue;
        }
        if (options.device >= 0 && *device != options.device)
            return fail(-EINVAL, cat("register_memory: [", hex(a), ", +", length, ") is memory of ", kind_name(kind),
                                     " device ", *device, ", not of device ", options.device, " as asked"));
        options.kind = static_cast<MemoryKind>(kind);
        options.device = *device;
        return options;
    }
    if (options.device >= 0)
        return fail(-EINVAL,
                    cat("register_memory: [", hex(a), ", +", length, ") is not memory of device ", options.device,
                        " for any loaded GPU runtime (", asked, "); pass the memory kind explicitly"));
    FERRY_DEBUG("register_memory: ", hex(a), " is host memory (", asked, ")");
    options.kind = MemoryKind::Host;
    return options;
}

// Registers one range (with shared_fd >= 0: that memfd's mapping at offset 0); returns the number
// of its queued change for publish_queued.
static Result<uint64_t> register_unpublished(Engine::Impl &im, void *addr, uint64_t length,
                                             const MemoryOptions &options_in, int shared_fd) {
    uint64_t a = reinterpret_cast<uintptr_t>(addr);
    if (!addr || length == 0) return fail(-EINVAL, "register_memory: address is null or length is 0");
    if (a + length < a) return fail(-EINVAL, cat("register_memory: [", hex(a), ", +", length, ") wraps around"));
    MemoryOptions options = options_in;
    if (options.kind == MemoryKind::Auto) {
        auto detected = detect_memory(im, addr, length, options);
        if (!detected) return std::unexpected(detected.error());
        options = *detected;
    }
    uint32_t kind = static_cast<uint32_t>(options.kind);
    if (kind > FERRY_MEM_ROCM) return fail(-EINVAL, cat("register_memory: unknown memory kind ", kind));
    if (options.access & ~(kRemoteRead | kRemoteWrite))
        return fail(-EINVAL,
                    cat("register_memory: access ", options.access, " has bits other than read (1) and write (2)"));
    if (kind != FERRY_MEM_HOST && options.device < 0)
        return fail(-EINVAL, cat("register_memory: ", kind_name(kind), " memory needs a device ordinal >= 0"));

    std::unique_lock lock(im.regions_mutex);
    // Neighbours that could overlap: the last region starting below end.
    auto next = im.regions.lower_bound(a);
    if (next != im.regions.end() && next->first < a + length)
        return fail(-EEXIST, cat("register_memory: [", hex(a), ", ", hex(a + length),
                                 ") overlaps the registered region [", hex(next->first), ", ", hex(next->second.end()),
                                 "); unregister it first or register disjoint ranges"));
    if (next != im.regions.begin()) {
        auto prev = std::prev(next);
        if (prev->second.end() > a)
            return fail(-EEXIST, cat("register_memory: [", hex(a), ", ", hex(a + length),
                                     ") overlaps the registered region [", hex(prev->first), ", ",
                                     hex(prev->second.end()), "); unregister it first or register disjoint ranges"));
    }

    LocalRegion region{a, length, kind, options.device, options.access, {}, {}};
    region.handles.resize(im.transports.size());
    region.keys.resize(im.transports.size());
    ferry_mem_region_t abi{a, length, kind, kind == FERRY_MEM_HOST ? -1 : options.device, options.access, 0};
    auto rollback = [&] {
        for (size_t j = 0; j < im.transports.size(); ++j)
            if (region.handles[j]) (void)im.transports[j]->deregister_mem(*region.handles[j]);
    };
    // Device memory that staging-capable host transports will serve (their keys go into the
    // descriptor) must really be that device's: their copies start from these addresses.
    std::string no_staging;
    bool staged = kind != FERRY_MEM_HOST && im.staging->offers(kind, no_staging);
    if (staged)
        if (auto c = im.stager(kind, no_staging)->check_device_memory(addr, length, options.device); !c)
            return fail(c.error().code, "register_memory: " + c.error().message);
    std::string unable;
    for (size_t i = 0; i < im.transports.size(); ++i) {
        auto &t = im.transports[i];
        bool serves = staged && t->serves_staged() && t->moves(FERRY_MEM_HOST);
        if (!t->moves(kind) && !serves) {
            unable += (unable.empty() ? "" : ", ") + t->name();
            continue;
        }
        auto h =
            shared_fd >= 0 && kind == FERRY_MEM_HOST ? t->register_mem_fd(abi, shared_fd, 0) : t->register_mem(abi);
        if (!h) {
            rollback();
            return fail(h.error().code, cat("register_memory [", hex(a), ", +", length, "): ", h.error().message));
        }
        region.handles[i] = *h;
        auto key = t->export_mem(*h);
        if (!key) {
            rollback();
            return std::unexpected(key.error());
        }
        region.keys[i] = std::move(*key);
    }
    if (std::none_of(region.handles.begin(), region.handles.end(), [](auto &h) { return h.has_value(); })) {
        // Host-only transports can still carry it through pinned staging buffers.
        std::string why;
        bool host_transport =
            std::any_of(im.transports.begin(), im.transports.end(), [](auto &t) { return t->moves(FERRY_MEM_HOST); });
        GpuStager *stager = kind == FERRY_MEM_HOST || !host_transport || !im.staging->offers(kind, why)
                                ? nullptr
                                : im.stager(kind, why);
        if (!stager)
            return fail(-ENOTSUP, cat("register_memory: no loaded transport can move ", kind_name(kind),
                                      " memory (loaded: ", unable, ")",
                                      why.empty() ? "" : cat(", and it cannot be staged: ", why),
                                      "; install the plugin for it (see ferry-info)"));
        if (auto c = staged ? Result<void>{} : stager->check_device_memory(addr, length, options.device); !c)
            return fail(c.error().code, "register_memory: " + c.error().message);
    }
    uint64_t seq = im.queue_change_locked({a, im.region_descriptor(region)});
    im.regions.insert(std::move(region));
    FERRY_DEBUG("registered ", kind_name(kind), " region [", hex(a), ", +", length, ")");
    return seq;
}

Result<void> Engine::register_memory(void *addr, uint64_t length, const MemoryOptions &options) {
    return register_region(addr, length, options, -1);
}

Result<void> Engine::register_region(void *addr, uint64_t length, const MemoryOptions &options, int shared_fd) {
    auto seq = register_unpublished(*impl_, addr, length, options, shared_fd);
    if (!seq) return std::unexpected(seq.error());
    return impl_->publish_queued(*seq);
}

Result<void> Engine::register_memory_batch(std::span<const MemoryRange> ranges, const MemoryOptions &options) {
    uint64_t last = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
        auto seq = register_unpublished(*impl_, ranges[i].addr, ranges[i].length, options, -1);
        if (!seq) {
            (void)impl_->publish_queued(last);  // what was registered stays registered, and published
            return fail(seq.error().code, cat("register_memory_batch: range ", i, " of ", ranges.size(), " (", i,
                                              " before it registered): ", seq.error().message));
        }
        last = std::max(last, *seq);
    }
    return impl_->publish_queued(last);
}

Result<void> Engine::unregister_memory(void *addr) {
    auto &im = *impl_;
    uint64_t a = reinterpret_cast<uintptr_t>(addr);
    std::unique_lock lock(im.regions_mutex);
    auto it = im.regions.find_start(a);
    if (it == im.regions.end())
        return fail(-ENOENT, cat("unregister_memory: no region starts at ", hex(a),
                                 "; pass the address that was given to register_memory"));
    Result<void> result;
    for (size_t i = 0; i < im.transports.size(); ++i) {
        if (!it->second.handles[i]) continue;
        if (auto r = im.transports[i]->deregister_mem(*it->second.handles[i]); !r && result) result = r;
    }
    im.regions.erase(it);
    uint64_t seq = im.queue_change_locked({a, std::nullopt});
    lock.unlock();
    if (auto p = im.publish_queued(seq); !p && result) result = p;
    return result;
}

Result<SegmentId> Engine::open_segment(std::string_view name) {
    auto &im = *impl_;
    std::string key(name);
    {
        std::lock_guard lock(im.segments_mutex);
        if (auto it = im.segment_ids.find(key); it != im.segment_ids.end()) return it->second;
    }
    auto descriptor = im.metadata->fetch(key);
    if (!descriptor) return std::unexpected(descriptor.error());
    auto seg = std::make_shared<RemoteSegment>();
    seg->name = key;
    seg->same_host = descriptor->host_id == im.host_id;
    seg->descriptor = std::move(*descriptor);
    seg->peers.resize(im.transports.size());
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
    return {};
}

Result<BatchId> Engine::submit(std::span<const Request> requests) { return impl_->submit(requests); }

Result<OpStatus> Engine::status(BatchId id, size_t index) {
    auto batch = impl_->find_batch(id);
    if (!batch) return fail(-ENOENT, cat("status: batch ", id, " does not exist (never submitted or already freed)"));
    if (index >= batch->size)
        return fail(-EINVAL,
                    cat("status: batch ", id, " has ", batch->size, " ops; index ", index, " is out of range"));
    auto &op = batch->ops[index];
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
                                "; wait for them first"));
    im.batches.erase(it);
    return {};
}

}  // namespace ferry
