// shm.so instance life cycle, registration, and the epoll I/O thread shared by both roles.
#include "transport.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/prctl.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace ferry_shm {

namespace {

constexpr uint64_t kWakeTag = 1;  // epoll data of the wake eventfd
constexpr uint64_t kListenTag = 2;

uint64_t random_token() {
    uint64_t t = 0;
    if (getrandom(&t, sizeof t, 0) != static_cast<ssize_t>(sizeof t))
        t = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) ^ (uint64_t(getpid()) << 32);
    return t | 1;  // never 0
}

}  // namespace

Conn::~Conn() {
    if (pidfd >= 0) close(pidfd);
}

Transport::Transport(const Config &cfg, const ferry_host_api_t *host)
    : cfg_(cfg), log_(host, kName), stager_(host, kName) {}

int Transport::create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err) {
    Config cfg;
    if (int rc = parse_config(options, n, &cfg, err)) return rc;
    std::unique_ptr<Transport> t(new Transport(cfg, host));
    if (int rc = t->start(err)) return rc;
    *out = t.release();
    return 0;
}

int Transport::start(ferry_error_t *err) {
    pid_ = getpid();
    uid_ = geteuid();
    token_ = random_token();
    probe_[0] = probe_[1] = random_token();
    if (cfg_.ptracer_any && yama_ptrace_scope() == 1) {
        if (prctl(PR_SET_PTRACER, PR_SET_PTRACER_ANY, 0, 0, 0) != 0)
            log_.log(FERRY_LOG_WARN, "prctl(PR_SET_PTRACER_ANY): %s", errno_string(errno).c_str());
        else
            log_.log(FERRY_LOG_INFO, "Yama ptrace_scope=1: processes of uid %u may now access pid %d (shm.ptracer_any)",
                     static_cast<unsigned>(uid_), pid_);
    }
    listen_fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (listen_fd_ < 0) return set_error(err, -errno, "shm: socket(AF_UNIX): %s", errno_string(errno).c_str());
    std::string name = socket_name(static_cast<uint32_t>(pid_), token_);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, name.data(), name.size());
    socklen_t sl = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size());
    if (bind(listen_fd_, reinterpret_cast<sockaddr *>(&sa), sl) != 0 || listen(listen_fd_, 128) != 0)
        return set_error(err, -errno, "shm: cannot listen on abstract socket @%s: %s", name.c_str() + 1,
                         errno_string(errno).c_str());
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (epoll_fd_ < 0 || wake_fd_ < 0)
        return set_error(err, -errno, "shm: epoll/eventfd: %s", errno_string(errno).c_str());
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = kWakeTag;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
    ev.data.u64 = kListenTag;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, listen_fd_, &ev);
    io_ = std::thread([this] { io_loop(); });
    for (unsigned i = 0; i < cfg_.copy_threads; ++i) workers_.emplace_back([this] { worker_loop(); });
    log_.log(FERRY_LOG_DEBUG, "instance of pid %d listening on @%s, %u copy threads", pid_, name.c_str() + 1,
             cfg_.copy_threads);
    return 0;
}

Transport::~Transport() {
    if (io_.joinable()) {
        shutdown_all();
        stop_ = true;
        wake();
        io_.join();
    }
    {
        std::lock_guard lock(work_mu_);
        stop_ = true;
        work_.clear();
    }
    work_cv_.notify_all();
    for (auto &w : workers_) w.join();
    for (auto &[p, c] : conns_) {
        if (c->fd >= 0) close(c->fd);
        // A serving side that never closed (stopped) may still hold requests naming these gates:
        // they stay PROT_NONE rather than become addresses a later mapping could reopen.
        if (c->kind == Conn::Kind::Client) {
            auto &cc = static_cast<ClientConn &>(*c);
            std::lock_guard lock(cc.mu);
            for (auto &[id, p] : cc.pending)
                if (p.gate) p.gate->keep_mapped();
            if (cc.gate && !cc.pending.empty()) cc.gate->keep_mapped();
        }
    }
    refused_log_.flush(true);
    accept_log_.flush(true);
    for (int fd : {listen_fd_, epoll_fd_, wake_fd_})
        if (fd >= 0) close(fd);
}

