// The engine's own registered regions, by start address: a std::map that owns them (O(log n)
// register and unregister, stable addresses) and, for the per-op lookup, a flat snapshot of it:
// a cache-friendly StartIndex (start_index.hpp) over the starts and a parallel array of rows,
// each one cache line holding what an op's route reads (start, length, kind, the transports'
// handles), so a lookup reads the index's leaf and one row, never the map node. Rebuilt lazily,
// never per register. A peer's regions get the same (RemoteRows, next to its descriptor's
// StartIndex), with the handles this engine imported of them.
//
// Locking (Engine::Impl::regions_mutex): every writer (insert, erase) holds it exclusively;
// find() holds it shared, concurrently with other finds. A writer changes only the map and marks
// the current snapshot: an erased region's row there is cleared at once (it is never found
// again), a new region is not in it (find falls back to the map). Finds that fell back often
// enough rebuild the snapshot from the map (they may: the map does not change under the shared
// lock) and publish it; snapshots replaced that way are freed by the next writer, when no find
// can hold one. A row a find returned is valid while the lock is held.
#pragma once

#include <atomic>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <vector>

#include "metadata/descriptor.hpp"
#include "util/start_index.hpp"

namespace ferry {

// Handles kept inline in a row, for transports 0..kRowHandles-1 (an engine rarely loads more);
// a later transport's handle is read from the region itself (local) or the imported map (remote).
inline constexpr size_t kRowHandles = 4;
// Transports the rows' masks describe; an engine with more takes the slow route for the rest.
inline constexpr size_t kRowMaskBits = 32;

struct LocalRegion;

// A local region's hot fields, one cache line (in the snapshot's line-aligned array; not aligned
// in the map's node, where an over-aligned type would take glibc's slow memalign path).
struct LocalRow {
    uint64_t addr = 0;
    uint64_t length = 0;                  // 0: unregistered since its snapshot was built
    const LocalRegion *region = nullptr;  // the whole region: device, keys, later transports' handles
    uint32_t kind = 0;
    uint32_t handle_mask = 0;  // bit t: a handle for transport t (t < kRowMaskBits)
    uint64_t handles[kRowHandles] = {};

    uint64_t end() const { return addr + length; }
    bool holds(uint64_t a, uint64_t len) const { return a >= addr && len <= length && a - addr <= length - len; }
    inline std::optional<uint64_t> handle(size_t t) const;
};

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
    LocalRow row() const;  // its hot fields, `region` pointing here
};

std::optional<uint64_t> LocalRow::handle(size_t t) const {
    if (t < kRowHandles) return handle_mask >> t & 1 ? std::optional<uint64_t>(handles[t]) : std::nullopt;
    return t < region->handles.size() ? region->handles[t] : std::nullopt;
}

static_assert(sizeof(LocalRow) == 64);

// Rows are kept in arrays of whole, aligned cache lines: a row is one line, never two.
template <class T>
struct LineAllocator {
    using value_type = T;
    LineAllocator() = default;
    template <class U>
    LineAllocator(const LineAllocator<U> &) {}
    T *allocate(size_t n) { return static_cast<T *>(::operator new (n * sizeof(T), std::align_val_t{64})); }
    void deallocate(T *p, size_t) { ::operator delete (p, std::align_val_t{64}); }
    bool operator==(const LineAllocator &) const { return true; }
};
template <class T>
using Rows = std::vector<T, LineAllocator<T>>;

class RegionIndex {
public:
    // The map's node: the region and its row (what a find that falls back to the map returns).
    struct Entry : LocalRegion {
        LocalRow hot;
    };
    using Map = std::map<uint64_t, Entry>;
    // Lookups find_many takes at once.
    static constexpr size_t kMaxMany = 32;

    RegionIndex() = default;
    RegionIndex(const RegionIndex &) = delete;
    RegionIndex &operator=(const RegionIndex &) = delete;

