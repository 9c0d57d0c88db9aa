// Transmit cursor shared by client lanes and served connections: moves a FIFO of messages
// (40-byte header + optional payload) into a non-blocking socket.
// - By default messages are gathered into sendmsg calls (header and payload iovecs, many
//   messages per call): the kernel copies them into socket buffers.
// - A message marked by_ref (a large payload, with zerocopy on) goes through the owner's
//   SplicePipe: header copied in, payload vmsplice'd in by reference, then spliced into the
//   socket, so header and payload leave in the same segments.
// Nothing is sent by sendmsg while the pipe holds bytes, so stream order is kept. Bytes in
// the pipe count as committed: the owner may forget a committed message (but must keep its
// payload memory valid until the peer has consumed it; see splice_pipe.hpp).
#pragma once

#include "splice_pipe.hpp"
#include "wire.hpp"

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace ferry_tcp {

// Payloads from this size on go by reference when zerocopy is on. Measured on loopback
// (2 cores, 1 GiB buffers): 1 MiB slices gain 10-40%; below ~256 KiB the extra syscalls and
// wake-ups cost more than the copy saves.
inline constexpr uint64_t kZeroCopyMin = 512 * 1024;

struct TxItem {
    const uint8_t *hdr = nullptr;      // kHeaderSize bytes; nullptr: a continuation of the
                                       // previous item's payload (staged slices), never by_ref
    const uint8_t *payload = nullptr;  // nullptr when len == 0
    uint64_t len = 0;
    bool by_ref = false;
};

// The owner's queue, seen from the cursor: item 0 is the one the cursor is in.
class TxSource {
public:
    virtual size_t tx_count() const = 0;
    virtual TxItem tx_item(size_t i) const = 0;

protected:
    ~TxSource() = default;
};

struct TxResult {
    size_t completed = 0;  // items at the front now fully committed: the owner advances
    bool blocked = false;  // socket full: wait for EPOLLOUT
    bool refused = false;  // the kernel refused to reference item 0's payload: resend by copy
};

class TxCursor {
public:
    uint64_t offset() const { return off_; }  // bytes of item 0 already committed
    void reset() { off_ = 0; }

    // One step: drains the pipe if it holds bytes, else commits items from the cursor on.
    // Returns bytes moved (0 when blocked or refused) or -errno.
    ssize_t step(int fd, SplicePipe *pipe, const TxSource &src, TxResult *r);

private:
    ssize_t gather(int fd, const TxSource &src, size_t count, TxResult *r);
    ssize_t fill(SplicePipe &pipe, const TxSource &src, size_t count, TxResult *r);
    void advance(const TxSource &src, uint64_t n, TxResult *r);

    uint64_t off_ = 0;
};

}  // namespace ferry_tcp
