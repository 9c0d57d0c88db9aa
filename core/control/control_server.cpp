#include "control/control_server.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

#include "control/auth.hpp"
#include "control/control_protocol.hpp"
#include "util/log.hpp"
#include "util/socket_util.hpp"

namespace ferry {

using namespace control;

namespace {

// A peer that stops in the middle of a frame, or stops reading its replies, is cut after this.
constexpr auto kFrameTimeout = std::chrono::seconds(30);
// Out of descriptors with no spare to refuse with: the listener rests this long (no busy loop).
constexpr auto kListenPause = std::chrono::milliseconds(100);
// Accepts per wakeup, so that a flood of connections cannot starve the open ones.
constexpr size_t kAcceptBurst = 256;
constexpr size_t kHelloMax = kNonceBytes + 4 + 4 + kMaxNameBytes;

std::string peer_ip(const sockaddr_storage &ss) {
    char buf[INET6_ADDRSTRLEN] = "?";
    if (ss.ss_family == AF_INET)
        inet_ntop(AF_INET, &reinterpret_cast<const sockaddr_in *>(&ss)->sin_addr, buf, sizeof buf);
    else if (ss.ss_family == AF_INET6)
        inet_ntop(AF_INET6, &reinterpret_cast<const sockaddr_in6 *>(&ss)->sin6_addr, buf, sizeof buf);
    return buf;
}

std::string peer_address(const sockaddr_storage &ss) {
    if (ss.ss_family == AF_INET)
        return cat(peer_ip(ss), ":", ntohs(reinterpret_cast<const sockaddr_in *>(&ss)->sin_port));
    return cat("[", peer_ip(ss), "]:", ntohs(reinterpret_cast<const sockaddr_in6 *>(&ss)->sin6_port));
}

std::string seconds(Clock::duration d) {
    return cat(std::chrono::duration_cast<std::chrono::milliseconds>(d).count() / 1000.0, " s");
}

}  // namespace

struct ControlServer::Connection {
    enum class Stage { Hello, Auth, Ready };
    Fd fd;
    std::string peer;         // remote address
    std::string ip;           // remote IP address: the per-peer cap counts by it
    std::string client_name;  // the client's segment name, from HELLO
    Stage stage = Stage::Hello;
    Nonce client_nonce{}, server_nonce{};
    std::vector<uint8_t> in;
    std::vector<uint8_t> out;
    size_t out_off = 0;
    bool close_after_write = false;
    bool busy = false;           // Ready with a partial request in or unsent replies out
    Clock::time_point deadline;  // handshake, request, reply or idle deadline
};

Result<std::unique_ptr<ControlServer>> ControlServer::start(ControlServerOptions options) {
    auto listener = listen_tcp(options.local_ip, options.port);
    if (!listener) return fail(listener.error().code, "control server: " + listener.error().message);
    uint16_t port = bound_port(listener->get());
    std::string host =
        options.local_ip.find(':') != std::string::npos ? "[" + options.local_ip + "]" : options.local_ip;
    std::unique_ptr<ControlServer> server(
        new ControlServer(std::move(options), std::move(*listener), cat(host, ":", port)));
    if (!server->stop_ || !server->queued_fd_)
        return fail(-errno, cat("control server: eventfd: ", std::strerror(errno)));
    // Non-blocking, so accepting until EAGAIN never waits for a peer that already left.
    if (::fcntl(server->listener_.get(), F_SETFL, ::fcntl(server->listener_.get(), F_GETFL) | O_NONBLOCK) != 0)
        return fail(-errno, cat("control server: fcntl: ", std::strerror(errno)));
    // Kept for the moment the process runs out of descriptors: closing it makes room to accept
    // one peer and tell it why (a peer left in the backlog learns nothing).
    server->spare_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    server->thread_ = std::thread([s = server.get()] { s->serve(); });
    return server;
}

ControlServer::ControlServer(ControlServerOptions options, Fd listener, std::string address)
    : options_(std::move(options)),
      listener_(std::move(listener)),
      stop_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)),
      address_(std::move(address)),
      bad_log_{log::Limiter(options_.log_interval), "control connections closed for protocol errors or deadlines"},
      refused_log_{log::Limiter(options_.log_interval),
                   "control connections refused (a connection limit or out of descriptors)"},
      accept_log_{log::Limiter(options_.log_interval), "failed accepts on the control port"},
      queued_fd_(::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) {}

