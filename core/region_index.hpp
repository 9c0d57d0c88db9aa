// The engine's own registered regions, by start address: a std::map that owns them (O(log n)
// register and unregister, stable addresses) and, for the per-op lookup, a flat snapshot of it
// in a cache-friendly StartIndex (start_index.hpp) that is rebuilt lazily, never per register.
//
// Locking (Engine::Impl::regions_mutex): every writer (insert, erase) holds it exclusively;
// find() holds it shared, concurrently with other finds. A writer changes only the map and marks
// the current snapshot: an erased region's slot there is cleared at once (it is never found
// again), a new region is not in it (find falls back to the map). Finds that fell back often
// enough rebuild the snapshot from the map (they may: the map does not change under the shared
// lock) and publish it; snapshots replaced that way are freed by the next writer, when no find
// can hold one.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <vector>

#include "start_index.hpp"

namespace ferry {

struct LocalRegion {
    uint64_t addr = 0;
    uint64_t length = 0;
    uint32_t kind = 0;
    int32_t device = -1;
    uint32_t access = 0;
    // Registration handle per transport index; nullopt where that transport cannot move it.
    std::vector<std::optional<uint64_t>> handles;
    std::vector<std::vector<uint8_t>> keys;

    uint64_t end() const { return addr + length; }
    bool holds(uint64_t a, uint64_t len) const { return a >= addr && len <= length && a - addr <= length - len; }
};

class RegionIndex {
public:
    using Map = std::map<uint64_t, LocalRegion>;

    RegionIndex() = default;
    RegionIndex(const RegionIndex &) = delete;
    RegionIndex &operator=(const RegionIndex &) = delete;

    // Readers (the regions lock held, shared is enough).
    const Map &map() const { return map_; }
    size_t size() const { return map_.size(); }
    // The region holding all of [addr, addr + length), or nullptr.
    const LocalRegion *find(uint64_t addr, uint64_t length) const {
        const Flat *f = flat_.load(std::memory_order_acquire);
        if (f) {
            const LocalRegion *const *slots = f->regions.data();
            // The block's 16 slots (two lines) load while its keys are searched.
            size_t i = f->index.upper_bound(addr, [&](size_t first) {
                __builtin_prefetch(slots + first);
                __builtin_prefetch(slots + first + 8);
            });
            const LocalRegion *r = i ? slots[i - 1] : nullptr;
            if (r && r->holds(addr, length)) return r;
            if (f->changes == 0) return nullptr;  // the snapshot is the whole map
        }
        return find_slow(addr, length, f);
    }

    // Writers (the regions lock held exclusively).
    Map::iterator lower_bound(uint64_t addr) { return map_.lower_bound(addr); }
    Map::iterator find_start(uint64_t addr) { return map_.find(addr); }
    Map::iterator end() { return map_.end(); }
    Map::iterator begin() { return map_.begin(); }
    void insert(LocalRegion region);
    void erase(Map::iterator it);

private:
    struct Flat {
        StartIndex index;
        std::vector<const LocalRegion *> regions;  // parallel to the index; nullptr: erased since
        size_t changes = 0;                        // writes since it was built (written by writers only)
    };

    const LocalRegion *find_slow(uint64_t addr, uint64_t length, const Flat *seen) const;
    void writer_changed();  // frees replaced snapshots, counts the change on the current one

    Map map_;
    mutable std::atomic<Flat *> flat_{nullptr};
    mutable std::mutex rebuild_mutex_;                  // one rebuilding find at a time; guards `owned_`
    mutable std::vector<std::unique_ptr<Flat>> owned_;  // the current snapshot last, replaced ones before
    mutable std::atomic<size_t> slow_finds_{0};         // finds the snapshot could not answer
};

}  // namespace ferry