// Stops initiating: every connection is shut down and in-flight ops fail; then waits (bounded)
// until each serving side has closed, so none of them is still copying into our memory.
void Transport::shutdown_all() {
    std::vector<std::shared_ptr<ClientConn>> clients;
    {
        std::unique_lock lock(peers_mu_);
        for (auto &[id, c] : peers_) clients.push_back(c);
        peers_.clear();
        imports_.clear();
    }
    for (auto &c : clients) {
        std::lock_guard lock(c->mu);
        c->closing = true;
        revoke_locked(*c, -ECANCELED, strprintf("shm: op canceled: the transport is being destroyed"), Clock::now());
        std::lock_guard out(c->out_mu);
        if (c->fd >= 0) ::shutdown(c->fd, SHUT_WR);
    }
    auto deadline =
        Clock::now() + std::chrono::milliseconds(cfg_.op_timeout_ms ? std::min(cfg_.op_timeout_ms, 5000u) : 5000u);
    std::unique_lock lock(conns_mu_);
    dead_cv_.wait_until(lock, deadline, [&] {
        for (auto &c : clients)
            if (conns_.count(c.get())) return false;
        return true;
    });
}

int Transport::export_endpoint(void *buf, size_t *len, ferry_error_t *err) {
    EndpointBytes ep{kEndpointMagic, kWireVersion, 0, static_cast<uint32_t>(pid_), static_cast<uint32_t>(uid_), token_};
    if (*len < sizeof ep) {
        *len = sizeof ep;
        return set_error(err, -ENOSPC, "shm: the endpoint needs %zu bytes", sizeof ep);
    }
    memcpy(buf, &ep, sizeof ep);
    *len = sizeof ep;
    return 0;
}

int Transport::register_mem(const ferry_mem_region_t *r, uint64_t *handle, ferry_error_t *err, SharedBacking *shared) {
    std::string why;
    if (int rc = stager_.check_region(*r, &why)) return set_error(err, rc, "%s", why.c_str());
    if (r->length == 0 || r->addr == 0 || r->addr + r->length < r->addr)
        return set_error(err, -EINVAL, "shm: region [0x%" PRIx64 ", +%" PRIu64 ") is empty or wraps", r->addr,
                         r->length);
    if (r->access & ~(FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE))
        return set_error(err, -EINVAL, "shm: unknown access bits 0x%x", r->access);
    MemfdBacking memfd;
    if (cfg_.adopt_memfd && r->kind == FERRY_MEM_HOST && !shared) {  // device memory cannot move into a memfd
        if (!adopt_into_memfd(r->addr, r->length, &memfd, &why))
            log_.log(FERRY_LOG_DEBUG, "region [0x%" PRIx64 ", +%" PRIu64 ") stays on cross-memory attach: %s", r->addr,
                     r->length, why.c_str());
    }
    *handle = regions_.add(r->addr, r->length, r->access, memfd, r->kind, r->device_id,
                           shared ? std::move(*shared) : SharedBacking{});
    return 0;
}

int Transport::deregister_mem(uint64_t handle, ferry_error_t *err) {
    auto r = regions_.remove(handle);
    if (!r) return set_error(err, -ENOENT, "shm: no registered region has handle %" PRIu64, handle);
    r->retire_and_wait(log_);
    return 0;
}

void Transport::wake() {
    uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof one) < 0 && errno != EAGAIN)
        log_.log(FERRY_LOG_WARN, "wake eventfd: %s", errno_string(errno).c_str());
}

void Transport::add_conn(const std::shared_ptr<Conn> &c, uint32_t events) {
    {
        std::lock_guard lock(conns_mu_);
        conns_[c.get()] = c;
    }
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = c.get();
    if (epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, c->fd, &ev) != 0)
        log_.log(FERRY_LOG_ERROR, "epoll_ctl ADD: %s", errno_string(errno).c_str());
}

void Transport::close_conn(Conn &c) {
    if (c.kind == Conn::Kind::Server) forget(static_cast<ServerConn &>(c));
    {
        std::lock_guard lock(c.out_mu);
        if (c.fd >= 0) {
            epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c.fd, nullptr);
            close(c.fd);
            c.fd = -1;
        }
        c.out.clear();
    }
    std::shared_ptr<Conn> keep;  // released after the lock
    {
        std::lock_guard lock(conns_mu_);
        auto it = conns_.find(&c);
        if (it != conns_.end()) {
            keep = std::move(it->second);
            conns_.erase(it);
        }
    }
    dead_cv_.notify_all();
}

