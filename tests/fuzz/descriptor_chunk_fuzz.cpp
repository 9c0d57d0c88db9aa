// A chunk of a descriptor stored in parts (core/metadata/chunk_codec.cpp): bytes any writer to etcd can
// put there, read by every engine that opens the segment. Invariants: a refusal carries a code
// and a message and leaves the output and the budget as they were; an accepted chunk has
// non-empty, non-wrapping regions in address order, charges the budget exactly what its regions
// take, and re-encodes to a chunk that decodes to the same regions. The budget is small here
// (1 MiB), so "the same keys as before" repeated is refused rather than allocated.
#include <cerrno>

#include "fuzz_check.hpp"
#include "metadata/chunk_codec.hpp"
#include "util/log.hpp"

using namespace ferry;

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    log::set_level(log::Level::Error);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    constexpr size_t kBudget = 1u << 20;
    std::vector<RegionDescriptor> out(1);
    size_t budget = kBudget;
    auto r = decode_parts_chunk({data, size}, out, budget);
    if (!r) {
        FUZZ_CHECK(r.error().code < 0 && !r.error().message.empty(), "refusal without code or message");
        FUZZ_CHECK(out.size() == 1 && budget == kBudget, "a refused chunk changed the output or the budget");
        return 0;
    }
    size_t took = 0;
    std::vector<const RegionDescriptor *> regions;
    for (size_t i = 1; i < out.size(); ++i) {
        const auto &g = out[i];
        FUZZ_CHECK(g.length > 0 && g.end() > g.addr, "empty or wrapping region accepted");
        if (i > 1) FUZZ_CHECK(out[i - 1].end() <= g.addr, "unsorted or overlapping regions accepted");
        took += region_bytes(g);
        regions.push_back(&g);
    }
    FUZZ_CHECK(took == kBudget - budget, "the budget was not charged what the regions take");
    auto bytes = encode_parts_chunk(regions);
    std::vector<RegionDescriptor> again;
    size_t big = kMaxDecodedRegionBytes;
    FUZZ_CHECK(decode_parts_chunk(bytes, again, big).has_value(), "re-encoded chunk does not decode");
    FUZZ_CHECK(again.size() == regions.size(), "round trip changed the region count");
    for (size_t i = 0; i < again.size(); ++i) {
        const auto &a = again[i], &b = *regions[i];
        bool same = a.addr == b.addr && a.length == b.length && a.kind == b.kind && a.device == b.device &&
                    a.access == b.access && a.keys.size() == b.keys.size();
        for (size_t k = 0; same && k < a.keys.size(); ++k)
            same = a.keys[k].transport == b.keys[k].transport && a.keys[k].key == b.keys[k].key;
        FUZZ_CHECK(same, "round trip changed a region");
    }
    return 0;
}
