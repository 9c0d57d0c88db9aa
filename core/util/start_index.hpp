// A static search index over sorted 64-bit keys (region start addresses), laid out for the
// cache: a B+-tree-like stack of levels, each level holding the first key of every block of
// kWidth keys of the level below. A lookup reads one block (one cache line, aligned) per level;
// every level above the keys themselves is 1/8 of the one below (at 100k keys ~115 KB), and a
// lookup costs one miss on the keys where a binary search over them (or a std::map) costs ~17
// dependent ones. Many lookups at once (leaf_blocks) descend level by level, all of them a level
// at a time with the next level's blocks prefetched, so the misses on the upper levels overlap
// too. Immutable once built; built in O(n).
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <new>
#include <span>
#include <vector>

namespace ferry {

class StartIndex {
public:
    static constexpr size_t kWidth = 8;  // keys per block: 64 bytes, one cache line
    static constexpr size_t kAlign = kWidth * sizeof(uint64_t);

    StartIndex() = default;
    explicit StartIndex(std::span<const uint64_t> sorted) { build(sorted); }

    void build(std::span<const uint64_t> sorted) {
        size_ = sorted.size();
        levels_.clear();
        if (size_ == 0) return;
        levels_.push_back(padded(sorted));
        while (levels_.back().blocks > 1) {
            const Level &below = levels_.back();
            std::vector<uint64_t> firsts(below.blocks);
            for (size_t b = 0; b < below.blocks; ++b) firsts[b] = below.keys[b * kWidth];
            levels_.push_back(padded(firsts));
        }
    }

    size_t size() const { return size_; }

    // How many keys are <= x (std::upper_bound's index): the last key <= x is at that minus 1.
    size_t upper_bound(uint64_t x) const { return in_leaf(leaf_block(x), x); }

    // upper_bound in two steps, so that a caller looking up many keys can prefetch every one's
    // leaf block before it reads any: leaf_block descends to the block of keys that decides
    // (kBelowAll: x is below every key), in_leaf counts in it. leaf_blocks does leaf_block for n
    // keys a level at a time, each block it reads prefetched a level before, and prefetches the
    // leaves: at 100k keys the upper levels are in L2 at best, and one key's descent is a chain
    // of dependent loads that alone would stall on each.
    static constexpr size_t kBelowAll = SIZE_MAX;
    size_t leaf_block(uint64_t x) const {
        size_t block = 0;
        leaf_blocks(&x, 1, &block);
        return block;
    }
    void leaf_blocks(const uint64_t *x, size_t n, size_t *block) const {
        if (size_ == 0) {
            std::fill(block, block + n, kBelowAll);
            return;
        }
        std::fill(block, block + n, size_t{0});
        for (size_t l = levels_.size() - 1; l > 0; --l) {
            const uint64_t *keys = levels_[l].keys.get();
            const uint64_t *below = levels_[l - 1].keys.get();
            size_t last = levels_[l - 1].blocks - 1;
            for (size_t k = 0; k < n; ++k) {
                if (block[k] == kBelowAll) continue;
                size_t c = count(keys + block[k] * kWidth, x[k]);
                if (c == 0) {  // below the first key (top level only)
                    block[k] = kBelowAll;
                    continue;
                }
                // Padding counts only for x == UINT64_MAX: the last real block of the level below.
                block[k] = std::min(block[k] * kWidth + c - 1, last);
                __builtin_prefetch(below + block[k] * kWidth);
            }
        }
    }
    size_t in_leaf(size_t block, uint64_t x) const {
        if (block == kBelowAll) return 0;
        size_t idx = block * kWidth + count(levels_[0].keys.get() + block * kWidth, x);
        return idx < size_ ? idx : size_;  // padding counts only for x == max
    }

private:
    static size_t count(const uint64_t *k, uint64_t x) {
        size_t c = 0;
        for (size_t i = 0; i < kWidth; ++i) c += k[i] <= x;  // branch-free, vectorised
        return c;
    }

    // Shared, immutable once built: copies of an index (of a SegmentDescriptor) share it.
    struct Level {
        std::shared_ptr<uint64_t[]> keys;
        size_t blocks = 0;
    };

    // The keys padded with UINT64_MAX to whole blocks, aligned so that a block is one line.
    static Level padded(std::span<const uint64_t> keys) {
        Level level;
        level.blocks = (keys.size() + kWidth - 1) / kWidth;
        size_t n = level.blocks * kWidth;
        auto *p = static_cast<uint64_t *>(std::aligned_alloc(kAlign, n * sizeof(uint64_t)));
        if (!p) throw std::bad_alloc();
        level.keys = std::shared_ptr<uint64_t[]>(p, [](uint64_t *q) { std::free(q); });
        for (size_t i = 0; i < n; ++i) level.keys[i] = i < keys.size() ? keys[i] : UINT64_MAX;
        return level;
    }

    size_t size_ = 0;
    std::vector<Level> levels_;  // [0]: the keys; the last: one block
};

}  // namespace ferry
