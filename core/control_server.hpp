// The engine's control server: one thread, one listening TCP socket (local_ip:rpc_port),
// persistent connections from peer engines. It authenticates each connection
// (control_protocol.hpp) before serving anything, then answers descriptor requests with the
// last published descriptor and queues notifications until the engine takes them.
#pragma once

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "fd.hpp"
#include "ferry/engine.hpp"

namespace ferry {

struct ControlServerOptions {
    std::string local_ip = "127.0.0.1";
    uint16_t port = 0;                          // 0: any free port
    std::string secret;                         // empty: no authentication
    std::chrono::milliseconds handshake_timeout{5000}; // a connection must authenticate within it
    size_t queue_max = 65536;                   // notifications waiting to be taken
    size_t queue_max_bytes = 256u << 20;        // their bytes
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
    // Drains the notifications received so far, oldest first.
    std::vector<Notification> take_notifications();

    struct Connection;

private:
    ControlServer(ControlServerOptions options, Fd listener, std::string address);
    void serve();
    void accept_all();
    bool on_readable(Connection &c);  // false: close it
    bool on_writable(Connection &c);
    bool handle_frame(Connection &c, uint16_t code, std::vector<uint8_t> payload);
    void refuse(Connection &c, int code, const std::string &why);
    void reply(Connection &c, uint16_t status, std::span<const uint8_t> payload);

    ControlServerOptions options_;
    Fd listener_;
    Fd stop_;
    std::string address_;
    std::vector<std::unique_ptr<Connection>> connections_; // server thread only

    std::mutex mutex_; // guards everything below
    std::vector<uint8_t> descriptor_;
    std::deque<Notification> queue_;
    size_t queue_bytes_ = 0;
    bool full_logged_ = false;

    std::thread thread_;
};

} // namespace ferry
