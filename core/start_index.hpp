// A static search index over sorted 64-bit keys (region start addresses), laid out for the
// cache: a B+-tree-like stack of levels, each level holding the first key of every block of
// kWidth keys of the level below. A lookup reads one block (two cache lines, aligned) per level;
// every level above the keys themselves is 1/16 of the one below, so at 100k keys the upper
// levels (~53 KB) stay in L2 and a lookup costs about one miss where a binary search over the
// keys (or a std::map) costs ~17 dependent ones. Immutable once built; built in O(n).
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
    static constexpr size_t kWidth = 16;  // keys per block: 128 bytes, two cache lines

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
    // `leaf(first)` runs before the keys' own block [first, first + kWidth) is read, so that a
    // caller can prefetch its parallel array there and overlap the two misses.
    template <class Leaf>
    size_t upper_bound(uint64_t x, Leaf &&leaf) const {
        size_t block = leaf_block(x);
        if (block != kBelowAll) leaf(block * kWidth);
        return in_leaf(block, x);
    }
    size_t upper_bound(uint64_t x) const { return in_leaf(leaf_block(x), x); }

    // upper_bound in two steps, so that a caller looking up many keys can prefetch every one's
    // leaf block before it reads any (the levels above stay in cache; the leaves are the miss):
    // leaf_block descends to the block of keys that decides (kBelowAll: x is below every key),
    // prefetch_leaf asks for its two lines, in_leaf counts in it.
    static constexpr size_t kBelowAll = SIZE_MAX;
    size_t leaf_block(uint64_t x) const {
        if (size_ == 0) return kBelowAll;
        size_t block = 0;
        for (size_t l = levels_.size() - 1; l > 0; --l) {
            size_t c = count(levels_[l].keys.get() + block * kWidth, x);
            if (c == 0) return kBelowAll;  // below the first key (top level only)
            // Padding counts only for x == UINT64_MAX: the last real block of the level below.
            block = std::min(block * kWidth + c - 1, levels_[l - 1].blocks - 1);
        }
        return block;
    }
    void prefetch_leaf(size_t block) const {
        if (block == kBelowAll) return;
        const uint64_t *k = levels_[0].keys.get() + block * kWidth;
        __builtin_prefetch(k);
        __builtin_prefetch(k + 8);
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

    // The keys padded with UINT64_MAX to whole blocks, 128-byte aligned so a block is two lines.
    static Level padded(std::span<const uint64_t> keys) {
        Level level;
        level.blocks = (keys.size() + kWidth - 1) / kWidth;
        size_t n = level.blocks * kWidth;
        auto *p = static_cast<uint64_t *>(std::aligned_alloc(128, n * sizeof(uint64_t)));
        if (!p) throw std::bad_alloc();
        level.keys = std::shared_ptr<uint64_t[]>(p, [](uint64_t *q) { std::free(q); });
        for (size_t i = 0; i < n; ++i) level.keys[i] = i < keys.size() ? keys[i] : UINT64_MAX;
        return level;
    }

    size_t size_ = 0;
    std::vector<Level> levels_;  // [0]: the keys; the last: one block
};

}  // namespace ferry
