// The engine's control server: one thread, one listening TCP socket (local_ip:rpc_port),
// persistent connections from peer engines. It authenticates each connection
// (control_protocol.hpp) before serving anything, then answers descriptor requests with the
// last published descriptor and queues notifications until the engine takes them.
// Against peers that do not follow the protocol: a handshake deadline, an idle deadline, caps
// on connections per peer address and in all (refused with a reason the client shows), a
// reserved descriptor to refuse with when the process is out of them (no busy accept loop),
// and per-connection warnings rate-limited to a line and a count per interval.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/engine.hpp"
#include "util/fd.hpp"
#include "util/log.hpp"
#include "util/socket_util.hpp"

namespace ferry {

struct ControlServerOptions {
    std::string local_ip = "127.0.0.1";
    uint16_t port = 0;                                  // 0: any free port
    std::string secret;                                 // empty: no authentication
    std::chrono::milliseconds handshake_timeout{5000};  // a connection must authenticate within it
    std::chrono::milliseconds idle_timeout{120000};     // an authenticated one that sends nothing is closed
    size_t max_connections = 1024;                      // open at once, in all
    size_t max_connections_per_peer = 128;              // open at once from one peer IP address
    std::chrono::milliseconds log_interval{10000};      // repeated warnings: a line, then a count per interval
    size_t queue_max = 65536;                           // notifications waiting to be taken
    size_t queue_max_bytes = 256u << 20;                // their bytes
};

class ControlServer {
public:
    static Result<std::unique_ptr<ControlServer>> start(ControlServerOptions options);
    ~ControlServer();
    ControlServer(const ControlServer &) = delete;
    ControlServer &operator=(const ControlServer &) = delete;

    // "ip:port" ("[v6]:port") peers connect to.
    const std::string &address() const { return address_; }

    // Descriptor served to GET_DESCRIPTOR requests from now on.
    void publish(std::vector<uint8_t> descriptor);
    // From now on GET_DESCRIPTOR is answered with what `source` returns at that moment (called
    // on the server thread, without the server's lock held).
    void serve_descriptor(std::function<std::shared_ptr<const std::vector<uint8_t>>()> source);
    // Drains the notifications received so far, oldest first.
    std::vector<Notification> take_notifications();
    // As take_notifications, but first waits until at least one is queued or `deadline`
    // passes (then returns none); -ECANCELED when the server is destroyed meanwhile.
    Result<std::vector<Notification>> wait_notifications(Clock::time_point deadline);
    // An eventfd that is readable exactly while notifications are queued (level-triggered;
    // every arrival also writes to it, so edge-triggered epoll sees each one). Drained by
    // take/wait_notifications; callers only poll it.
    int notification_fd() const { return queued_fd_.get(); }

    struct Connection;

private:
    struct CountedWarning {
        log::Limiter limiter;
        const char *what;  // names the events in the periodic count
    };

    ControlServer(ControlServerOptions options, Fd listener, std::string address);
    void serve();
    void accept_all(Clock::time_point now);
    bool out_of_descriptors(int err, Clock::time_point now);  // true: one peer was refused
    // Tells a just-accepted peer why it is turned away, then closes it.
    void turn_away(Fd fd, const std::string &peer, uint16_t code, const std::string &why, Clock::time_point now);
    void warn(CountedWarning &w, const std::string &message, Clock::time_point now);
    void flush_counts(Clock::time_point now);
    void close_connection(size_t index);
    std::vector<Notification> take_locked();  // under mutex_
    void set_deadline(Connection &c, Clock::time_point now, bool progress);
    bool on_readable(Connection &c, Clock::time_point now);  // false: close it
    bool on_writable(Connection &c, Clock::time_point now);
    bool handle_frame(Connection &c, uint16_t code, std::vector<uint8_t> payload, Clock::time_point now);
    void refuse(Connection &c, int code, const std::string &why, Clock::time_point now);
    void reply(Connection &c, uint16_t status, std::span<const uint8_t> payload);

    ControlServerOptions options_;
    Fd listener_;
    Fd stop_;
    std::string address_;
    // Server thread only:
    std::vector<std::unique_ptr<Connection>> connections_;
    std::map<std::string, size_t> per_peer_;  // open connections by peer IP address
    Fd spare_;                                // given up to refuse a peer when out of descriptors
    Clock::time_point listen_paused_until_{};
    CountedWarning bad_log_, refused_log_, accept_log_;

    std::mutex mutex_;  // guards everything below
    std::vector<uint8_t> descriptor_;
    std::function<std::shared_ptr<const std::vector<uint8_t>>()> descriptor_source_;
    std::deque<Notification> queue_;
    size_t queue_bytes_ = 0;
    bool full_logged_ = false;
    std::condition_variable queued_cv_;  // signalled when a notification is queued or on closing
    size_t waiters_ = 0;                 // threads in wait_notifications
    bool closing_ = false;
    Fd queued_fd_;  // counter > 0 exactly while queue_ is not empty

    std::thread thread_;
};

}  // namespace ferry