    // Readers (the regions lock held, shared is enough).
    const Map &map() const { return map_; }
    size_t size() const { return map_.size(); }
    // The row of the region holding all of [addr, addr + length), or nullptr.
    const LocalRow *find(uint64_t addr, uint64_t length) const {
        const Flat *f = flat_.load(std::memory_order_acquire);
        if (f) {
            size_t i = f->index.upper_bound(addr);
            if (i && f->rows[i - 1].holds(addr, length)) return &f->rows[i - 1];
            if (f->changes == 0) return nullptr;  // the snapshot is the whole map
        }
        return find_slow(addr, length, f);
    }
    // find() for n <= kMaxMany ranges: out[k] = find(addr[k], length[k]), and where `remote` is
    // given, its rows' find() for its ranges (same lengths) alongside. Every leaf block is asked
    // for before any is read, then every row, so the lookups' cache misses overlap instead of
    // following one another (a batch's ops are independent).
    struct RemoteProbe;
    void find_many(const uint64_t *addr, const uint64_t *length, size_t n, const LocalRow **out,
                   const RemoteProbe *remote = nullptr) const;

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
        Rows<LocalRow> rows;  // parallel to the index; length 0: erased since
        size_t changes = 0;   // writes since it was built (written by writers only)
    };

    const LocalRow *find_slow(uint64_t addr, uint64_t length, const Flat *seen) const;
    void writer_changed();  // frees replaced snapshots, counts the change on the current one

    Map map_;
    mutable std::atomic<Flat *> flat_{nullptr};
    mutable std::mutex rebuild_mutex_;                  // one rebuilding find at a time; guards `owned_`
    mutable std::vector<std::unique_ptr<Flat>> owned_;  // the current snapshot last, replaced ones before
    mutable std::atomic<size_t> slow_finds_{0};         // finds the snapshot could not answer
};

// A peer's region's hot fields, one cache line, and what this engine imported of it.
struct RemoteRow {
    uint64_t addr = 0;
    uint64_t length = 0;
    uint32_t access = 0;
    uint32_t key_mask = 0;       // bit t: the peer registered it with local transport t's name
    uint32_t imported_mask = 0;  // bit t (t < kRowHandles): imported[t] is its import over t
    uint32_t index = 0;          // in the descriptor's regions
    uint64_t imported[kRowHandles] = {};

    uint64_t end() const { return addr + length; }
    bool holds(uint64_t a, uint64_t len) const { return a >= addr && len <= length && a - addr <= length - len; }
};
static_assert(sizeof(RemoteRow) == 64);

// Rows parallel to a SegmentDescriptor's regions, searched with its StartIndex. Owned by the
// segment and guarded by its mutex; rebuilt whenever its descriptor is replaced.
class RemoteRows {
public:
    static constexpr size_t kNone = SIZE_MAX;

    // `transports`: the local transports' names by index (a region's key is matched by name).
    void build(const SegmentDescriptor &d, std::span<const std::string_view> transports);
    void clear() { rows_.clear(); }
    bool built_for(const SegmentDescriptor &d) const {
        return rows_.size() == d.regions.size() && d.starts.size() == d.regions.size();
    }
    size_t size() const { return rows_.size(); }
    RemoteRow &operator[](size_t i) { return rows_[i]; }
    const RemoteRow &operator[](size_t i) const { return rows_[i]; }

    // The row holding all of [addr, addr + length) (kNone: none); built_for(d) must hold. Many
    // at once: RegionIndex::find_many with a RemoteProbe.
    size_t find(const SegmentDescriptor &d, uint64_t addr, uint64_t length) const {
        size_t i = d.starts.upper_bound(addr);
        return i && rows_[i - 1].holds(addr, length) ? i - 1 : kNone;
    }
    // The region starting at `addr` was imported over transport t (t < kRowHandles).
    void set_imported(const SegmentDescriptor &d, size_t t, uint64_t addr, uint64_t handle);

private:
    friend class RegionIndex;
    Rows<RemoteRow> rows_;
};

// A window's remote lookups, made by RegionIndex::find_many with its local ones.
struct RegionIndex::RemoteProbe {
    const RemoteRows *rows;
    const SegmentDescriptor *descriptor;
    const uint64_t *addr;
    size_t *out;
};

}  // namespace ferry
