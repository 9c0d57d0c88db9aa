// Socket set-up shared by client lanes, served connections and the listener.
#pragma once

#include "options.hpp"

#include <string>

namespace ferry_tcp {

// TCP_NODELAY (requests, ACKs and headers must not wait for Nagle; bulk data is already
// gathered into large sendmsg calls) and the configured SO_SNDBUF / SO_RCVBUF.
// Returns 0 or -errno with *why set.
int tune_socket(int fd, const Config &cfg, std::string *why);

// The socket's pending error (SO_ERROR), 0 if none.
int socket_error(int fd);

// Receive low-water mark while a bulk payload is expected: epoll then wakes the receiver once
// per `kBulkLowat` bytes instead of once per loopback segment (64 KiB), which halves the
// wake-ups of a reactor streaming a payload into memory. `current` caches the value set.
inline constexpr int kBulkLowat = 256 * 1024;
void set_rcvlowat(int fd, int *current, int want);

}  // namespace ferry_tcp
