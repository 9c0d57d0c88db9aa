// Pinned staging buffers for GPU ops on host-only transports: allocated on demand in
// power-of-two sizes, registered with the transport once, and reused.
#include <bit>

#include "engine_impl.hpp"
#include "log.hpp"

namespace ferry {

GpuStager *Engine::Impl::stager(uint32_t kind, std::string &why) {
    std::lock_guard lock(staging_mutex);
    if (auto it = stagers.find(kind); it != stagers.end()) return it->second.get();
    if (auto it = stager_errors.find(kind); it != stager_errors.end()) {
        why = it->second;
        return nullptr;
    }
    auto s = GpuStager::open(kind, why);
    if (!s) {
        stager_errors[kind] = why;
        return nullptr;
    }
    return (stagers[kind] = std::move(s)).get();
}

Result<StagingBuffer> Engine::Impl::take_staging(size_t transport, uint32_t kind, int device, uint64_t length) {
    uint64_t size = std::max<uint64_t>(std::bit_ceil(length), 64 << 10);
    auto key = std::make_tuple(transport, kind, device, size);
    {
        std::lock_guard lock(staging_mutex);
        if (auto it = staging_free.find(key); it != staging_free.end()) {
            StagingBuffer b = it->second;
            staging_free.erase(it);
            return b;
        }
    }
    std::string why;
    GpuStager *s = stager(kind, why);
    if (!s) return fail(-ENOTSUP, why);
    auto ptr = s->alloc_pinned(device, size);
    if (!ptr) return std::unexpected(ptr.error());
    ferry_mem_region_t region{reinterpret_cast<uintptr_t>(*ptr), size, FERRY_MEM_HOST, -1, 0, 0};
    auto handle = transports[transport]->register_mem(region);
    if (!handle) {
        s->free_pinned(device, *ptr);
        return std::unexpected(handle.error());
    }
    StagingBuffer b{*ptr, size, kind, device, transport, *handle};
    std::lock_guard lock(staging_mutex);
    staging_all.push_back(b);
    return b;
}

void Engine::Impl::give_staging(const StagingBuffer &b) {
    std::lock_guard lock(staging_mutex);
    staging_free.emplace(std::make_tuple(b.transport, b.kind, b.device, b.size), b);
}

std::vector<StagingBuffer> Engine::Impl::release_staging() {
    std::lock_guard lock(staging_mutex);
    for (auto &b : staging_all) (void)transports[b.transport]->deregister_mem(b.handle);
    staging_free.clear();
    return std::move(staging_all);
}

} // namespace ferry
