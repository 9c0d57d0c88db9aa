// The memfds of managed buffers (memfd.hpp, map_wire.hpp): the serving side's hold on the
// host's memfd and its liveness word, and the initiator's checks before it maps one a peer sent.
#include "map_wire.hpp"
#include "memfd.hpp"

#include "plugin_util.hpp"

#include <ferry/plugin.h>

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <utility>

namespace ferry_shm {

namespace {

constexpr int kNeededSeals = F_SEAL_SHRINK | F_SEAL_GROW;

uint64_t page_size() { return static_cast<uint64_t>(sysconf(_SC_PAGESIZE)); }

}  // namespace

ssize_t send_with_fd(int sock, const void *buf, size_t len, int fd, int flags) {
    iovec iov{const_cast<void *>(buf), len};
    msghdr mh{};
    mh.msg_iov = &iov;
    mh.msg_iovlen = 1;
    alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int))] = {};
    if (fd >= 0) {
        mh.msg_control = control;
        mh.msg_controllen = sizeof control;
        cmsghdr *cm = CMSG_FIRSTHDR(&mh);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int));
        memcpy(CMSG_DATA(cm), &fd, sizeof fd);
    }
    ssize_t n;
    do n = sendmsg(sock, &mh, flags);
    while (n < 0 && errno == EINTR);
    return n;
}

bool sealed_memfd(int fd, std::string *why) {
    struct statfs fs {};
    if (fstatfs(fd, &fs) != 0) return *why = "fstatfs: " + errno_string(errno), false;
    if (fs.f_type != TMPFS_MAGIC) return *why = "it is not a memfd (not on tmpfs)", false;
    char link[64], target[256];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd);
    ssize_t n = readlink(link, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    if (n <= 0 || strncmp(target, "/memfd:", 7) != 0) return *why = strprintf("it is '%s', not a memfd", target), false;
    int seals = fcntl(fd, F_GET_SEALS);
    if (seals < 0 || (seals & kNeededSeals) != kNeededSeals)
        return *why = "it is not sealed against shrinking and growing (F_SEAL_SHRINK | F_SEAL_GROW)", false;
    return true;
}

SharedBacking &SharedBacking::operator=(SharedBacking &&o) noexcept {
    if (this != &o) {
        reset();
        fd_offset = o.fd_offset, live_offset = o.live_offset, live_value = o.live_value, ino = o.ino;
        fd_ = std::exchange(o.fd_, -1);
        live_page_ = std::exchange(o.live_page_, nullptr);
        page_ = o.page_;
    }
    return *this;
}

SharedBacking::~SharedBacking() { reset(); }

void SharedBacking::reset() {
    revoke();
    if (live_page_ != nullptr) munmap(live_page_, page_);
    if (fd_ >= 0) close(fd_);
    live_page_ = nullptr;
    fd_ = -1;
}

bool SharedBacking::init(int host_fd, uint64_t off, uint64_t length, std::string *why) {
    page_ = page_size();
    if (off % page_ != 0) return *why = "the memfd offset is not page-aligned", false;
    if (!sealed_memfd(host_fd, why)) return false;
    struct stat st {};
    const uint64_t live_at = off + (length + page_ - 1) / page_ * page_;
    if (fstat(host_fd, &st) != 0 || static_cast<uint64_t>(st.st_size) < live_at + page_)
        return *why = "the memfd has no page after the region for the plugin", false;
    int fl = fcntl(host_fd, F_GETFL);
    if (fl < 0 || (fl & O_ACCMODE) != O_RDWR) return *why = "the memfd is not open read-write", false;
    uint64_t v = 0;
    if (getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v)) return *why = "getrandom failed", false;
    void *p = mmap(nullptr, page_, PROT_READ | PROT_WRITE, MAP_SHARED, host_fd, static_cast<off_t>(live_at));
    if (p == MAP_FAILED) return *why = "mmap of the liveness page: " + errno_string(errno), false;
    fd_ = fcntl(host_fd, F_DUPFD_CLOEXEC, 0);
    if (fd_ < 0) {
        munmap(p, page_);
        return *why = "dup: " + errno_string(errno), false;
    }
    live_page_ = p;
    fd_offset = off;
    live_offset = live_at;
    live_value = v | 1;  // never 0
    ino = st.st_ino;
    __atomic_store_n(static_cast<uint64_t *>(live_page_), live_value, __ATOMIC_RELEASE);
    return true;
}

int SharedBacking::reopen_read_only() const {
    char link[64];
    snprintf(link, sizeof link, "/proc/self/fd/%d", fd_);
    return open(link, O_RDONLY | O_CLOEXEC);  // a new open file description: read-only, same inode
}

void SharedBacking::revoke() {
    if (live_page_ != nullptr) __atomic_store_n(static_cast<uint64_t *>(live_page_), 0, __ATOMIC_RELEASE);
}

SharedMapping::~SharedMapping() {
    if (ptr != nullptr) munmap(ptr, map_len);
}

int check_received_memfd(int fd, const MapReply &r, uint64_t *ino, std::string *why) {
    if (!sealed_memfd(fd, why)) return -EBADF;
    int fl = fcntl(fd, F_GETFL);
    const bool rw = r.access & FERRY_ACCESS_REMOTE_WRITE;
    if (fl < 0 || (fl & O_PATH) || (fl & O_ACCMODE) != (rw ? O_RDWR : O_RDONLY))
        return *why = rw ? "it is not open read-write, as the region's access says"
                         : "it is not open read-only, as the region's access says",
               -EBADF;
    struct stat st {};
    const uint64_t page = page_size();
    if (fstat(fd, &st) != 0) return *why = "fstat: " + errno_string(errno), -EBADF;
    if (static_cast<uint64_t>(st.st_size) < r.live_offset + page)
        return *why = strprintf("it has %lld bytes, too few for the region and its liveness page",
                                static_cast<long long>(st.st_size)),
               -EBADF;
    // Holes would be allocated by our copies' page faults (SIGBUS when memory is short).
    if (static_cast<uint64_t>(st.st_blocks) * 512 < r.live_offset + page - r.fd_offset)
        return *why = "it is not fully allocated", -EBADF;
    if (st.st_ino != r.ino) return *why = "its inode is not the one the reply names", -EBADF;
    *ino = st.st_ino;
    return 0;
}

std::shared_ptr<SharedMapping> map_checked_memfd(int fd, const MapReply &r, uint64_t ino, std::string *why) {
    const uint64_t page = page_size();
    const size_t len = static_cast<size_t>(r.live_offset + page - r.fd_offset);
    const bool rw = r.access & FERRY_ACCESS_REMOTE_WRITE;
    void *p = mmap(nullptr, len, rw ? PROT_READ | PROT_WRITE : PROT_READ, MAP_SHARED | MAP_POPULATE, fd,
                   static_cast<off_t>(r.fd_offset));  // populated: no page fault per 4 KiB in the first copies
    if (p == MAP_FAILED) return *why = "mmap: " + errno_string(errno), nullptr;
    auto m = std::make_shared<SharedMapping>();
    m->ptr = static_cast<uint8_t *>(p);
    m->map_len = len;
    m->base = r.base;
    m->length = r.length;
    m->ino = ino;
    m->live_value = r.live_value;
    m->writable = rw;
    m->live = reinterpret_cast<const volatile uint64_t *>(m->ptr + (r.live_offset - r.fd_offset));
    return m;
}

}  // namespace ferry_shm
