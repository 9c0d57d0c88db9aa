// Engine::alloc_shared / free_shared: memfd-backed buffers that shm.so maps into peers.
#include "engine/shared_memory.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <string>

#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23  // Linux 5.14; older headers lack it
#endif

#include "engine/engine_impl.hpp"
#include "huge_pages.hpp"
#include "util/log.hpp"

namespace ferry {

namespace {

std::string errno_text(int e) { return std::strerror(e); }

}  // namespace

Result<SharedBuffer> make_shared_buffer(uint64_t length, void **addr) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (length == 0) return fail(-EINVAL, "alloc_shared: length is 0");
    if (length > (uint64_t(1) << 46))
        return fail(-EINVAL, "alloc_shared: " + std::to_string(length) + " bytes is more than 64 TiB");
    SharedBuffer b;
    b.length = (length + page - 1) / page * page;
    b.map_length = b.length + page;
    b.fd = Fd(memfd_create("ferry-shared", MFD_CLOEXEC | MFD_ALLOW_SEALING));
    if (!b.fd) return fail(-errno, "alloc_shared: memfd_create: " + errno_text(errno));
    if (ftruncate(b.fd.get(), static_cast<off_t>(b.map_length)) != 0)
        return fail(-errno, "alloc_shared: ftruncate to " + std::to_string(b.map_length) + ": " + errno_text(errno));
    // Huge pages where the kernel gives them to shared memory (shmem_enabled advise or always):
    // asked for on the mapping before its pages exist, which then come in through it. Our own
    // buffer, so no option: a kernel that says no leaves 4 KiB pages.
    void *p = mmap(nullptr, b.map_length, PROT_READ | PROT_WRITE, MAP_SHARED, b.fd.get(), 0);
    if (p == MAP_FAILED) return fail(-errno, "alloc_shared: mmap: " + errno_text(errno));
    std::string ignored;
    (void)advise_huge_pages(p, b.map_length, false, ignored);
    bool populated = madvise(p, b.map_length, MADV_POPULATE_WRITE) == 0;  // Linux 5.14+
    // Every page allocated now: a peer's copy into it never faults a page in (no SIGBUS when
    // memory is short later; the cost is paid here, not in the first transfers).
    if (int rc = posix_fallocate(b.fd.get(), 0, static_cast<off_t>(b.map_length)); rc != 0) {
        munmap(p, b.map_length);
        return fail(-rc, "alloc_shared: cannot allocate " + std::to_string(b.map_length) +
                             " bytes of shared memory (fallocate): " + errno_text(rc));
    }
    if (!populated) {  // an older kernel: map it again, pre-faulted
        munmap(p, b.map_length);
        p = mmap(nullptr, b.map_length, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, b.fd.get(), 0);
        if (p == MAP_FAILED) return fail(-errno, "alloc_shared: mmap: " + errno_text(errno));
    }
    // Sealed before anyone sees it: a peer that maps it must never meet a shorter file.
    if (fcntl(b.fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) {
        munmap(p, b.map_length);
        return fail(-errno, "alloc_shared: fcntl(F_ADD_SEALS): " + errno_text(errno));
    }
    *addr = p;
    return b;
}

void unmap_shared_buffer(void *addr, const SharedBuffer &b) {
    if (munmap(addr, b.map_length) != 0) FERRY_WARN("free_shared: munmap: ", errno_text(errno));
}

SharedBuffers::~SharedBuffers() {
    for (auto &[a, b] : by_addr_) unmap_shared_buffer(reinterpret_cast<void *>(a), b);
}

void SharedBuffers::add(void *addr, SharedBuffer b) {
    std::lock_guard lock(mu_);
    by_addr_.emplace(reinterpret_cast<uintptr_t>(addr), std::move(b));
}

bool SharedBuffers::take(void *addr, SharedBuffer *out) {
    std::lock_guard lock(mu_);
    auto it = by_addr_.find(reinterpret_cast<uintptr_t>(addr));
    if (it == by_addr_.end()) return false;
    *out = std::move(it->second);
    by_addr_.erase(it);
    return true;
}

int SharedBuffers::fd_of(void *addr, uint64_t *length) const {
    std::lock_guard lock(mu_);
    auto it = by_addr_.find(reinterpret_cast<uintptr_t>(addr));
    if (it == by_addr_.end()) return -1;
    *length = it->second.length;
    return it->second.fd.get();
}

Result<void *> Engine::alloc_shared(uint64_t length, uint32_t access) {
    void *addr = nullptr;
    auto b = make_shared_buffer(length, &addr);
    if (!b) return std::unexpected(b.error());
    MemoryOptions o{MemoryKind::Host, -1, access};
    if (auto r = register_region(addr, b->length, o, b->fd.get()); !r) {
        unmap_shared_buffer(addr, *b);
        return fail(r.error().code, "alloc_shared: " + r.error().message);
    }
    FERRY_DEBUG("alloc_shared: ", b->length, " bytes at ", addr);
    impl_->shared_buffers.add(addr, std::move(*b));
    return addr;
}

Result<void> Engine::free_shared(void *addr) {
    uint64_t length = 0;
    if (impl_->shared_buffers.fd_of(addr, &length) < 0)
        return fail(-ENOENT, "free_shared: no buffer from alloc_shared starts at " +
                                 std::to_string(reinterpret_cast<uintptr_t>(addr)) +
                                 "; pass the address alloc_shared returned (memory from elsewhere: unregister_memory)");
    // Deregistered first: the transports stop serving it and tell mapped peers it is gone
    // (shm.so), then the mapping goes. A peer still holding the memfd keeps only its pages.
    auto r = unregister_memory(addr);
    SharedBuffer b;
    if (impl_->shared_buffers.take(addr, &b)) unmap_shared_buffer(addr, b);
    return r;
}

}  // namespace ferry
