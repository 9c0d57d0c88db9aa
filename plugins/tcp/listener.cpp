#include "listener.hpp"

#include "socket_util.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <memory>

namespace ferry_tcp {

namespace {
constexpr unsigned kFirstPauseMs = 50;
constexpr unsigned kMaxPauseMs = 1000;
constexpr int kMaxShedPerWake = 64;

// The peer's address without the port: the key of the per-address caps.
std::string address_of(const sockaddr_storage &a) {
    char buf[INET6_ADDRSTRLEN] = "?";
    if (a.ss_family == AF_INET)
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in *>(&a)->sin_addr, buf, sizeof buf);
    else if (a.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 *>(&a)->sin6_addr, buf, sizeof buf);
    return buf;
}

// Best effort: an ERROR frame fits the send buffer of a fresh socket. The client may have sent
// its HELLO already, and closing over unread bytes resets the connection, so it may see the
// reset instead.
void send_refusal(int fd, int status, const std::string &msg) {
    Header h;
    h.type = kError;
    h.status = status;
    h.msg_len = static_cast<uint32_t>(std::min<size_t>(msg.size(), kMaxErrorMsg));
    uint8_t buf[kHeaderSize + kMaxErrorMsg];
    encode_header(h, buf);
    memcpy(buf + kHeaderSize, msg.data(), h.msg_len);
    ssize_t n = send(fd, buf, kHeaderSize + h.msg_len, MSG_NOSIGNAL | MSG_DONTWAIT);
    (void)n;
}

int open_spare() { return ::open("/dev/null", O_RDONLY | O_CLOEXEC); }
}  // namespace

Listener::Listener(ServerContext &ctx, std::vector<Reactor *> reactors)
    : ctx_(ctx), reactors_(std::move(reactors)), spare_fd_(open_spare()) {}

Listener::~Listener() {
    if (fd_ >= 0) close(fd_);
    if (spare_fd_ >= 0) close(spare_fd_);
}

int Listener::open(const std::string &ip_text, sockaddr_storage *bound, std::string *why) {
    sockaddr_storage addr{};
    socklen_t len;
    const char *ip = ip_text.c_str();
    auto *a4 = reinterpret_cast<sockaddr_in *>(&addr);
    auto *a6 = reinterpret_cast<sockaddr_in6 *>(&addr);
    if (inet_pton(AF_INET, ip, &a4->sin_addr) == 1) {
        a4->sin_family = AF_INET;
        a4->sin_port = htons(ctx_.cfg.port);
        len = sizeof *a4;
    } else if (inet_pton(AF_INET6, ip, &a6->sin6_addr) == 1) {
        a6->sin6_family = AF_INET6;
        a6->sin6_port = htons(ctx_.cfg.port);
        len = sizeof *a6;
    } else {
        *why = strprintf("bind_ip '%s' is not an IP address", ip);
        return -EINVAL;
    }
    fd_ = socket(addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd_ < 0) {
        int e = errno;
        *why = "socket(): " + errno_string(e);
        return -e;
    }
    int one = 1;
    // Lets a restarted instance take its port back while old connections sit in TIME_WAIT.
    setsockopt(fd_, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    if (addr.ss_family == AF_INET6) setsockopt(fd_, IPPROTO_IPV6, IPV6_V6ONLY, &one, sizeof one);
    if (bind(fd_, reinterpret_cast<sockaddr *>(&addr), len) != 0) {
        int e = errno;
        *why = strprintf("bind to %s port %u failed: %s", ip, ctx_.cfg.port, errno_string(e).c_str());
        return -e;
    }
    if (listen(fd_, SOMAXCONN) != 0) {
        int e = errno;
        *why = "listen(): " + errno_string(e);
        return -e;
    }
    len = sizeof addr;
    if (getsockname(fd_, reinterpret_cast<sockaddr *>(&addr), &len) != 0) {
        int e = errno;
        *why = "getsockname(): " + errno_string(e);
        return -e;
    }
    *bound = addr;
    return 0;
}

int Listener::start() { return reactors_[0]->add_fd(fd_, EPOLLIN, this); }

void Listener::stop() {
    if (fd_ < 0) return;
    reactors_[0]->forget(this);
    reactors_[0]->del_fd(fd_);
    close(fd_);
    fd_ = -1;
}

void Listener::on_events(uint32_t) {
    for (int shed = 0;;) {
        sockaddr_storage peer{};
        socklen_t len = sizeof peer;
        int fd = accept4(fd_, reinterpret_cast<sockaddr *>(&peer), &len, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd >= 0) {
            pause_ms_ = 0;
            admit(fd, peer);
            continue;
        }
        int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK) return;
        if (e == EINTR || e == ECONNABORTED) continue;
        // Out of descriptors the connection stays in the backlog and the socket stays
        // readable: without shedding and pausing this loop would spin. The spare is gone when
        // another thread took the descriptor shed_one freed; try again to get it back each
        // time, or shedding would stop for as long as the backlog is never drained.
        if ((e == EMFILE || e == ENFILE) && shed < kMaxShedPerWake) {
            if (spare_fd_ < 0) spare_fd_ = open_spare();
            if (spare_fd_ >= 0) {
                shed_one(e);
                ++shed;
                continue;
            }
        }
        pause(e);
        return;
    }
}

