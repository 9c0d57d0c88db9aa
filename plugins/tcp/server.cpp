#include "server.hpp"
#include "untracked_io.hpp"

#include "socket_util.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <climits>
#include <cstring>
#include <memory>

namespace ferry_tcp {

namespace {
constexpr uint64_t kBudget = 16ull << 20;  // bytes moved per wake-up before yielding
constexpr size_t kMaxQueued = 1024;        // unsent responses before reading stops
constexpr size_t kMaxAwaiting = 4096;      // by-reference READ_RESPs without READ_DONE: a client
                                           // this far behind is broken (in flight is a few MiB)
constexpr size_t kScratch = 64 * 1024;
// Payload-less requests taken by one recv (read_request_run): a batch of 128 small READs is read
// at once and answered by one sendmsg. The buffer is per reactor thread, not per connection.
constexpr size_t kRunMax = 256;
constexpr unsigned kRefusalMs = 2000;  // how long a refused connection is kept to answer it
constexpr unsigned kLingerMs = 1000;   // how long a refusal may take to be sent
constexpr uint32_t kEvents = EPOLLIN | EPOLLOUT | EPOLLRDHUP | EPOLLET;
}  // namespace

ServerConn::ServerConn(ServerContext &ctx, Reactor &reactor, int fd, std::string peer_name, Admission admission)
    : ctx_(ctx), reactor_(reactor), fd_(fd), name_(std::move(peer_name)), adm_(std::move(admission)) {}

ServerConn::~ServerConn() {
    stage_teardown();
    // dispose_all() (transport destroyed) unkicked this before its staging window was detached:
    // a copy that ended since may have queued a kick, which must not reach a deleted handler.
    reactor_.unkick(this);
    if (adm_.refused) ctx_.limits.release_refusal();
    else ctx_.limits.release(adm_.ip, established_);
    if (cur_ref_ != nullptr) ctx_.regions.release(cur_ref_);
    for (Resp &r : out_)
        if (r.ref != nullptr) ctx_.regions.release(r.ref);
    for (Awaiting &a : awaiting_) ctx_.regions.release(a.ref);
    if (fd_ >= 0) {
        reactor_.del_fd(fd_);
        if (fd_keeper_) fd_keeper_.reset();  // closes now, or once the last staging copy ended
        else close(fd_);
    }
}

int ServerConn::start() {
    last_progress_ = Clock::now();
    // A refused peer gets a short while to send its HELLO and read the refusal.
    handshake_deadline_ =
        last_progress_ + std::chrono::milliseconds(adm_.refused ? std::min(ctx_.cfg.handshake_timeout_ms, kRefusalMs)
                                                                : ctx_.cfg.handshake_timeout_ms);
    int rc = reactor_.add_fd(fd_, kEvents, this);
    if (rc == 0) reactor_.want_timer(this);  // the handshake deadline
    return rc;
}

void ServerConn::close_conn(int level, const std::string &why) {
    if (closed_) return;
    closed_ = true;
    if (window_) window_->detach();  // no kick may reach this handler once it is disposed
    ctx_.peer_log.log(level, "connection from %s closed: %s", name_.c_str(), why.c_str());
    reactor_.dispose(this);  // deleted at the end of this loop iteration
}

void ServerConn::on_events(uint32_t events) {
    if (closed_) return;
    if (events & EPOLLOUT) writable_ = true;
    if (events & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) readable_ = true;
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) hup_ = true;
    progress();
}

bool ServerConn::can_read() const {
    // Only unsent responses throttle reading: READ_DONE reports arrive on this same stream, so
    // waiting for them must never stop it.
    return readable_ && !closing_ && !stage_wait_ && out_.size() < kMaxQueued;
}

