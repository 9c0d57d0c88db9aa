#include "control_server.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry_rdma {

namespace {

using Clock = std::chrono::steady_clock;
using std::chrono::milliseconds;

// An unauthenticated peer sends only Hello (33 bytes) and Auth (32): anything bigger is refused
// before a byte of it is buffered.
constexpr size_t kMaxUnauthenticatedBody = 256;
// Connections told why they were refused, kept open a moment so the peer reads the reason (a
// close with its Hello unread would reset the connection and lose it); beyond this many, closed.
constexpr size_t kMaxLingering = 64;
constexpr auto kLinger = milliseconds(500);
constexpr auto kAcceptPause = milliseconds(200);  // out of descriptors: try again after this

std::string peer_address(int fd, uint32_t *ip) {
    sockaddr_in a{};
    socklen_t len = sizeof a;
    if (getpeername(fd, reinterpret_cast<sockaddr *>(&a), &len) != 0 || a.sin_family != AF_INET) {
        *ip = 0;
        return "(unknown address)";
    }
    *ip = a.sin_addr.s_addr;
    char buf[INET_ADDRSTRLEN] = {};
    inet_ntop(AF_INET, &a.sin_addr, buf, sizeof buf);
    return std::string(buf) + ":" + std::to_string(ntohs(a.sin_port));
}

// One small frame, never blocking: an unauthenticated peer that does not read loses it.
void send_now(int fd, const CtrlHeader &h, const std::vector<uint8_t> &body) {
    std::vector<uint8_t> frame(kCtrlHeaderSize + body.size());
    CtrlHeader copy = h;
    copy.body_len = static_cast<uint32_t>(body.size());
    encode_header(copy, frame.data());
    std::copy(body.begin(), body.end(), frame.begin() + kCtrlHeaderSize);
    (void)!::send(fd, frame.data(), frame.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
}

}  // namespace

ControlServer::ControlServer(int listen_fd, const std::string *key, const ControlLimits &limits, const Logger &log,
                             Handler handler)
    : listen_fd_(listen_fd),
      key_(key),
      limits_(limits),
      log_(log),
      handler_(std::move(handler)),
      refusals_(log, FERRY_LOG_WARN),
      out_of_fds_(log, FERRY_LOG_WARN) {}

ControlServer::~ControlServer() { stop(); }

int ControlServer::start(std::string *why) {
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (wake_fd_ < 0) {
        *why = "eventfd: " + errno_string(errno);
        return -errno;
    }
    thread_ = std::thread([this] { loop(); });
    return 0;
}

void ControlServer::stop() {
    stop_ = true;
    if (wake_fd_ >= 0) {
        uint64_t one = 1;
        (void)!write(wake_fd_, &one, sizeof one);
    }
    if (thread_.joinable()) thread_.join();
    while (!conns_.empty()) close_conn(conns_.size() - 1);
    for (auto &[fd, until] : lingering_) ::close(fd);
    lingering_.clear();
    if (wake_fd_ >= 0) ::close(wake_fd_);
    wake_fd_ = -1;
}

unsigned ControlServer::unauthenticated_from(uint32_t ip) const {
    unsigned n = 0;
    for (const auto &c : conns_) n += (!c->auth.done() && c->ip == ip) ? 1 : 0;
    return n;
}

void ControlServer::refuse(int fd, const std::string &address, const std::string &why) {
    refusals_.event([&] { return "refused a control connection from " + address + ": " + why; });
    CtrlHeader h;
    h.type = static_cast<uint16_t>(CtrlType::HelloAck);
    h.status = -EBUSY;
    send_now(fd, h, std::vector<uint8_t>(why.begin(), why.end()));
    if (lingering_.size() >= kMaxLingering) {
        ::close(fd);
        return;
    }
    ::shutdown(fd, SHUT_WR);
    lingering_.emplace_back(fd, Clock::now() + kLinger);
}

void ControlServer::accept_ready() {
    for (int round = 0; round < 64; ++round) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_CLOEXEC | SOCK_NONBLOCK);
        if (fd < 0) {
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) {
                // The pending connection stays in the backlog; polling the listener again at once
                // would spin. Pause, and say so once per interval.
                int e = errno;
                accept_paused_until_ = Clock::now() + kAcceptPause;
                out_of_fds_.event([&] {
                    return "cannot accept control connections: " + errno_string(e) +
                           " (raise the open-file limit, ulimit -n, or find what holds the descriptors); accepting "
                           "paused for 200 ms at a time";
                });
            }
            return;  // EAGAIN, or a connection that went away before it was accepted
        }
        uint32_t ip = 0;
        std::string address = peer_address(fd, &ip);
        if (conns_.size() >= limits_.max_connections) {
            refuse(fd, address,
                   "this rdma.so control server already has " + std::to_string(conns_.size()) +
                       " connections (max_control_connections); try again later or raise rdma.max_control_connections");
            continue;
        }
        if (unauthenticated_from(ip) >= limits_.max_unauthenticated_per_address) {
            refuse(fd, address,
                   std::to_string(limits_.max_unauthenticated_per_address) +
                       " connections from this address are still in their handshake "
                       "(rdma.max_unauthenticated_per_address); try again in " +
                       std::to_string(limits_.handshake_timeout_ms) + " ms");
            continue;
        }
        auto c = std::make_unique<ServedConn>(key_);
        c->fd = fd;
        c->ip = ip;
        c->address = std::move(address);
        c->deadline = Clock::now() + milliseconds(limits_.handshake_timeout_ms);
        conns_.push_back(std::move(c));
        open_ = conns_.size();
    }
}

