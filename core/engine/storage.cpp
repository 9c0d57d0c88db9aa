// Storage segments: open_segment("file:<path>") makes a segment whose one region is the file's
// offsets, [0, FERRY_STORAGE_MAX_OFFSET), carried by the storage transports (file.so, gds.so) and
// by nothing else. Its descriptor is made here and never fetched or published, so no peer can
// name a file of ours, and a peer's descriptor can never make us open one (route.cpp keeps
// storage transports to storage segments). The files are opened here, at once, so a bad path
// fails open_segment with the plugin's message instead of every op later.
#include <cerrno>

#include "engine/engine_impl.hpp"
#include "util/log.hpp"

namespace ferry {

Result<SegmentId> Engine::Impl::open_storage_segment(const std::string &name) {
    std::string_view spec = std::string_view(name).substr(5);  // after "file:"
    if (spec.empty()) return fail(-EINVAL, cat("open_segment: '", name, "' names no file; write file:/path/to/file"));
    std::vector<size_t> storage;
    for (size_t t = 0; t < transports.size(); ++t)
        if (transports[t]->storage()) storage.push_back(t);
    if (storage.empty())
        return fail(-ENOENT, cat("open_segment: ", name,
                                 " needs a storage transport (file.so for host memory, gds.so for GPU memory) and "
                                 "this engine loaded none; run ferry-info to see why, and keep file in `plugins`"));

    auto seg = std::make_shared<RemoteSegment>();
    seg->name = name;
    seg->storage = true;
    seg->same_host = true;
    seg->descriptor.name = name;
    seg->descriptor.host_id = host_id;
    RegionDescriptor region{0, FERRY_STORAGE_MAX_OFFSET, FERRY_MEM_HOST, -1, kRemoteRead | kRemoteWrite, {}};
    const ferry_mem_region_t abi{
        0, FERRY_STORAGE_MAX_OFFSET, FERRY_MEM_HOST, -1, FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE, 0};
    seg->peers.resize(transports.size());
    std::span<const uint8_t> path(reinterpret_cast<const uint8_t *>(spec.data()), spec.size());
    std::string errors;
    int first_code = 0;  // the first failure's: its message names the path and the cause
    for (size_t t : storage) {
        auto &tr = *transports[t];
        auto peer = tr.connect(path);
        if (!peer) {
            if (!first_code) first_code = peer.error().code;
            errors += cat(errors.empty() ? "" : "; ", peer.error().message);
            // A file that would not open will not open on a retry inside this segment either.
            seg->unusable[t] = {std::chrono::steady_clock::time_point::max(), peer.error().message};
            continue;
        }
        auto mem = tr.import_mem(*peer, abi, {});
        if (!mem) {
            (void)tr.disconnect(*peer);
            if (!first_code) first_code = mem.error().code;
            errors += cat(errors.empty() ? "" : "; ", mem.error().message);
            seg->unusable[t] = {std::chrono::steady_clock::time_point::max(), mem.error().message};
            continue;
        }
        seg->peers[t] = *peer;
        seg->imported[{t, 0}] = *mem;
        seg->descriptor.transports.push_back({tr.name(), {}});
        region.keys.push_back({tr.name(), {}});
    }
    if (seg->imported.empty()) return fail(first_code, cat("open_segment: ", name, ": ", errors));
    if (!errors.empty()) FERRY_INFO("open_segment ", name, ": ", errors, " (the other storage transports carry it)");
    seg->descriptor.regions.push_back(std::move(region));
    reindex(*seg);

    std::lock_guard lock(segments_mutex);
    if (auto it = segment_ids.find(name); it != segment_ids.end()) {
        // Opened by another thread meanwhile: keep that one, close our files.
        for (auto &[key, handle] : seg->imported)
            (void)transports[key.first]->release_mem(*seg->peers[key.first], handle);
        for (size_t t = 0; t < seg->peers.size(); ++t)
            if (seg->peers[t]) (void)transports[t]->disconnect(*seg->peers[t]);
        return it->second;
    }
    seg->id = next_segment++;
    segment_ids[name] = seg->id;
    segments[seg->id] = seg;
    FERRY_DEBUG("opened storage segment ", name);
    return seg->id;
}

}  // namespace ferry
