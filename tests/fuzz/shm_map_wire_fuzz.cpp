// shm.so's map channel decoders (plugins/shm/map_wire.cpp): the bytes an initiator sends a
// serving side (MapRequest), the reply a serving side sends back with a memfd (MapReply), and
// the export_mem bytes that mark a managed buffer (SharedDesc).
//
// Input: byte 0 picks the decoder (0 request, 1 reply, 2 desc); the rest is the record, of any
// length (only the exact size may be accepted).
//
// Invariants: no crash; what is accepted satisfies what the callers rely on: a request asks for
// read access, no unknown bits, a non-empty range that does not wrap; a successful reply names a
// non-empty, non-wrapping region, a page-aligned memfd offset, its liveness word in the page
// right after the region, a non-zero liveness value and read or read-write access.
#include "../../plugins/shm/map_wire.hpp"
#include "../../plugins/shm/wire.hpp"
#include "fuzz_check.hpp"

#include <ferry/plugin.h>

#include <cstddef>
#include <cstdint>
#include <string>

using namespace ferry_shm;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    if (size < 1) return 0;
    const uint8_t which = data[0] % 3;
    const uint8_t *p = data + 1;
    const size_t n = size - 1;
    std::string why;
    if (which == 0) {
        MapRequest m{};
        if (parse_map_request(p, n, &m, &why)) {
            FUZZ_CHECK(n == sizeof m, "only a whole request is accepted");
            FUZZ_CHECK(m.magic == kMapRequestMagic, "magic");
            FUZZ_CHECK((m.access & FERRY_ACCESS_REMOTE_READ) != 0, "read access is always asked for");
            FUZZ_CHECK((m.access & ~3u) == 0, "no unknown access bits");
            FUZZ_CHECK(m.length > 0 && m.addr != 0 && m.addr + m.length > m.addr,
                       "a non-empty range that does not wrap");
        } else {
            FUZZ_CHECK(!why.empty(), "a refusal says why");
        }
    } else if (which == 1) {
        constexpr uint64_t kPage = 4096;
        MapReply r{};
        if (parse_map_reply(p, n, kPage, &r, &why)) {
            FUZZ_CHECK(n == sizeof r, "only a whole reply is accepted");
            FUZZ_CHECK(r.magic == kMapReplyMagic && r.status <= 0, "magic and status");
            FUZZ_CHECK(r.message[sizeof r.message - 1] == '\0', "the message is terminated");
            if (r.status == 0) {
                FUZZ_CHECK(r.length > 0 && r.base != 0 && r.base + r.length > r.base, "region");
                FUZZ_CHECK(r.fd_offset % kPage == 0, "page-aligned offset");
                FUZZ_CHECK(r.live_offset == r.fd_offset + (r.length + kPage - 1) / kPage * kPage &&
                               r.live_offset > r.fd_offset,
                           "the liveness word is in the page after the region");
                FUZZ_CHECK(r.live_value != 0, "liveness value");
                FUZZ_CHECK(r.access == 1 || r.access == 3, "read or read-write");
            }
        } else {
            FUZZ_CHECK(!why.empty(), "a refusal says why");
        }
    } else if (parse_shared_desc(p, n)) {
        FUZZ_CHECK(n == sizeof(SharedDesc), "only a whole descriptor is accepted");
    }
    return 0;
}
