// Admission of served connections (server.cpp): how many are in the handshake (not yet
// authenticated) and how many are established, per peer address and in total, so that peers
// that do not follow the protocol cannot take every descriptor of the target. Shared by the
// listener and every reactor thread.
#pragma once

#include "options.hpp"

#include <mutex>
#include <string>
#include <unordered_map>

namespace ferry_tcp {

class ConnLimits {
public:
    explicit ConnLimits(const Config &cfg) : cfg_(cfg) {}

    // At accept: takes a handshake slot for `ip`, or returns false with the cap it hit.
    bool admit(const std::string &ip, std::string *why);
    // After authentication: moves `ip`'s handshake slot to an established one, or returns false
    // with the cap it hit (the handshake slot is then still held).
    bool promote(const std::string &ip, std::string *why);
    void release(const std::string &ip, bool established);

    // Refused connections held until the refusal (an ERROR) is sent: a small fixed number, so a
    // flood beyond the caps is closed at once instead of being answered.
    bool admit_refusal();
    void release_refusal();

    static constexpr unsigned kMaxRefusals = 32;

private:
    struct Count {
        unsigned handshakes = 0;
        unsigned established = 0;
    };
    const Config &cfg_;
    std::mutex mu_;
    std::unordered_map<std::string, Count> by_ip_;
    unsigned handshakes_ = 0;
    unsigned established_ = 0;
    unsigned refusals_ = 0;
};

}  // namespace ferry_tcp
