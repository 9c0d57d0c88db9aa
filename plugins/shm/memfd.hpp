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

struct MapReply;

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

// True when fd is a memfd (tmpfs, "/memfd:" name) sealed against shrinking and growing; else
// false and *why says what it is instead.
bool sealed_memfd(int fd, std::string *why);

// One sendmsg of `len` bytes from `buf` with `fd` as its only ancillary data (SCM_RIGHTS; none
// when fd < 0), retried on EINTR: what sendmsg returned (-1 with errno on failure).
ssize_t send_with_fd(int sock, const void *buf, size_t len, int fd, int flags);

// ---- managed buffers (register_mem_fd, map_wire.hpp) ----

// The serving side's hold on a managed region's memfd: its own descriptor (dup) and the
// liveness word, mapped here, that peers watch.
class SharedBacking {
public:
    SharedBacking() = default;
    SharedBacking(SharedBacking &&o) noexcept { *this = std::move(o); }
    SharedBacking &operator=(SharedBacking &&o) noexcept;
    ~SharedBacking();
    // Checks the host's memfd (sealed, large enough for the region and the plugin's page) and
    // takes a dup of it; false and *why when it does not qualify.
    bool init(int host_fd, uint64_t fd_offset, uint64_t length, std::string *why);
    bool valid() const { return fd_ >= 0; }
    int fd() const { return fd_; }
    // A new read-only open file description of the memfd (for peers that may only read), or -1.
    int reopen_read_only() const;
    void revoke();  // the liveness word becomes 0: mapped peers fail their later ops
    uint64_t fd_offset = 0, live_offset = 0, live_value = 0, ino = 0;

private:
    void reset();
    int fd_ = -1;
    void *live_page_ = nullptr;
    size_t page_ = 0;
};

// A peer's managed region mapped here (the initiator's side).
struct SharedMapping {
    uint8_t *ptr = nullptr;         // the region's first byte here
    size_t map_len = 0;             // the region rounded up to pages, plus the liveness page
    uint64_t base = 0, length = 0;  // the region in the serving process
    uint64_t ino = 0, live_value = 0;
    bool writable = false;
    const volatile uint64_t *live = nullptr;
    SharedMapping() = default;
    SharedMapping(const SharedMapping &) = delete;
    SharedMapping &operator=(const SharedMapping &) = delete;
    ~SharedMapping();
    bool alive() const { return __atomic_load_n(const_cast<const uint64_t *>(live), __ATOMIC_ACQUIRE) == live_value; }
};

// Checks a descriptor a serving side sent with `reply` (parse_map_reply passed) before anything
// maps it: a memfd (tmpfs, "/memfd:" name) sealed against shrinking and growing, opened
// read-write when reply grants write (read-only otherwise), covering the region and its
// liveness page, fully allocated. 0 with *ino, or -errno with *why. Never closes fd.
int check_received_memfd(int fd, const MapReply &reply, uint64_t *ino, std::string *why);
// Maps it (after check_received_memfd); nullptr and *why when mmap fails. Never closes fd.
std::shared_ptr<SharedMapping> map_checked_memfd(int fd, const MapReply &reply, uint64_t ino, std::string *why);

}  // namespace ferry_shm
