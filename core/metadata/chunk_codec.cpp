#include "metadata/chunk_codec.hpp"

#include <cerrno>
#include <string_view>

#include "util/byte_codec.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

enum : uint8_t { kGap = 1, kLength = 2, kAttrs = 4, kKeys = 8 };

void put_varint(ByteWriter &w, uint64_t v) {
    for (; v >= 0x80; v >>= 7) w.u8(static_cast<uint8_t>(v | 0x80));
    w.u8(static_cast<uint8_t>(v));
}

// A bounds-checked cursor over a version 2 chunk: every read reports failure instead of reading
// past the end.
class Cursor {
public:
    explicit Cursor(std::span<const uint8_t> in) : in_(in) {}
    size_t remaining() const { return in_.size() - pos_; }
    bool u8(uint8_t &v) {
        if (pos_ == in_.size()) return false;
        v = in_[pos_++];
        return true;
    }
    bool varint(uint64_t &v) {
        v = 0;
        for (int shift = 0; shift < 64; shift += 7) {
            uint8_t b;
            if (!u8(b)) return false;
            if (shift == 63 && b > 1) return false;  // past 64 bits
            v |= static_cast<uint64_t>(b & 0x7f) << shift;
            if (!(b & 0x80)) return true;
        }
        return false;
    }
    // A varint length and that many bytes (at most `max`) into `out`.
    template <class Out>
    bool blob(Out &out, size_t max) {
        uint64_t n;
        if (!varint(n) || n > max || n > remaining()) return false;
        const auto *p = reinterpret_cast<const typename Out::value_type *>(in_.data() + pos_);
        out.assign(p, p + n);
        pos_ += n;
        return true;
    }

private:
    std::span<const uint8_t> in_;
    size_t pos_ = 0;
};

uint64_t zigzag(int32_t v) { return (static_cast<uint32_t>(v) << 1) ^ static_cast<uint32_t>(v >> 31); }
int32_t unzigzag(uint32_t z) { return static_cast<int32_t>((z >> 1) ^ (0u - (z & 1))); }

bool same_attrs(const RegionDescriptor &a, const RegionDescriptor &b) {
    return a.kind == b.kind && a.device == b.device && a.access == b.access;
}

bool same_keys(const RegionDescriptor &a, const RegionDescriptor &b) {
    if (a.keys.size() != b.keys.size()) return false;
    for (size_t i = 0; i < a.keys.size(); ++i)
        if (a.keys[i].transport != b.keys[i].transport || a.keys[i].key != b.keys[i].key) return false;
    return true;
}

const RegionDescriptor kNone{};  // what the first region is told apart from

// One region of a version 2 chunk after `prev`; nullptr or why it is refused.
const char *read_region(Cursor &c, const RegionDescriptor &prev, RegionDescriptor &reg) {
    uint8_t tag;
    if (!c.u8(tag)) return "truncated region";
    if (tag & ~(kGap | kLength | kAttrs | kKeys)) return "unknown region flags";
    uint64_t gap = 0, v;
    if ((tag & kGap) && !c.varint(gap)) return "truncated address";
    if (gap > UINT64_MAX - prev.end()) return "address wraps";
    reg.addr = prev.end() + gap;
    reg.length = prev.length;
    if ((tag & kLength) && !c.varint(reg.length)) return "truncated length";
    if (reg.length == 0 || reg.addr + reg.length < reg.addr) return "region wraps or is empty";
    reg.kind = prev.kind;
    reg.device = prev.device;
    reg.access = prev.access;
    if (tag & kAttrs) {
        if (!c.varint(v) || v > 2) return "unknown memory kind";
        reg.kind = static_cast<uint32_t>(v);
        if (!c.varint(v) || v > UINT32_MAX) return "bad device";
        reg.device = unzigzag(static_cast<uint32_t>(v));
        if (!c.varint(v) || v > UINT32_MAX) return "bad access";
        reg.access = static_cast<uint32_t>(v);
    }
    if (!(tag & kKeys)) {
        reg.keys = prev.keys;
        return nullptr;
    }
    if (!c.varint(v) || v > kMaxTransports) return "bad key count";
    reg.keys.resize(v);
    for (auto &k : reg.keys)
        if (!c.blob(k.transport, kMaxNameBytes) || !c.blob(k.key, kMaxBlobBytes)) return "truncated region key";
    return nullptr;
}

}  // namespace

