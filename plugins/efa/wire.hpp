// What efa.so instances exchange besides RMA: the endpoint bytes, the export_mem bytes (one
// entry per memory registration, so regions split at the provider's MR size limit carry several
// keys), and small control messages sent with fi_send over the same RDM endpoint.
//
// Control messages (CtrlHeader + body, at most kCtrlSize bytes):
//   Hello      initiator -> target: body = the initiator's fi_getname bytes. The target adds
//              them to its address vector and answers HelloAck; it doubles as the liveness
//              probe after a connection error.
//   Query      body = QueryBody: which registrations cover [addr, +len)? Answered with
//              QueryReply = QueryReplyHead + RemoteChunk[n]; import_mem uses it when the host
//              passes no export_mem bytes.
//   Revoke     target -> every instance that said Hello to it, from deregister_mem: body = the
//              keys (uint64_t each) about to be closed. The initiator stops using them, waits
//              for its RMA on them to complete, then answers RevokeAck (status 0). While RMA
//              is still in flight it first answers RevokeAck with status -EINPROGRESS, so the
//              target can tell a busy peer (waited for up to op_timeout_ms) from a vanished
//              one (given up after connect_timeout_ms). The target closes the registrations once
//              all answered or their time ran out.
#pragma once

#include <cstddef>
#include <cstdint>

namespace ferry_efa {

inline constexpr uint32_t kEndpointMagic = 0x41464546;  // "FEFA"
inline constexpr uint32_t kMemMagic = 0x4d464546;       // "FEFM"
inline constexpr uint32_t kCtrlMagic = 0x43464546;      // "FEFC"
inline constexpr uint16_t kWireVersion = 1;
inline constexpr size_t kCtrlSize = 4096;

struct EndpointHead {
    uint32_t magic;
    uint16_t version;
    uint16_t name_len;  // fi_getname bytes that follow
    uint64_t token;     // random per instance
};
static_assert(sizeof(EndpointHead) == 16);

// One registration as a peer needs it: RMA address of byte x (addr <= x < addr+len) is
// rma_base + (x - addr); rma_base is addr under FI_MR_VIRT_ADDR and 0 otherwise.
struct RemoteChunk {
    uint64_t addr, len, key, rma_base;
    uint32_t access;   // FERRY_ACCESS_* granted
    uint32_t revoked;  // 0 on the wire; set locally once the owner revoked the key
};
static_assert(sizeof(RemoteChunk) == 40);

// MemHead.flags: the region is served through the host's staging calls (no RMA keys).
inline constexpr uint16_t kMemStaged = 1;

struct MemHead {
    uint32_t magic;
    uint16_t version;
    uint16_t flags;  // kMemStaged
    uint32_t count;  // RemoteChunk entries that follow
    uint32_t reserved2;
};

enum class CtrlType : uint16_t {
    Hello = 1,
    HelloAck = 2,
    Query = 3,
    QueryReply = 4,
    Revoke = 5,
    RevokeAck = 6,
    StageRead = 7,
    StageWrite = 8,
    StageGrant = 9,
    StageDone = 10,
    StageAck = 11
};

struct CtrlHeader {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint64_t req_id;
    uint64_t from_token;
    uint64_t to_token;
    int32_t status;
    uint32_t body_len;
};
static_assert(sizeof(CtrlHeader) == 40);

struct QueryBody {
    uint64_t addr, len;
};

struct QueryReplyHead {
    uint64_t next;  // where to ask again, 0 when complete
    uint32_t count;
    uint32_t reserved;
};

struct StageReqBody {
    uint64_t addr, len;  // inside one staged region of the target
};

struct StageGrantBody {
    uint32_t slice;  // 0, 1, 2, ... in order
    uint32_t reserved;
    uint64_t offset, len;  // of the slice in the request: back to back, inside [0, request len)
    uint64_t rma_addr, key;
};
static_assert(sizeof(StageGrantBody) == 40);

struct StageDoneBody {
    uint32_t slice;
    int32_t status;  // 0, or < 0: the request is given up
};

inline constexpr size_t kChunksPerReply =
    (kCtrlSize - sizeof(CtrlHeader) - sizeof(QueryReplyHead)) / sizeof(RemoteChunk);

}  // namespace ferry_efa