bool ControlServer::on_message(ServedConn &c, const CtrlHeader &h, const std::vector<uint8_t> &body) {
    if (c.auth.done()) return handler_(c, h, body);
    CtrlHeader reply;
    std::vector<uint8_t> out;
    std::string why;
    int rc = c.auth.on_message(h, body, &reply, &out, &why);
    if (rc != 0) refusals_.event([&] { return "refused a control connection from " + c.address + ": " + why; });
    send_now(c.fd, reply, out);
    return rc == 0;
}

bool ControlServer::read_ready(ServedConn &c) {
    uint8_t buf[16 * 1024];
    for (;;) {
        ssize_t n = ::recv(c.fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n == 0) return false;
        if (n < 0 && errno == EINTR) continue;
        if (n < 0) return errno == EAGAIN || errno == EWOULDBLOCK;
        c.in.insert(c.in.end(), buf, buf + n);
        // Every complete message in what arrived; a partial one waits for more.
        size_t at = 0;
        while (c.in.size() - at >= kCtrlHeaderSize) {
            CtrlHeader h;
            std::string why;
            if (!decode_header(c.in.data() + at, &h, &why)) {
                refusals_.event([&] { return "dropped a control connection from " + c.address + ": " + why; });
                return false;
            }
            if (!c.auth.done() && h.body_len > kMaxUnauthenticatedBody) {
                refusals_.event([&] {
                    return "dropped a control connection from " + c.address + ": a " + std::to_string(h.body_len) +
                           "-byte message before authentication";
                });
                return false;
            }
            if (c.in.size() - at - kCtrlHeaderSize < h.body_len) break;
            auto first = c.in.begin() + static_cast<ptrdiff_t>(at + kCtrlHeaderSize);
            std::vector<uint8_t> body(first, first + h.body_len);
            at += kCtrlHeaderSize + h.body_len;
            if (!on_message(c, h, body)) return false;
        }
        c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(at));
        if (static_cast<size_t>(n) < sizeof buf) return true;
    }
}

void ControlServer::close_conn(size_t i) {
    ::close(conns_[i]->fd);
    conns_[i] = std::move(conns_.back());  // its session (queue pairs) goes with it
    conns_.pop_back();
    open_ = conns_.size();
}

void ControlServer::loop() {
    std::vector<pollfd> fds;
    while (!stop_) {
        auto now = Clock::now();
        // Handshake deadlines and lingering refusals that are due.
        for (size_t i = conns_.size(); i-- > 0;) {
            if (!conns_[i]->auth.done() && now >= conns_[i]->deadline) {
                std::string why = "no handshake within " + std::to_string(limits_.handshake_timeout_ms) +
                                  " ms (rdma.handshake_timeout_ms)";
                refusals_.event([&] { return "closed a control connection from " + conns_[i]->address + ": " + why; });
                CtrlHeader h;
                h.type = static_cast<uint16_t>(CtrlType::HelloAck);
                h.status = -ETIMEDOUT;
                send_now(conns_[i]->fd, h, std::vector<uint8_t>(why.begin(), why.end()));
                close_conn(i);
            }
        }
        for (size_t i = lingering_.size(); i-- > 0;) {
            if (now >= lingering_[i].second) {
                ::close(lingering_[i].first);
                lingering_[i] = lingering_.back();
                lingering_.pop_back();
            }
        }
        auto next = now + std::chrono::seconds(1);
        for (const auto &c : conns_)
            if (!c->auth.done()) next = std::min(next, c->deadline);
        for (const auto &l : lingering_) next = std::min(next, l.second);
        bool accepting = now >= accept_paused_until_;
        if (!accepting) next = std::min(next, accept_paused_until_);

        fds.clear();
        fds.push_back({wake_fd_, POLLIN, 0});
        fds.push_back({accepting ? listen_fd_ : -1, POLLIN, 0});
        for (const auto &c : conns_) fds.push_back({c->fd, POLLIN, 0});
        for (const auto &l : lingering_) fds.push_back({l.first, POLLIN, 0});
        int wait_ms =
            static_cast<int>(std::max<int64_t>(1, std::chrono::duration_cast<milliseconds>(next - now).count() + 1));
        if (::poll(fds.data(), fds.size(), wait_ms) <= 0) continue;
        if (fds[0].revents != 0) continue;  // stop_ is set
        // Connections first (indices match fds until something is closed or accepted).
        size_t n_conns = conns_.size(), n_linger = lingering_.size();
        std::vector<ServedConn *> drop;
        for (size_t i = 0; i < n_conns; ++i)
            if (fds[2 + i].revents != 0 && !read_ready(*conns_[i])) drop.push_back(conns_[i].get());
        for (size_t i = n_linger; i-- > 0;) {
            if (fds[2 + n_conns + i].revents == 0) continue;
            uint8_t sink[4096];
            ssize_t n = ::recv(lingering_[i].first, sink, sizeof sink, MSG_DONTWAIT);
            if (n == 0 || (n < 0 && errno != EAGAIN && errno != EINTR)) {
                ::close(lingering_[i].first);
                lingering_[i] = lingering_.back();
                lingering_.pop_back();
            }
        }
        for (ServedConn *d : drop)
            for (size_t i = 0; i < conns_.size(); ++i)
                if (conns_[i].get() == d) {
                    close_conn(i);
                    break;
                }
        if (fds[1].revents & POLLIN) accept_ready();
    }
}

}  // namespace ferry_rdma
