#include "metadata/descriptor.hpp"

#include <algorithm>
#include <cerrno>

#include "util/byte_codec.hpp"
#include "util/log.hpp"

namespace ferry {

const RegionTransportKey *RegionDescriptor::key_for(std::string_view transport) const {
    for (const auto &k : keys)
        if (k.transport == transport) return &k;
    return nullptr;
}

const TransportEndpoint *SegmentDescriptor::endpoint_for(std::string_view transport) const {
    for (const auto &t : transports)
        if (t.transport == transport) return &t;
    return nullptr;
}

void SegmentDescriptor::index() {
    std::vector<uint64_t> addrs(regions.size());
    for (size_t i = 0; i < regions.size(); ++i) addrs[i] = regions[i].addr;
    starts.build(addrs);
}

const RegionDescriptor *SegmentDescriptor::find_region(uint64_t addr, uint64_t length) const {
    // Last region starting at or below addr.
    size_t after;
    if (starts.size() == regions.size()) {
        after = starts.upper_bound(addr);
    } else {
        after = static_cast<size_t>(std::upper_bound(regions.begin(), regions.end(), addr,
                                                     [](uint64_t a, const RegionDescriptor &r) { return a < r.addr; }) -
                                    regions.begin());
    }
    if (after == 0) return nullptr;
    const RegionDescriptor &r = regions[after - 1];
    return r.holds(addr, length) ? &r : nullptr;
}

namespace {

void write_region(ByteWriter &w, const RegionDescriptor &r) {
    w.u64(r.addr);
    w.u64(r.length);
    w.u32(r.kind);
    w.i32(r.device);
    w.u32(r.access);
    w.u32(static_cast<uint32_t>(r.keys.size()));
    for (const auto &k : r.keys) {
        w.str(k.transport);
        w.bytes(k.key);
    }
}

// What a region's refusal says, or nullptr.
const char *read_region(ByteReader &r, RegionDescriptor &reg) {
    uint32_t n_keys;
    if (!r.u64(reg.addr) || !r.u64(reg.length) || !r.u32(reg.kind) || !r.i32(reg.device) || !r.u32(reg.access) ||
        !r.u32(n_keys))
        return "truncated region";
    if (reg.length == 0 || reg.addr + reg.length < reg.addr) return "region wraps or is empty";
    if (reg.kind > 2) return "unknown memory kind";
    if (n_keys > kMaxTransports) return "bad key count";
    reg.keys.resize(n_keys);
    for (auto &k : reg.keys)
        if (!r.str(k.transport, kMaxNameBytes) || !r.bytes(k.key, kMaxBlobBytes)) return "truncated region key";
    return nullptr;
}

const char *check_sorted(const std::vector<RegionDescriptor> &regions, size_t from) {
    for (size_t i = std::max<size_t>(from, 1); i < regions.size(); ++i)
        if (regions[i].addr < regions[i - 1].end()) return "regions unsorted or overlapping";
    return nullptr;
}

// Version 1 lists the regions; the parts header (version 2) gives the chunk and region counts.
void write_descriptor(ByteWriter &w, const SegmentDescriptor &d, uint16_t version, uint64_t epoch, uint32_t chunks,
                      uint32_t regions) {
    w.u32(kDescriptorMagic);
    w.u16(version);
    w.u16(d.control.empty() ? 0 : kDescriptorHasControl);
    w.str(d.name);
    w.str(d.host_id);
    w.u64(d.generation);
    w.u32(static_cast<uint32_t>(d.transports.size()));
    for (const auto &t : d.transports) {
        w.str(t.transport);
        w.bytes(t.endpoint);
    }
    if (version == kDescriptorVersion) {
        w.u32(static_cast<uint32_t>(d.regions.size()));
        for (const auto &r : d.regions) write_region(w, r);
    } else {
        w.u64(epoch);
        w.u32(chunks);
        w.u32(regions);
    }
    if (!d.control.empty()) w.str(d.control);
}

Result<DescriptorHeader> read_descriptor(std::span<const uint8_t> bytes, uint16_t want) {
    auto bad = [&](const char *what) {
        return fail(-EPROTO, cat("malformed segment descriptor (", bytes.size(), " bytes): ", what,
                                 "; the peer runs an incompatible or broken Ferry"));
    };
    if (bytes.size() > kMaxDescriptorBytes) return bad("larger than 64 MiB");
    ByteReader r(bytes);
    uint32_t magic;
    uint16_t version, flags;
    if (!r.u32(magic) || magic != kDescriptorMagic) return bad("bad magic");
    if (!r.u16(version) || !r.u16(flags)) return bad("truncated header");
    if (version != want)
        return fail(-EPROTONOSUPPORT,
                    version == kDescriptorPartsVersion || want == kDescriptorPartsVersion
                        ? cat("segment descriptor version ", version, " where version ", want,
                              " was expected (version 2 is a descriptor stored in parts, by etcd); both sides must "
                              "run the same metadata backend, and an older Ferry reading etcd must be upgraded")
                        : cat("segment descriptor version ", version, " is not supported (this Ferry reads version ",
                              kDescriptorVersion, "); upgrade the older side"));
    DescriptorHeader h;
    SegmentDescriptor &d = h.descriptor;
    uint32_t n_transports, n_regions;
    if (!r.str(d.name, kMaxNameBytes) || !r.str(d.host_id, kMaxNameBytes) || !r.u64(d.generation))
        return bad("truncated name, host id or generation");
    if (!r.u32(n_transports) || n_transports > kMaxTransports) return bad("bad transport count");
    d.transports.resize(n_transports);
    for (auto &t : d.transports)
        if (!r.str(t.transport, kMaxNameBytes) || !r.bytes(t.endpoint, kMaxBlobBytes))
            return bad("truncated transport endpoint");
    if (want == kDescriptorVersion) {
        if (!r.u32(n_regions) || n_regions > kMaxRegions) return bad("bad region count");
        // Each region takes at least 36 bytes: a count larger than the bytes left is a lie.
        if (n_regions > r.remaining() / 36) return bad("region count exceeds the data");
        d.regions.resize(n_regions);
        for (auto &reg : d.regions)
            if (const char *why = read_region(r, reg)) return bad(why);
    } else {
        if (!r.u64(h.epoch) || !r.u32(h.chunks) || !r.u32(h.regions) || h.regions > kMaxRegions ||
            h.chunks > h.regions + 1)
            return bad("bad chunk or region count");
    }
    if (flags & ~kDescriptorHasControl) return bad("unknown header flags");
    if ((flags & kDescriptorHasControl) && (!r.str(d.control, kMaxNameBytes) || d.control.empty()))
        return bad("truncated control address");
    if (r.remaining() != 0) return bad("trailing bytes");
    if (const char *why = check_sorted(d.regions, 0)) return bad(why);
    d.index();
    return h;
}

}  // namespace

std::vector<uint8_t> encode_descriptor(const SegmentDescriptor &d) {
    ByteWriter w;
    write_descriptor(w, d, kDescriptorVersion, 0, 0, 0);
    return w.take();
}

Result<SegmentDescriptor> decode_descriptor(std::span<const uint8_t> bytes) {
    auto h = read_descriptor(bytes, kDescriptorVersion);
    if (!h) return std::unexpected(h.error());
    return std::move(h->descriptor);
}

std::vector<uint8_t> encode_descriptor_header(const SegmentDescriptor &d, uint64_t epoch, uint32_t chunks,
                                              uint32_t regions) {
    ByteWriter w;
    write_descriptor(w, d, kDescriptorPartsVersion, epoch, chunks, regions);
    return w.take();
}

Result<DescriptorHeader> decode_descriptor_header(std::span<const uint8_t> bytes) {
    return read_descriptor(bytes, kDescriptorPartsVersion);
}

std::vector<uint8_t> encode_region_chunk(std::span<const RegionDescriptor *const> regions) {
    ByteWriter w;
    w.u32(kChunkMagic);
    w.u16(kChunkVersion);
    w.u16(0);
    w.u32(static_cast<uint32_t>(regions.size()));
    for (const auto *r : regions) write_region(w, *r);
    return w.take();
}

const char *read_chunk_header(ByteReader &r, uint16_t version, uint32_t *count) {
    uint32_t magic;
    uint16_t got_version, flags;
    if (!r.u32(magic) || magic != kChunkMagic) return "bad magic";
    if (!r.u16(got_version) || !r.u16(flags) || !r.u32(*count)) return "truncated header";
    if (got_version != version) return "unknown chunk version";
    if (flags != 0) return "unknown flags";
    return nullptr;
}

Result<void> decode_region_chunk(std::span<const uint8_t> bytes, std::vector<RegionDescriptor> &out) {
    auto bad = [&](const char *what) {
        return fail(-EPROTO, cat("malformed chunk of a segment descriptor (", bytes.size(), " bytes): ", what,
                                 "; the peer runs an incompatible or broken Ferry"));
    };
    if (bytes.size() > kMaxDescriptorBytes) return bad("larger than 64 MiB");
    ByteReader r(bytes);
    uint32_t n;
    if (const char *why = read_chunk_header(r, kChunkVersion, &n)) return bad(why);
    if (n > r.remaining() / 36 || out.size() + n > kMaxRegions) return bad("region count exceeds the data");
    size_t first = out.size();
    out.resize(first + n);
    for (size_t i = first; i < out.size(); ++i)
        if (const char *why = read_region(r, out[i])) {
            out.resize(first);
            return bad(why);
        }
    if (r.remaining() != 0 || check_sorted(out, first + 1)) {
        out.resize(first);
        return bad(r.remaining() != 0 ? "trailing bytes" : "regions unsorted or overlapping");
    }
    return {};
}

Result<SegmentDescriptor> assemble_descriptor(DescriptorHeader h, std::vector<RegionDescriptor> regions,
                                              size_t chunks) {
    if (chunks != h.chunks || regions.size() != h.regions)
        return fail(-EPROTO, cat("segment ", h.descriptor.name, "'s descriptor is inconsistent: its header says ",
                                 h.chunks, " chunks and ", h.regions, " regions, the store holds ", chunks, " and ",
                                 regions.size(), "; the peer runs a broken Ferry or something else writes its keys"));
    std::sort(regions.begin(), regions.end(),
              [](const RegionDescriptor &a, const RegionDescriptor &b) { return a.addr < b.addr; });
    if (check_sorted(regions, 0))
        return fail(-EPROTO, cat("segment ", h.descriptor.name, "'s descriptor chunks hold overlapping regions"));
    SegmentDescriptor d = std::move(h.descriptor);
    d.regions = std::move(regions);
    d.index();
    return d;
}

}  // namespace ferry
