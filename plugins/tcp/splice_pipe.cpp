#include "splice_pipe.hpp"

#include <fcntl.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>

namespace ferry_tcp {

namespace {
constexpr int kPipeSize = 1 << 20;
}  // namespace

bool SplicePipe::open() {
    if (rd_ >= 0) return true;
    int fds[2];
    if (pipe2(fds, O_NONBLOCK | O_CLOEXEC) != 0) return false;
    rd_ = fds[0];
    wr_ = fds[1];
    pending_ = 0;
    // Larger pipes mean fewer syscalls per slice. Refused above the per-user pipe budget
    // (fs.pipe-user-pages-soft) for unprivileged users: the default size still works.
    (void)fcntl(wr_, F_SETPIPE_SZ, kPipeSize);
    return true;
}

ssize_t SplicePipe::push(const uint8_t *p, size_t len) {
    iovec iov{const_cast<uint8_t *>(p), len};
    ssize_t n = vmsplice(wr_, &iov, 1, SPLICE_F_NONBLOCK);
    if (n < 0) return -errno;
    pending_ += static_cast<size_t>(n);
    return n;
}

ssize_t SplicePipe::copy_in(const uint8_t *p, size_t len) {
    ssize_t n = write(wr_, p, len);
    if (n < 0) return -errno;
    pending_ += static_cast<size_t>(n);
    return n;
}

ssize_t SplicePipe::drain(int sock) {
    ssize_t n = splice(rd_, nullptr, sock, nullptr, pending_, SPLICE_F_NONBLOCK | SPLICE_F_MOVE);
    if (n < 0) return -errno;
    pending_ -= static_cast<size_t>(n);
    return n;
}

void SplicePipe::reset() {
    if (rd_ >= 0) close(rd_);
    if (wr_ >= 0) close(wr_);
    rd_ = wr_ = -1;
    pending_ = 0;
}

}  // namespace ferry_tcp
