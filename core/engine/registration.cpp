// Memory registration: register_memory and unregister_memory, one range or a batch, and how the
// changes reach the metadata store (queued in order under the regions lock, published after it).
#include <algorithm>
#include <atomic>
#include <cerrno>
#include <unordered_map>

#include "engine/engine_impl.hpp"
#include "huge_pages.hpp"
#include "util/log.hpp"

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

RegionDescriptor Engine::Impl::region_descriptor(const LocalRegion &r) const {
    RegionDescriptor rd{r.addr, r.length, r.kind, r.device, r.access, {}};
    for (size_t i = 0; i < transports.size(); ++i)
        if (r.handles[i] && !transports[i]->storage()) rd.keys.push_back({transports[i]->name(), r.keys[i]});
    return rd;
}

SegmentDescriptor Engine::Impl::descriptor_locked() const {
    SegmentDescriptor d;
    d.name = segment_name;
    d.host_id = host_id;
    d.generation = generation;
    d.control = control->address();
    // Storage transports serve no peer: publishing them would only invite peers to name one.
    for (size_t i = 0; i < transports.size(); ++i)
        if (!transports[i]->storage()) d.transports.push_back({transports[i]->name(), endpoints[i]});
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

// A region added and removed again before either change was published never reaches the store:
// a batch that failed half-way and took its regions out again publishes nothing. Only an add
// followed by a remove cancels (a remove then an add replaces a published region).
static void drop_cancelled(std::vector<RegionChange> &changes) {
    if (std::none_of(changes.begin(), changes.end(), [](const RegionChange &c) { return !c.region; })) return;
    std::unordered_map<uint64_t, size_t> added;  // address -> its add not yet removed
    std::vector<bool> drop(changes.size());
    for (size_t i = 0; i < changes.size(); ++i) {
        if (changes[i].region) {
            added[changes[i].addr] = i;
        } else if (auto it = added.find(changes[i].addr); it != added.end()) {
            drop[it->second] = drop[i] = true;
            added.erase(it);
        }
    }
    size_t kept = 0;
    for (size_t i = 0; i < changes.size(); ++i)
        if (!drop[i]) changes[kept++] = std::move(changes[i]);
    changes.resize(kept);
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
    drop_cancelled(changes);
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

// What register_memory checks before it takes the regions lock: the range and its options, with
// MemoryKind::Auto resolved.
static Result<MemoryOptions> check_range(Engine::Impl &im, void *addr, uint64_t length, const MemoryOptions &in) {
    uint64_t a = reinterpret_cast<uintptr_t>(addr);
    if (!addr || length == 0) return fail(-EINVAL, "register_memory: address is null or length is 0");
    if (a + length < a) return fail(-EINVAL, cat("register_memory: [", hex(a), ", +", length, ") wraps around"));
    MemoryOptions options = in;
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
    return options;
}

// Registers a checked range (with shared_fd >= 0: that memfd's mapping at offset 0) with the
// transports and adds it to the index (regions_mutex held exclusively); returns the number of its
// queued change for publish_queued.
static Result<uint64_t> add_region_locked(Engine::Impl &im, void *addr, uint64_t length, const MemoryOptions &options,
                                          int shared_fd) {
    uint64_t a = reinterpret_cast<uintptr_t>(addr);
    uint32_t kind = static_cast<uint32_t>(options.kind);
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

// Takes a region out of the transports and the index (regions_mutex held exclusively); returns
// the number of its queued change. A transport's failure to deregister goes into `result` (the
// first one) and the region goes anyway.
static uint64_t remove_region_locked(Engine::Impl &im, RegionIndex::Map::iterator it, Result<void> &result) {
    uint64_t a = it->first;
    for (size_t i = 0; i < im.transports.size(); ++i) {
        if (!it->second.handles[i]) continue;
        if (auto r = im.transports[i]->deregister_mem(*it->second.handles[i]); !r && result) result = r;
    }
    im.regions.erase(it);
    return im.queue_change_locked({a, std::nullopt});
}

// huge_pages=advise|collapse: a registered host range asks for transparent huge pages. Never a
// reason to refuse the registration: what the kernel would not do is logged (once per process
// for each kind of failure) and the memory works as it is.
static void advise_huge_pages_on(Engine::Impl &im, void *addr, uint64_t length, const MemoryOptions &options) {
    using HugePages = EngineSettings::HugePages;
    if (im.settings.huge_pages == HugePages::Off || options.kind != MemoryKind::Host) return;
    std::string error;
    int rc = advise_huge_pages(addr, length, im.settings.huge_pages == HugePages::Collapse, error);
    if (rc == 0) {
        FERRY_DEBUG("register_memory: [", hex(reinterpret_cast<uintptr_t>(addr)), ", +", length,
                    ") asks for huge pages (", im.settings.huge_pages == HugePages::Collapse ? "collapse" : "advise",
                    "); ", huge_page_bytes(addr, length), " bytes are huge pages now");
        return;
    }
    static std::atomic<int> logged_codes{0};  // one warning per failure kind in a process, not per region
    int bit = rc == -EINVAL ? 1 : rc == -EAGAIN || rc == -ENOMEM ? 2 : 4;
    if (!(logged_codes.fetch_or(bit) & bit))
        FERRY_WARN("huge_pages: ", error, " on [", hex(reinterpret_cast<uintptr_t>(addr)), ", +", length,
                   "); transparent huge pages are '", thp_mode(), "' here; the memory works as it is");
}

Result<void> Engine::register_memory(void *addr, uint64_t length, const MemoryOptions &options) {
    return register_region(addr, length, options, -1);
}

Result<void> Engine::register_region(void *addr, uint64_t length, const MemoryOptions &options, int shared_fd) {
    auto checked = check_range(*impl_, addr, length, options);
    if (!checked) return std::unexpected(checked.error());
    std::unique_lock lock(impl_->regions_mutex);
    auto seq = add_region_locked(*impl_, addr, length, *checked, shared_fd);
    lock.unlock();
    if (!seq) return std::unexpected(seq.error());
    if (shared_fd < 0) advise_huge_pages_on(*impl_, addr, length, *checked);
    return impl_->publish_queued(*seq);
}

// All or none: every range is checked first (nothing registered when one is invalid), then each is
// registered under the regions lock of its own (submits and peers' descriptor fetches go on
// meanwhile); when one fails, those before it are taken out again. Their changes then cancel in
// the publish queue, so the store sees none of them.
Result<void> Engine::register_memory_batch(std::span<const MemoryRange> ranges, const MemoryOptions &options) {
    auto &im = *impl_;
    auto range_name = [&](size_t i) {
        return cat("register_memory_batch: range ", i, " of ", ranges.size(), " [",
                   hex(reinterpret_cast<uintptr_t>(ranges[i].addr)), ", +", ranges[i].length, ")");
    };
    auto why = [](const Error &e) {  // register_memory's message, without its name
        std::string_view m = e.message;
        if (m.starts_with("register_memory: ")) m.remove_prefix(17);
        return std::string(m);
    };
    // MemoryKind::Auto where no GPU runtime loads (a host without GPUs): host memory, found out
    // once for the batch instead of for every range (detect_memory asks both runtimes and builds
    // its message each time).
    std::optional<bool> gpu_runtime;
    auto any_gpu_runtime = [&] {
        std::string reason;  // CUDA first, and HIP only without it (detect_memory's order)
        return im.stager(FERRY_MEM_CUDA, reason) != nullptr || im.stager(FERRY_MEM_ROCM, reason) != nullptr;
    };
    std::vector<MemoryOptions> checked;
    checked.reserve(ranges.size());
    for (size_t i = 0; i < ranges.size(); ++i) {
        MemoryOptions asked = ranges[i].options.value_or(options);
        if (asked.kind == MemoryKind::Auto && asked.device < 0) {
            if (!gpu_runtime) gpu_runtime = any_gpu_runtime();
            if (!*gpu_runtime) asked.kind = MemoryKind::Host;
        }
        auto o = check_range(im, ranges[i].addr, ranges[i].length, asked);
        if (!o) return fail(o.error().code, cat(range_name(i), ": ", why(o.error()), "; nothing was registered"));
        checked.push_back(*o);
    }
    uint64_t last = 0;
    for (size_t i = 0; i < ranges.size(); ++i) {
        std::unique_lock lock(im.regions_mutex);
        auto seq = add_region_locked(im, ranges[i].addr, ranges[i].length, checked[i], -1);
        if (seq) {
            last = *seq;
            continue;
        }
        // Which earlier range of this batch it overlaps, if one: the message names a region the
        // rollback removes.
        uint64_t a = reinterpret_cast<uintptr_t>(ranges[i].addr), end = a + ranges[i].length;
        std::string earlier;
        for (size_t j = 0; j < i && earlier.empty(); ++j) {
            uint64_t b = reinterpret_cast<uintptr_t>(ranges[j].addr);
            if (b < end && a < b + ranges[j].length) earlier = cat(" (range ", j, " of this batch)");
        }
        Result<void> ignored;
        for (size_t j = 0; j < i; ++j)
            if (auto it = im.regions.find_start(reinterpret_cast<uintptr_t>(ranges[j].addr)); it != im.regions.end())
                last = remove_region_locked(im, it, ignored);
        lock.unlock();
        (void)im.publish_queued(last);
        return fail(seq.error().code, cat(range_name(i), ": ", why(seq.error()), earlier, "; none of the ",
                                          ranges.size(), " ranges stays registered"));
    }
    for (size_t i = 0; i < ranges.size(); ++i) advise_huge_pages_on(im, ranges[i].addr, ranges[i].length, checked[i]);
    return im.publish_queued(last);
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
    uint64_t seq = remove_region_locked(im, it, result);
    lock.unlock();
    if (auto p = im.publish_queued(seq); !p && result) result = p;
    return result;
}

// All or none: every address is looked up, under one hold of the regions lock, before any region
// goes.
Result<void> Engine::unregister_memory_batch(std::span<void *const> addrs) {
    auto &im = *impl_;
    auto at = [&](size_t i) { return reinterpret_cast<uintptr_t>(addrs[i]); };
    // Two equal addresses would take one region out twice. Addresses in ascending order (as a
    // batch registered them) are checked in place; others through a sorted copy.
    auto twice = [&](size_t i, size_t j, uint64_t a) {
        return fail(-EINVAL, cat("unregister_memory_batch: addresses ", std::min(i, j), " and ", std::max(i, j), " of ",
                                 addrs.size(), " are both ", hex(a), "; nothing was unregistered"));
    };
    bool ascending = true;
    for (size_t i = 1; i < addrs.size() && ascending; ++i) {
        if (at(i) == at(i - 1)) return twice(i - 1, i, at(i));
        ascending = at(i) > at(i - 1);
    }
    if (!ascending) {
        std::vector<std::pair<uint64_t, size_t>> sorted(addrs.size());
        for (size_t i = 0; i < addrs.size(); ++i) sorted[i] = {at(i), i};
        std::sort(sorted.begin(), sorted.end());
        for (size_t k = 1; k < sorted.size(); ++k)
            if (sorted[k].first == sorted[k - 1].first)
                return twice(sorted[k - 1].second, sorted[k].second, sorted[k].first);
    }
    // Every address is looked up before any region goes, then again to take it out (cheaper than
    // a list of 100k iterators: the regions of a batch usually follow each other in the index, so
    // the region after the last one found is tried first).
    std::unique_lock lock(im.regions_mutex);
    auto seek = [&](RegionIndex::Map::iterator hint, uint64_t a) {
        return hint != im.regions.end() && hint->first == a ? hint : im.regions.find_start(a);
    };
    auto it = im.regions.end();
    for (size_t i = 0; i < addrs.size(); ++i) {
        it = seek(it == im.regions.end() ? it : std::next(it), at(i));
        if (it == im.regions.end())
            return fail(-ENOENT, cat("unregister_memory_batch: address ", i, " of ", addrs.size(), " (", hex(at(i)),
                                     ") is not where a registered region starts; nothing was unregistered"));
    }
    Result<void> result;
    uint64_t last = 0;
    auto next = im.regions.end();
    for (size_t i = 0; i < addrs.size(); ++i) {
        it = seek(next, at(i));
        next = std::next(it);
        last = remove_region_locked(im, it, result);
    }
    lock.unlock();
    if (auto p = im.publish_queued(last); !p && result) result = p;
    return result;
}

}  // namespace ferry