void ServerConn::progress() {
    uint64_t moved = 0;
    while (!closed_) {
        ssize_t n = 0, m = 0;
        if (writable_ && (!out_.empty() || pipe_.pending() > 0)) {
            n = do_send();
            if (n < 0) return;
        }
        if (closing_ && out_.empty() && pipe_.pending() == 0) {
            close_conn(FERRY_LOG_DEBUG, "refused");
            return;
        }
        if (can_read()) {
            m = do_recv();
            if (m < 0) return;
        }
        if (n == 0 && m == 0) break;
        moved += static_cast<uint64_t>(n + m);
        if (moved >= kBudget) {
            reactor_.mark_ready(this);
            break;
        }
    }
    // Small WRITEs received so far go to the device now, unless one is still arriving.
    if (!closed_ && pack_ && !rx_in_pack_) stage_flush_pack();
    if (!closed_ && ((ctx_.cfg.op_timeout_ms != 0 && busy()) || !hello_done_ || stage_busy()))
        reactor_.want_timer(this);
}

TxItem ServerConn::tx_item(size_t i) const {
    const Resp &r = out_[i];
    TxItem it;
    it.hdr = r.head ? r.hdr : nullptr;
    it.payload = r.data;
    it.len = r.len;
    it.by_ref = r.by_ref;
    return it;
}

ssize_t ServerConn::do_send() {
    while (!out_.empty() && out_.front().dead && !out_.front().in_staged) {  // skipped staged items
        stage_release(out_.front());
        if (out_.front().ref != nullptr) ctx_.regions.release(out_.front().ref);
        out_.pop_front();
    }
    TxResult r;
    ssize_t n = tx_.step(fd_, &pipe_, *this, &r);
    if (r.refused) {
        out_.front().by_ref = false;  // the client still owes READ_DONE (header flag)
        n = tx_.step(fd_, &pipe_, *this, &r);
    }
    if (n < 0) {
        close_conn(FERRY_LOG_INFO, "send failed: " + errno_string(static_cast<int>(-n)));
        return -1;
    }
    if (r.blocked) writable_ = false;
    if (n > 0) last_progress_ = Clock::now();
    const bool staged = staged_in_out_ > 0;
    for (size_t i = 0; i < r.completed; ++i) {
        Resp &resp = out_.front();
        stage_release(resp);
        if (resp.needs_done) {
            awaiting_.push_back(Awaiting{resp.id, resp.ref});
            resp.ref = nullptr;
        } else if (resp.ref != nullptr) {
            ctx_.regions.release(resp.ref);
        }
        out_.pop_front();
    }
    while (!out_.empty() && out_.front().dead && !out_.front().in_staged) {
        stage_release(out_.front());
        if (out_.front().ref != nullptr) ctx_.regions.release(out_.front().ref);
        out_.pop_front();
    }
    if (staged && r.completed > 0) {  // buffers came back: start the next copies
        stage_progress();
        if (closed_) return -1;
    }
    if (awaiting_.size() > kMaxAwaiting) {
        close_conn(FERRY_LOG_WARN, strprintf("client owes READ_DONE for %zu responses", awaiting_.size()));
        return -1;
    }
    return n;
}

