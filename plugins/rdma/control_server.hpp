// rdma.so's control server: accepts other instances' TCP control connections, authenticates
// each (control.hpp) before anything else is read from it, and hands authenticated requests to
// the transport. Built to survive peers that do not follow the protocol: a connection must finish
// its handshake within a deadline, caps bound connections in all and unauthenticated ones per
// address (a refused peer is told why), input is framed without blocking so one slow peer never
// stalls the others, running out of descriptors pauses accepting instead of spinning, and
// refusals are logged at most once per interval.
#pragma once

#include "control.hpp"
#include "options.hpp"
#include "plugin_util.hpp"
#include "rate_limited_log.hpp"

#include <atomic>
#include <chrono>
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <thread>
#include <utility>
#include <vector>

namespace ferry_rdma {

// What the transport keeps for one authenticated initiator (its queue pairs); destroyed when the
// connection closes.
struct ServedSession {
    virtual ~ServedSession() = default;
};

struct ServedConn {
    explicit ServedConn(const std::string *key) : auth(key) {}
    int fd = -1;
    std::string address;                             // "ip:port" of the peer, for messages
    uint32_t ip = 0;                                 // network order
    AuthServer auth;                                 // nothing else is served before it is done
    std::chrono::steady_clock::time_point deadline;  // of the handshake
    std::vector<uint8_t> in;                         // bytes of the message being received
    std::unique_ptr<ServedSession> session;
};

class ControlServer {
public:
    // Handles one request of an authenticated connection (and sends its reply); false closes it.
    using Handler = std::function<bool(ServedConn &, const CtrlHeader &, const std::vector<uint8_t> &)>;

    // Takes the listening socket (non-blocking); `key` must outlive the server.
    ControlServer(int listen_fd, const std::string *key, const ControlLimits &limits, const Logger &log,
                  Handler handler);
    ~ControlServer();  // stops and closes every connection
    ControlServer(const ControlServer &) = delete;
    ControlServer &operator=(const ControlServer &) = delete;

    int start(std::string *why);  // the serving thread
    void stop();                  // joins it and closes every connection (sessions destroyed here)
    size_t connections() const { return open_.load(); }

private:
    void loop();
    void accept_ready();
    void refuse(int fd, const std::string &address, const std::string &why);
    // false: close the connection.
    bool read_ready(ServedConn &c);
    bool on_message(ServedConn &c, const CtrlHeader &h, const std::vector<uint8_t> &body);
    void close_conn(size_t i);
    unsigned unauthenticated_from(uint32_t ip) const;

    const int listen_fd_;
    const std::string *key_;
    const ControlLimits limits_;
    const Logger &log_;
    const Handler handler_;
    int wake_fd_ = -1;
    std::atomic<bool> stop_{false};
    std::atomic<size_t> open_{0};
    std::thread thread_;
    std::vector<std::unique_ptr<ServedConn>> conns_;  // serving thread only (and stop(), after join)
    std::chrono::steady_clock::time_point accept_paused_until_{};
    // Refused connections kept a moment so the peer reads why (control_server.cpp).
    std::vector<std::pair<int, std::chrono::steady_clock::time_point>> lingering_;
    ferry_plugin::RateLimitedLog refusals_, out_of_fds_;
};

}  // namespace ferry_rdma