ControlServer::~ControlServer() {
    uint64_t one = 1;
    [[maybe_unused]] auto n = ::write(stop_.get(), &one, sizeof one);
    if (thread_.joinable()) thread_.join();
    // Threads blocked in wait_notifications return (-ECANCELED) before the queue goes away.
    std::unique_lock lock(mutex_);
    closing_ = true;
    queued_cv_.notify_all();
    queued_cv_.wait(lock, [&] { return waiters_ == 0; });
}

void ControlServer::publish(std::vector<uint8_t> descriptor) {
    std::lock_guard lock(mutex_);
    descriptor_ = std::move(descriptor);
    descriptor_source_ = nullptr;
}

void ControlServer::serve_descriptor(std::function<std::shared_ptr<const std::vector<uint8_t>>()> source) {
    std::lock_guard lock(mutex_);
    descriptor_source_ = std::move(source);
}

std::vector<Notification> ControlServer::take_notifications() {
    std::lock_guard lock(mutex_);
    return take_locked();
}

Result<std::vector<Notification>> ControlServer::wait_notifications(Clock::time_point deadline) {
    std::unique_lock lock(mutex_);
    auto queued = [&] { return !queue_.empty() || closing_; };
    ++waiters_;
    if (deadline == Clock::time_point::max()) queued_cv_.wait(lock, queued);
    else queued_cv_.wait_until(lock, deadline, queued);
    --waiters_;
    if (closing_) {
        queued_cv_.notify_all();  // the destructor waits for the last waiter
        return fail(-ECANCELED, "wait_notifications: the engine is being destroyed");
    }
    return take_locked();
}

// Under mutex_: the eventfd is reset together with the queue, so it is readable exactly while
// notifications wait.
std::vector<Notification> ControlServer::take_locked() {
    if (queue_.empty()) return {};
    std::vector<Notification> out(std::make_move_iterator(queue_.begin()), std::make_move_iterator(queue_.end()));
    queue_.clear();
    queue_bytes_ = 0;
    full_logged_ = false;
    uint64_t count;
    [[maybe_unused]] auto n = ::read(queued_fd_.get(), &count, sizeof count);
    return out;
}

void ControlServer::warn(CountedWarning &w, const std::string &message, Clock::time_point now) {
    if (w.limiter.admit(now))
        FERRY_LOG(Warn, "control", message, " (more ", w.what, " in the next ", seconds(w.limiter.every()),
                  " are counted, not logged one by one)");
}

void ControlServer::flush_counts(Clock::time_point now) {
    for (auto *w : {&bad_log_, &refused_log_, &accept_log_})
        if (uint64_t n = w->limiter.take_due(now))
            FERRY_LOG(Warn, "control", n, " more ", w->what, " in the last ", seconds(w->limiter.every()));
}

void ControlServer::close_connection(size_t index) {
    auto it = per_peer_.find(connections_[index]->ip);
    if (it != per_peer_.end() && --it->second == 0) per_peer_.erase(it);
    connections_.erase(connections_.begin() + static_cast<ptrdiff_t>(index));
}

// Before Ready the handshake deadline set at accept stands. Ready: a request being received or
// replies being sent must finish (or make progress) within kFrameTimeout; an idle connection
// is closed after idle_timeout (the client reconnects when it needs one).
void ControlServer::set_deadline(Connection &c, Clock::time_point now, bool progress) {
    if (c.stage != Connection::Stage::Ready) return;
    bool busy = !c.in.empty() || !c.out.empty();
    if (!busy) c.deadline = now + options_.idle_timeout;
    else if (!c.busy || progress) c.deadline = now + kFrameTimeout;
    c.busy = busy;
}