ssize_t ServerConn::do_recv() {
    ssize_t n;
    size_t requested;
    size_t chunk = 0;  // bytes of payload asked for (Payload / Drain)
    if (rx_ == Rx::Header && hdr_got_ == 0 && (last_type_ == kReadReq || last_type_ == kReadDone)) {
        ssize_t k = read_request_run();
        if (k != 0) return k;
    }
    if (rx_ == Rx::Header) {
        requested = kHeaderSize - hdr_got_;
        n = recv(fd_, hdr_ + hdr_got_, requested, MSG_DONTWAIT);
    } else {
        // Payload: straight into the registered region ([dst_, dst_ + left_) was checked in
        // on_header). Drain: into a scratch sink. When the rest of the payload fits, the next
        // request's header is read by the same call.
        iovec iov[2];
        if (rx_ == Rx::Staged && !rx_slice_ && writes_.back().status == 0 && !stage_rx_slice())
            return 0;  // waits for a staging buffer (stage_wait_)
        if (rx_ == Rx::Payload || rx_ == Rx::Handshake) {
            chunk = static_cast<size_t>(std::min<uint64_t>(left_, SSIZE_MAX - kHeaderSize));
            iov[0] = {dst_, chunk};
        } else if (rx_ == Rx::Staged && rx_slice_) {
            chunk = static_cast<size_t>(std::min<uint64_t>(left_, rx_len_ - rx_slice_got_));
            iov[0] = {rx_base_ + rx_slice_got_, chunk};
        } else {
            if (scratch_.empty()) scratch_.resize(kScratch);
            chunk = static_cast<size_t>(std::min<uint64_t>(left_, scratch_.size()));
            iov[0] = {scratch_.data(), chunk};
        }
        iov[1] = {hdr_, kHeaderSize};
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = chunk == left_ ? 2 : 1;
        requested = chunk + (mh.msg_iovlen == 2 ? kHeaderSize : 0);
        UntrackedPayloadIo payload;
        n = recvmsg(fd_, &mh, MSG_DONTWAIT);
    }
    if (n == 0) {
        bool mid = rx_ != Rx::Header || hdr_got_ != 0;
        close_conn(mid ? FERRY_LOG_WARN : FERRY_LOG_DEBUG,
                   mid ? "peer closed the connection in the middle of a request" : "peer closed the connection");
        return -1;
    }
    if (n < 0) {
        int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK) {
            readable_ = false;
            // A mark set by an earlier short read did not count the bytes read since: never wait
            // for more than the payload still owes (the next header may be all that follows).
            if (rx_ != Rx::Header && static_cast<uint64_t>(lowat_) > left_)
                set_rcvlowat(fd_, &lowat_, static_cast<int>(left_));
            return 0;
        }
        if (e == EINTR) return 0;
        close_conn(FERRY_LOG_INFO, "receive failed: " + errno_string(e));
        return -1;
    }
    last_progress_ = Clock::now();
    if (static_cast<size_t>(n) < requested && !hup_) {
        readable_ = false;  // drained: the next data raises a new edge
        if (rx_ != Rx::Header && static_cast<size_t>(n) < chunk)
            set_rcvlowat(fd_, &lowat_, static_cast<int>(std::min<uint64_t>(left_ - n, kBulkLowat)));
    }
    if (rx_ == Rx::Header) {
        hdr_got_ += static_cast<size_t>(n);
        if (hdr_got_ < kHeaderSize) return n;
        hdr_got_ = 0;
        return on_header() ? n : -1;
    }
    const size_t body = std::min(static_cast<size_t>(n), chunk);
    left_ -= body;
    if (rx_ == Rx::Payload || rx_ == Rx::Handshake) {
        dst_ += body;
    } else if (rx_ == Rx::Staged && rx_slice_) {
        rx_slice_got_ += body;
        if (rx_slice_got_ == rx_len_) stage_rx_filled();
    }
    if (left_ != 0) return n;
    set_rcvlowat(fd_, &lowat_, 1);
    if (rx_ == Rx::Payload) {
        ctx_.regions.release(cur_ref_);
        cur_ref_ = nullptr;
        queue(kWriteAck, cur_.id, 0, 0);
    } else if (rx_ == Rx::Handshake) {
        on_handshake_data();
    } else if (rx_ == Rx::Staged) {
        stage_rx_done();
    } else {
        queue_error(cur_.id, drain_status_, drain_why_);
    }
    rx_ = Rx::Header;
    hdr_got_ = static_cast<size_t>(n) - body;    // start of the next header, read along
    if (hdr_got_ == kHeaderSize && !closing_) {  // refused: the ERROR goes out, nothing more is read
        hdr_got_ = 0;
        if (!on_header()) return -1;
    }
    return n;
}