bool Transport::send(Conn &c, const void *data, size_t len) {
    std::lock_guard lock(c.out_mu);
    if (c.fd < 0) return false;
    const char *p = static_cast<const char *>(data);
    if (c.out.empty()) {
        while (len > 0) {
            ssize_t n = ::send(c.fd, p, len, MSG_NOSIGNAL | MSG_DONTWAIT);
            if (n > 0) {
                p += n;
                len -= static_cast<size_t>(n);
            } else if (n < 0 && errno == EINTR) {
                continue;
            } else {
                break;  // EAGAIN: the I/O thread flushes; errors show up there as EOF
            }
        }
    }
    if (len > 0) {
        c.out.append(p, len);
        if (!c.out_armed) {
            c.out_armed = true;
            rearm_locked(c);
        }
    }
    return true;
}

void Transport::flush_locked(Conn &c) {
    while (!c.out.empty() && c.fd >= 0) {
        ssize_t n = ::send(c.fd, c.out.data(), c.out.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n > 0) c.out.erase(0, static_cast<size_t>(n));
        else if (n < 0 && errno == EINTR) continue;
        else if (n < 0 && errno == EAGAIN) return;
        else {
            c.out.clear();  // the peer is gone; reading will show EOF
            break;
        }
    }
    if (c.out_armed && c.out.empty() && c.fd >= 0) {
        c.out_armed = false;
        rearm_locked(c);
    }
}

void Transport::accept_all() {
    for (;;) {
        int fd = accept4(listen_fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
        if (fd < 0) {
            if (errno == EINTR) continue;
            if (errno == EMFILE || errno == ENFILE || errno == ENOBUFS || errno == ENOMEM) accept_failed(errno);
            else if (errno != EAGAIN && errno != ECONNABORTED)
                accept_log_.event(strprintf("accept: %s", errno_string(errno).c_str()));
            return;
        }
        accept_backoff_ = std::chrono::milliseconds(0);
        auto c = std::make_shared<ServerConn>();
        c->fd = fd;
        c->accepted = Clock::now();
        ucred cred{};
        socklen_t cl = sizeof cred;
        if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0) {
            c->pid = cred.pid;
            c->uid = cred.uid;
        }
        if (!admit(*c)) {
            close(fd);
            c->fd = -1;
            continue;
        }
        c->pidfd = peer_pidfd(fd, c->pid);  // checked by the handshake (on_hello)
        add_conn(c, EPOLLIN | EPOLLRDHUP);
        handshaking_.push_back(c);
    }
}

void Transport::io_loop() {
    epoll_event events[64];
    while (!stop_.load(std::memory_order_acquire)) {
        int n = epoll_wait(epoll_fd_, events, 64, loop_timeout_ms());
        if (n < 0 && errno != EINTR) {
            log_.log(FERRY_LOG_ERROR, "epoll_wait: %s", errno_string(errno).c_str());
            break;
        }
        for (int i = 0; i < n; ++i) {
            if (events[i].data.u64 == kWakeTag) {
                uint64_t v;
                (void)!read(wake_fd_, &v, sizeof v);
                continue;
            }
            if (events[i].data.u64 == kListenTag) {
                accept_all();
                continue;
            }
            std::shared_ptr<Conn> c;
            {
                std::lock_guard lock(conns_mu_);
                auto it = conns_.find(static_cast<Conn *>(events[i].data.ptr));
                if (it != conns_.end()) c = it->second;
            }
            if (!c) continue;
            if (events[i].events & EPOLLOUT) {
                std::lock_guard lock(c->out_mu);
                flush_locked(*c);
            }
            if (c->kind == Conn::Kind::Server)
                on_server_event(std::static_pointer_cast<ServerConn>(c), events[i].events);
            else on_client_event(std::static_pointer_cast<ClientConn>(c), events[i].events);
        }
        const auto now = Clock::now();
        check_handshakes(now);
        reap_idle_servers();
        resume_paused();
        maybe_resume_accept(now);
        if (in_flight_.load(std::memory_order_relaxed)) check_timeouts();
        refused_log_.flush();
        accept_log_.flush();
    }
}

}  // namespace ferry_shm
