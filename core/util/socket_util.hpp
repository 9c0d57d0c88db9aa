// Blocking-with-deadline socket helpers for the control plane (handshake, metadata). The data
// plane lives in the transport plugins.
#pragma once

#include <chrono>
#include <cstdint>
#include <span>
#include <string>

#include "ferry/result.hpp"
#include "util/fd.hpp"

namespace ferry {

using Clock = std::chrono::steady_clock;

struct HostPort {
    std::string host;
    uint16_t port = 0;
};

// "127.0.0.1:7000" or "[::1]:7000".
Result<HostPort> parse_host_port(std::string_view text);

Result<Fd> listen_tcp(const std::string &ip, uint16_t port, int backlog = 128);
uint16_t bound_port(int fd);
Result<Fd> connect_tcp(const HostPort &to, Clock::time_point deadline);

// Whole-buffer I/O that gives up at the deadline (-ETIMEDOUT) or on EOF (-ECONNRESET).
Result<void> write_all(int fd, std::span<const uint8_t> data, Clock::time_point deadline);
Result<void> read_all(int fd, std::span<uint8_t> data, Clock::time_point deadline);

}  // namespace ferry