// After a READ_REQ, more are likely to follow (batches): look at what is queued and take a
// run of payload-less requests (READ_REQ, READ_DONE) with one recv, instead of one recv per
// 40-byte header. MSG_PEEK leaves anything else (a WRITE_REQ and its payload) in the socket,
// so no payload byte is ever staged. Returns bytes consumed, 0 to use the one-header path, or
// -1 when the connection was closed.
ssize_t ServerConn::read_request_run() {
    thread_local uint8_t run[kRunMax * kHeaderSize];
    ssize_t n = recv(fd_, run, sizeof run, MSG_PEEK | MSG_DONTWAIT);
    if (n < static_cast<ssize_t>(2 * kHeaderSize))
        return 0;  // nothing, little, EOF or an error: the one-header path reports it
    size_t k = 0;
    while ((k + 1) * kHeaderSize <= static_cast<size_t>(n)) {
        Header h = decode_header(run + k * kHeaderSize);
        if (h.magic != kWireMagic || (h.type != kReadReq && h.type != kReadDone)) break;
        ++k;
    }
    if (k < 2) return 0;
    ssize_t got = recv(fd_, run, k * kHeaderSize, MSG_DONTWAIT);
    if (got != static_cast<ssize_t>(k * kHeaderSize)) {
        // Only this thread reads the socket: peeked bytes cannot vanish.
        close_conn(FERRY_LOG_ERROR, "receive after peek returned a different length");
        return -1;
    }
    last_progress_ = Clock::now();
    // All that was queued is taken: the next bytes raise a new edge (not after a hang-up, whose
    // EOF must still be read).
    if (got == n && static_cast<size_t>(n) < sizeof run && !hup_) readable_ = false;
    // Device-memory READs of the run are all queued before their copies start, so the small
    // ones can share staging buffers (server_staged.cpp).
    stage_hold_ = true;
    for (size_t i = 0; i < k; ++i) {
        memcpy(hdr_, run + i * kHeaderSize, kHeaderSize);
        if (!on_header()) {
            stage_hold_ = false;
            return -1;
        }
    }
    stage_hold_ = false;
    if (!staged_.empty()) {
        stage_progress();
        if (closed_) return -1;
    }
    return got;
}

void ServerConn::queue(uint8_t type, uint64_t id, int status, uint64_t length, uint8_t flags) {
    Header h;
    h.type = type;
    h.flags = flags;
    h.id = id;
    h.status = status;
    h.length = length;
    out_.emplace_back();
    out_.back().id = id;
    encode_header(h, out_.back().hdr);
}

void ServerConn::queue_error(uint64_t id, int status, const std::string &msg) {
    Header h;
    h.type = kError;
    h.id = id;
    h.status = status;
    h.msg_len = static_cast<uint32_t>(std::min<size_t>(msg.size(), kMaxErrorMsg));
    out_.emplace_back();
    Resp &r = out_.back();
    r.id = id;
    r.msg = msg.substr(0, h.msg_len);
    r.data = reinterpret_cast<const uint8_t *>(r.msg.data());
    r.len = r.msg.size();
    encode_header(h, r.hdr);
}

