// Segment descriptor: everything a peer needs to move bytes to or from an engine: its host
// identity, each transport's endpoint bytes, and every registered region with each transport's
// remote-access bytes. Encoded in a versioned little-endian format; the decoder is
// bounds-checked and rejects anything inconsistent.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/result.hpp"
#include "util/start_index.hpp"

namespace ferry {

struct TransportEndpoint {
    std::string transport;
    std::vector<uint8_t> endpoint;
};

struct RegionTransportKey {
    std::string transport;
    std::vector<uint8_t> key;  // export_mem bytes
};

struct RegionDescriptor {
    uint64_t addr = 0;
    uint64_t length = 0;
    uint32_t kind = 0;
    int32_t device = -1;
    uint32_t access = 0;
    std::vector<RegionTransportKey> keys;

    uint64_t end() const { return addr + length; }
    // All of [a, a + len) lies inside.
    bool holds(uint64_t a, uint64_t len) const { return a >= addr && len <= length && a - addr <= length - len; }
    const RegionTransportKey *key_for(std::string_view transport) const;
};

struct SegmentDescriptor {
    std::string name;
    std::string host_id;
    uint64_t generation = 0;  // changes whenever regions change
    std::vector<TransportEndpoint> transports;
    std::vector<RegionDescriptor> regions;  // sorted by addr, non-overlapping
    std::string control;                    // "ip:port" of the engine's control server; empty from older engines
    // regions[i].addr in a cache-friendly search index (start_index.hpp): find_region then
    // reads about one cache line of starts per level instead of a whole RegionDescriptor per
    // binary-search step. Set by decode_descriptor and index(); find_region searches `regions`
    // itself when the sizes differ.
    StartIndex starts;
    void index();

    const TransportEndpoint *endpoint_for(std::string_view transport) const;
    // Region holding all of [addr, addr+length), or nullptr.
    const RegionDescriptor *find_region(uint64_t addr, uint64_t length) const;
};

inline constexpr uint32_t kDescriptorMagic = 0x46525344;  // "FRSD"
inline constexpr uint16_t kDescriptorVersion = 1;
// Header flag: the control address follows the regions (readers without it saw no flags).
inline constexpr uint16_t kDescriptorHasControl = 1;
// Limits the decoder enforces: a peer cannot make us allocate without bound.
inline constexpr size_t kMaxDescriptorBytes = 64u << 20;
inline constexpr size_t kMaxNameBytes = 1024;
inline constexpr size_t kMaxBlobBytes = 64u << 10;
inline constexpr size_t kMaxTransports = 64;
inline constexpr size_t kMaxRegions = 1u << 20;

std::vector<uint8_t> encode_descriptor(const SegmentDescriptor &descriptor);
Result<SegmentDescriptor> decode_descriptor(std::span<const uint8_t> bytes);

// A descriptor stored in parts (etcd: one key per part, all written by one transaction and read
// at one revision): a header, which is the descriptor without its regions (version 2: where
// version 1 lists the regions it says how many chunks and regions there are in all), and chunks
// of regions. A reader of version 1 refuses the header with "upgrade the older side".
inline constexpr uint16_t kDescriptorPartsVersion = 2;
inline constexpr uint32_t kChunkMagic = 0x43525346;  // "FSRC"
inline constexpr uint16_t kChunkVersion = 1;
struct DescriptorHeader {
    SegmentDescriptor descriptor;  // regions empty
    uint64_t epoch = 0;            // which set of chunks is this header's (the store's key names say)
    uint32_t chunks = 0;
    uint32_t regions = 0;
};
std::vector<uint8_t> encode_descriptor_header(const SegmentDescriptor &descriptor, uint64_t epoch, uint32_t chunks,
                                              uint32_t regions);
Result<DescriptorHeader> decode_descriptor_header(std::span<const uint8_t> bytes);
std::vector<uint8_t> encode_region_chunk(std::span<const RegionDescriptor *const> regions);
// Reads a chunk's header (magic, `version`, flags, region count) for both chunk versions:
// nullptr, or what is wrong with it. *count is meaningful only on success.
class ByteReader;
const char *read_chunk_header(ByteReader &r, uint16_t version, uint32_t *count);
// Appends the chunk's regions to `out` (sorted and non-overlapping within the chunk).
Result<void> decode_region_chunk(std::span<const uint8_t> bytes, std::vector<RegionDescriptor> &out);
// The header's descriptor with every chunk's regions: checks the counts and sorts the regions.
Result<SegmentDescriptor> assemble_descriptor(DescriptorHeader header, std::vector<RegionDescriptor> regions,
                                              size_t chunks);

}  // namespace ferry
