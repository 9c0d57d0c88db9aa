// The map channel of shm.so: how a serving side hands the memfd of a managed buffer (a region the
// host registered with register_mem_fd: ferry_alloc_shared) to an initiator, which maps it once
// and copies with memcpy from then on (docs/DESIGN.md, "managed buffers").
//
// A map channel is its own connection to the serving side's abstract socket, authenticated like
// a data connection (wire.hpp: target token, SO_PEERCRED, pidfd, the ptrace probe of the
// initiator, same-user rule) but opened with a Hello whose magic is kMapHelloMagic. Then:
//   initiator: MapRequest            serving side: MapReply, with exactly one descriptor
//                                    (SCM_RIGHTS) when status is 0 and none otherwise
// and so on, one request at a time. The serving side answers only for a region that was
// registered with a memfd and grants the access asked for; the descriptor is O_RDWR when the
// region may be read and written, O_RDONLY when it may only be read, and a write-only region is
// never mapped (a mapping that can be written can be read). No other descriptor ever crosses.
//
// The region is bytes [fd_offset, +length) of the memfd; the 8 bytes at live_offset (the page
// after the region, which only the plugin uses) hold live_value while the region is registered
// and 0 once the serving side deregistered it: the initiator checks the word before and after
// each copy, so its ops fail cleanly once the region is gone.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace ferry_shm {

inline constexpr uint32_t kMapHelloMagic = 0x50485346;    // "FSHP": Hello of a map channel
inline constexpr uint32_t kMapRequestMagic = 0x51485346;  // "FSHQ"
inline constexpr uint32_t kMapReplyMagic = 0x52485346;    // "FSHR"
inline constexpr uint32_t kSharedDescMagic = 0x53485346;  // "FSHS": export_mem of a managed region

// export_mem bytes of a managed region: tells importers a map channel can be asked for it.
struct SharedDesc {
    uint32_t magic;
    uint16_t version;  // kWireVersion
    uint16_t reserved;
};
static_assert(sizeof(SharedDesc) == 8);

struct MapRequest {
    uint32_t magic;
    uint32_t access;  // FERRY_ACCESS_REMOTE_* the initiator wants (READ at least)
    uint64_t addr;    // a range in the serving process, inside the region
    uint64_t length;
};
static_assert(sizeof(MapRequest) == 24);

struct MapReply {
    uint32_t magic;
    int32_t status;         // 0, or a negative errno and message
    uint64_t base, length;  // the region, in the serving process
    uint64_t fd_offset;     // where it starts in the memfd (page-aligned)
    uint64_t live_offset;   // the liveness word in the memfd (see above)
    uint64_t live_value;    // its value while the region is registered (never 0)
    uint64_t ino;           // the memfd's inode, as the serving side sees it
    uint32_t access;        // what the descriptor grants: READ, or READ | WRITE
    uint32_t reserved;
    char message[160];
};
static_assert(sizeof(MapReply) == 224);

// Decoders of peer bytes (fuzzed: tests/fuzz/shm_map_wire_fuzz.cpp). False with *why when the
// bytes are not a well-formed record; nothing is trusted beyond what they check.
bool parse_map_request(const void *data, size_t len, MapRequest *out, std::string *why);
// page: the page size; checks the reply's own consistency (a success names a non-empty,
// non-wrapping region, page-aligned offsets, the liveness word in the page after the region).
bool parse_map_reply(const void *data, size_t len, uint64_t page, MapReply *out, std::string *why);
bool parse_shared_desc(const void *data, size_t len);

}  // namespace ferry_shm
