#include "socket_util.hpp"

#include "plugin_util.hpp"

#include <netinet/in.h>
#include <netinet/tcp.h>
#include <sys/socket.h>

#include <cerrno>

namespace ferry_tcp {

int tune_socket(int fd, const Config &cfg, std::string *why) {
    int one = 1;
    if (setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one) != 0) {
        int e = errno;
        *why = "setsockopt(TCP_NODELAY): " + errno_string(e);
        return -e;
    }
    // Setting a buffer size turns off the kernel's autotuning for that direction, so it is
    // done only when asked; the kernel caps the value at net.core.{w,r}mem_max.
    if (cfg.sndbuf != 0) {
        int v = static_cast<int>(cfg.sndbuf);
        if (setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof v) != 0) {
            int e = errno;
            *why = "setsockopt(SO_SNDBUF): " + errno_string(e);
            return -e;
        }
    }
    if (cfg.rcvbuf != 0) {
        int v = static_cast<int>(cfg.rcvbuf);
        if (setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof v) != 0) {
            int e = errno;
            *why = "setsockopt(SO_RCVBUF): " + errno_string(e);
            return -e;
        }
    }
    return 0;
}

int socket_error(int fd) {
    int err = 0;
    socklen_t len = sizeof err;
    if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) return errno;
    return err;
}

void set_rcvlowat(int fd, int *current, int want) {
    if (want < 1) want = 1;
    if (*current == want) return;
    // The kernel signals EPOLLIN at once when the data already queued meets the new mark.
    if (setsockopt(fd, SOL_SOCKET, SO_RCVLOWAT, &want, sizeof want) == 0) *current = want;
}

}  // namespace ferry_tcp
