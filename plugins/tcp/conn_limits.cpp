#include "conn_limits.hpp"

#include "plugin_util.hpp"

namespace ferry_tcp {

bool ConnLimits::admit(const std::string &ip, std::string *why) {
    std::lock_guard lk(mu_);
    if (handshakes_ >= cfg_.max_handshakes) {
        *why = strprintf(
            "this engine has %u connections in the handshake (max_handshakes=%u); "
            "try again, or raise tcp.max_handshakes on this engine",
            handshakes_, cfg_.max_handshakes);
        return false;
    }
    Count &c = by_ip_[ip];
    if (c.handshakes >= cfg_.max_handshakes_per_ip) {
        *why = strprintf(
            "%s has %u connections in the handshake with this engine "
            "(max_handshakes_per_ip=%u); try again, or raise "
            "tcp.max_handshakes_per_ip on this engine",
            ip.c_str(), c.handshakes, cfg_.max_handshakes_per_ip);
        return false;
    }
    ++c.handshakes;
    ++handshakes_;
    return true;
}

bool ConnLimits::promote(const std::string &ip, std::string *why) {
    std::lock_guard lk(mu_);
    Count &c = by_ip_[ip];
    if (established_ >= cfg_.max_connections) {
        *why = strprintf(
            "this engine has %u connections (max_connections=%u); raise "
            "tcp.max_connections on this engine, or use fewer lanes or peers",
            established_, cfg_.max_connections);
        return false;
    }
    if (c.established >= cfg_.max_connections_per_ip) {
        *why = strprintf(
            "%s has %u connections to this engine (max_connections_per_ip=%u); "
            "raise tcp.max_connections_per_ip on this engine, or use fewer lanes "
            "or peers on that host",
            ip.c_str(), c.established, cfg_.max_connections_per_ip);
        return false;
    }
    --c.handshakes;
    --handshakes_;
    ++c.established;
    ++established_;
    return true;
}

void ConnLimits::release(const std::string &ip, bool established) {
    std::lock_guard lk(mu_);
    auto it = by_ip_.find(ip);
    if (it == by_ip_.end()) return;
    if (established) {
        --it->second.established;
        --established_;
    } else {
        --it->second.handshakes;
        --handshakes_;
    }
    if (it->second.handshakes == 0 && it->second.established == 0) by_ip_.erase(it);
}

bool ConnLimits::admit_refusal() {
    std::lock_guard lk(mu_);
    if (refusals_ >= kMaxRefusals) return false;
    ++refusals_;
    return true;
}

void ConnLimits::release_refusal() {
    std::lock_guard lk(mu_);
    --refusals_;
}

}  // namespace ferry_tcp
