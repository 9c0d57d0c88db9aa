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
    const RegionTransportKey *key_for(std::string_view transport) const;
};

struct SegmentDescriptor {
    std::string name;
    std::string host_id;
    uint64_t generation = 0;  // changes whenever regions change
    std::vector<TransportEndpoint> transports;
    std::vector<RegionDescriptor> regions;  // sorted by addr, non-overlapping
    std::string control;                    // "ip:port" of the engine's control server; empty from older engines
    // regions[i].addr, dense: find_region's binary search then reads 8 bytes a step instead of a
    // whole RegionDescriptor (100k regions: 0.8 MB instead of 6.4 MB). Set by decode_descriptor
    // and index(); find_region searches `regions` itself when the sizes differ.
    std::vector<uint64_t> starts;
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

}  // namespace ferry
