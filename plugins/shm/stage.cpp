// The staging area's memfd (stage.hpp): made by the initiator, checked and mapped by the serving
// side. The checks are those of managed buffers (shared_memfd.cpp) with the roles swapped.
#include "stage.hpp"

#include "memfd.hpp"
#include "plugin_util.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <vector>

namespace ferry_shm {

using ferry_plugin::errno_string;
using ferry_plugin::strprintf;

StageArea::~StageArea() {
    if (ptr != nullptr) munmap(ptr, size);
    if (fd >= 0) close(fd);
}

namespace {

std::unique_ptr<StageArea> map_area(int fd, uint64_t size, std::string *why) {
    // Populated: the first ops do not fault page by page.
    void *p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_SHARED | MAP_POPULATE, fd, 0);
    if (p == MAP_FAILED) return *why = "mmap: " + errno_string(errno), nullptr;
    auto a = std::make_unique<StageArea>();
    a->ptr = static_cast<uint8_t *>(p);
    a->size = size;
    return a;
}

}  // namespace

std::unique_ptr<StageArea> create_stage(uint64_t size, std::string *why) {
    int f = memfd_create("ferry-shm-stage", MFD_CLOEXEC | MFD_ALLOW_SEALING);
    if (f < 0) return *why = "memfd_create: " + errno_string(errno), nullptr;
    auto fail = [&](const char *what) {
        *why = strprintf("%s: %s", what, errno_string(errno).c_str());
        close(f);
        return nullptr;
    };
    if (ftruncate(f, static_cast<off_t>(size)) != 0) return fail("ftruncate");
    // Fully allocated, so the serving side's copies never fault a hole in (SIGBUS when memory is short).
    if (int e = posix_fallocate(f, 0, static_cast<off_t>(size)); e != 0) {
        errno = e;
        return fail("posix_fallocate");
    }
    if (fcntl(f, F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) != 0) return fail("F_ADD_SEALS");
    auto a = map_area(f, size, why);
    if (!a) {
        close(f);
        return nullptr;
    }
    a->fd = f;
    return a;
}

std::unique_ptr<StageArea> map_peer_stage(int fd, uint64_t size, std::string *why) {
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (size < kStageMinBytes || size > kStageMaxBytes || size % page != 0)
        return *why = strprintf("its size %llu is not whole pages between %llu and %llu bytes",
                                static_cast<unsigned long long>(size), static_cast<unsigned long long>(kStageMinBytes),
                                static_cast<unsigned long long>(kStageMaxBytes)),
               nullptr;
    // Sealed against shrinking: the initiator cannot truncate it under our mapping (SIGBUS).
    if (!sealed_memfd(fd, why)) return nullptr;
    int fl = fcntl(fd, F_GETFL);
    if (fl < 0 || (fl & O_PATH) || (fl & O_ACCMODE) != O_RDWR) return *why = "it is not open read-write", nullptr;
    struct stat st {};
    if (fstat(fd, &st) != 0) return *why = "fstat: " + errno_string(errno), nullptr;
    if (static_cast<uint64_t>(st.st_size) != size)
        return *why = strprintf("it has %lld bytes, the offer says %llu", static_cast<long long>(st.st_size),
                                static_cast<unsigned long long>(size)),
               nullptr;
    if (static_cast<uint64_t>(st.st_blocks) * 512 < size) return *why = "it is not fully allocated", nullptr;
    return map_area(fd, size, why);
}

void stage_file_copy(int fd, bool into_area, const iovec *iov, size_t n, uint64_t off, int *status) {
    std::vector<iovec> v(iov, iov + n);
    size_t i = 0;
    while (i < n) {
        const int cnt = static_cast<int>(std::min<size_t>(n - i, 1024));  // UIO_MAXIOV
        ssize_t k = into_area ? pwritev(fd, v.data() + i, cnt, static_cast<off_t>(off))
                              : preadv(fd, v.data() + i, cnt, static_cast<off_t>(off));
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) {  // stopped at the start of v[i]: that op's buffer faults (or the call fails as a whole)
            const int e = k < 0 && errno != EFAULT ? -errno : -EFAULT;
            status[i] = e;
            off += v[i].iov_len;
            ++i;
            while (i < n && v[i].iov_len == 0) ++i;
            continue;
        }
        off += static_cast<uint64_t>(k);
        auto left = static_cast<uint64_t>(k);
        while (i < n && left >= v[i].iov_len) left -= v[i++].iov_len;
        if (left > 0) {  // stopped inside v[i]: go on from there (fails at once if it faults there)
            v[i].iov_base = static_cast<uint8_t *>(v[i].iov_base) + left;
            v[i].iov_len -= left;
        }
    }
}

}  // namespace ferry_shm
