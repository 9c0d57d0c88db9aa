// Zero-copy sending of payloads (option zerocopy=1; off by default, see options.hpp): the
// payload pages are vmsplice'd into a pipe owned by the lane and spliced from there into the
// socket, so the kernel references the registered source pages instead of copying them into
// socket buffers. On loopback the receiving side then copies straight from the source pages:
// one copy per byte instead of two.
//
// Safety: a WRITE completes only once the peer acknowledged the bytes as placed in its memory,
// after it has read them from the socket; by then no reference to the source pages remains.
// When a connection fails, the lane drops its pipe (releasing its references) and closes the
// socket; but a peer on this host that is still alive (stalled, or merely disconnected from)
// may read bytes it had already queued, from the source pages, later. With zerocopy=0 (the
// default) payloads are copied at send time instead.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <cstdint>

namespace ferry_tcp {

class SplicePipe {
public:
    SplicePipe() = default;
    ~SplicePipe() { reset(); }
    SplicePipe(const SplicePipe &) = delete;
    SplicePipe &operator=(const SplicePipe &) = delete;

    // Creates the pipe (1 MiB when the system allows it). False when no pipe can be made;
    // the lane then sends with sendmsg.
    bool open();
    bool is_open() const { return rd_ >= 0; }
    size_t pending() const { return pending_; }  // bytes in the pipe, not yet in the socket

    // Moves up to len bytes of [p, p+len) into the pipe by reference. Returns the bytes moved,
    // or -errno (-EFAULT for memory the kernel cannot reference: the caller falls back to a
    // copy; -EAGAIN when the pipe is full).
    ssize_t push(const uint8_t *p, size_t len);
    // Copies up to len bytes into the pipe (headers, small payloads, memory vmsplice refuses).
    ssize_t copy_in(const uint8_t *p, size_t len);
    // Splices pending bytes into the socket. Returns bytes moved or -errno (-EAGAIN: socket
    // full).
    ssize_t drain(int sock);
    void reset();  // closes the pipe, dropping every page reference it holds

private:
    int rd_ = -1;
    int wr_ = -1;
    size_t pending_ = 0;
};

}  // namespace ferry_tcp
