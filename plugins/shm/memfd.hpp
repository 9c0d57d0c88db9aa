// The memfd fast path of shm.so (option adopt_memfd, off by default; docs/DESIGN.md).
//
// An initiator's registered region that is page-aligned private anonymous memory can be moved
// into a memfd in place: its contents are copied once into the memfd, which is then mapped
// MAP_SHARED|MAP_FIXED over the same addresses, so the application's pointers stay valid. The
// serving side then opens the memfd through /proc/<pid>/fd/<n> (the same ptrace permission
// cross-memory attach needs), maps it, and copies with memcpy instead of process_vm_readv/writev.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <memory>
#include <string>

namespace ferry_shm {

struct MemfdBacking {
    int fd = -1;      // our descriptor of the memfd, -1: none
    uint64_t ino = 0; // its inode, so a peer can tell a reused descriptor number
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

// Maps descriptor `fd` of process `pid` when it is the file with inode `ino` holding at least
// `len` bytes; nullptr (and *why) otherwise.
std::shared_ptr<PeerMapping> map_peer_memfd(pid_t pid, int fd, uint64_t ino, uint64_t len, std::string *why);

} // namespace ferry_shm
