#include "util/socket_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>
#include <memory>

#include "util/log.hpp"

namespace ferry {
namespace {

int remaining_ms(Clock::time_point deadline) {
    auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
    return left < 0 ? 0 : static_cast<int>(std::min<int64_t>(left, 1 << 30));
}

// Waits for `events` on fd until the deadline.
Result<void> wait_for(int fd, short events, Clock::time_point deadline, const char *what) {
    for (;;) {
        pollfd p{fd, events, 0};
        int n = ::poll(&p, 1, remaining_ms(deadline));
        if (n > 0) return {};
        if (n == 0) return fail(-ETIMEDOUT, cat("timed out while ", what));
        if (errno != EINTR) return fail(-errno, cat("poll failed while ", what, ": ", strerror(errno)));
    }
}

}  // namespace

Result<HostPort> parse_host_port(std::string_view text) {
    std::string host;
    std::string_view port_text;
    if (!text.empty() && text.front() == '[') {
        auto close = text.find(']');
        if (close == std::string_view::npos || close + 1 >= text.size() || text[close + 1] != ':')
            return fail(-EINVAL, cat("'", text, "' is not host:port ([v6]:port for IPv6)"));
        host = std::string(text.substr(1, close - 1));
        port_text = text.substr(close + 2);
    } else {
        auto colon = text.rfind(':');
        if (colon == std::string_view::npos || colon == 0)
            return fail(-EINVAL, cat("'", text, "' is not host:port, e.g. 127.0.0.1:7000"));
        host = std::string(text.substr(0, colon));
        port_text = text.substr(colon + 1);
    }
    if (port_text.empty() || port_text.size() > 5) return fail(-EINVAL, cat("bad port in '", text, "'"));
    unsigned port = 0;
    for (char c : port_text) {
        if (c < '0' || c > '9') return fail(-EINVAL, cat("bad port in '", text, "'"));
        port = port * 10 + static_cast<unsigned>(c - '0');
    }
    if (port == 0 || port > 65535) return fail(-EINVAL, cat("port out of range in '", text, "'"));
    return HostPort{host, static_cast<uint16_t>(port)};
}

Result<Fd> listen_tcp(const std::string &ip, uint16_t port, int backlog) {
    sockaddr_storage ss{};
    socklen_t len = 0;
    auto *v4 = reinterpret_cast<sockaddr_in *>(&ss);
    auto *v6 = reinterpret_cast<sockaddr_in6 *>(&ss);
    if (inet_pton(AF_INET, ip.c_str(), &v4->sin_addr) == 1) {
        v4->sin_family = AF_INET;
        v4->sin_port = htons(port);
        len = sizeof *v4;
    } else if (inet_pton(AF_INET6, ip.c_str(), &v6->sin6_addr) == 1) {
        v6->sin6_family = AF_INET6;
        v6->sin6_port = htons(port);
        len = sizeof *v6;
    } else {
        return fail(-EINVAL, cat("'", ip, "' is not a numeric IPv4 or IPv6 address; set local_ip to one"));
    }
    Fd fd(::socket(ss.ss_family, SOCK_STREAM | SOCK_CLOEXEC, 0));
    if (!fd) return fail(-errno, cat("socket(): ", strerror(errno)));
    int one = 1;
    setsockopt(fd.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (::bind(fd.get(), reinterpret_cast<sockaddr *>(&ss), len) != 0)
        return fail(-errno, cat("cannot bind ", ip, ":", port, ": ", strerror(errno),
                                port ? "; pick another port or 0 for any free one" : ""));
    if (::listen(fd.get(), backlog) != 0) return fail(-errno, cat("listen(): ", strerror(errno)));
    return fd;
}

uint16_t bound_port(int fd) {
    sockaddr_storage ss{};
    socklen_t len = sizeof ss;
    if (getsockname(fd, reinterpret_cast<sockaddr *>(&ss), &len) != 0) return 0;
    if (ss.ss_family == AF_INET) return ntohs(reinterpret_cast<sockaddr_in *>(&ss)->sin_port);
    return ntohs(reinterpret_cast<sockaddr_in6 *>(&ss)->sin6_port);
}

Result<Fd> connect_tcp(const HostPort &to, Clock::time_point deadline) {
    addrinfo hints{};
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_family = AF_UNSPEC;
    addrinfo *res = nullptr;
    std::string port = std::to_string(to.port);
    if (int rc = getaddrinfo(to.host.c_str(), port.c_str(), &hints, &res); rc != 0)
        return fail(-EHOSTUNREACH, cat("cannot resolve '", to.host, "': ", gai_strerror(rc)));
    std::unique_ptr<addrinfo, decltype(&freeaddrinfo)> guard(res, freeaddrinfo);
    Error last{-ECONNREFUSED, ""};
    for (auto *ai = res; ai; ai = ai->ai_next) {
        Fd fd(::socket(ai->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0));
        if (!fd) continue;
        if (::connect(fd.get(), ai->ai_addr, ai->ai_addrlen) != 0) {
            if (errno != EINPROGRESS) {
                last = Error{-errno, strerror(errno)};
                continue;
            }
            if (auto w = wait_for(fd.get(), POLLOUT, deadline, "connecting"); !w) {
                last = w.error();
                continue;
            }
            int soerr = 0;
            socklen_t sl = sizeof soerr;
            getsockopt(fd.get(), SOL_SOCKET, SO_ERROR, &soerr, &sl);
            if (soerr != 0) {
                last = Error{-soerr, strerror(soerr)};
                continue;
            }
        }
        int flags = fcntl(fd.get(), F_GETFL);
        fcntl(fd.get(), F_SETFL, flags & ~O_NONBLOCK);
        int one = 1;
        setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        return fd;
    }
    return fail(last.code, cat("cannot connect to ", to.host, ":", to.port, ": ", last.message));
}

Result<void> write_all(int fd, std::span<const uint8_t> data, Clock::time_point deadline) {
    size_t done = 0;
    while (done < data.size()) {
        if (auto w = wait_for(fd, POLLOUT, deadline, "sending"); !w) return w;
        ssize_t n = ::send(fd, data.data() + done, data.size() - done, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) {
            done += static_cast<size_t>(n);
        } else if (n < 0 && errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
            return fail(-errno, cat("send failed: ", strerror(errno)));
        }
    }
    return {};
}

Result<void> read_all(int fd, std::span<uint8_t> data, Clock::time_point deadline) {
    size_t done = 0;
    while (done < data.size()) {
        if (auto w = wait_for(fd, POLLIN, deadline, "receiving"); !w) return w;
        ssize_t n = ::recv(fd, data.data() + done, data.size() - done, MSG_DONTWAIT);
        if (n > 0) {
            done += static_cast<size_t>(n);
        } else if (n == 0) {
            return fail(-ECONNRESET, "connection closed by peer");
        } else if (errno != EINTR && errno != EAGAIN && errno != EWOULDBLOCK) {
            return fail(-errno, cat("recv failed: ", strerror(errno)));
        }
    }
    return {};
}

}  // namespace ferry
