#include "peer.hpp"

#include <poll.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>

#ifndef SO_PEERPIDFD
#define SO_PEERPIDFD 77
#endif

namespace ferry_shm {

int peer_pidfd(int sock, pid_t pid) {
    int fd = -1;
    socklen_t len = sizeof fd;
    if (getsockopt(sock, SOL_SOCKET, SO_PEERPIDFD, &fd, &len) == 0 && fd >= 0) return fd;
#ifdef SYS_pidfd_open
    if (pid > 0) return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
#endif
    errno = ENOSYS;
    return -1;
}

bool process_alive(int pidfd) {
    if (pidfd < 0) return false;
    pollfd p{pidfd, POLLIN, 0};
    int r;
    do r = ::poll(&p, 1, 0);
    while (r < 0 && errno == EINTR);
    return r == 0;
}

std::shared_ptr<Gate> Gate::make() {
    void *p = mmap(nullptr, static_cast<size_t>(sysconf(_SC_PAGESIZE)), PROT_READ | PROT_WRITE,
                   MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (p == MAP_FAILED) return nullptr;
    std::shared_ptr<Gate> g(new Gate());
    g->page_ = p;
    return g;
}

void Gate::revoke() {
    if (!revoked_ && mprotect(page_, static_cast<size_t>(sysconf(_SC_PAGESIZE)), PROT_NONE) == 0) revoked_ = true;
}

Gate::~Gate() {
    if (!keep_) munmap(page_, static_cast<size_t>(sysconf(_SC_PAGESIZE)));
}

}  // namespace ferry_shm
