// The memfd fast path of shm.so (option adopt_memfd, off by default; docs/DESIGN.md).
//
// An initiator's registered region that is page-aligned private anonymous memory can be moved
// into a memfd in place: its contents are copied once into the memfd, which is then mapped
// MAP_SHARED|MAP_FIXED over the same addresses, so the application's pointers stay valid. The
// memfd is named kMemfdName and sealed against shrinking and growing (and further sealing).
//
// The serving side, when its own adopt_memfd is on too, takes the initiator's descriptor with
// pidfd_getfd(2) on its pidfd of the initiator (the same ptrace permission cross-memory attach
// needs): it gets the initiator's own open file description, so never more access than the
// initiator itself had. It maps it only when it is a sealed Ferry memfd opened read-write (see
// map_peer_memfd), and copies with memcpy instead of process_vm_readv/writev.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ferry_shm {

inline constexpr const char *kMemfdName = "ferry-shm-region";

struct MemfdBacking {
    int fd = -1;       // our descriptor of the memfd, -1: none
    uint64_t ino = 0;  // its inode, so a peer can tell a reused descriptor number
};

// Moves [addr, +len) into a new memfd as described above. False (with *why) when the range does
// not qualify or a step fails; the range is unchanged then.
bool adopt_into_memfd(uint64_t addr, uint64_t len, MemfdBacking *out, std::string *why);

// A peer's memfd mapped here.
struct PeerMapping {
    uint8_t *ptr = nullptr;
    uint64_t len = 0, ino = 0;
    PeerMapping() = default;
    PeerMapping(const PeerMapping &) = delete;
    PeerMapping &operator=(const PeerMapping &) = delete;
    ~PeerMapping();
};

// Maps descriptor `fd` of the process `pidfd` refers to, when it is a memfd that shm.so created:
// on tmpfs/hugetlbfs, named kMemfdName, opened O_RDWR, sealed with F_SEAL_SHRINK (so it cannot
// be truncated under our mapping: SIGBUS), with inode `ino` and at least `len` bytes. nullptr
// (and *why) otherwise. Never opens anything by path.
std::shared_ptr<PeerMapping> map_peer_memfd(int pidfd, int fd, uint64_t ino, uint64_t len, std::string *why);

}  // namespace ferry_shm
