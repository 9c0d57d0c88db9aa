// Receive side of a lane: responses parsed in request order (HELLO_ACK / AUTH_ACK during the
// handshake, then WRITE_ACK / READ_RESP / ERROR), payloads into local memory.
//
// Small responses are read in runs: one recv into rxbuf_ takes as many responses as are surely
// next (headers and READ payloads up to kSmallPayload), and consume() copies each payload into
// its op's memory, so a batch of 64 B READs costs a few recvs instead of one per op. A large
// READ payload is received straight into its op's memory (recvmsg, with the next header read
// by the same call): it is never staged whole, only its first bytes can arrive in a run (after
// an ERROR shorter than the READ_RESP it replaced). Bytes are copied into an op's memory only
// here, on the loop thread, while the op is at the front of the queue, so never after it failed.
#include "lane.hpp"
#include "untracked_io.hpp"

#include "peer.hpp"
#include "plugin_util.hpp"
#include "socket_util.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry_tcp {

namespace {
// Error text from a peer ends up in logs and completions: keep it printable.
void sanitize(char *s) {
    for (; *s; ++s)
        if (static_cast<unsigned char>(*s) < 0x20 || static_cast<unsigned char>(*s) > 0x7e) *s = '?';
}
}  // namespace

// Bytes the responses still owed surely hold, up to rxbuf_'s size, stopping at the header of
// the first large READ_RESP (its payload goes straight to memory). 0: the front payload is
// large and is received directly. An ERROR can replace any response, so the guess may be off
// either way: fewer bytes mean another recv, more mean consume() meets the next responses.
size_t Lane::run_bytes() const {
    if (state_ != State::Ready)  // handshake: one header, then its data
        return rx_ == Rx::Message ? cur_.msg_len - msg_got_ : kHeaderSize - hdr_got_;
    size_t want = 0;
    size_t k = 0;
    if (rx_ == Rx::Payload) {
        if (payload_left_ > kSmallPayload) return 0;
        want = static_cast<size_t>(payload_left_);
        k = 1;
    } else if (rx_ == Rx::Message) {
        want = cur_.msg_len - msg_got_;
        k = 1;
    } else {
        want = kHeaderSize - hdr_got_;
        if (send_idx_ == 0) return want;  // nothing is owed: the header is a protocol error
        const Slice &s = q_.front();
        if (s.opcode == FERRY_OP_READ && s.len > kSmallPayload) return want;
        if (s.opcode == FERRY_OP_READ && s.len <= kSmallPayload) want += static_cast<size_t>(s.len);
        k = 1;
    }
    for (; k < send_idx_ && want < rxbuf_.size(); ++k) {
        const Slice &s = q_[k];
        want += kHeaderSize;
        if (s.opcode != FERRY_OP_READ) continue;
        if (s.len > kSmallPayload) break;
        want += static_cast<size_t>(s.len);
    }
    return std::min(want, rxbuf_.size());
}

ssize_t Lane::do_recv() {
    ssize_t n;
    size_t requested = run_bytes();
    const bool direct = requested == 0;
    if (direct) {
        // Straight into local memory; the next response's header is read by the same call.
        iovec iov[2] = {{payload_dst_, static_cast<size_t>(payload_left_)}, {hdr_, kHeaderSize}};
        msghdr mh{};
        mh.msg_iov = iov;
        mh.msg_iovlen = 2;
        requested = static_cast<size_t>(payload_left_) + kHeaderSize;
        UntrackedPayloadIo payload;
        n = recvmsg(fd_, &mh, MSG_DONTWAIT);
    } else {
        set_rcvlowat(fd_, &lowat_, 1);  // a mark left by a large payload would hold back a short run
        n = recv(fd_, rxbuf_.data(), requested, MSG_DONTWAIT);
    }
    if (n == 0) {
        fail(-ECONNRESET, strprintf("peer %s closed the connection", remote().name.c_str()));
        return -1;
    }
    if (n < 0) {
        int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK) {
            readable_ = false;
            // A mark set by an earlier short read did not count the bytes read since: never wait
            // for more than the payload still owes (the next header may be all that follows).
            if (direct && static_cast<uint64_t>(lowat_) > payload_left_)
                set_rcvlowat(fd_, &lowat_, static_cast<int>(payload_left_));
            return 0;
        }
        if (e == EINTR) return 0;
        fail(-e, strprintf("connection to peer %s failed: %s", remote().name.c_str(), errno_string(e).c_str()));
        return -1;
    }
    last_progress_ = Clock::now();
    // A short read drained the socket: the next data raises a new edge. Not after a hang-up,
    // whose edge has already been delivered and whose EOF must still be read.
    if (static_cast<size_t>(n) < requested && !hup_) {
        readable_ = false;
        if (direct && payload_left_ > static_cast<uint64_t>(n))
            set_rcvlowat(fd_, &lowat_,
                         static_cast<int>(std::min<uint64_t>(payload_left_ - static_cast<uint64_t>(n), kBulkLowat)));
    }
    if (!direct) {
        if (!consume(rxbuf_.data(), static_cast<size_t>(n))) return -1;
        // Every response owed was read in full: a server sends nothing unasked, so the next
        // bytes raise a new edge (saves a recv that would only say EAGAIN).
        if (state_ == State::Ready && send_idx_ == 0 && rx_ == Rx::Header && hdr_got_ == 0 && !hup_) readable_ = false;
        return n;
    }
    const uint64_t body = std::min<uint64_t>(static_cast<uint64_t>(n), payload_left_);
    payload_dst_ += body;
    payload_left_ -= body;
    if (payload_left_ != 0) return n;
    set_rcvlowat(fd_, &lowat_, 1);
    payload_done();
    hdr_got_ = static_cast<size_t>(static_cast<uint64_t>(n) - body);
    if (hdr_got_ == kHeaderSize) {
        hdr_got_ = 0;
        if (!on_header()) return -1;
    }
    return n;
}

// Feeds a run of received bytes through the receive state machine. False: the lane failed (the
// rest of the run is dropped with it).
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
            take = static_cast<size_t>(std::min<uint64_t>(n, payload_left_));
            {
                UntrackedPayloadIo payload;
                memcpy(payload_dst_, p, take);
            }
            payload_dst_ += take;
            payload_left_ -= take;
            if (payload_left_ == 0) payload_done();
        }
        p += take;
        n -= take;
    }
    return true;
}

void Lane::payload_done() {
    rx_ = Rx::Header;
    if (cur_.flags & kFlagNeedsDone) {
        // The server sent these bytes by reference and keeps its region busy until told they
        // were consumed.
        ++done_count_;
        done_last_id_ = cur_.id;
    }
    complete_front(0, nullptr);
}

bool Lane::on_header() {
    cur_ = decode_header(hdr_);
    const Header &h = cur_;
    const std::string &name = remote().name;
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
    const std::string &name = remote().name;
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
    const std::string &name = remote().name;
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
    // Counted on the lane's own line with plain stores (only the lane's holder writes it): what
    // rails carried (rail_stats) and how fast (Peer::sample_rates).
    if (status == 0) counts_->count(s.opcode, s.len);
    finish_slice(*sink_, s.op, status, message);
}

}  // namespace ferry_tcp
