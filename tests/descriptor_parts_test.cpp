// A descriptor in parts (core/descriptor_parts.*, core/chunk_codec.*): the version 2 chunk codec
// round trip and its refusals, and that publishing many changes in transactions never leaves the
// store in a state a reader cannot resolve. The store is a std::map that applies each
// transaction's puts and deletes, as etcd does; tests/etcd_test.cpp does the same against etcd.
#include <gtest/gtest.h>

#include <map>
#include <random>

#include "metadata/chunk_codec.hpp"
#include "metadata/descriptor_parts.hpp"

using namespace ferry;

namespace {

using Kvs = std::vector<std::pair<std::string, std::vector<uint8_t>>>;

RegionDescriptor region(uint64_t addr, uint64_t length, std::vector<uint8_t> key = {}) {
    return {addr, length, 0, -1, 3, {{"tcp", {}}, {"rdma", std::move(key)}}};
}

std::vector<RegionDescriptor> round_trip(const std::vector<RegionDescriptor> &in, size_t *size = nullptr) {
    std::vector<const RegionDescriptor *> ptrs;
    for (const auto &r : in) ptrs.push_back(&r);
    auto bytes = encode_parts_chunk(ptrs);
    if (size) *size = bytes.size();
    std::vector<RegionDescriptor> out;
    size_t budget = kMaxDecodedRegionBytes;
    auto r = decode_parts_chunk(bytes, out, budget);
    EXPECT_TRUE(r) << r.error().message;
    return out;
}

void expect_same(const std::vector<RegionDescriptor> &a, const std::vector<RegionDescriptor> &b) {
    ASSERT_EQ(a.size(), b.size());
    for (size_t i = 0; i < a.size(); ++i) {
        EXPECT_EQ(a[i].addr, b[i].addr) << i;
        EXPECT_EQ(a[i].length, b[i].length) << i;
        EXPECT_EQ(a[i].kind, b[i].kind) << i;
        EXPECT_EQ(a[i].device, b[i].device) << i;
        EXPECT_EQ(a[i].access, b[i].access) << i;
        ASSERT_EQ(a[i].keys.size(), b[i].keys.size()) << i;
        for (size_t k = 0; k < a[i].keys.size(); ++k) {
            EXPECT_EQ(a[i].keys[k].transport, b[i].keys[k].transport) << i;
            EXPECT_EQ(a[i].keys[k].key, b[i].keys[k].key) << i;
        }
    }
}

// A transaction applied to the store, as etcd applies one.
void apply(std::map<std::string, std::vector<uint8_t>> &store, const DescriptorParts::Write &w) {
    for (const auto &[from, to] : w.deletes) store.erase(store.lower_bound(from), store.lower_bound(to));
    for (const auto &[k, v] : w.puts) store[k] = v;
}

Result<SegmentDescriptor> read(const std::map<std::string, std::vector<uint8_t>> &store, const std::string &h) {
    Kvs kvs(store.begin(), store.end());
    return assemble_parts(h, kvs);
}

}  // namespace

TEST(ChunkCodec, LikeRegionsTakeAByteOrTwoEachAndComeBackTheSame) {
    std::vector<RegionDescriptor> in;
    for (uint64_t i = 0; i < 128; ++i) in.push_back(region(0x7f0000000000 + i * 4096, 4096));  // back to back
    size_t size = 0;
    expect_same(in, round_trip(in, &size));
    EXPECT_LT(size, 12 + 128 * 2 + 64) << "version 2 should store a back-to-back run in about a byte a region";

    // Gaps, other lengths, kinds, devices (negative too) and keys, changing from region to region.
    std::vector<RegionDescriptor> mixed;
    for (uint64_t i = 0; i < 64; ++i) {
        auto r = region(0x1000 + i * 10000 + (i % 3) * 7, 100 + i % 5, std::vector<uint8_t>(i % 4, uint8_t(i)));
        r.kind = i % 3;
        r.device = i % 3 == 0 ? -1 : int32_t(i % 7);
        r.access = 1 + i % 3;
        mixed.push_back(std::move(r));
    }
    mixed.push_back(region(UINT64_MAX - 10, 10));  // the top of the address space
    expect_same(mixed, round_trip(mixed));
}

