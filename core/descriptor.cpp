#include "descriptor.hpp"

#include <algorithm>
#include <cerrno>

#include "byte_codec.hpp"
#include "log.hpp"

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
    starts.resize(regions.size());
    for (size_t i = 0; i < regions.size(); ++i) starts[i] = regions[i].addr;
}

const RegionDescriptor *SegmentDescriptor::find_region(uint64_t addr, uint64_t length) const {
    // Last region starting at or below addr.
    size_t after;
    if (starts.size() == regions.size()) {
        after = static_cast<size_t>(std::upper_bound(starts.begin(), starts.end(), addr) - starts.begin());
    } else {
        after = static_cast<size_t>(std::upper_bound(regions.begin(), regions.end(), addr,
                                                     [](uint64_t a, const RegionDescriptor &r) { return a < r.addr; }) -
                                    regions.begin());
    }
    if (after == 0) return nullptr;
    const RegionDescriptor &r = regions[after - 1];
    if (addr < r.addr || length > r.length || addr - r.addr > r.length - length) return nullptr;
    return &r;
}

std::vector<uint8_t> encode_descriptor(const SegmentDescriptor &d) {
    ByteWriter w;
    w.u32(kDescriptorMagic);
    w.u16(kDescriptorVersion);
    w.u16(d.control.empty() ? 0 : kDescriptorHasControl);
    w.str(d.name);
    w.str(d.host_id);
    w.u64(d.generation);
    w.u32(static_cast<uint32_t>(d.transports.size()));
    for (const auto &t : d.transports) {
        w.str(t.transport);
        w.bytes(t.endpoint);
    }
    w.u32(static_cast<uint32_t>(d.regions.size()));
    for (const auto &r : d.regions) {
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
    if (!d.control.empty()) w.str(d.control);
    return w.take();
}

Result<SegmentDescriptor> decode_descriptor(std::span<const uint8_t> bytes) {
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
    if (version != kDescriptorVersion)
        return fail(-EPROTONOSUPPORT,
                    cat("segment descriptor version ", version, " is not supported (this Ferry reads version ",
                        kDescriptorVersion, "); upgrade the older side"));
    SegmentDescriptor d;
    uint32_t n_transports, n_regions;
    if (!r.str(d.name, kMaxNameBytes) || !r.str(d.host_id, kMaxNameBytes) || !r.u64(d.generation))
        return bad("truncated name, host id or generation");
    if (!r.u32(n_transports) || n_transports > kMaxTransports) return bad("bad transport count");
    d.transports.resize(n_transports);
    for (auto &t : d.transports)
        if (!r.str(t.transport, kMaxNameBytes) || !r.bytes(t.endpoint, kMaxBlobBytes))
            return bad("truncated transport endpoint");
    if (!r.u32(n_regions) || n_regions > kMaxRegions) return bad("bad region count");
    // Each region takes at least 36 bytes: a count larger than the bytes left is a lie.
    if (n_regions > r.remaining() / 36) return bad("region count exceeds the data");
    d.regions.resize(n_regions);
    for (auto &reg : d.regions) {
        uint32_t n_keys;
        if (!r.u64(reg.addr) || !r.u64(reg.length) || !r.u32(reg.kind) || !r.i32(reg.device) || !r.u32(reg.access) ||
            !r.u32(n_keys))
            return bad("truncated region");
        if (reg.length == 0 || reg.addr + reg.length < reg.addr) return bad("region wraps or is empty");
        if (reg.kind > 2) return bad("unknown memory kind");
        if (n_keys > kMaxTransports) return bad("bad key count");
        reg.keys.resize(n_keys);
        for (auto &k : reg.keys)
            if (!r.str(k.transport, kMaxNameBytes) || !r.bytes(k.key, kMaxBlobBytes))
                return bad("truncated region key");
    }
    if (flags & ~kDescriptorHasControl) return bad("unknown header flags");
    if ((flags & kDescriptorHasControl) && (!r.str(d.control, kMaxNameBytes) || d.control.empty()))
        return bad("truncated control address");
    if (r.remaining() != 0) return bad("trailing bytes");
    for (size_t i = 1; i < d.regions.size(); ++i)
        if (d.regions[i].addr < d.regions[i - 1].end()) return bad("regions unsorted or overlapping");
    d.index();
    return d;
}

}  // namespace ferry
