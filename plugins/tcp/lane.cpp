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
constexpr size_t kMaxAckRun = 64;          // WRITE_ACK headers read by one recv
constexpr uint64_t kBudget = 16ull << 20;  // bytes moved per wake-up before yielding
constexpr uint32_t kEvents = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;

// Error text from a peer ends up in logs and completions: keep it printable.
void sanitize(char *s) {
    for (; *s; ++s)
        if (static_cast<unsigned char>(*s) < 0x20 || static_cast<unsigned char>(*s) > 0x7e) *s = '?';
}
}  // namespace

Lane::Lane(Peer &peer, Reactor &reactor, unsigned index) : peer_(peer), reactor_(reactor), index_(index) {}

Lane::~Lane() {
    if (fd_ >= 0) close(fd_);
}

void Lane::push(Batch &batch) noexcept {
    {
        std::lock_guard lk(in_mu_);
        incoming_.splice(incoming_.end(), batch);
    }
    reactor_.kick(this);
}

void Lane::start() {
    if (state_ == State::Down) connect_now();
}

void Lane::connect_now() {
    const Endpoint &ep = peer_.endpoint();
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
    if (fd_ >= 0) {
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
        if (q_.empty())
            peer_.log().log(level, "lane %u to peer %s: %s", index_, peer_.endpoint().name.c_str(), why.c_str());
        else
            peer_.log().log(level, "lane %u to peer %s: %s (%zu slices failed)", index_, peer_.endpoint().name.c_str(),
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
    for (Slice &s : failed) {
        load_.fetch_sub(s.len, std::memory_order_relaxed);
        finish_slice(reactor_, s.op, status, why.c_str());
    }
    reactor_.forget(this);
    if (handshaking) peer_.on_handshake(index_, status, why);
}

void Lane::protocol_error(const std::string &what) {
    fail(-EPROTO, strprintf("protocol error from peer %s: %s", peer_.endpoint().name.c_str(), what.c_str()));
}

void Lane::shutdown(int status, const std::string &why) {
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
    for (auto &vec : got) {
        for (Slice &s : vec) {
            s.id = next_id_++;
            Header h;
            h.type = s.opcode == FERRY_OP_WRITE ? kWriteReq : kReadReq;
            h.id = s.id;
            h.addr = s.remote_addr;
            h.length = s.len;
            encode_header(h, s.hdr);
            q_.push_back(s);
            // The pipe (two fds) is made for the first WRITE large enough to go zero-copy.
            if (s.opcode == FERRY_OP_WRITE && s.len >= kZeroCopyMin && peer_.config().zerocopy && !pipe_.is_open() &&
                !pipe_.open())
                peer_.log().log(FERRY_LOG_DEBUG, "lane %u to peer %s: no pipe (%s), copying", index_,
                                peer_.endpoint().name.c_str(), errno_string(errno).c_str());
        }
    }
    if (state_ == State::Closed)  // cannot happen: submit checks the peer first; be safe
        fail(-ECANCELED, "peer " + peer_.endpoint().name + " is disconnected", State::Closed);
}

void Lane::on_kick() {
    take_incoming();
    if (q_.empty()) return;
    if (state_ == State::Down) connect_now();
    else if (state_ == State::Ready) progress();
    if (needs_timer()) reactor_.want_timer(this);
}

void Lane::on_events(uint32_t events) {
    if (state_ == State::Connecting) {
        int err = socket_error(fd_);
        if (err != 0) {
            fail(-err,
                 strprintf("connect to peer %s failed: %s", peer_.endpoint().name.c_str(), errno_string(err).c_str()));
            return;
        }
        if ((events & (EPOLLOUT | EPOLLERR | EPOLLHUP)) == 0) return;
        state_ = State::Hello;
        if (!ferry_auth::fill_random(client_nonce_)) {
            fail(-EIO, strprintf("connect to peer %s failed: getrandom: %s", peer_.endpoint().name.c_str(),
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

// How many fully sent WRITE slices lead the queue: their responses are headers only (or an
// error header and its message), so reading up to that many headers at once can never pull in
// bytes of a READ payload.
size_t Lane::front_write_acks() const {
    size_t k = 0;
    size_t lim = std::min(send_idx_, kMaxAckRun);
    while (k < lim && q_[k].opcode == FERRY_OP_WRITE) ++k;
    return k;
}

ssize_t Lane::do_recv() {
    ssize_t n;
    size_t requested;
    bool staged = false;
    if (rx_ == Rx::Header) {
        size_t run = (hdr_got_ == 0 && state_ == State::Ready) ? front_write_acks() : 0;
        if (run >= 2) {
            staging_.resize(run * kHeaderSize);
            requested = staging_.size();
            n = recv(fd_, staging_.data(), requested, MSG_DONTWAIT);
            staged = true;
        } else {
            requested = kHeaderSize - hdr_got_;
            n = recv(fd_, hdr_ + hdr_got_, requested, MSG_DONTWAIT);
        }
    } else if (rx_ == Rx::Payload) {
        // Straight into local memory; the next response's header is read by the same call.
        iovec iov[2] = {{payload_dst_, static_cast<size_t>(payload_left_)}, {hdr_, kHeaderSize}};
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = 2;
        requested = static_cast<size_t>(payload_left_) + kHeaderSize;
        UntrackedPayloadIo payload;
        n = recvmsg(fd_, &mh, MSG_DONTWAIT);
    } else {
        requested = cur_.msg_len - msg_got_;
        n = recv(fd_, msg_ + msg_got_, requested, MSG_DONTWAIT);
    }
    if (n == 0) {
        fail(-ECONNRESET, strprintf("peer %s closed the connection", peer_.endpoint().name.c_str()));
        return -1;
    }
    if (n < 0) {
        int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK) {
            readable_ = false;
            // A mark set by an earlier short read did not count the bytes read since: never wait
            // for more than the payload still owes (the next header may be all that follows).
            if (rx_ == Rx::Payload && static_cast<uint64_t>(lowat_) > payload_left_)
                set_rcvlowat(fd_, &lowat_, static_cast<int>(payload_left_));
            return 0;
        }
        if (e == EINTR) return 0;
        fail(-e, strprintf("connection to peer %s failed: %s", peer_.endpoint().name.c_str(), errno_string(e).c_str()));
        return -1;
    }
    last_progress_ = Clock::now();
    // A short read drained the socket: the next data raises a new edge. Not after a hang-up,
    // whose edge has already been delivered and whose EOF must still be read.
    if (static_cast<size_t>(n) < requested && !hup_) {
        readable_ = false;
        if (rx_ == Rx::Payload && payload_left_ > static_cast<uint64_t>(n))
            set_rcvlowat(fd_, &lowat_,
                         static_cast<int>(std::min<uint64_t>(payload_left_ - static_cast<uint64_t>(n), kBulkLowat)));
    }
    if (staged) return consume(staging_.data(), static_cast<size_t>(n)) ? n : -1;
    bool ok = true;
    if (rx_ == Rx::Header) {
        hdr_got_ += static_cast<size_t>(n);
        if (hdr_got_ == kHeaderSize) {
            hdr_got_ = 0;
            ok = on_header();
        }
    } else if (rx_ == Rx::Payload) {
        const uint64_t body = std::min<uint64_t>(static_cast<uint64_t>(n), payload_left_);
        payload_dst_ += body;
        payload_left_ -= body;
        if (payload_left_ == 0) {
            set_rcvlowat(fd_, &lowat_, 1);
            rx_ = Rx::Header;
            if (cur_.flags & kFlagNeedsDone) {
                // The server sent these bytes by reference and keeps its region busy until
                // told they were consumed.
                ++done_count_;
                done_last_id_ = cur_.id;
            }
            complete_front(0, nullptr);
            hdr_got_ = static_cast<size_t>(static_cast<uint64_t>(n) - body);
            if (hdr_got_ == kHeaderSize) {
                hdr_got_ = 0;
                ok = on_header();
            }
        }
    } else {
        msg_got_ += static_cast<uint32_t>(n);
        if (msg_got_ == cur_.msg_len) ok = on_message_done();
    }
    return ok ? n : -1;
}

// Feeds bytes read ahead into the staging buffer through the receive state machine.
bool Lane::consume(const uint8_t *p, size_t n) {
    while (n > 0) {
        size_t take;
        if (rx_ == Rx::Header) {
            take = std::min(n, kHeaderSize - hdr_got_);
            memcpy(hdr_ + hdr_got_, p, take);
            hdr_got_ += take;
            if (hdr_got_ == kHeaderSize) {
                hdr_got_ = 0;
                if (!on_header()) return false;
            }
        } else if (rx_ == Rx::Message) {
            take = std::min<size_t>(n, cur_.msg_len - msg_got_);
            memcpy(msg_ + msg_got_, p, take);
            msg_got_ += static_cast<uint32_t>(take);
            if (msg_got_ == cur_.msg_len && !on_message_done()) return false;
        } else {
            // Unreachable: a READ_RESP is never the answer to a WRITE (on_header checks).
            protocol_error("payload bytes inside a run of WRITE responses");
            return false;
        }
        p += take;
        n -= take;
    }
    return true;
}

bool Lane::on_header() {
    cur_ = decode_header(hdr_);
    const Header &h = cur_;
    const std::string &name = peer_.endpoint().name;
    if (h.magic != kWireMagic) {
        protocol_error(strprintf("bad magic 0x%08x: %s is not a Ferry tcp server", h.magic, name.c_str()));
        return false;
    }
    if (h.version != kWireVersion && !(state_ == State::Hello && h.type == kError)) {
        fail(-EPROTO, strprintf("peer %s speaks tcp wire version %u, this plugin speaks %u", name.c_str(), h.version,
                                kWireVersion));
        return false;
    }
    if (h.type == kError) {
        if (h.msg_len > kMaxErrorMsg || h.status >= 0 || h.status < -4095) {
            protocol_error(strprintf("ERROR with status %d and %u message bytes", h.status, h.msg_len));
            return false;
        }
        if (state_ == State::Ready && (send_idx_ == 0 || h.id != q_.front().id)) {
            protocol_error(strprintf("ERROR for request %llu, expected %llu", static_cast<unsigned long long>(h.id),
                                     static_cast<unsigned long long>(send_idx_ ? q_.front().id : 0)));
            return false;
        }
        rx_ = Rx::Message;
        msg_got_ = 0;
        return h.msg_len == 0 ? on_message_done() : true;
    }
    if (state_ == State::Hello) {
        if (!auth_sent_ && h.type == kHelloAck && h.msg_len == kHelloAckData) {
            rx_ = Rx::Message;  // nonce and proof, handled by on_hello_ack
            msg_got_ = 0;
            return true;
        }
        if (!auth_sent_ || h.type != kAuthAck || h.msg_len != 0) {
            protocol_error(strprintf("%s with %u data bytes during the handshake", msg_type_name(h.type), h.msg_len));
            return false;
        }
        if (!auth_problem_.empty()) {
            fail(-EACCES, std::string(auth_problem_));  // a copy: fail() clears auth_problem_
            return false;
        }
        state_ = State::Ready;
        peer_.on_handshake(index_, 0, std::string());
        last_progress_ = Clock::now();
        if (!needs_timer()) reactor_.forget(this);
        return true;
    }
    if (send_idx_ == 0) {
        protocol_error(strprintf("unsolicited %s", msg_type_name(h.type)));
        return false;
    }
    const Slice &s = q_.front();
    if (h.id != s.id || h.msg_len != 0 || h.status != 0) {
        protocol_error(strprintf("%s for request %llu, expected %llu", msg_type_name(h.type),
                                 static_cast<unsigned long long>(h.id), static_cast<unsigned long long>(s.id)));
        return false;
    }
    if (h.type == kWriteAck && s.opcode == FERRY_OP_WRITE && h.flags == 0) {
        complete_front(0, nullptr);
        return true;
    }
    if (h.type == kReadResp && s.opcode == FERRY_OP_READ && h.length == s.len && (h.flags & ~kFlagNeedsDone) == 0) {
        rx_ = Rx::Payload;
        payload_dst_ = reinterpret_cast<uint8_t *>(s.local_addr);
        payload_left_ = s.len;
        return true;
    }
    protocol_error(strprintf("%s of %llu bytes does not answer a %s of %llu bytes", msg_type_name(h.type),
                             static_cast<unsigned long long>(h.length), s.opcode == FERRY_OP_WRITE ? "WRITE" : "READ",
                             static_cast<unsigned long long>(s.len)));
    return false;
}

bool Lane::on_hello_ack() {
    const uint8_t *server_nonce = reinterpret_cast<const uint8_t *>(msg_);
    const uint8_t *server_proof = server_nonce + kNonceSize;
    const std::string &key = peer_.config().auth_key;
    const std::string &name = peer_.endpoint().name;
    // The server refuses a mismatch of "has a key" itself; a wrong proof is ours to find. AUTH
    // is sent either way, so the server logs the failed attempt too.
    if (!key.empty() && !(cur_.flags & kFlagAuth))
        auth_problem_ = strprintf(
            "authentication failed: peer %s has no cluster secret but this "
            "engine requires one (auth_secret)",
            name.c_str());
    else if (!key.empty() &&
             !ferry_auth::proof_matches(key, kProtocol, Role::kServer, client_nonce_,
                                        ferry_auth::nonce_at(server_nonce), ferry_auth::proof_at(server_proof)))
        auth_problem_ = strprintf(
            "authentication failed: peer %s does not know the cluster "
            "secret (wrong auth_secret on one side)",
            name.c_str());
    Header h;
    h.type = kAuth;
    h.msg_len = kAuthData;
    encode_header(h, hello_);
    auto proof =
        ferry_auth::make_proof(key, kProtocol, Role::kClient, client_nonce_, ferry_auth::nonce_at(server_nonce));
    memcpy(hello_ + kHeaderSize, proof.data(), kProofSize);
    hello_len_ = kHeaderSize + kAuthData;
    hello_off_ = 0;
    auth_sent_ = true;
    rx_ = Rx::Header;
    return true;
}

bool Lane::on_message_done() {
    if (state_ == State::Hello && cur_.type == kHelloAck) return on_hello_ack();
    msg_[msg_got_] = '\0';
    sanitize(msg_);
    rx_ = Rx::Header;
    const std::string &name = peer_.endpoint().name;
    if (state_ == State::Hello) {
        if (!auth_problem_.empty()) fail(-EACCES, std::string(auth_problem_));  // a copy: fail() clears auth_problem_
        else fail(cur_.status, strprintf("peer %s refused the connection: %s", name.c_str(), msg_));
        return false;
    }
    complete_front(cur_.status, strprintf("peer %s: %s", name.c_str(), msg_).c_str());
    return true;
}

void Lane::complete_front(int status, const char *message) {
    Slice s = q_.front();
    q_.pop_front();
    --send_idx_;
    load_.fetch_sub(s.len, std::memory_order_relaxed);
    finish_slice(reactor_, s.op, status, message);
}

bool Lane::needs_timer() const {
    if (state_ == State::Connecting || state_ == State::Hello) return true;
    return state_ == State::Ready && !q_.empty() && peer_.config().op_timeout_ms != 0;
}

bool Lane::on_timer(Clock::time_point now) {
    const Config &cfg = peer_.config();
    const std::string &name = peer_.endpoint().name;
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
