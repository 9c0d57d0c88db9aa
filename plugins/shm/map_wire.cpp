// Decoders of the map channel's records (map_wire.hpp): bytes from a peer, checked before use.
#include "map_wire.hpp"

#include "wire.hpp"

#include <ferry/plugin.h>

#include <cstring>

namespace ferry_shm {

bool parse_map_request(const void *data, size_t len, MapRequest *out, std::string *why) {
    MapRequest m;
    if (len != sizeof m) return *why = "a map request has " + std::to_string(sizeof m) + " bytes", false;
    memcpy(&m, data, sizeof m);
    if (m.magic != kMapRequestMagic) return *why = "not a map request (magic)", false;
    if (m.access & ~(FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE))
        return *why = "unknown access bits " + std::to_string(m.access), false;
    if (!(m.access & FERRY_ACCESS_REMOTE_READ))
        return *why = "a mapping is always readable: ask for read access", false;
    if (m.length == 0 || m.addr == 0 || m.addr + m.length < m.addr) return *why = "the range is empty or wraps", false;
    *out = m;
    return true;
}

bool parse_map_reply(const void *data, size_t len, uint64_t page, MapReply *out, std::string *why) {
    MapReply r;
    if (len != sizeof r) return *why = "a map reply has " + std::to_string(sizeof r) + " bytes", false;
    memcpy(&r, data, sizeof r);
    r.message[sizeof r.message - 1] = '\0';
    if (r.magic != kMapReplyMagic) return *why = "not a map reply (magic)", false;
    if (r.status > 0) return *why = "status is positive", false;
    if (r.status == 0) {
        const uint64_t max = uint64_t(1) << 46;  // no region is larger: keeps the sums below from wrapping
        if (r.length == 0 || r.length > max || r.base == 0 || r.base + r.length < r.base)
            return *why = "the region is empty, too large or wraps", false;
        if (page == 0 || r.fd_offset % page != 0 || r.fd_offset > max)
            return *why = "the memfd offset is not page-aligned", false;
        const uint64_t pages = (r.length + page - 1) / page * page;
        if (r.live_offset != r.fd_offset + pages)
            return *why = "the liveness word is not in the page after the region", false;
        if (r.live_value == 0) return *why = "the liveness value is 0", false;
        if (r.access != FERRY_ACCESS_REMOTE_READ && r.access != (FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE))
            return *why = "the granted access is neither read nor read-write", false;
    }
    *out = r;
    return true;
}

bool parse_shared_desc(const void *data, size_t len) {
    SharedDesc d;
    if (data == nullptr || len != sizeof d) return false;
    memcpy(&d, data, sizeof d);
    return d.magic == kSharedDescMagic && d.version == kWireVersion;
}

}  // namespace ferry_shm
