#include "lane.hpp"
#include "untracked_io.hpp"

#include "peer.hpp"
#include "plugin_util.hpp"
#include "socket_util.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>

namespace ferry_tcp {

namespace {

constexpr uint64_t kBudget = 16ull << 20;  // bytes moved per wake-up before yielding
constexpr uint32_t kEvents = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
// Waiter mode: the reactor still sees hang-ups (they wake every waiter, whatever its mask) and
// the socket's send space after a blocked send, but not the data, which wakes the host's thread.
constexpr uint32_t kWaiterEvents = EPOLLOUT | EPOLLRDHUP | EPOLLET;
constexpr unsigned kWaiterIdleMs = 1000;  // back to the reactor after this long without work
}  // namespace

Lane::Lane(Peer &peer, Reactor &reactor, WaitSet &waiters, unsigned index, unsigned rail)
    : peer_(peer),
      reactor_(reactor),
      waiters_(waiters),
      index_(index),
      rail_(rail),
      counts_(peer.tally().attach(peer.rail(rail).local)),
      rxbuf_(kRxBuf) {}

const Endpoint &Lane::remote() const { return peer_.rail(rail_).remote; }

Lane::~Lane() {
    if (fd_ >= 0) {
        if (waiter_) waiters_.remove(fd_);
        close(fd_);
    }
    peer_.tally().detach(peer_.rail(rail_).local, counts_);
}

void Lane::push(Batch &batch) noexcept {
    {
        std::lock_guard lk(in_mu_);
        incoming_.splice(incoming_.end(), batch);
    }
    reactor_.kick(this);
}

void Lane::start() {
    Held h(*this, reactor_.completions());
    if (state_ == State::Down) connect_now();
}

void Lane::connect_now() {
    const Endpoint &ep = remote();
    connect_start_ = Clock::now();
    int fd = socket(ep.addr.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) {
        int e = errno;
        fail(-e, strprintf("connect to peer %s failed: socket(): %s", ep.name.c_str(), errno_string(e).c_str()));
        return;
    }
    fd_ = fd;
    std::string why;
    int rc = tune_socket(fd_, peer_.config(), &why);
    if (rc != 0) {
        fail(rc, strprintf("connect to peer %s failed: %s", ep.name.c_str(), why.c_str()));
        return;
    }
    // A rail's lanes leave through its interface: its address is their source.
    const Rail &rail = peer_.rail(rail_);
    if (rail.source_len != 0 && ::bind(fd_, reinterpret_cast<const sockaddr *>(&rail.source), rail.source_len) != 0) {
        int e = errno;
        fail(-e, strprintf("connect to peer %s over rail %s failed: bind: %s", ep.name.c_str(), rail.name.c_str(),
                           errno_string(e).c_str()));
        return;
    }
    if (::connect(fd_, reinterpret_cast<const sockaddr *>(&ep.addr), ep.addr_len) != 0 && errno != EINPROGRESS) {
        int e = errno;
        fail(-e, strprintf("connect to peer %s failed: %s", ep.name.c_str(), errno_string(e).c_str()));
        return;
    }
    rc = reactor_.add_fd(fd_, kEvents, this);
    if (rc != 0) {
        fail(rc, strprintf("connect to peer %s failed: epoll_ctl: %s", ep.name.c_str(), errno_string(-rc).c_str()));
        return;
    }
    state_ = State::Connecting;
    readable_ = writable_ = hup_ = false;
    lowat_ = 1;
    reactor_.want_timer(this);
}

// Closes the socket and fails every slice this lane holds. Slices still in incoming_ were
// submitted after the failure was detected: they stay and trigger a reconnect.
void Lane::fail(int status, const std::string &why, State next) {
    const bool handshaking = state_ == State::Connecting || state_ == State::Hello;
    if (next != State::Closed && ferry_is_path_error(status)) peer_.tally().failed(peer_.rail(rail_).local);
    if (fd_ >= 0) {
        if (waiter_) waiters_.remove(fd_);
        waiter_ = false;
        reactor_.del_fd(fd_);
        close(fd_);
        fd_ = -1;
    }
    if (state_ != State::Closed) {
        // Logged once here, at a level that matches who else reports it: failed slices reach
        // the host as completions (WARN here names the cause once per connection); a failed
        // first handshake is returned by connect(); cancellations were asked for.
        int level = FERRY_LOG_WARN;
        if (status == -ECANCELED) level = q_.empty() ? FERRY_LOG_DEBUG : FERRY_LOG_INFO;
        else if (q_.empty()) level = handshaking ? FERRY_LOG_DEBUG : FERRY_LOG_INFO;
        if (q_.empty()) peer_.log().log(level, "lane %u to peer %s: %s", index_, remote().name.c_str(), why.c_str());
        else
            peer_.log().log(level, "lane %u to peer %s: %s (%zu slices failed)", index_, remote().name.c_str(),
                            why.c_str(), q_.size());
    }
    if (pipe_.pending() > 0 || next == State::Closed)
        pipe_.reset();  // drops the references to source pages the pipe still held
    state_ = next;
    readable_ = writable_ = hup_ = false;
    rx_ = Rx::Header;
    hdr_got_ = 0;
    send_idx_ = 0;
    tx_.reset();
    done_count_ = 0;
    done_off_ = kHeaderSize;
    hello_off_ = hello_len_ = 0;
    auth_sent_ = false;
    auth_problem_.clear();
    std::deque<Slice> failed;
    failed.swap(q_);
    // With several rails, the slices of a broken path move to the other rails (Peer::reroute)
    // instead of failing, with those still waiting in incoming_ (which would reconnect this
    // rail): no byte of theirs can land through this lane any more (its socket is closed, and
    // this thread was the one receiving).
    const size_t own = failed.size();
    bool moved = false;
    if (next != State::Closed && ferry_is_path_error(status) && peer_.rail_count() > 1) {
        Batch waiting;
        {
            std::lock_guard lk(in_mu_);
            waiting.swap(incoming_);
        }
        try {
            for (auto &vec : waiting) failed.insert(failed.end(), vec.begin(), vec.end());
            moved = peer_.reroute(rail_, why, failed);
        } catch (...) {
            moved = false;
        }
        if (!moved) {
            failed.resize(own);
            std::lock_guard lk(in_mu_);
            incoming_.splice(incoming_.begin(), waiting);
        }
    }
    for (size_t i = 0; i < failed.size(); ++i) {
        load_.fetch_sub(failed[i].len, std::memory_order_relaxed);
        if (!moved) finish_slice(*sink_, failed[i].op, status, why.c_str());
    }
    // Off the loop thread (send_now, receive_now) a stale timer or ready entry stays: on a Down
    // lane it does nothing and drops itself.
    if (reactor_.in_loop()) reactor_.forget(this);
    if (handshaking) peer_.on_handshake(index_, status, why);
}

void Lane::protocol_error(const std::string &what) {
    fail(-EPROTO, strprintf("protocol error from peer %s: %s", remote().name.c_str(), what.c_str()));
}

void Lane::shutdown(int status, const std::string &why) {
    Held h(*this, reactor_.completions());
    take_incoming();
    if (state_ == State::Closed) return;
    if (state_ == State::Down && q_.empty()) {
        // Nothing to fail and nothing to report again (a failed connect was logged already).
        pipe_.reset();
        state_ = State::Closed;
        reactor_.forget(this);
        return;
    }
    fail(status, why, State::Closed);
}

void Lane::take_incoming() {
    Batch got;
    {
        std::lock_guard lk(in_mu_);
        got.swap(incoming_);
    }
    if (got.empty()) return;
    if (q_.empty()) last_progress_ = Clock::now();  // idle time before this work is not a stall
    bool all_small = true;
    for (auto &vec : got) {
        for (Slice &s : vec) {
            stamp(s);
            q_.push_back(s);
            all_small = all_small && is_small(s);
            // The pipe (two fds) is made for the first WRITE large enough to go zero-copy.
            if (s.opcode == FERRY_OP_WRITE && s.len >= kZeroCopyMin && peer_.config().zerocopy && !pipe_.is_open() &&
                !pipe_.open())
                peer_.log().log(FERRY_LOG_DEBUG, "lane %u to peer %s: no pipe (%s), copying", index_,
                                remote().name.c_str(), errno_string(errno).c_str());
        }
    }
    if (state_ == State::Closed)  // cannot happen: submit checks the peer first; be safe
        fail(-ECANCELED, "peer " + remote().name + " is disconnected", State::Closed);
    if (state_ == State::Ready && waiter_ && !all_small) leave_waiter();
    else if (state_ == State::Ready && !waiter_ && all_small) enter_waiter();
}

void Lane::stamp(Slice &s) {
    s.id = next_id_++;
    Header h;
    h.type = s.opcode == FERRY_OP_WRITE ? kWriteReq : kReadReq;
    h.id = s.id;
    h.addr = s.remote_addr;
    h.length = s.len;
    encode_header(h, s.hdr);
}

// Waiter mode starts with the first batch of small ops on a Ready lane, on the loop thread.
void Lane::enter_waiter() {
    if (waiters_.add(fd_, this) != 0) return;  // stays with the reactor
    reactor_.mod_fd(fd_, kWaiterEvents, this);
    waiter_ = true;
    reactor_.want_timer(this);
}

void Lane::leave_waiter() {
    waiters_.remove(fd_);
    waiter_ = false;
    reactor_.mod_fd(fd_, kEvents, this);  // re-arms: bytes already waiting raise an event
    readable_ = true;
}

bool Lane::send_now(std::vector<Slice> &slices, std::vector<ferry_completion_t> &done) noexcept {
    std::unique_lock lk(mu_, std::try_to_lock);
    if (!lk.owns_lock() || state_ != State::Ready || !waiter_ || !writable_ || has_output()) return false;
    {
        std::lock_guard in(in_mu_);
        if (!incoming_.empty()) return false;  // work handed over earlier goes first
    }
    const size_t before = q_.size();
    const uint64_t first_id = next_id_;
    try {
        done.reserve(done.size() + before + slices.size());  // a failure below cannot throw
        for (Slice &s : slices) {
            stamp(s);
            q_.push_back(s);
        }
    } catch (...) {
        while (q_.size() > before) q_.pop_back();
        next_id_ = first_id;
        return false;
    }
    if (before == 0) last_progress_ = Clock::now();
    sink_ = &done;
    // A socket that fills up leaves the rest to the reactor: the send space it waits for
    // raises EPOLLOUT there.
    while (state_ == State::Ready && writable_ && has_output())
        if (do_send() <= 0) break;
    sink_ = nullptr;
    return true;
}

void Lane::receive_now(std::vector<ferry_completion_t> &done) noexcept {
    std::unique_lock lk(mu_, std::try_to_lock);
    if (!lk.owns_lock() || !waiter_ || state_ != State::Ready) return;
    try {
        done.reserve(done.size() + q_.size());  // completing cannot throw half-way
    } catch (...) {
        return;  // the reactor reads on its next tick
    }
    sink_ = &done;
    readable_ = true;  // the wait set said so
    uint64_t moved = 0;
    while (state_ == State::Ready && readable_ && moved < kBudget) {
        ssize_t m = do_recv();
        if (m <= 0) break;
        moved += static_cast<uint64_t>(m);
    }
    // READ_DONE reports owed for what was just read.
    while (state_ == State::Ready && writable_ && has_output())
        if (do_send() <= 0) break;
    sink_ = nullptr;
}

void Lane::on_kick() {
    Held h(*this, reactor_.completions());
    take_incoming();
    if (q_.empty()) return;
    if (state_ == State::Down) connect_now();
    else if (state_ == State::Ready) progress();
    if (needs_timer()) reactor_.want_timer(this);
}

void Lane::on_events(uint32_t events) {
    Held h(*this, reactor_.completions());
    if (state_ == State::Connecting) {
        int err = socket_error(fd_);
        if (err != 0) {
            fail(-err, strprintf("connect to peer %s failed: %s", remote().name.c_str(), errno_string(err).c_str()));
            return;
        }
        if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return;
        state_ = State::Hello;
        if (!ferry_auth::fill_random(client_nonce_)) {
            fail(-EIO, strprintf("connect to peer %s failed: getrandom: %s", remote().name.c_str(),
                                 errno_string(errno).c_str()));
            return;
        }
        Header h;
        h.type = kHello;
        h.flags = peer_.config().auth_key.empty() ? 0 : kFlagAuth;
        h.msg_len = kHelloData;
        encode_header(h, hello_);
        memcpy(hello_ + kHeaderSize, client_nonce_, kNonceSize);
        hello_len_ = kHeaderSize + kHelloData;
        hello_off_ = 0;
    }
    if (events & EPOLLOUT) writable_ = true;
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) readable_ = true;
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) hup_ = true;
    progress();
}

