// Cutting a socket provider's connections to one peer (tcp, sockets: the provider's connection
// is a kernel TCP socket in this process). libfabric's tcp provider keeps the RMA it was given
// to a stopped peer queued on the connection even after fi_av_remove, and places it into (READ)
// or takes it from (WRITE) the caller's buffer whenever the peer resumes; shutting the socket
// down makes the provider fail and hand back everything it held for that peer at once, so a
// timed-out op can be reported only when the provider can no longer touch its buffer.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

namespace ferry_efa {

// shutdown(SHUT_RDWR) on every TCP socket of this process connected to `addr` (the peer's
// fi_getname bytes: a sockaddr_in or sockaddr_in6). Returns how many; 0 when `addr` is not an IP
// socket address (providers that are not socket based).
size_t cut_connections_to(const std::vector<uint8_t> &addr);

// Whether `addr` (a peer's claimed address) could be one of this provider's: for IP socket
// addresses (ours is one) the same family and a port; other formats are taken as they are.
bool same_address_family(const std::vector<uint8_t> &ours, const uint8_t *addr, size_t len);

}  // namespace ferry_efa
