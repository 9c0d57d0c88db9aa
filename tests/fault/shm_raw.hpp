// A hand-driven initiator of shm.so for the fault tests: a raw connection to an instance's
// abstract socket, and the records of plugins/shm/wire.hpp. Every wait has a hang guard.
#pragma once

#include "wire.hpp"  // plugins/shm/wire.hpp

#include <ferry/plugin.h>

#include <poll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>
#include <vector>

namespace ferry_fault {

class RawShm {
public:
    explicit RawShm(const std::vector<uint8_t> &endpoint) {
        ferry_shm::EndpointBytes ep;
        memcpy(&ep, endpoint.data(), sizeof ep);
        std::string name = ferry_shm::socket_name(ep.pid, ep.token);
        fd_ = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_un sa{};
        sa.sun_family = AF_UNIX;
        memcpy(sa.sun_path, name.data(), name.size());
        connected_ = connect(fd_, reinterpret_cast<sockaddr *>(&sa),
                             static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())) == 0;
        token_ = ep.token;
    }
    // Takes over a connected socket (one handed over from another process, say).
    explicit RawShm(int connected_fd) : fd_(connected_fd), connected_(connected_fd >= 0) {}
    ~RawShm() {
        if (fd_ >= 0) close(fd_);
    }
    RawShm(const RawShm &) = delete;
    RawShm &operator=(const RawShm &) = delete;
    int fd() const { return fd_; }
    bool connected() const { return connected_; }
    uint64_t token() const { return token_; }
    bool send_bytes(const void *p, size_t n) { return send(fd_, p, n, MSG_NOSIGNAL) == static_cast<ssize_t>(n); }
    // False when the serving side closed first (10 s hang guard).
    bool recv_exact(void *out, size_t len) {
        size_t got = 0;
        auto *p = static_cast<uint8_t *>(out);
        while (got < len) {
            pollfd pf{fd_, POLLIN, 0};
            if (poll(&pf, 1, 10000) <= 0) return false;
            ssize_t n = recv(fd_, p + got, len - got, 0);
            if (n <= 0) return false;
            got += static_cast<size_t>(n);
        }
        return true;
    }
    bool ack(ferry_shm::HelloAck *out) { return recv_exact(out, sizeof *out); }
    // True once the serving side closed the connection (10 s hang guard).
    bool closed_by_peer(int guard_ms = 10000) {
        char b[256];
        for (;;) {
            pollfd pf{fd_, POLLIN, 0};
            if (poll(&pf, 1, guard_ms) <= 0) return false;
            ssize_t n = recv(fd_, b, sizeof b, 0);
            if (n <= 0) return true;
        }
    }

private:
    int fd_ = -1;
    bool connected_ = false;
    uint64_t token_ = 0;
};

inline ferry_shm::Hello hello_for(uint64_t token, uint64_t probe_addr, uint64_t probe_token) {
    ferry_shm::Hello h{};
    h.magic = ferry_shm::kHelloMagic;
    h.version = ferry_shm::kWireVersion;
    h.target_token = token;
    h.probe_addr = probe_addr;
    h.probe_token = probe_token;
    h.pid = static_cast<uint32_t>(getpid());
    h.uid = getuid();
    return h;
}

// A handshake with a probe in this process. False when the serving side refused it or closed.
inline bool handshake(RawShm &raw) {
    static uint64_t probe[2];
    probe[0] = probe[1] = 0x5eed0000u + static_cast<uint64_t>(getpid());
    auto h = hello_for(raw.token(), reinterpret_cast<uint64_t>(probe), probe[0]);
    ferry_shm::HelloAck ack{};
    return raw.send_bytes(&h, sizeof h) && raw.ack(&ack) && ack.status == 0;
}

// Sends one request and reads its answer (and the message). False when the serving side closed.
inline bool request(RawShm &raw, const ferry_shm::Request &r, ferry_shm::Done *done, std::string *message) {
    if (!raw.send_bytes(&r, sizeof r) || !raw.recv_exact(done, sizeof *done)) return false;
    message->assign(done->message_len, '\0');
    return raw.recv_exact(message->data(), message->size());
}

}  // namespace ferry_fault