void ControlServer::serve() {
    std::vector<pollfd> fds;
    for (;;) {
        auto now = Clock::now();
        const bool listening = now >= listen_paused_until_;
        fds.clear();
        fds.push_back({stop_.get(), POLLIN, 0});
        fds.push_back({listening ? listener_.get() : -1, POLLIN, 0});
        auto next_deadline = listening ? Clock::time_point::max() : listen_paused_until_;
        for (auto *w : {&bad_log_, &refused_log_, &accept_log_})
            next_deadline = std::min(next_deadline, w->limiter.due());
        for (auto &c : connections_) {
            // Backpressure: a peer that does not read its replies is not read from either.
            short events = c->out.empty() ? POLLIN : POLLOUT;
            fds.push_back({c->fd.get(), events, 0});
            next_deadline = std::min(next_deadline, c->deadline);
        }
        int timeout = -1;
        if (next_deadline != Clock::time_point::max())
            timeout = static_cast<int>(std::clamp<int64_t>(
                std::chrono::duration_cast<std::chrono::milliseconds>(next_deadline - now).count() + 1, 0, 60000));
        int n = ::poll(fds.data(), fds.size(), timeout);
        if (n < 0 && errno != EINTR) {
            FERRY_LOG(Error, "control", "poll failed: ", std::strerror(errno), "; control server stops");
            return;
        }
        if (fds[0].revents & POLLIN) return;
        now = Clock::now();
        // Connections accepted below are not in fds: walk only the ones polled.
        size_t polled = connections_.size();
        std::vector<bool> keep(polled, true);
        for (size_t i = 0; i < polled; ++i) {
            auto &c = *connections_[i];
            short re = n > 0 ? fds[i + 2].revents : 0;
            if (re & (POLLIN | POLLHUP | POLLERR)) keep[i] = on_readable(c, now);
            if (keep[i] && (re & POLLOUT)) keep[i] = on_writable(c, now);
            if (keep[i] && c.deadline <= now) {
                keep[i] = false;
                if (c.stage != Connection::Stage::Ready)
                    warn(bad_log_,
                         cat("connection from ", c.peer, " did not authenticate within ",
                             options_.handshake_timeout.count(), " ms (handshake_timeout_ms); closed"),
                         now);
                else if (c.busy)
                    warn(bad_log_,
                         cat("connection from ", c.peer,
                             " stalled in the middle of a request or stopped reading "
                             "replies; closed"),
                         now);
                else
                    FERRY_LOG(Debug, "control", "connection from ", c.peer, " idle for ", options_.idle_timeout.count(),
                              " ms (control_idle_timeout_ms); closed");
            }
        }
        for (size_t i = polled; i-- > 0;)
            if (!keep[i]) close_connection(i);
        if (n > 0 && listening && (fds[1].revents & POLLIN)) accept_all(now);
        flush_counts(now);
    }
}