// What an engine of the previous layout wrote (version 1 chunks) is still read.
TEST(ChunkCodec, ReadsVersionOneChunks) {
    std::vector<RegionDescriptor> in{region(0x1000, 64), region(0x5000, 128, {1, 2, 3})};
    std::vector<const RegionDescriptor *> ptrs{&in[0], &in[1]};
    auto bytes = encode_region_chunk(ptrs);
    ASSERT_EQ(bytes[4], kChunkVersion);
    std::vector<RegionDescriptor> out;
    size_t budget = kMaxDecodedRegionBytes;
    ASSERT_TRUE(decode_parts_chunk(bytes, out, budget));
    expect_same(in, out);
    EXPECT_EQ(budget, kMaxDecodedRegionBytes - region_bytes(in[0]) - region_bytes(in[1]));
}

TEST(ChunkCodec, RefusesWhatNoWriterMakes) {
    std::vector<RegionDescriptor> in{region(0x1000, 64), region(0x1040, 64)};
    std::vector<const RegionDescriptor *> ptrs{&in[0], &in[1]};
    const auto good = encode_parts_chunk(ptrs);
    ASSERT_EQ(good[4], kChunkVersionDeltas);
    auto refused = [](std::vector<uint8_t> bytes, const char *why) {
        std::vector<RegionDescriptor> out(1);  // what a reader already had stays as it was
        size_t budget = kMaxDecodedRegionBytes;
        auto r = decode_parts_chunk(bytes, out, budget);
        EXPECT_FALSE(r) << why;
        if (!r) {
            EXPECT_NE(r.error().message.find(why), std::string::npos) << r.error().message;
        }
        EXPECT_EQ(out.size(), 1u);
        EXPECT_EQ(budget, kMaxDecodedRegionBytes);
    };
    for (size_t cut = 0; cut < good.size(); ++cut)
        refused(std::vector<uint8_t>(good.begin(), good.begin() + cut), "");  // every truncation
    auto more = good;
    more.push_back(0);
    refused(more, "trailing bytes");
    auto flags = good;
    flags[12] |= 0x10;
    refused(flags, "unknown region flags");
    auto count = good;
    count[8] = 200;
    refused(count, "region count exceeds the data");
    // A gap that runs past the top of the address space.
    std::vector<uint8_t> wrap(good.begin(), good.begin() + 12);
    wrap[8] = 1;
    for (uint8_t b : {0x01 | 0x02, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01, 0x40}) wrap.push_back(b);
    refused(wrap, "wraps");
}

// "The same keys as the region before" repeated: a few bytes a region in the store, 64 KiB a
// region decoded. The budget bounds what a hostile store can make a reader allocate.
TEST(ChunkCodec, RepeatedKeysCannotDecodeBeyondTheBudget) {
    std::vector<RegionDescriptor> in;
    for (uint64_t i = 0; i < 64; ++i) in.push_back(region(0x1000 + i * 64, 64, std::vector<uint8_t>(60000, 7)));
    std::vector<const RegionDescriptor *> ptrs;
    for (const auto &r : in) ptrs.push_back(&r);
    auto bytes = encode_parts_chunk(ptrs);
    EXPECT_LT(bytes.size(), 61000u) << "the key should be stored once";
    std::vector<RegionDescriptor> out;
    size_t budget = 1u << 20;  // 17 regions' worth
    auto r = decode_parts_chunk(bytes, out, budget);
    ASSERT_FALSE(r);
    EXPECT_NE(r.error().message.find("decode to more than"), std::string::npos) << r.error().message;
    EXPECT_TRUE(out.empty());
    budget = 64u << 20;
    ASSERT_TRUE(decode_parts_chunk(bytes, out, budget));
    EXPECT_EQ(out.size(), 64u);
}