bool ServerConn::on_header() {
    cur_ = decode_header(hdr_);
    const Header &h = cur_;
    last_type_ = h.type;
    if (!hello_done_) return on_handshake_header();
    std::string why;
    if (!check_request(h, &why)) {
        close_conn(FERRY_LOG_WARN, "malformed request: " + why);
        return false;
    }
    if (h.type == kReadDone) return on_read_done(h);
    int code = 0;
    if (h.type == kWriteReq) {
        Region *r = ctx_.regions.acquire_remote(h.addr, h.length, FERRY_ACCESS_REMOTE_WRITE, &code, &why);
        left_ = h.length;
        if (r != nullptr && r->kind != FERRY_MEM_HOST) {
            stage_write(h, r);
        } else if (r != nullptr) {
            cur_ref_ = r;
            dst_ = reinterpret_cast<uint8_t *>(h.addr);
            rx_ = Rx::Payload;
        } else {
            // Keep the stream in sync: read the payload into a scratch sink, then refuse.
            ctx_.peer_log.log(FERRY_LOG_INFO, "request from %s: %s", name_.c_str(), why.c_str());
            drain_status_ = code;
            drain_why_ = std::move(why);
            rx_ = Rx::Drain;
        }
        return true;
    }
    Region *r = ctx_.regions.acquire_remote(h.addr, h.length, FERRY_ACCESS_REMOTE_READ, &code, &why);
    if (r == nullptr) {
        ctx_.peer_log.log(FERRY_LOG_INFO, "request from %s: %s", name_.c_str(), why.c_str());
        queue_error(h.id, code, why);
        return true;
    }
    if (r->kind != FERRY_MEM_HOST) return stage_read(h, r);  // device memory: never dereferenced here
    // Large payloads go by reference (zero-copy); the region then stays referenced until the
    // client reports them consumed (READ_DONE).
    const bool by_ref = ctx_.cfg.zerocopy && h.length >= kZeroCopyMin && (pipe_.is_open() || pipe_.open());
    queue(kReadResp, h.id, 0, h.length, by_ref ? kFlagNeedsDone : 0);
    Resp &resp = out_.back();
    resp.data = reinterpret_cast<const uint8_t *>(h.addr);
    resp.len = h.length;
    resp.ref = r;
    resp.by_ref = by_ref;
    resp.needs_done = by_ref;
    return true;
}

bool ServerConn::on_handshake_header() {
    const Header &h = cur_;
    const uint8_t expected = awaiting_auth_ ? kAuth : kHello;
    if (h.magic != kWireMagic || (h.type != expected && !(h.type == kHello && h.version != kWireVersion))) {
        close_conn(FERRY_LOG_WARN, strprintf("not a Ferry tcp client (magic 0x%08x, type %u instead of %s)", h.magic,
                                             h.type, msg_type_name(expected)));
        return false;
    }
    if (h.version != kWireVersion) {
        refuse(-EPROTONOSUPPORT, strprintf("tcp wire version %u is not supported, this server "
                                           "speaks version %u; run the same Ferry release on every engine",
                                           h.version, kWireVersion));
        return true;
    }
    const uint32_t want = awaiting_auth_ ? kAuthData : kHelloData;
    if (h.msg_len != want || h.length != 0 || h.status != 0) {
        close_conn(FERRY_LOG_WARN,
                   strprintf("malformed %s (%u data bytes, %u expected)", msg_type_name(h.type), h.msg_len, want));
        return false;
    }
    if (!awaiting_auth_) client_has_key_ = (h.flags & kFlagAuth) != 0;
    rx_ = Rx::Handshake;
    dst_ = hs_;
    left_ = want;
    return true;
}

void ServerConn::refuse(int status, const std::string &why) {
    ctx_.peer_log.log(FERRY_LOG_WARN, "refusing connection from %s: %s", name_.c_str(), why.c_str());
    queue_error(0, status, why);
    closing_ = true;
}

