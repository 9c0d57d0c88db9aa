// A client connection to another engine's control server (control_protocol.hpp), authenticated
// both ways when this engine has a cluster secret. Blocking calls bounded by a deadline; one
// caller at a time.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "ferry/result.hpp"
#include "util/fd.hpp"
#include "util/socket_util.hpp"

namespace ferry {

class ControlClient {
public:
    // Connects to `address` ("ip:port") and runs the handshake. `self_name` is this engine's
    // segment name (what the peer reports as the sender of notifications); `label` names the
    // peer in messages.
    static Result<ControlClient> connect(const std::string &address, const std::string &label,
                                         const std::string &self_name, const std::string &secret,
                                         Clock::time_point deadline);
    // The handshake alone, on a connected stream socket (connect() runs it after connecting;
    // the control_client fuzz target runs it on a socketpair holding a hostile server's bytes).
    static Result<ControlClient> handshake(Fd fd, const std::string &address, const std::string &label,
                                           const std::string &self_name, const std::string &secret,
                                           Clock::time_point deadline);

    // One request, one reply. A refusal (non-zero status) comes back as that errno and the
    // peer's message; the connection stays usable after a refusal but not after an I/O error.
    Result<std::vector<uint8_t>> call(uint16_t type, std::span<const uint8_t> payload, Clock::time_point deadline);

    const std::string &address() const { return address_; }
    // True when the peer closed or reset this (idle) connection: reconnect before using it.
    bool broken() const;

private:
    ControlClient(Fd fd, std::string address, std::string label)
        : fd_(std::move(fd)), address_(std::move(address)), label_(std::move(label)) {}
    // Reads one reply frame; status != 0 is returned as the error.
    Result<std::vector<uint8_t>> read_reply(Clock::time_point deadline, const char *during);

    Fd fd_;
    std::string address_;
    std::string label_;
    bool failed_ = false;
};

}  // namespace ferry
