#include "memfd.hpp"

#include "plugin_util.hpp"

#include <fcntl.h>
#include <linux/magic.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace ferry_shm {

namespace {

// True when [addr, addr+len) is covered, without gaps, by private anonymous read-write
// mappings (no file, no [heap]/[stack], not shared).
bool private_anonymous(uint64_t addr, uint64_t len, std::string *why) {
    FILE *f = fopen("/proc/self/maps", "re");
    if (f == nullptr) {
        *why = "cannot read /proc/self/maps";
        return false;
    }
    const uint64_t end = addr + len;
    uint64_t covered = addr;
    char line[512];
    bool ok = true;
    while (ok && fgets(line, sizeof line, f) != nullptr && covered < end) {
        unsigned long long lo = 0, hi = 0, ino = 0;
        char perms[8] = "", path[256] = "";
        unsigned long long off = 0;
        unsigned dmaj = 0, dmin = 0;
        int n = sscanf(line, "%llx-%llx %7s %llx %x:%x %llu %255s", &lo, &hi, perms, &off, &dmaj, &dmin, &ino, path);
        if (n < 7 || hi <= covered || lo >= end) continue;
        if (lo > covered) {
            *why = strprintf("[0x%" PRIx64 ", +%" PRIu64 ") is not fully mapped", addr, len);
            ok = false;
        } else if (strcmp(perms, "rw-p") != 0 || ino != 0 || path[0] != '\0') {
            *why = strprintf("[0x%llx, 0x%llx) is %s %s, not private anonymous read-write memory", lo, hi, perms,
                             path[0] ? path : "(anonymous)");
            ok = false;
        } else {
            covered = hi;
        }
    }
    fclose(f);
    if (ok && covered < end) {
        *why = strprintf("[0x%" PRIx64 ", +%" PRIu64 ") is not fully mapped", addr, len);
        ok = false;
    }
    return ok;
}

}  // namespace

bool adopt_into_memfd(uint64_t addr, uint64_t len, MemfdBacking *out, std::string *why) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (addr % page != 0 || len % page != 0) {
        *why = "the region is not page-aligned or not a whole number of pages";
        return false;
    }
    if (!private_anonymous(addr, len, why)) return false;
    int fd = memfd_create(kMemfdName, MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (fd < 0) {
        *why = "memfd_create: " + errno_string(errno);
        return false;
    }
    auto fail = [&](const char *step) {
        *why = std::string(step) + ": " + errno_string(errno);
        close(fd);
        return false;
    };
    if (ftruncate(fd, static_cast<off_t>(len)) != 0) return fail("ftruncate");
    // Sealed before any peer can see it: a serving side maps it and must never meet a shorter file.
    if (fcntl(fd, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) return fail("fcntl(F_ADD_SEALS)");
    void *staging = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    if (staging == MAP_FAILED) return fail("mmap");
    void *region = reinterpret_cast<void *>(addr);
    memcpy(staging, region, len);
    // MAP_FIXED replaces the anonymous pages atomically: same addresses, now backed by the memfd.
    void *at = mmap(region, len, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_FIXED, fd, 0);
    munmap(staging, len);
    if (at != region) return fail("mmap(MAP_FIXED)");
    struct stat st {};
    if (fstat(fd, &st) != 0) return fail("fstat");
    out->fd = fd;
    out->ino = st.st_ino;
    return true;
}

PeerMapping::~PeerMapping() {
    if (ptr != nullptr) munmap(ptr, len);
}

std::shared_ptr<PeerMapping> map_peer_memfd(int pidfd, int fd, uint64_t ino, uint64_t len, std::string *why) {
#ifndef SYS_pidfd_getfd
    (void)pidfd, (void)fd, (void)ino, (void)len;
    *why = "this C library has no pidfd_getfd";
    return nullptr;
#else
    if (pidfd < 0 || fd < 0) {
        *why = "no pidfd of the initiator";
        return nullptr;
    }
    // The initiator's own open file description: its access, not ours.
    int mine = static_cast<int>(syscall(SYS_pidfd_getfd, pidfd, fd, 0));
    if (mine < 0) {
        *why = strprintf("pidfd_getfd of its descriptor %d: %s", fd, errno_string(errno).c_str());
        return nullptr;
    }
    auto refuse = [&](const std::string &m) {
        *why = strprintf("its descriptor %d %s", fd, m.c_str());
        close(mine);
        return nullptr;
    };
    struct statfs fs {};
    if (fstatfs(mine, &fs) != 0 || (fs.f_type != TMPFS_MAGIC && fs.f_type != HUGETLBFS_MAGIC))
        return refuse("is not on tmpfs/hugetlbfs (not a memfd)");
    char link[64], target[256];
    snprintf(link, sizeof link, "/proc/self/fd/%d", mine);
    ssize_t n = readlink(link, target, sizeof target - 1);
    target[n > 0 ? n : 0] = '\0';
    const std::string want = std::string("/memfd:") + kMemfdName;
    if (n <= 0 || std::string(target).compare(0, want.size(), want) != 0 ||
        (target[want.size()] != '\0' && target[want.size()] != ' '))
        return refuse(strprintf("is '%s', not a memfd named %s", target, kMemfdName));
    int fl = fcntl(mine, F_GETFL);
    if (fl < 0 || (fl & O_ACCMODE) != O_RDWR || (fl & O_PATH)) return refuse("is not open read-write");
    int seals = fcntl(mine, F_GET_SEALS);
    if (seals < 0 || !(seals & F_SEAL_SHRINK)) return refuse("is not sealed against shrinking (F_SEAL_SHRINK)");
    struct stat st {};
    if (fstat(mine, &st) != 0 || st.st_ino != ino || static_cast<uint64_t>(st.st_size) < len)
        return refuse("is not the announced memfd (inode or size differ)");
    void *p = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, mine, 0);
    int e = errno;
    close(mine);  // the mapping keeps the file
    if (p == MAP_FAILED) {
        *why = strprintf("mmap of its descriptor %d: %s", fd, errno_string(e).c_str());
        return nullptr;
    }
    auto m = std::make_shared<PeerMapping>();
    m->ptr = static_cast<uint8_t *>(p);
    m->len = len;
    m->ino = ino;
    return m;
#endif
}

}  // namespace ferry_shm
