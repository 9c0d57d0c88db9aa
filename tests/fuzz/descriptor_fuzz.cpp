// The segment descriptor codec (core/metadata/descriptor.cpp): bytes a peer serves over the handshake
// or publishes in etcd. Invariants: a refusal carries a code and a message; an accepted
// descriptor has sorted, non-overlapping, non-wrapping regions, re-encodes to bytes that decode
// to the same descriptor, and find_region only returns a region holding the whole range.
#include <cerrno>

#include "fuzz_check.hpp"
#include "metadata/descriptor.hpp"
#include "util/log.hpp"

using namespace ferry;

namespace {

bool same(const SegmentDescriptor &a, const SegmentDescriptor &b) {
    if (a.name != b.name || a.host_id != b.host_id || a.generation != b.generation || a.control != b.control ||
        a.transports.size() != b.transports.size() || a.regions.size() != b.regions.size())
        return false;
    for (size_t i = 0; i < a.transports.size(); ++i)
        if (a.transports[i].transport != b.transports[i].transport ||
            a.transports[i].endpoint != b.transports[i].endpoint)
            return false;
    for (size_t i = 0; i < a.regions.size(); ++i) {
        const auto &x = a.regions[i], &y = b.regions[i];
        if (x.addr != y.addr || x.length != y.length || x.kind != y.kind || x.device != y.device ||
            x.access != y.access || x.keys.size() != y.keys.size())
            return false;
        for (size_t k = 0; k < x.keys.size(); ++k)
            if (x.keys[k].transport != y.keys[k].transport || x.keys[k].key != y.keys[k].key) return false;
    }
    return true;
}

}  // namespace

extern "C" int LLVMFuzzerInitialize(int *, char ***) {
    log::set_level(log::Level::Error);
    return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    auto d = decode_descriptor({data, size});
    if (!d) {
        FUZZ_CHECK(d.error().code < 0 && !d.error().message.empty(), "refusal without code or message");
        return 0;
    }
    for (size_t i = 0; i < d->regions.size(); ++i) {
        const auto &r = d->regions[i];
        FUZZ_CHECK(r.length > 0 && r.end() > r.addr, "empty or wrapping region accepted");
        if (i > 0) FUZZ_CHECK(d->regions[i - 1].end() <= r.addr, "unsorted or overlapping regions accepted");
        // Every byte range inside a region is found, and nothing straddling its end is.
        FUZZ_CHECK(d->find_region(r.addr, r.length) == &r, "a whole region is not found");
        FUZZ_CHECK(d->find_region(r.end() - 1, 1) == &r, "a region's last byte is not found");
        FUZZ_CHECK(d->find_region(r.addr, r.length + 1) == nullptr || r.length == UINT64_MAX,
                   "a range past a region's end was accepted");
    }
    auto bytes = encode_descriptor(*d);
    auto again = decode_descriptor(bytes);
    FUZZ_CHECK(again.has_value(), "re-encoded descriptor does not decode");
    FUZZ_CHECK(same(*d, *again), "descriptor round trip changed it");
    // The encoding is canonical: what decodes re-encodes to the same bytes.
    FUZZ_CHECK(bytes.size() == size && std::equal(bytes.begin(), bytes.end(), data), "re-encoding differs");
    return 0;
}
