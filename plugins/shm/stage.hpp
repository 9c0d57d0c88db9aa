// The staging area of small ops (docs/DESIGN.md, "Small ops through a staging area").
//
// Cross-memory attach pins the initiator's pages once per iovec (~0.65 µs each on a VM), which
// is most of what a scattered 64-byte op costs. So each initiator owns, per connection, a sealed
// memfd (kStageBytes) that it hands to the serving side over the authenticated data connection
// (SCM_RIGHTS, with a StageOffer record right after the HelloAck). Small host ops then travel
// through it: the initiator writes a block (StageHead, StageOp[count], then a WRITE's payloads)
// and sends ONE StageBatch record naming the block; the serving side copies between the block
// and ITS OWN registered memory with memcpy (its memory needs no pinning), and answers with one
// Done for the batch (preceded by a Done per failed op). A READ's bytes wait in the block until
// the initiator copies them out, which it does only for an op it has not reported failed, so no
// byte lands in an application buffer after its op was reported failed.
//
// Records are ordinary 72-byte Requests with opcodes an older serving side refuses as malformed
// (-EINVAL): the initiator then keeps using cross-memory attach for everything.
#pragma once

#include "wire.hpp"

#include <sys/uio.h>

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

namespace ferry_shm {

inline constexpr uint32_t kOpStageOffer = 0x53540001;  // Request: length = the memfd's size; one fd attached
inline constexpr uint32_t kOpStageBatch = 0x53540002;  // Request: remote_addr = block offset, length = block
                                                       // bytes, local_addr = op count
inline constexpr uint64_t kStageBytes = 1 << 20;       // the initiator's area per connection
inline constexpr uint64_t kStageMinBytes = 64 << 10, kStageMaxBytes = 64 << 20;  // what a serving side maps
inline constexpr uint64_t kStageMaxOp = 16 << 10;  // larger ops keep cross-memory attach (one copy, not two)
inline constexpr uint32_t kStageMaxOps = 1024;     // ops per block
inline constexpr uint64_t kStageAlign = 64;        // blocks start at multiples of this

// Block states (StageHead::state), changed with atomic compare-and-swap by both processes: the
// serving side claims a block before copying it; the initiator revokes one it gave up on (an op
// timed out, a disconnect). Whoever swaps first decides.
inline constexpr uint32_t kStagePosted = 0, kStageClaimed = 1, kStageRevoked = 2;

struct StageHead {
    uint32_t state;
    uint32_t count;
    uint64_t id;  // the batch's record id
    uint64_t reserved[6];
};
static_assert(sizeof(StageHead) == 64);

struct StageOp {
    uint64_t remote_addr;  // in the serving process
    uint64_t data_off;     // the op's bytes in the area, inside its block
    uint32_t length;
    uint32_t opcode;
};
static_assert(sizeof(StageOp) == 24);

// A Done with reserved != 0 answers op (reserved - 1) of the staged batch `id` (a failure, its
// message follows); the batch's own Done (reserved == 0) comes last and ends it.

// A block's size for `count` ops of `payload` bytes (each rounded to 16).
inline uint64_t stage_block_bytes(uint64_t count, uint64_t payload) {
    const uint64_t b = sizeof(StageHead) + count * sizeof(StageOp) + payload;
    return (b + kStageAlign - 1) / kStageAlign * kStageAlign;
}
inline uint64_t stage_pad(uint64_t len) { return (len + 15) & ~uint64_t{15}; }

inline bool stage_swap(uint8_t *area, uint64_t off, uint32_t from, uint32_t to) {
    auto *state = reinterpret_cast<uint32_t *>(area + off);
    return __atomic_compare_exchange_n(state, &from, to, false, __ATOMIC_ACQ_REL, __ATOMIC_ACQUIRE);
}

// A memfd mapped read-write here: the initiator's own area, or the serving side's view of an
// initiator's.
struct StageArea {
    uint8_t *ptr = nullptr;
    uint64_t size = 0;
    int fd = -1;  // the initiator keeps its memfd: it copies its buffers in and out with pwritev/preadv
    StageArea() = default;
    StageArea(const StageArea &) = delete;
    StageArea &operator=(const StageArea &) = delete;
    ~StageArea();
};

// The initiator's area: a new memfd of `size` bytes, fully allocated, sealed against shrinking,
// growing and further seals, mapped (its fd kept in the StageArea), or nullptr and *why.
std::unique_ptr<StageArea> create_stage(uint64_t size, std::string *why);

// Copies between the initiator's buffers and the area with ONE pwritev (into the area) or preadv
// (out of it) per run of ops rather than memcpy: the kernel's copy_from/to_user stops at a page
// the application made inaccessible and returns short instead of crashing the process, and,
// unlike process_vm_readv, it pins nothing. iov[i] holds op i's buffer, the area's bytes are
// contiguous from `off`. An op whose buffer faults gets status[i] = -EFAULT (others unchanged).
void stage_file_copy(int fd, bool into_area, const iovec *iov, size_t n, uint64_t off, int *status);

// The serving side's check of an initiator's descriptor before mapping it: a memfd (tmpfs,
// "/memfd:" name) sealed against shrinking and growing, open read-write, of exactly `size` bytes
// (kStageMinBytes..kStageMaxBytes, whole pages), fully allocated. The mapping, or nullptr and *why.
// Never closes fd.
std::unique_ptr<StageArea> map_peer_stage(int fd, uint64_t size, std::string *why);

}  // namespace ferry_shm
