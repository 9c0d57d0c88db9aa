// The serving side's limits against initiators that do not follow the protocol: connection caps
// (total and per uid) with a refusal the initiator can read, a deadline for the Hello,
// backpressure when answers are not read or too many requests are being copied, and back-off
// when accept() runs out of descriptors. Refusals are logged through a RateLimitedLog.
#include "transport.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>

#include <cerrno>
#include <cstring>

namespace ferry_shm {

bool Transport::admit(ServerConn &c) {
    unsigned &mine = per_uid_[c.uid];
    std::string why;
    if (n_served_ >= cfg_.max_connections)
        why =
            strprintf("pid %d serves at most %u connections at once (shm.max_connections)", pid_, cfg_.max_connections);
    else if (mine >= cfg_.max_connections_per_user)
        why = strprintf(
            "pid %d serves at most %u connections from processes of uid %u at once "
            "(shm.max_connections_per_user)",
            pid_, cfg_.max_connections_per_user, static_cast<unsigned>(c.uid));
    if (why.empty()) {
        ++mine;
        ++n_served_;
        c.counted = true;
        return true;
    }
    if (mine == 0) per_uid_.erase(c.uid);
    // Answer before the Hello: a fresh socket takes the bytes at once, and the initiator's
    // connect() reads them as the handshake's answer.
    HelloAck ack{};
    ack.magic = kAckMagic;
    ack.status = -EBUSY;
    snprintf(ack.message, sizeof ack.message, "%s", why.c_str());
    (void)!::send(c.fd, &ack, sizeof ack, MSG_NOSIGNAL | MSG_DONTWAIT);
    refused_log_.event(strprintf("refused a connection from pid %d: %s", c.pid, why.c_str()));
    return false;
}

void Transport::forget(ServerConn &c) {
    if (!c.counted) return;
    c.counted = false;
    --n_served_;
    auto it = per_uid_.find(c.uid);
    if (it != per_uid_.end() && --it->second == 0) per_uid_.erase(it);
}

// A connection that has not completed its Hello by connect_timeout_ms is closed.
void Transport::check_handshakes(Clock::time_point now) {
    const auto limit = std::chrono::milliseconds(cfg_.connect_timeout_ms);
    while (!handshaking_.empty()) {
        auto c = handshaking_.front().lock();
        if (c && !c->hello_done && !c->gone.load()) {
            if (now - c->accepted < limit) return;
            refused_log_.event(
                strprintf("closed a connection from pid %d: no handshake within %u ms "
                          "(shm.connect_timeout_ms)",
                          c->pid, cfg_.connect_timeout_ms));
            server_gone(c);
        }
        handshaking_.pop_front();
    }
}

bool Transport::throttled(const ServerConn &c) {
    return c.out.size() > kMaxReplyBacklog || c.active.load(std::memory_order_relaxed) >= kMaxActivePerConn;
}

void Transport::rearm_locked(Conn &c) {
    if (c.fd < 0) return;
    epoll_event ev{};
    ev.events = EPOLLRDHUP | (c.reading ? EPOLLIN : 0u) | (c.out_armed ? EPOLLOUT : 0u);
    ev.data.ptr = &c;
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, c.fd, &ev);
}

// Stops reading c's requests until its answers drain and its copies finish: what an initiator
// that never reads its answers can make us hold stays bounded (kMaxReplyBacklog plus the
// requests of one read).
void Transport::pause_reading(const std::shared_ptr<ServerConn> &c) {
    {
        std::lock_guard lock(c->out_mu);
        c->reading = false;
        rearm_locked(*c);
    }
    if (!c->paused) {
        c->paused = true;
        paused_.push_back(c);
    }
}

void Transport::resume_paused() {
    for (size_t i = 0; i < paused_.size();) {
        auto &c = paused_[i];
        bool resume = c->gone.load();
        if (!resume) {
            std::lock_guard lock(c->out_mu);
            if (c->out.size() <= kMaxReplyBacklog / 2 && c->active.load() < kMaxActivePerConn / 2) {
                c->reading = true;
                rearm_locked(*c);  // level-triggered: what waits in the socket is reported again
                resume = true;
            }
        }
        if (resume) {
            c->paused = false;
            paused_[i] = std::move(paused_.back());
            paused_.pop_back();
        } else {
            ++i;
        }
    }
}

// Out of descriptors (or memory): the pending connection stays in the backlog and the listening
// socket stays readable, so retrying at once would spin. Stop watching it for a while instead.
void Transport::accept_failed(int e) {
    accept_backoff_ = accept_backoff_.count() == 0 ? std::chrono::milliseconds(50)
                                                   : std::min(accept_backoff_ * 2, std::chrono::milliseconds(1000));
    accept_log_.event(strprintf("accept: %s; not accepting for %lld ms (raise the descriptor limit, ulimit -n)",
                                errno_string(e).c_str(), static_cast<long long>(accept_backoff_.count())));
    epoll_event ev{};
    ev.events = 0;
    ev.data.u64 = 2;  // kListenTag
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
    accept_paused_ = true;
    accept_resume_ = Clock::now() + accept_backoff_;
}

void Transport::maybe_resume_accept(Clock::time_point now) {
    if (!accept_paused_ || now < accept_resume_) return;
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = 2;  // kListenTag
    epoll_ctl(epoll_fd_, EPOLL_CTL_MOD, listen_fd_, &ev);
    accept_paused_ = false;
}

// epoll_wait's timeout: short while anything has a deadline (ops, handshakes, paused accept or
// reading), else until an event or a wake().
int Transport::loop_timeout_ms() const {
    if (in_flight_.load(std::memory_order_relaxed) || !handshaking_.empty() || !paused_.empty() ||
        !gone_servers_.empty())
        return 100;
    if (accept_paused_)
        return static_cast<int>(std::max<long long>(
            1, std::chrono::duration_cast<std::chrono::milliseconds>(accept_resume_ - Clock::now()).count()));
    return -1;
}

}  // namespace ferry_shm
