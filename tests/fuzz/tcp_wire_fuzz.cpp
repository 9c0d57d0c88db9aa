// tcp.so's wire decoders (plugins/tcp/wire.cpp): the 40-byte frame header a server or client
// reads from a peer, the server's request check, and the endpoint bytes from a descriptor.
// Invariants: decode/encode round-trips byte for byte; a request the check accepts has a
// length the server can bound (1..kMaxPayload, or a READ_DONE count); an endpoint that decodes
// re-encodes to the same bytes (apart from the zero padding, which the decoder ignores).
#include <cstring>
#include <string>

#include "fuzz_check.hpp"
#include "rails.hpp"
#include "wire.hpp"

using namespace ferry_tcp;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size >= kHeaderSize) {
        Header h = decode_header(data);
        uint8_t again[kHeaderSize];
        encode_header(h, again);
        FUZZ_CHECK(memcmp(again, data, kHeaderSize) == 0, "header round trip");
        std::string why;
        bool ok = check_request(h, &why);
        FUZZ_CHECK(ok == why.empty(), "check_request gives a reason exactly when it refuses");
        if (ok) {
            FUZZ_CHECK(h.magic == kWireMagic && h.version == kWireVersion, "accepted a foreign header");
            if (h.type == kReadDone)
                FUZZ_CHECK(h.length >= 1 && h.length <= UINT32_MAX && h.addr == 0, "READ_DONE bounds");
            else
                FUZZ_CHECK((h.type == kWriteReq || h.type == kReadReq) && h.length >= 1 && h.length <= kMaxPayload,
                           "request length bounds");
        }
        FUZZ_CHECK(msg_type_name(h.type) != nullptr, "type name");
    }
    Endpoint ep;
    std::string why;
    if (decode_endpoint(data, size, &ep, &why)) {
        FUZZ_CHECK(size == kEndpointSize && why.empty(), "endpoint size");
        FUZZ_CHECK(ep.addr.ss_family == AF_INET || ep.addr.ss_family == AF_INET6, "endpoint family");
        uint8_t again[kEndpointSize];
        encode_endpoint(ep.addr, again);
        // Magic, version, family, port and the address bytes the family uses must match.
        size_t addr_bytes = ep.addr.ss_family == AF_INET ? 4 : 16;
        FUZZ_CHECK(memcmp(again, data, 7) == 0 && memcmp(again + 8, data + 8, 2) == 0 &&
                       memcmp(again + 12, data + 12, addr_bytes) == 0,
                   "endpoint round trip");
        FUZZ_CHECK(!ep.name.empty(), "endpoint name");
    } else {
        FUZZ_CHECK(!why.empty(), "endpoint refusal without a reason");
    }
    // The rails form (a list of addresses) or the single one: what decodes encodes back to
    // bytes that decode to the same addresses.
    std::vector<Endpoint> rails;
    why.clear();
    if (decode_rails_endpoint(data, size, &rails, &why)) {
        FUZZ_CHECK(!rails.empty() && rails.size() <= kMaxRails, "rail count");
        std::vector<sockaddr_storage> addrs;
        for (const auto &r : rails) addrs.push_back(r.addr);
        auto again = encode_rails_endpoint(addrs);
        std::vector<Endpoint> back;
        std::string why2;
        FUZZ_CHECK(decode_rails_endpoint(again.data(), again.size(), &back, &why2), "rails round trip decodes");
        FUZZ_CHECK(back.size() == rails.size(), "rails round trip count");
        for (size_t i = 0; i < back.size(); ++i) FUZZ_CHECK(back[i].name == rails[i].name, "rails round trip address");
    } else {
        FUZZ_CHECK(!why.empty(), "rails endpoint refusal without a reason");
    }
    return 0;
}
