#include "metadata/descriptor_parts.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <random>

#include "metadata/chunk_codec.hpp"

namespace ferry {
namespace {

std::string hex16(uint64_t v) {
    char buf[17];
    std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
    return buf;
}

// Epochs differ between processes publishing under the same name (a restarted engine whose old
// lease still runs): random, then counted up.
uint64_t first_epoch() {
    std::random_device rd;
    uint64_t e = (uint64_t{rd()} << 32) ^ rd() ^
                 static_cast<uint64_t>(std::chrono::steady_clock::now().time_since_epoch().count());
    return e & 0x7fffffffffffffffull;
}

}  // namespace

DescriptorParts::DescriptorParts(std::string header_key) : header_key_(std::move(header_key)), epoch_(first_epoch()) {
    bounds_[0] = next_id_;
    sizes_[next_id_++] = 0;
}

std::string DescriptorParts::chunk_key(uint64_t epoch, uint64_t id) const {
    return header_key_ + '\0' + hex16(epoch) + '/' + hex16(id);
}

void DescriptorParts::reset(const SegmentDescriptor &d) {
    base_ = d;
    base_.regions.clear();
    base_.starts = {};
    regions_.clear();
    for (const auto &r : d.regions) {
        regions_.emplace(r.addr, r);
        max_region_bytes_ = std::max(max_region_bytes_, region_bytes(r));
    }
    header_bytes_ = encode_descriptor_header(base_, 0, 0, 0).size();
    // Chunks half full, so registering next to any region splits nothing at first.
    bounds_.clear();
    sizes_.clear();
    bounds_[0] = next_id_;
    sizes_[next_id_++] = 0;
    for (const auto &[addr, r] : regions_) {
        auto &size = sizes_[std::prev(bounds_.end())->second];
        if (size == kChunkRegions / 2) {
            bounds_[addr] = next_id_;
            sizes_[next_id_++] = 1;
        } else {
            ++size;
        }
    }
    rewrite_all();
}

void DescriptorParts::rewrite_all() {
    ++epoch_;
    dirty_.clear();
    gone_.clear();
    for (const auto &[lo, id] : bounds_) dirty_.insert(id);
    header_dirty_ = true;
    rewriting_ = true;
}

void DescriptorParts::apply(const RegionChange &c) {
    header_dirty_ = true;
    auto bound = std::prev(bounds_.upper_bound(c.addr));
    uint64_t id = bound->second;
    if (!c.region) {
        if (regions_.erase(c.addr) == 0) return;
        if (--sizes_[id] == 0 && bound->first != 0) {
            // An empty chunk goes; its range joins the chunk below, which holds the same regions.
            sizes_.erase(id);
            bounds_.erase(bound);
            dirty_.erase(id);
            gone_.insert(id);  // during a rewrite it may have gone out already in the new epoch
            return;
        }
        dirty_.insert(id);
        return;
    }
    auto [it, fresh] = regions_.insert_or_assign(c.addr, *c.region);
    max_region_bytes_ = std::max(max_region_bytes_, region_bytes(*c.region));
    dirty_.insert(id);
    if (!fresh || ++sizes_[id] <= kChunkRegions) return;
    // Full: its upper half becomes a new chunk (both written in the same transaction). A region
    // added above all of its chunk's starts a chunk of its own instead, so that registering in
    // address order (a KV cache's blocks) leaves full chunks, not half full ones.
    auto next = std::next(bound);
    auto after = std::next(it);
    bool last = after == regions_.end() || (next != bounds_.end() && after->first >= next->first);
    auto r = it;
    if (!last) {
        r = regions_.lower_bound(bound->first);
        for (size_t i = 0; i < sizes_[id] / 2; ++i) ++r;
    }
    uint64_t fresh_id = next_id_++;
    size_t moved = 0;
    for (auto m = r; m != regions_.end() && (next == bounds_.end() || m->first < next->first); ++m) ++moved;
    bounds_[r->first] = fresh_id;
    sizes_[fresh_id] = moved;
    sizes_[id] -= moved;
    dirty_.insert(fresh_id);
}

bool DescriptorParts::room_for(const RegionChange &change, size_t max_ops, size_t max_bytes) const {
    if (pending_ops() == 0) return true;
    size_t region = std::max(max_region_bytes_, change.region ? region_bytes(*change.region) : 0);
    size_t chunk = 12 + (kChunkRegions + 1) * region;
    return pending_ops() + 2 <= max_ops && (dirty_.size() + 2) * chunk + header_bytes_ <= max_bytes;
}

Result<void> DescriptorParts::apply_all(std::span<const RegionChange> changes, size_t max_ops, size_t max_bytes,
                                        const Commit &commit) {
    if (!commit) {
        for (const auto &c : changes) apply(c);
        return {};
    }
    Result<void> result;
    // What waits is whole changes within the limits (room_for), so it goes as one transaction;
    // a single change larger than the limits goes whole too (torn, a reader could not resolve it).
    auto flush = [&] {
        while (result && pending()) {
            auto w = rewriting_ ? take(max_ops, max_bytes) : take(SIZE_MAX, SIZE_MAX);
            if (auto r = commit(w); !r) result = r;
        }
    };
    for (const auto &c : changes) {
        if (!room_for(c, max_ops, max_bytes)) flush();
        apply(c);
    }
    flush();
    return result;
}

std::vector<uint8_t> DescriptorParts::encode_chunk(std::map<uint64_t, uint64_t>::const_iterator bound) const {
    auto next = std::next(bound);
    std::vector<const RegionDescriptor *> in;
    for (auto r = regions_.lower_bound(bound->first);
         r != regions_.end() && (next == bounds_.end() || r->first < next->first); ++r)
        in.push_back(&r->second);
    return encode_parts_chunk(in);
}

DescriptorParts::Write DescriptorParts::take(size_t max_ops, size_t max_bytes) {
    Write w;
    // Chunk ids to their bounds, for the dirty ones.
    std::map<uint64_t, std::map<uint64_t, uint64_t>::const_iterator> where;
    for (auto b = bounds_.cbegin(); b != bounds_.cend(); ++b)
        if (dirty_.count(b->second)) where.emplace(b->second, b);
    while (!dirty_.empty() && (w.puts.empty() || (w.puts.size() + w.deletes.size() < max_ops && w.bytes < max_bytes))) {
        uint64_t id = *dirty_.begin();
        dirty_.erase(dirty_.begin());
        auto value = encode_chunk(where.at(id));
        w.bytes += value.size();
        w.puts.emplace_back(chunk_key(epoch_, id), std::move(value));
    }
    while (!gone_.empty() && w.puts.size() + w.deletes.size() < max_ops) {
        std::string key = chunk_key(epoch_, *gone_.begin());
        gone_.erase(gone_.begin());
        w.deletes.emplace_back(key, key + '\0');
    }
    if (rewriting_ && pending_ops() > 0) return w;  // the header once every chunk of the epoch is out
    if (rewriting_) {
        // Every other epoch's chunks go with the header that stops naming them.
        std::string first = header_key_ + '\0', mine = header_key_ + '\0' + hex16(epoch_) + '/';
        std::string after_mine = header_key_ + '\0' + hex16(epoch_) + '0';  // '/' + 1
        w.deletes.emplace_back(first, mine);
        w.deletes.emplace_back(after_mine, header_key_ + '\x01');
        rewriting_ = false;
    }
    auto header = encode_descriptor_header(base_, epoch_, static_cast<uint32_t>(bounds_.size()),
                                           static_cast<uint32_t>(regions_.size()));
    w.bytes += header.size();
    w.puts.emplace_back(header_key_, std::move(header));
    header_dirty_ = false;
    return w;
}

Result<SegmentDescriptor> assemble_parts(const std::string &header_key,
                                         const std::vector<std::pair<std::string, std::vector<uint8_t>>> &kvs) {
    const std::vector<uint8_t> *header_bytes = nullptr;
    for (const auto &[k, v] : kvs)
        if (k == header_key) header_bytes = &v;
    if (!header_bytes) return fail(-ENOENT, "no header");
    // An older Ferry's whole descriptor under the header key.
    if (header_bytes->size() >= 6 && (*header_bytes)[4] == kDescriptorVersion && (*header_bytes)[5] == 0)
        return decode_descriptor(*header_bytes);
    auto header = decode_descriptor_header(*header_bytes);
    if (!header) return std::unexpected(header.error());
    const std::string mine = header_key + '\0' + hex16(header->epoch) + '/';
    std::vector<RegionDescriptor> regions;
    regions.reserve(header->regions);
    size_t chunks = 0, budget = kMaxDecodedRegionBytes;
    for (const auto &[k, v] : kvs) {
        if (k.size() <= mine.size() || k.compare(0, mine.size(), mine) != 0) continue;
        if (++chunks > header->chunks) break;  // assemble_descriptor says what is wrong
        if (auto c = decode_parts_chunk(v, regions, budget); !c) return std::unexpected(c.error());
    }
    return assemble_descriptor(std::move(*header), std::move(regions), chunks);
}

}  // namespace ferry
