// Shared by the control_server fuzz targets (with and without a cluster secret): one control
// server for the whole run, and each input sent on a fresh connection to it, half-closed,
// the reply read until the server closes, then closed abortively.
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <memory>
#include <string>

#include "control/control_server.hpp"
#include "fuzz_check.hpp"
#include "util/log.hpp"

namespace control_fuzz {

inline const std::string kMarker = "FUZZ-DESCRIPTOR-MARKER-7f3a9c";

struct Server {
    std::unique_ptr<ferry::ControlServer> server;
    uint16_t port = 0;
};

inline Server start(const std::string &secret) {
    ferry::log::set_level(ferry::log::Level::Error);
    ferry::ControlServerOptions o;
    o.secret = secret;
    o.handshake_timeout = std::chrono::milliseconds(2000);
    // Inputs come one after another from one address; the server may not have seen the last
    // connection's reset yet when the next arrives.
    o.max_connections_per_peer = o.max_connections;
    auto s = ferry::ControlServer::start(o);
    FUZZ_CHECK(s.has_value(), "control server start");
    Server out;
    out.server = std::move(*s);
    out.server->publish(std::vector<uint8_t>(kMarker.begin(), kMarker.end()));
    const auto &a = out.server->address();
    out.port = static_cast<uint16_t>(std::stoul(a.substr(a.rfind(':') + 1)));
    return out;
}

// Sends the input, half-closes, returns everything the server sent before it closed.
inline std::string exchange(uint16_t port, const uint8_t *data, size_t size) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    FUZZ_CHECK(fd >= 0, "socket");
    sockaddr_in a{};
    a.sin_family = AF_INET;
    a.sin_port = htons(port);
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    // libFuzzer's timeout alarm (SIGALRM) interrupts blocking calls: EINTR is retried below.
    if (connect(fd, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
        int e = errno;
        if (e == EINTR) {  // the connection goes on in the background: wait for it
            pollfd p{fd, POLLOUT, 0};
            while (poll(&p, 1, 5000) < 0 && errno == EINTR) {}
            socklen_t len = sizeof e;
            getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &len);
        }
        if (e != 0) {
            fprintf(stderr, "connect to the control server: %s\n", strerror(e));
            FUZZ_CHECK(false, "connect to the control server");
        }
    }
    for (size_t done = 0; done < size;) {
        ssize_t n = send(fd, data + done, size - done, MSG_NOSIGNAL);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;  // the server may close before reading everything
        done += static_cast<size_t>(n);
    }
    shutdown(fd, SHUT_WR);
    std::string reply;
    char buf[4096];
    for (;;) {
        pollfd p{fd, POLLIN, 0};
        int r = poll(&p, 1, 5000);
        if (r < 0 && errno == EINTR) continue;
        FUZZ_CHECK(r > 0, "the server kept a half-closed connection open for 5 s");
        ssize_t n = recv(fd, buf, sizeof buf, 0);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        reply.append(buf, static_cast<size_t>(n));
    }
    // Abortive close: the server closed first, so an orderly one would leave a TIME_WAIT per
    // input, and after some 55,000 inputs connect() ran out of ports (EADDRNOTAVAIL).
    linger no_wait{1, 0};
    setsockopt(fd, SOL_SOCKET, SO_LINGER, &no_wait, sizeof no_wait);
    close(fd);
    return reply;
}

}  // namespace control_fuzz