void ServerConn::on_handshake_data() {
    const std::string &key = ctx_.cfg.auth_key;
    if (awaiting_auth_) {
        if (!ferry_auth::proof_matches(key, kProtocol, Role::kClient, client_nonce_, server_nonce_,
                                       ferry_auth::proof_at(hs_))) {
            refuse(-EACCES,
                   "authentication failed: the client does not know the cluster secret (wrong "
                   "auth_secret); set the same auth_secret on every engine of the cluster");
            return;
        }
        std::string why;
        if (!ctx_.limits.promote(adm_.ip, &why)) {
            refuse(-EBUSY, why);
            return;
        }
        established_ = true;
        awaiting_auth_ = false;
        hello_done_ = true;
        queue(kAuthAck, 0, 0, 0);
        return;
    }
    if (adm_.refused) {  // over a cap at accept: the HELLO was read, so closing sends a FIN
        refuse(-EBUSY, adm_.refusal);
        return;
    }
    memcpy(client_nonce_, hs_, kNonceSize);
    if (!key.empty() && !client_has_key_) {
        refuse(-EACCES,
               "authentication failed: this engine requires the cluster secret (auth_secret) "
               "and the client has none; set the same auth_secret on every engine of the cluster");
        return;
    }
    if (key.empty() && client_has_key_) {
        refuse(-EACCES,
               "authentication failed: this engine has no cluster secret but the client uses "
               "one; set the same auth_secret on every engine of the cluster");
        return;
    }
    if (!ferry_auth::fill_random(server_nonce_)) {
        refuse(-EIO, "getrandom failed: " + errno_string(errno));
        return;
    }
    uint8_t data[kHelloAckData];
    memcpy(data, server_nonce_, kNonceSize);
    auto proof = ferry_auth::make_proof(key, kProtocol, Role::kServer, client_nonce_, server_nonce_);
    memcpy(data + kNonceSize, proof.data(), kProofSize);
    queue_data(kHelloAck, key.empty() ? 0 : kFlagAuth, data, kHelloAckData);
    awaiting_auth_ = true;
}

void ServerConn::queue_data(uint8_t type, uint8_t flags, const uint8_t *data, uint32_t len) {
    Header h;
    h.type = type;
    h.flags = flags;
    h.msg_len = len;
    out_.emplace_back();
    Resp &r = out_.back();
    r.msg.assign(reinterpret_cast<const char *>(data), len);
    r.data = reinterpret_cast<const uint8_t *>(r.msg.data());
    r.len = r.msg.size();
    encode_header(h, r.hdr);
}

bool ServerConn::busy() const {
    return rx_ != Rx::Header || hdr_got_ != 0 || !out_.empty() || !awaiting_.empty() || stage_busy();
}

bool ServerConn::on_read_done(const Header &h) {
    const uint64_t n = h.length;
    if (n > awaiting_.size() || awaiting_[n - 1].id != h.id) {
        close_conn(FERRY_LOG_WARN, strprintf("malformed request: READ_DONE for %llu responses up to id %llu, "
                                             "%zu awaiting",
                                             static_cast<unsigned long long>(n), static_cast<unsigned long long>(h.id),
                                             awaiting_.size()));
        return false;
    }
    for (uint64_t i = 0; i < n; ++i) {
        ctx_.regions.release(awaiting_.front().ref);
        awaiting_.pop_front();
    }
    last_progress_ = Clock::now();
    return true;
}

// A client that stops reading responses, or stops in the middle of a request, holds region
// references (and so blocks deregister_mem): after op_timeout_ms without progress it is cut.
bool ServerConn::on_timer(Clock::time_point now) {
    if (closed_) return false;
    if (!hello_done_ && now >= handshake_deadline_) {
        if (closing_) {  // the refusal could not be sent in time
            close_conn(FERRY_LOG_INFO, "refusal not taken");
            return false;
        }
        if (adm_.refused) refuse(-EBUSY, adm_.refusal);
        else
            refuse(-ETIMEDOUT, strprintf("the handshake did not finish within %u ms "
                                         "(handshake_timeout_ms of this engine)",
                                         ctx_.cfg.handshake_timeout_ms));
        handshake_deadline_ = now + std::chrono::milliseconds(kLingerMs);
        progress();
        return !closed_;
    }
    if (!hello_done_) return true;
    if (!busy()) return false;
    if (stage_busy()) {
        stage_progress();  // the bound was held by other connections: try again
        progress();
        if (closed_) return false;
    }
    if (ctx_.cfg.op_timeout_ms != 0 && ms_between(last_progress_, now) >= ctx_.cfg.op_timeout_ms) {
        close_conn(FERRY_LOG_WARN, strprintf("no progress for %u ms (op_timeout_ms)", ctx_.cfg.op_timeout_ms));
        return false;
    }
    return ctx_.cfg.op_timeout_ms != 0 || stage_busy();
}

}  // namespace ferry_tcp