void Listener::shed_one(int e) {
    close(spare_fd_);
    spare_fd_ = -1;
    sockaddr_storage peer{};
    socklen_t len = sizeof peer;
    int fd = accept4(fd_, reinterpret_cast<sockaddr *>(&peer), &len, SOCK_CLOEXEC);
    if (fd >= 0) {
        ++shed_;
        rlimit rl{};
        getrlimit(RLIMIT_NOFILE, &rl);
        std::string why = strprintf(
            "this engine is out of file descriptors (%s; RLIMIT_NOFILE %llu): raise its limit "
            "(ulimit -n) or lower tcp.max_connections",
            errno_string(e).c_str(), static_cast<unsigned long long>(rl.rlim_cur));
        send_refusal(fd, -EMFILE, why);
        close(fd);
        ctx_.peer_log.log(FERRY_LOG_ERROR, "connection from %s refused: %s (%llu refused so far)",
                          sockaddr_name(peer).c_str(), why.c_str(), static_cast<unsigned long long>(shed_));
    }
    spare_fd_ = open_spare();  // fails while another thread took the descriptor freed above
}

void Listener::pause(int e) {
    pause_ms_ = pause_ms_ == 0 ? kFirstPauseMs : std::min(2 * pause_ms_, kMaxPauseMs);
    ctx_.peer_log.log(FERRY_LOG_ERROR, "accept failed: %s; accepting again in %u ms", errno_string(e).c_str(),
                      pause_ms_);
    paused_ = true;
    resume_at_ = Clock::now() + std::chrono::milliseconds(pause_ms_);
    reactors_[0]->mod_fd(fd_, 0, this);
    reactors_[0]->want_timer(this);
}

void Listener::admit(int fd, const sockaddr_storage &peer) {
    if (spare_fd_ < 0) spare_fd_ = open_spare();
    std::string name = sockaddr_name(peer);
    std::string why;
    if (tune_socket(fd, ctx_.cfg, &why) != 0) {
        ctx_.peer_log.log(FERRY_LOG_WARN, "connection from %s dropped: %s", name.c_str(), why.c_str());
        close(fd);
        return;
    }
    Admission adm;
    adm.ip = address_of(peer);
    if (!ctx_.limits.admit(adm.ip, &adm.refusal)) {
        if (!ctx_.limits.admit_refusal()) {
            // A flood: more refusals are pending than are answered; this one is not.
            ctx_.peer_log.log(FERRY_LOG_WARN, "connection from %s closed unanswered: %s", name.c_str(),
                              adm.refusal.c_str());
            close(fd);
            return;
        }
        adm.refused = true;  // answered with an ERROR once its HELLO is read (server.cpp)
    }
    ctx_.log.log(FERRY_LOG_DEBUG, "connection from %s", name.c_str());
    Reactor *r = reactors_[next_++ % reactors_.size()];
    ServerContext *ctx = &ctx_;
    // The task owns fd and the admission until it runs; the transport runs every reactor's
    // queue before stopping, so it always runs.
    r->post([ctx, r, fd, name = std::move(name), adm = std::move(adm)]() mutable {
        auto conn = std::make_unique<ServerConn>(*ctx, *r, fd, std::move(name), std::move(adm));
        if (conn->start() != 0) {
            ctx->log.log(FERRY_LOG_ERROR, "cannot watch an accepted connection");
            return;  // the destructor closes fd and releases the admission
        }
        r->adopt(std::move(conn));
    });
}

bool Listener::on_timer(Clock::time_point now) {
    bool keep = ctx_.peer_log.flush();
    if (paused_ && fd_ >= 0 && now < resume_at_) return true;
    if (paused_ && fd_ >= 0) reactors_[0]->mod_fd(fd_, EPOLLIN, this);
    paused_ = false;
    return keep;
}

}  // namespace ferry_tcp
