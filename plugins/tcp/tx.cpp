#include "tx.hpp"
#include "untracked_io.hpp"

#include <sys/socket.h>
#include <sys/uio.h>

#include <cerrno>
#include <cstring>
#include <memory>
#include <new>

namespace ferry_tcp {

namespace {
constexpr int kMaxIov = 256;              // iovecs per sendmsg
constexpr size_t kPackMax = 2048;         // pieces up to this size are copied into the pack buffer
constexpr size_t kPackBytes = 64 * 1024;  // bytes packed per sendmsg

// Small pieces (headers, small payloads) of consecutive messages are copied into one buffer and
// sent as one iovec: the kernel's per-iovec cost exceeds a copy of a few dozen bytes. The
// buffer is only used during one sendmsg, so one per thread (the reactors) serves every
// connection; without it (allocation failed) every piece is its own iovec.
uint8_t *pack_buffer() {
    thread_local std::unique_ptr<uint8_t[]> buf(new (std::nothrow) uint8_t[kPackBytes]);
    return buf.get();
}
}  // namespace

void TxCursor::advance(const TxSource &src, uint64_t n, TxResult *r) {
    while (n > 0) {
        const TxItem it = src.tx_item(r->completed);
        uint64_t rest = (it.hdr != nullptr ? kHeaderSize : 0) + it.len - off_;
        if (n < rest) {
            off_ += n;
            return;
        }
        n -= rest;
        off_ = 0;
        ++r->completed;
    }
}

ssize_t TxCursor::step(int fd, SplicePipe *pipe, const TxSource &src, TxResult *r) {
    *r = TxResult{};
    if (pipe != nullptr && pipe->pending() > 0) {
        ssize_t n = pipe->drain(fd);
        if (n == -EAGAIN) r->blocked = true;
        return n == -EAGAIN || n == -EINTR ? 0 : n;
    }
    const size_t count = src.tx_count();
    if (count == 0) return 0;
    if (pipe != nullptr && pipe->is_open() && src.tx_item(0).by_ref) {
        ssize_t n = fill(*pipe, src, count, r);
        if (n <= 0) return n;
        ssize_t m = pipe->drain(fd);
        if (m == -EAGAIN) r->blocked = true;
        else if (m < 0 && m != -EINTR) return m;
        return n;
    }
    return gather(fd, src, count, r);
}

ssize_t TxCursor::gather(int fd, const TxSource &src, size_t count, TxResult *r) {
    iovec iov[kMaxIov];
    int cnt = 0;
    size_t requested = 0;
    uint64_t off = off_;
    uint8_t *const pack = pack_buffer();
    size_t packed = 0;
    bool last_packed = false;    // iov[cnt - 1] ends at pack + packed
    UntrackedPayloadIo payload;  // the pack copies and sendmsg read payload memory
    auto add = [&](const uint8_t *p, size_t len) {
        if (pack != nullptr && len <= kPackMax && packed + len <= kPackBytes) {
            memcpy(pack + packed, p, len);
            if (last_packed) iov[cnt - 1].iov_len += len;
            else iov[cnt++] = {pack + packed, len};
            packed += len;
            last_packed = true;
        } else {
            iov[cnt++] = {const_cast<uint8_t *>(p), len};
            last_packed = false;
        }
    };
    for (size_t i = 0; i < count && cnt + 2 <= kMaxIov; ++i, off = 0) {
        const TxItem it = src.tx_item(i);
        if (i > 0 && it.by_ref) break;  // goes through the pipe
        const uint64_t hl = it.hdr != nullptr ? kHeaderSize : 0;
        if (off < hl) {
            add(it.hdr + off, kHeaderSize - off);
            if (it.len != 0) add(it.payload, it.len);
        } else {
            add(it.payload + (off - hl), it.len - (off - hl));
        }
    }
    for (int i = 0; i < cnt; ++i) requested += iov[i].iov_len;
    msghdr mh{};
    mh.msg_iov = iov;
    mh.msg_iovlen = static_cast<size_t>(cnt);
    ssize_t n = sendmsg(fd, &mh, MSG_NOSIGNAL | MSG_DONTWAIT);
    if (n < 0) {
        int e = errno;
        if (e == EAGAIN || e == EWOULDBLOCK) {
            r->blocked = true;
            return 0;
        }
        return e == EINTR ? 0 : -e;
    }
    // A short write means the socket buffer is full (the kernel then signals the next
    // EPOLLOUT edge), which saves the sendmsg that would return EAGAIN.
    if (static_cast<size_t>(n) < requested) r->blocked = true;
    advance(src, static_cast<uint64_t>(n), r);
    return n;
}

// Moves by_ref items into the (empty) pipe until it is full or the next item is not by_ref.
ssize_t TxCursor::fill(SplicePipe &pipe, const TxSource &src, size_t count, TxResult *r) {
    ssize_t total = 0;
    while (r->completed < count) {
        const TxItem it = src.tx_item(r->completed);
        if (!it.by_ref) break;
        ssize_t n;
        size_t want;
        if (off_ < kHeaderSize) {
            want = kHeaderSize - off_;
            n = pipe.copy_in(it.hdr + off_, want);
        } else {
            want = it.len - (off_ - kHeaderSize);
            n = pipe.push(it.payload + (off_ - kHeaderSize), want);
            if (n < 0 && n != -EAGAIN && n != -EINTR) {
                // Memory the kernel cannot reference. Item 0 (after what the pipe holds is
                // drained) is then sent by copy; a later item simply waits.
                if (r->completed == 0 && pipe.pending() == 0) r->refused = true;
                break;
            }
        }
        if (n == -EAGAIN || n == -EINTR) break;  // pipe full
        if (n < 0) return n;
        total += n;
        advance(src, static_cast<uint64_t>(n), r);
        if (static_cast<size_t>(n) < want) break;  // pipe full
    }
    return total;
}

}  // namespace ferry_tcp