size_t region_bytes(const RegionDescriptor &r) {
    size_t n = 36;  // addr, length, kind, device, access, key count
    for (const auto &k : r.keys) n += 8 + k.transport.size() + k.key.size();
    return n;
}

std::vector<uint8_t> encode_parts_chunk(std::span<const RegionDescriptor *const> regions) {
    ByteWriter w;
    w.u32(kChunkMagic);
    w.u16(kChunkVersionDeltas);
    w.u16(0);
    w.u32(static_cast<uint32_t>(regions.size()));
    const RegionDescriptor *prev = &kNone;
    for (const auto *r : regions) {
        uint8_t tag = (r->addr != prev->end() ? kGap : 0) | (r->length != prev->length ? kLength : 0) |
                      (same_attrs(*r, *prev) ? 0 : kAttrs) | (same_keys(*r, *prev) ? 0 : kKeys);
        w.u8(tag);
        if (tag & kGap) put_varint(w, r->addr - prev->end());
        if (tag & kLength) put_varint(w, r->length);
        if (tag & kAttrs) {
            put_varint(w, r->kind);
            put_varint(w, zigzag(r->device));
            put_varint(w, r->access);
        }
        if (tag & kKeys) {
            put_varint(w, r->keys.size());
            for (const auto &k : r->keys) {
                put_varint(w, k.transport.size());
                for (char c : k.transport) w.u8(static_cast<uint8_t>(c));
                put_varint(w, k.key.size());
                for (uint8_t b : k.key) w.u8(b);
            }
        }
        prev = r;
    }
    return w.take();
}

Result<void> decode_parts_chunk(std::span<const uint8_t> bytes, std::vector<RegionDescriptor> &out, size_t &budget) {
    auto bad = [&](const char *what) {
        return fail(-EPROTO, cat("malformed chunk of a segment descriptor (", bytes.size(), " bytes): ", what,
                                 "; the peer runs an incompatible or broken Ferry"));
    };
    const size_t first = out.size();
    if (bytes.size() >= 6 && bytes[4] == kChunkVersion && bytes[5] == 0) {
        if (auto r = decode_region_chunk(bytes, out); !r) return r;
        size_t took = 0;
        for (size_t i = first; i < out.size(); ++i) took += region_bytes(out[i]);
        if (took > budget) {
            out.resize(first);
            return bad("the descriptor's regions decode to more than 256 MiB");
        }
        budget -= took;
        return {};
    }
    if (bytes.size() > kMaxDescriptorBytes) return bad("larger than 64 MiB");
    ByteReader header(bytes);
    uint32_t n;
    if (const char *why = read_chunk_header(header, kChunkVersionDeltas, &n)) return bad(why);
    Cursor c(bytes.subspan(header.position()));
    // Every region takes at least its tag byte.
    if (n > c.remaining() || first + n > kMaxRegions) return bad("region count exceeds the data");
    size_t left = budget;
    const char *why = nullptr;
    for (uint32_t i = 0; i < n && !why; ++i) {
        RegionDescriptor reg;
        why = read_region(c, out.size() > first ? out.back() : kNone, reg);
        if (!why && region_bytes(reg) > left) why = "the descriptor's regions decode to more than 256 MiB";
        if (why) break;
        left -= region_bytes(reg);
        out.push_back(std::move(reg));
    }
    if (!why && c.remaining() != 0) why = "trailing bytes";
    if (why) {
        out.resize(first);
        return bad(why);
    }
    budget = left;
    return {};
}

}  // namespace ferry