bool Lane::has_output() const {
    if (state_ == State::Hello) return hello_off_ < hello_len_;
    return state_ == State::Ready &&
           (send_idx_ < q_.size() || pipe_.pending() > 0 || done_count_ > 0 || done_off_ < kHeaderSize);
}

void Lane::progress() {
    uint64_t moved = 0;
    while (state_ == State::Hello || state_ == State::Ready) {
        ssize_t n = 0, m = 0;
        if (writable_ && has_output()) {
            n = do_send();
            if (n < 0) return;
        }
        if (readable_) {
            m = do_recv();
            if (m < 0) return;
        }
        if (n == 0 && m == 0) return;
        moved += static_cast<uint64_t>(n + m);
        if (moved >= kBudget) {
            reactor_.mark_ready(this);  // let the reactor's other connections run
            return;
        }
    }
}

bool Lane::needs_timer() const {
    if (state_ == State::Connecting || state_ == State::Hello) return true;
    return state_ == State::Ready && (waiter_ || (!q_.empty() && peer_.config().op_timeout_ms != 0));
}

void Lane::on_ready() {
    Held h(*this, reactor_.completions());
    progress();
}

bool Lane::on_timer(Clock::time_point now) {
    Held h(*this, reactor_.completions());
    const Config &cfg = peer_.config();
    if (state_ == State::Ready && waiter_) {
        if (!q_.empty()) {
            readable_ = true;  // responses no host polled for: read them here, once a tick
            progress();
            if (state_ != State::Ready) return needs_timer();
        } else if (ms_between(last_progress_, now) >= kWaiterIdleMs) {
            leave_waiter();
        }
    }
    const std::string &name = remote().name;
    if (state_ == State::Connecting || state_ == State::Hello) {
        if (ms_between(connect_start_, now) >= cfg.connect_timeout_ms) {
            fail(-ETIMEDOUT, strprintf("connect to peer %s timed out after %u ms%s", name.c_str(),
                                       cfg.connect_timeout_ms, state_ == State::Hello ? " (no HELLO reply)" : ""));
            return false;
        }
    } else if (state_ == State::Ready && !q_.empty() && cfg.op_timeout_ms != 0 &&
               ms_between(last_progress_, now) >= cfg.op_timeout_ms) {
        fail(-ETIMEDOUT,
             strprintf("peer %s made no progress for %u ms (op_timeout_ms)", name.c_str(), cfg.op_timeout_ms));
        return false;
    }
    return needs_timer();
}

}  // namespace ferry_tcp
