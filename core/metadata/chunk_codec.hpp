// The chunks of a descriptor stored in parts (descriptor_parts.hpp), version 2: each region as
// what differs from the region before it, so a run of like regions (a KV cache's blocks: one
// size, kind and set of keys, in address order) costs a byte or two each instead of ~50. etcd's
// JSON gateway spends its time on bytes (docs/PERFORMANCE.md, "Batch registration over etcd"), and
// etcd keeps every revision's values until compaction. Version 1 chunks (descriptor.hpp) are still
// read. A region never takes more than in version 1 (a varint is at most 10 bytes, and lengths
// and counts take 1-3 where version 1 takes 4).
//
// Version 2, after the chunk header of version 1 (magic, version, flags 0, region count), per
// region a tag byte and what it announces, each number a LEB128 varint:
//   kGap     addr - (end of the region before; 0 for the first)      else 0: it follows at once
//   kLength  length                                                 else the one before's
//   kAttrs   kind, device (zigzag), access                          else the one before's
//   kKeys    key count, then per key: name length, name, key length, key    else the one before's
// (the "one before" of the first region is empty: length 0, kind 0, device -1, access 0, no
// keys). Regions come in address order and never overlap, by construction.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "metadata/descriptor.hpp"

namespace ferry {

inline constexpr uint16_t kChunkVersionDeltas = 2;
// What the regions of one descriptor's chunks may decode to (counted as region_bytes), across all
// its chunks: "the same keys as before" multiplies what a store holds, so a hostile store could
// otherwise make a reader allocate far more than it sent.
inline constexpr size_t kMaxDecodedRegionBytes = 256u << 20;

// A region's size in a version 1 chunk.
size_t region_bytes(const RegionDescriptor &r);

// The chunk in version 2.
std::vector<uint8_t> encode_parts_chunk(std::span<const RegionDescriptor *const> regions);
// Appends a chunk's regions (version 1 or 2) to `out`. `budget` is what decoded regions may still
// take (region_bytes each); it shrinks by what this chunk took.
Result<void> decode_parts_chunk(std::span<const uint8_t> bytes, std::vector<RegionDescriptor> &out, size_t &budget);

}  // namespace ferry
