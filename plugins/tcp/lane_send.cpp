// Transmit side of a lane: HELLO, requests through the TxCursor (tx.hpp), and READ_DONE
// reports, which go between requests.
#include "lane.hpp"

#include "peer.hpp"
#include "plugin_util.hpp"

#include <sys/socket.h>

#include <cerrno>

namespace ferry_tcp {

size_t Lane::tx_count() const { return q_.size() - send_idx_; }

TxItem Lane::tx_item(size_t i) const {
    const Slice &s = q_[send_idx_ + i];
    TxItem it;
    it.hdr = s.hdr;
    if (s.opcode == FERRY_OP_WRITE) {
        it.payload = reinterpret_cast<const uint8_t *>(s.local_addr);
        it.len = s.len;
        it.by_ref = !s.copy_only && s.len >= kZeroCopyMin && pipe_.is_open();
    }
    return it;
}

ssize_t Lane::send_failed(int e) {
    fail(-e,
         strprintf("connection to peer %s failed while sending: %s", remote().name.c_str(), errno_string(e).c_str()));
    return -1;
}

ssize_t Lane::send_done() {
    if (done_off_ == kHeaderSize) {
        Header h;
        h.type = kReadDone;
        h.id = done_last_id_;
        h.length = done_count_;
        encode_header(h, done_hdr_);
        done_off_ = 0;
        done_count_ = 0;
    }
    ssize_t n = send(fd_, done_hdr_ + done_off_, kHeaderSize - done_off_, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
        int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK) {
            writable_ = false;
            return 0;
        }
        return e == EINTR ? 0 : send_failed(e);
    }
    done_off_ += static_cast<size_t>(n);
    return n;
}

ssize_t Lane::do_send() {
    ssize_t n;
    if (state_ == State::Hello) {
        n = send(fd_, hello_ + hello_off_, hello_len_ - hello_off_, MSG_NOSIGNAL | MSG_DONTWAIT);
        if (n < 0) {
            int e = errno;
            if (e == EAGAIN || e == EWOULDBLOCK) {
                writable_ = false;
                return 0;
            }
            return e == EINTR ? 0 : send_failed(e);
        }
        hello_off_ += static_cast<size_t>(n);
        last_progress_ = Clock::now();
        return n;
    }
    const bool boundary = tx_.offset() == 0 && pipe_.pending() == 0;
    if (done_off_ < kHeaderSize || (done_count_ > 0 && boundary)) return send_done();
    if (send_idx_ == q_.size() && pipe_.pending() == 0) return 0;
    TxResult r;
    n = tx_.step(fd_, &pipe_, *this, &r);
    if (r.refused) {
        peer_.log().log(FERRY_LOG_DEBUG, "lane %u: source pages cannot be spliced; copying", index_);
        q_[send_idx_].copy_only = true;
        n = tx_.step(fd_, &pipe_, *this, &r);
    }
    if (n < 0) return send_failed(static_cast<int>(-n));
    send_idx_ += r.completed;
    if (r.blocked) writable_ = false;
    if (n > 0) last_progress_ = Clock::now();
    return n;
}

}  // namespace ferry_tcp
