#include "engine/region_index.hpp"

#include <cassert>

namespace ferry {
namespace {

// A snapshot is rebuilt once this many finds fell back to the map since: a rebuild costs O(n),
// a fallback O(log n) cache misses, so n/64 of them pay for it many times over, and a register
// loop with no finds in between rebuilds nothing.
size_t rebuild_after(size_t regions) { return 64 + regions / 64; }

}  // namespace

LocalRow LocalRegion::row() const {
    LocalRow r;
    r.addr = addr;
    r.length = length;
    r.region = this;
    r.kind = kind;
    for (size_t t = 0; t < handles.size() && t < kRowMaskBits; ++t) {
        if (!handles[t]) continue;
        r.handle_mask |= uint32_t{1} << t;
        if (t < kRowHandles) r.handles[t] = *handles[t];
    }
    return r;
}

void RegionIndex::writer_changed() {
    std::lock_guard lock(rebuild_mutex_);
    // No find runs now (the lock is held exclusively): replaced snapshots can go.
    if (owned_.size() > 1) owned_.erase(owned_.begin(), owned_.end() - 1);
    if (Flat *f = flat_.load(std::memory_order_relaxed)) ++f->changes;
}

void RegionIndex::insert(LocalRegion region) {
    uint64_t a = region.addr;
    auto [it, added] = map_.emplace(a, Entry{std::move(region), {}});
    assert(added);
    it->second.hot = it->second.row();  // the node's address is final now
    writer_changed();
}

void RegionIndex::erase(Map::iterator it) {
    // Its row in the snapshot is cleared before the region goes: no find sees it afterwards.
    if (Flat *f = flat_.load(std::memory_order_relaxed)) {
        size_t i = f->index.upper_bound(it->first);
        if (i && f->rows[i - 1].region == &it->second) f->rows[i - 1] = LocalRow{};
    }
    map_.erase(it);
    writer_changed();
}

void RegionIndex::find_many(const uint64_t *addr, const uint64_t *length, size_t n, const LocalRow **out,
                            const RemoteProbe *remote) const {
    assert(n <= kMaxMany);
    assert(!remote || remote->rows->built_for(*remote->descriptor));
    const Flat *f = flat_.load(std::memory_order_acquire);
    const StartIndex *rs = remote ? &remote->descriptor->starts : nullptr;
    const RemoteRow *rrows = remote ? remote->rows->rows_.data() : nullptr;
    size_t at[kMaxMany], rat[kMaxMany];
    if (f) f->index.leaf_blocks(addr, n, at);
    if (rs) rs->leaf_blocks(remote->addr, n, rat);
    for (size_t k = 0; k < n; ++k) {
        if (f) {
            at[k] = f->index.in_leaf(at[k], addr[k]);
            if (at[k]) __builtin_prefetch(&f->rows[at[k] - 1]);
        }
        if (rs) {
            rat[k] = rs->in_leaf(rat[k], remote->addr[k]);
            if (rat[k]) __builtin_prefetch(&rrows[rat[k] - 1]);
        }
    }
    for (size_t k = 0; k < n; ++k) {
        const LocalRow *r = f && at[k] ? &f->rows[at[k] - 1] : nullptr;
        if (r && r->holds(addr[k], length[k])) out[k] = r;
        else out[k] = f && f->changes == 0 ? nullptr : find_slow(addr[k], length[k], f);
        if (rs)
            remote->out[k] =
                rat[k] && rrows[rat[k] - 1].holds(remote->addr[k], length[k]) ? rat[k] - 1 : RemoteRows::kNone;
    }
}

const LocalRow *RegionIndex::find_slow(uint64_t addr, uint64_t length, const Flat *seen) const {
    const LocalRow *found = nullptr;
    if (auto it = map_.upper_bound(addr); it != map_.begin()) {
        const LocalRow &cand = std::prev(it)->second.hot;
        if (cand.holds(addr, length)) found = &cand;
    }
    if (slow_finds_.fetch_add(1, std::memory_order_relaxed) + 1 < rebuild_after(map_.size())) return found;
    std::unique_lock lock(rebuild_mutex_, std::try_to_lock);
    if (!lock.owns_lock() || flat_.load(std::memory_order_relaxed) != seen) return found;  // another find is at it
    auto f = std::make_unique<Flat>();
    std::vector<uint64_t> starts;
    starts.reserve(map_.size());
    f->rows.reserve(map_.size());
    for (const auto &[a, r] : map_) {
        starts.push_back(a);
        f->rows.push_back(r.hot);
    }
    f->index.build(starts);
    flat_.store(f.get(), std::memory_order_release);
    owned_.push_back(std::move(f));  // `seen` stays alive: finds may still read it
    slow_finds_.store(0, std::memory_order_relaxed);
    return found;
}

void RemoteRows::build(const SegmentDescriptor &d, std::span<const std::string_view> transports) {
    rows_.assign(d.regions.size(), RemoteRow{});
    for (size_t i = 0; i < d.regions.size(); ++i) {
        const RegionDescriptor &r = d.regions[i];
        RemoteRow &row = rows_[i];
        row.addr = r.addr;
        row.length = r.length;
        row.access = r.access;
        row.index = static_cast<uint32_t>(i);
        for (size_t t = 0; t < transports.size() && t < kRowMaskBits; ++t)
            if (r.key_for(transports[t])) row.key_mask |= uint32_t{1} << t;
    }
}

void RemoteRows::set_imported(const SegmentDescriptor &d, size_t t, uint64_t addr, uint64_t handle) {
    if (t >= kRowHandles || !built_for(d)) return;
    size_t i = d.starts.upper_bound(addr);
    if (!i || rows_[i - 1].addr != addr) return;
    rows_[i - 1].imported[t] = handle;
    rows_[i - 1].imported_mask |= uint32_t{1} << t;
}

}  // namespace ferry
