#include "region_index.hpp"

namespace ferry {
namespace {

// A snapshot is rebuilt once this many finds fell back to the map since: a rebuild costs O(n),
// a fallback O(log n) cache misses, so n/64 of them pay for it many times over, and a register
// loop with no finds in between rebuilds nothing.
size_t rebuild_after(size_t regions) { return 64 + regions / 64; }

}  // namespace

void RegionIndex::writer_changed() {
    std::lock_guard lock(rebuild_mutex_);
    // No find runs now (the lock is held exclusively): replaced snapshots can go.
    if (owned_.size() > 1) owned_.erase(owned_.begin(), owned_.end() - 1);
    if (Flat *f = flat_.load(std::memory_order_relaxed)) ++f->changes;
}

void RegionIndex::insert(LocalRegion region) {
    uint64_t a = region.addr;
    map_.emplace(a, std::move(region));
    writer_changed();
}

void RegionIndex::erase(Map::iterator it) {
    // Its slot in the snapshot is cleared before the region goes: no find sees it afterwards.
    if (Flat *f = flat_.load(std::memory_order_relaxed)) {
        size_t i = f->index.upper_bound(it->first);
        if (i && f->regions[i - 1] == &it->second) f->regions[i - 1] = nullptr;
    }
    map_.erase(it);
    writer_changed();
}

const LocalRegion *RegionIndex::find_slow(uint64_t addr, uint64_t length, const Flat *seen) const {
    const LocalRegion *found = nullptr;
    if (auto it = map_.upper_bound(addr); it != map_.begin()) {
        const LocalRegion &cand = std::prev(it)->second;
        if (cand.holds(addr, length)) found = &cand;
    }
    if (slow_finds_.fetch_add(1, std::memory_order_relaxed) + 1 < rebuild_after(map_.size())) return found;
    std::unique_lock lock(rebuild_mutex_, std::try_to_lock);
    if (!lock.owns_lock() || flat_.load(std::memory_order_relaxed) != seen) return found;  // another find is at it
    auto f = std::make_unique<Flat>();
    std::vector<uint64_t> starts;
    starts.reserve(map_.size());
    f->regions.reserve(map_.size());
    for (const auto &[a, r] : map_) {
        starts.push_back(a);
        f->regions.push_back(&r);
    }
    f->index.build(starts);
    flat_.store(f.get(), std::memory_order_release);
    owned_.push_back(std::move(f));  // `seen` stays alive: finds may still read it
    slow_finds_.store(0, std::memory_order_relaxed);
    return found;
}

}  // namespace ferry
