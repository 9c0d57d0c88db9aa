// A segment descriptor kept in a key-value store (etcd) in parts, so that registering a region
// rewrites one small chunk instead of the whole descriptor (O(1) per register, and no limit from
// the store's largest value: etcd's 1.5 MiB request capped a whole descriptor at ~15-20k regions).
//
// Keys, for a segment whose header key is H (<prefix>/segments/<name>):
//   H                           the header (descriptor.hpp: version 2, the descriptor without its
//                               regions, with its epoch and how many chunks and regions it has)
//   H \0 <epoch:16 hex> / <id:16 hex>   a chunk: up to kChunkRegions regions adjacent in address
//                               (chunk_codec.hpp: each region as what differs from the one before)
// A writer puts the chunks a change touched together with the header in one transaction, and a
// reader reads [H, H\x01) at one revision, so it sees the descriptor after some whole change, never
// a torn one; the header's counts are checked against the chunks found. Chunks split when they
// grow past kChunkRegions and go when they empty. Writing everything again (a new lease after etcd
// lost ours) uses a new epoch: the chunks go first, invisible to readers, and the header last,
// with the old epoch's keys deleted in the same transaction.
#pragma once

#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "metadata/descriptor.hpp"
#include "metadata/metadata.hpp"

namespace ferry {

// 128: 100k regions registered in address order are ~800 keys (etcd charges per key and per byte,
// docs/PERFORMANCE.md "Batch registration over etcd"), and a single register rewrites 128 regions.
inline constexpr size_t kChunkRegions = 128;

class DescriptorParts {
public:
    // One transaction's worth: keys to put and key ranges [first, second) to delete.
    struct Write {
        std::vector<std::pair<std::string, std::vector<uint8_t>>> puts;
        std::vector<std::pair<std::string, std::string>> deletes;
        size_t bytes = 0;
    };

    explicit DescriptorParts(std::string header_key);

    const std::string &header_key() const { return header_key_; }
    // Everything anew (the first publish, or the store lost our keys): a new epoch, every chunk
    // to be written, the header last.
    void reset(const SegmentDescriptor &descriptor);
    // Everything again from what is held (same regions, new epoch).
    void rewrite_all();
    void apply(const RegionChange &change);
    // Applies `changes` in order and hands `commit` each transaction's worth as it fills, and what
    // is left at the end: every one ends between two changes, so each leaves a whole descriptor
    // (a reader at any revision can resolve it), and holds at most `max_ops` chunk operations (the
    // header comes on top) and about `max_bytes` of values, however many changes there are. After
    // a commit fails (or with no `commit`) the rest is applied but not committed, and that failure
    // is returned.
    using Commit = std::function<Result<void>(const Write &)>;
    Result<void> apply_all(std::span<const RegionChange> changes, size_t max_ops, size_t max_bytes,
                           const Commit &commit);
    void set_generation(uint64_t generation) { base_.generation = generation; }

    // Chunk writes and deletes waiting.
    size_t pending_ops() const { return dirty_.size() + gone_.size(); }
    bool pending() const { return pending_ops() > 0 || header_dirty_; }
    // Takes what is waiting, up to about `max_ops` operations and `max_bytes` of values (at least
    // one chunk). The header comes with it unless a rewrite still has chunks to go.
    Write take(size_t max_ops, size_t max_bytes);

    size_t regions() const { return regions_.size(); }
    size_t chunks() const { return bounds_.size(); }

private:
    // Whether `change` can join what is waiting without passing the limits: a change rewrites at
    // most two chunks (one that splits), each of at most kChunkRegions + 1 regions no larger than
    // the largest region seen (region_bytes, the version 1 size, bounds the version 2 one). True
    // when nothing waits (one change is one transaction).
    bool room_for(const RegionChange &change, size_t max_ops, size_t max_bytes) const;
    std::string chunk_key(uint64_t epoch, uint64_t id) const;
    std::vector<uint8_t> encode_chunk(std::map<uint64_t, uint64_t>::const_iterator bound) const;

    std::string header_key_;
    SegmentDescriptor base_;  // regions empty
    std::map<uint64_t, RegionDescriptor> regions_;
    std::map<uint64_t, uint64_t> bounds_;  // chunk's lowest address -> chunk id; the first is at 0
    std::map<uint64_t, size_t> sizes_;     // chunk id -> regions in it
    std::set<uint64_t> dirty_;             // chunk ids to put
    std::set<uint64_t> gone_;              // chunk ids to delete
    uint64_t next_id_ = 1;
    uint64_t epoch_ = 0;
    size_t max_region_bytes_ = 0;  // largest encoded region seen (never lowered)
    size_t header_bytes_ = 0;      // the encoded header (only its generation changes later)
    bool header_dirty_ = false;
    bool rewriting_ = false;  // the chunks of a new epoch are going out; the header waits for them
};

// The descriptor from the keys read in [H, H\x01) at one revision (any order): the header's
// epoch's chunks, checked against its counts. A header of version 1 (an older Ferry's whole
// descriptor) is read as it is.
Result<SegmentDescriptor> assemble_parts(const std::string &header_key,
                                         const std::vector<std::pair<std::string, std::vector<uint8_t>>> &kvs);

}  // namespace ferry