// Many changes published in transactions of at most `ops` operations: after every transaction
// the store holds a whole descriptor (the regions of some prefix of the changes, in order), never
// a torn one; a change is never split across two transactions.
TEST(DescriptorParts, EveryTransactionOfAManyChangePublishLeavesAWholeDescriptor) {
    for (auto [ops, n] : {std::pair<size_t, uint64_t>{100, 20000}, {5, 2000}}) {
        const std::string h = "/ferry/segments/x";
        DescriptorParts parts(h);
        SegmentDescriptor base;
        base.name = "x";
        parts.reset(base);
        std::map<std::string, std::vector<uint8_t>> store;
        ASSERT_TRUE(parts.apply_all({}, ops, 640u << 10, [&](const DescriptorParts::Write &w) -> Result<void> {
            apply(store, w);
            return {};
        }));
        // n regions in address order, then n/4 more scattered between them, then all removed in
        // a shuffled order, in batches of n/4 changes.
        std::vector<RegionChange> changes;
        for (uint64_t i = 0; i < n; ++i) changes.push_back({0x100000 + i * 256, region(0x100000 + i * 256, 128)});
        for (uint64_t i = 0; i < n / 4; ++i) {
            uint64_t a = 0x100000 + (i * 7919 % n) * 256 + 128;
            changes.push_back({a, region(a, 64, {uint8_t(i)})});
        }
        std::vector<uint64_t> all;
        for (const auto &c : changes) all.push_back(c.addr);
        std::shuffle(all.begin(), all.end(), std::mt19937_64(1));
        for (uint64_t a : all) changes.push_back({a, std::nullopt});

        // Each prefix of the changes as a hash of the regions it leaves (XOR of one hash a region).
        auto mix = [](uint64_t x) {
            x += 0x9e3779b97f4a7c15ull;
            x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
            x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
            return x ^ (x >> 31);
        };
        auto hash = [&](const RegionDescriptor &r) {
            return mix(r.addr ^ mix(r.length + (r.keys[1].key.empty() ? 0 : 1u + r.keys[1].key[0])));
        };
        std::vector<uint64_t> prefix{0};
        std::map<uint64_t, uint64_t> live;  // address -> its hash, after the prefix
        for (const auto &c : changes) {
            uint64_t x = c.region ? hash(*c.region) : live.at(c.addr);
            c.region ? (void)(live[c.addr] = x) : (void)live.erase(c.addr);
            prefix.push_back(prefix.back() ^ x);
        }
        size_t seen = 0, txns = 0;  // the longest prefix a read showed so far
        std::string problem;
        auto check = [&](size_t upto) {
            auto d = read(store, h);
            if (!d) return problem = "torn after transaction " + std::to_string(txns) + ": " + d.error().message, false;
            uint64_t x = 0;
            for (const auto &r : d->regions) x ^= hash(r);
            for (size_t k = seen; k <= upto; ++k)
                if (prefix[k] == x) return seen = k, true;
            return problem = "after transaction " + std::to_string(txns) + " the store is no prefix of the changes",
                   false;
        };
        for (size_t from = 0; from < changes.size() && problem.empty(); from += n / 4) {
            size_t to = std::min(changes.size(), from + n / 4);
            std::span<const RegionChange> batch(changes.data() + from, to - from);
            auto r = parts.apply_all(batch, ops, 640u << 10, [&](const DescriptorParts::Write &w) -> Result<void> {
                ++txns;
                if (w.puts.size() + w.deletes.size() > ops + 3) problem = "a transaction has too many operations";
                apply(store, w);
                if (problem.empty()) check(to);
                return {};
            });
            ASSERT_TRUE(r);
            ASSERT_TRUE(problem.empty() && check(to) && seen == to)
                << problem << " after changes [" << from << ", " << to << ")";
        }
        EXPECT_TRUE(problem.empty()) << problem << " (ops per transaction " << ops << ")";
        EXPECT_GT(txns, 2 * changes.size() / (n / 4)) << "no batch was split: the test did not test splitting";
    }
}