void ControlServer::turn_away(Fd fd, const std::string &peer, uint16_t code, const std::string &why,
                              Clock::time_point now) {
    // Read what the peer sent already (its HELLO): closing with unread bytes would reset the
    // connection instead of ending it after the reason.
    uint8_t sink[4096];
    for (int i = 0; i < 4 && ::recv(fd.get(), sink, sizeof sink, MSG_DONTWAIT) > 0; ++i) {}
    auto f = frame(code, why);
    [[maybe_unused]] auto sent = ::send(fd.get(), f.data(), f.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
    warn(refused_log_, cat("refused a control connection from ", peer, ": ", why), now);
}

bool ControlServer::out_of_descriptors(int err, Clock::time_point now) {
    warn(accept_log_,
         cat("cannot accept control connections: ", std::strerror(err),
             "; peers are refused until "
             "descriptors are free again (raise the process's limit, ulimit -n, if this persists)"),
         now);
    if (!spare_) spare_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
    if (spare_) {
        spare_.reset();
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        Fd fd(::accept4(listener_.get(), reinterpret_cast<sockaddr *>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
        const bool took_one = static_cast<bool>(fd);
        if (took_one)
            turn_away(
                std::move(fd), peer_address(ss), EMFILE,
                cat("control server at ", address_, " refused the connection: that engine is out of file descriptors (",
                    std::strerror(err), "); retry later, or raise its descriptor limit (ulimit -n)"),
                now);
        spare_ = Fd(::open("/dev/null", O_RDONLY | O_CLOEXEC));
        if (took_one && spare_) return true;
    }
    // Nothing to refuse with: rest instead of polling a listener that stays readable.
    listen_paused_until_ = now + kListenPause;
    return false;
}

void ControlServer::accept_all(Clock::time_point now) {
    for (size_t accepted = 0; accepted < kAcceptBurst; ++accepted) {
        sockaddr_storage ss{};
        socklen_t len = sizeof ss;
        Fd fd(::accept4(listener_.get(), reinterpret_cast<sockaddr *>(&ss), &len, SOCK_CLOEXEC | SOCK_NONBLOCK));
        if (!fd) {
            int err = errno;
            if (err == EINTR || err == ECONNABORTED) continue;
            if (err == EAGAIN || err == EWOULDBLOCK) return;
            if (err == EMFILE || err == ENFILE || err == ENOBUFS || err == ENOMEM) {
                if (out_of_descriptors(err, now)) continue;
                return;
            }
            warn(accept_log_, cat("accept failed: ", std::strerror(err)), now);
            listen_paused_until_ = now + kListenPause;
            return;
        }
        std::string ip = peer_ip(ss);
        std::string peer = peer_address(ss);
        auto mine = per_peer_.find(ip);
        size_t from_here = mine == per_peer_.end() ? 0 : mine->second;
        if (connections_.size() >= options_.max_connections) {
            turn_away(std::move(fd), peer, EUSERS,
                      cat("control server at ", address_, " refused the connection: ", connections_.size(),
                          " connections already open in all (control_max_connections); close idle engines or raise "
                          "control_max_connections on that engine"),
                      now);
            continue;
        }
        if (from_here >= options_.max_connections_per_peer) {
            turn_away(std::move(fd), peer, EUSERS,
                      cat("control server at ", address_, " refused the connection: ", from_here,
                          " connections already open from this address (", ip,
                          "; control_max_connections_per_peer); "
                          "close idle engines on that host or raise control_max_connections_per_peer on that engine"),
                      now);
            continue;
        }
        int one = 1;
        setsockopt(fd.get(), IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        auto c = std::make_unique<Connection>();
        c->fd = std::move(fd);
        c->peer = std::move(peer);
        c->ip = ip;
        c->deadline = now + options_.handshake_timeout;
        ++per_peer_[ip];
        connections_.push_back(std::move(c));
    }
}

bool ControlServer::on_readable(Connection &c, Clock::time_point now) {
    uint8_t buf[64 * 1024];
    ssize_t n = ::recv(c.fd.get(), buf, sizeof buf, MSG_DONTWAIT);
    if (n == 0) {
        if (c.stage != Connection::Stage::Ready)
            warn(bad_log_, cat("connection from ", c.peer, " closed during the handshake"), now);
        return false;
    }
    if (n < 0) return errno == EINTR || errno == EAGAIN || errno == EWOULDBLOCK;
    c.in.insert(c.in.end(), buf, buf + n);
    size_t used = 0;
    bool keep = true;
    while (keep && !c.close_after_write && c.in.size() - used >= kHeaderBytes) {
        Header h = parse_header({c.in.data() + used, kHeaderBytes});
        if (h.magic != kMagic) {
            warn(bad_log_, cat("connection from ", c.peer, " sent bytes that are not a Ferry control frame; closed"),
                 now);
            return false;
        }
        if (h.version != kVersion) {
            refuse(c, EPROTONOSUPPORT,
                   cat("control protocol version ", h.version, " is not supported: this engine (", address_,
                       ") speaks version ", kVersion, "; run the same Ferry release on every engine"),
                   now);
            break;
        }
        size_t limit = c.stage == Connection::Stage::Hello  ? kHelloMax
                       : c.stage == Connection::Stage::Auth ? sizeof(Proof)
                                                            : kMaxRequestBytes;
        if (h.length > limit) {
            refuse(
                c, h.code == kNotify ? EMSGSIZE : EPROTO,
                cat("request of ", h.length, " bytes exceeds the limit of ", limit,
                    h.code == kNotify ? cat(" (notifications carry at most ", kMaxNotificationBytes, " bytes)") : ""),
                now);
            break;
        }
        if (c.in.size() - used < kHeaderBytes + h.length) break;
        std::vector<uint8_t> payload(c.in.begin() + static_cast<ptrdiff_t>(used + kHeaderBytes),
                                     c.in.begin() + static_cast<ptrdiff_t>(used + kHeaderBytes + h.length));
        used += kHeaderBytes + h.length;
        keep = handle_frame(c, h.code, std::move(payload), now);
    }
    c.in.erase(c.in.begin(), c.in.begin() + static_cast<ptrdiff_t>(used));
    set_deadline(c, now, used > 0);
    if (keep && !c.out.empty()) keep = on_writable(c, now);
    return keep;
}

bool ControlServer::on_writable(Connection &c, Clock::time_point now) {
    bool sent = false;
    while (c.out_off < c.out.size()) {
        ssize_t n = ::send(c.fd.get(), c.out.data() + c.out_off, c.out.size() - c.out_off, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            if (errno == EINTR) continue;
            if (errno != EAGAIN && errno != EWOULDBLOCK) return false;
            set_deadline(c, now, sent);
            return true;
        }
        sent = sent || n > 0;
        c.out_off += static_cast<size_t>(n);
    }
    c.out.clear();
    c.out_off = 0;
    set_deadline(c, now, sent);
    return !c.close_after_write;
}

void ControlServer::reply(Connection &c, uint16_t status, std::span<const uint8_t> payload) {
    auto f = frame(status, payload);
    c.out.insert(c.out.end(), f.begin(), f.end());
}

// Answers with the reason and closes once it is sent. Logged here, once, with the peer.
void ControlServer::refuse(Connection &c, int code, const std::string &why, Clock::time_point now) {
    warn(bad_log_,
         cat("refused connection from ", c.peer, c.client_name.empty() ? "" : cat(" (segment ", c.client_name, ")"),
             ": ", why),
         now);
    reply(c, static_cast<uint16_t>(code), {reinterpret_cast<const uint8_t *>(why.data()), why.size()});
    c.close_after_write = true;
}

bool ControlServer::handle_frame(Connection &c, uint16_t code, std::vector<uint8_t> payload, Clock::time_point now) {
    const bool have_secret = !options_.secret.empty();
    switch (c.stage) {
        case Connection::Stage::Hello: {
            ByteReader r(payload);
            uint32_t flags = 0;
            std::vector<uint8_t> nonce;
            if (code != kHello) {
                refuse(c, EPROTO, cat("request type ", code, " before HELLO"), now);
                return true;
            }
            if (!r.bytes(nonce, kNonceBytes) || nonce.size() != kNonceBytes || !r.u32(flags) ||
                !r.str(c.client_name, kMaxNameBytes) || r.remaining() != 0) {
                refuse(c, EPROTO, "malformed HELLO", now);
                return true;
            }
            std::copy(nonce.begin(), nonce.end(), c.client_nonce.begin());
            const bool peer_secret = flags & kFlagSecret;
            if (have_secret && !peer_secret) {
                refuse(c, EACCES,
                       cat("authentication failed: this engine (", address_,
                           ") requires the cluster secret (auth_secret) and the peer has none; set the same "
                           "auth_secret, auth_secret_file or FERRY_AUTH_SECRET on every engine of the cluster"),
                       now);
                return true;
            }
            if (!have_secret && peer_secret) {
                refuse(c, EACCES,
                       cat("authentication failed: this engine (", address_,
                           ") has no cluster secret but the peer uses one; set the same auth_secret, "
                           "auth_secret_file or FERRY_AUTH_SECRET on every engine of the cluster"),
                       now);
                return true;
            }
            auto server_nonce = random_nonce();
            if (!server_nonce) {
                refuse(c, -server_nonce.error().code, server_nonce.error().message, now);
                return true;
            }
            c.server_nonce = *server_nonce;
            Proof proof = ferry_auth::make_proof(options_.secret, kProtocol, Role::kServer, c.client_nonce,
                                                 c.server_nonce, c.client_name);
            ByteWriter w;
            w.bytes(c.server_nonce);
            w.u32(have_secret ? kFlagSecret : 0);
            w.bytes(proof);
            reply(c, 0, w.data());
            c.stage = Connection::Stage::Auth;
            return true;
        }
        case Connection::Stage::Auth: {
            if (code != kAuth || payload.size() != sizeof(Proof)) {
                refuse(c, EPROTO, "malformed AUTH", now);
                return true;
            }
            if (!ferry_auth::proof_matches(options_.secret, kProtocol, Role::kClient, c.client_nonce, c.server_nonce,
                                           ferry_auth::proof_at(payload.data()), c.client_name)) {
                refuse(c, EACCES,
                       cat("authentication failed: the peer does not know this cluster's secret (wrong "
                           "auth_secret); this engine (",
                           address_, ") refuses it"),
                       now);
                return true;
            }
            c.stage = Connection::Stage::Ready;
            reply(c, 0, {});
            FERRY_LOG(Debug, "control", "connection from ", c.peer, " (segment ", c.client_name, ") ",
                      have_secret ? "authenticated" : "accepted");
            return true;
        }
        case Connection::Stage::Ready: break;
    }
    if (code == kGetDescriptor) {
        std::function<std::shared_ptr<const std::vector<uint8_t>>()> source;
        std::vector<uint8_t> d;
        {
            std::lock_guard lock(mutex_);
            if (descriptor_source_) source = descriptor_source_;
            else d = descriptor_;
        }
        if (source) {
            auto encoded = source();
            reply(c, 0, encoded ? std::span<const uint8_t>(*encoded) : std::span<const uint8_t>());
        } else {
            reply(c, 0, d);
        }
        return true;
    }
    if (code == kNotify) {
        std::string why;
        {
            std::lock_guard lock(mutex_);
            if (queue_.size() >= options_.queue_max || queue_bytes_ + payload.size() > options_.queue_max_bytes) {
                why = cat("the notification queue of ", address_, " is full (", queue_.size(), " notifications, ",
                          queue_bytes_, " bytes not yet taken); its engine must call take_notifications");
                if (!full_logged_) FERRY_LOG(Warn, "control", why, "; refusing notifications until it does");
                full_logged_ = true;
            } else {
                queue_bytes_ += payload.size();
                queue_.push_back(Notification{c.client_name, std::move(payload)});
                uint64_t one = 1;
                [[maybe_unused]] auto n = ::write(queued_fd_.get(), &one, sizeof one);
            }
        }
        if (why.empty()) queued_cv_.notify_all();
        if (!why.empty()) {
            reply(c, ENOBUFS, {reinterpret_cast<const uint8_t *>(why.data()), why.size()});
            return true;
        }
        reply(c, 0, {});
        return true;
    }
    std::string why = cat("unknown request type ", code, "; the peer runs a newer Ferry");
    reply(c, EOPNOTSUPP, {reinterpret_cast<const uint8_t *>(why.data()), why.size()});
    return true;
}

}  // namespace ferry
