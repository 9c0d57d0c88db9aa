// Hand-driven TCP clients for the fault tests, and the listening ports of this process (to
// find the port a transport plugin bound). Every wait has a hang guard.
#pragma once

#include <arpa/inet.h>
#include <dirent.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <set>
#include <sstream>
#include <string>
#include <vector>

namespace ferry_fault {

class RawTcp {
public:
    explicit RawTcp(uint16_t port) {
        fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        a.sin_port = htons(port);
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        connected_ = ::connect(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a) == 0;
    }
    ~RawTcp() {
        if (fd_ >= 0) close(fd_);
    }
    bool connected() const { return connected_; }
    bool send_bytes(const void *p, size_t n) {
        auto *b = static_cast<const uint8_t *>(p);
        while (n > 0) {
            ssize_t k = send(fd_, b, n, MSG_NOSIGNAL);
            if (k <= 0) return false;
            b += k;
            n -= static_cast<size_t>(k);
        }
        return true;
    }
    bool send_bytes(const std::vector<uint8_t> &v) { return send_bytes(v.data(), v.size()); }
    // Reads until the other side closes; false if it is still open after `guard_ms`. What it
    // sent before closing (an error frame, say) is kept in received().
    bool closed_by_peer(int guard_ms = 10000) {
        char b[4096];
        for (;;) {
            pollfd pf{fd_, POLLIN, 0};
            if (poll(&pf, 1, guard_ms) <= 0) return false;
            ssize_t n = recv(fd_, b, sizeof b, 0);
            if (n <= 0) return true;
            received_.append(b, static_cast<size_t>(n));
        }
    }
    const std::string &received() const { return received_; }
    // Sends FIN: the other side sees the end of the stream (mid-frame, when the frame was cut).
    void finish() { shutdown(fd_, SHUT_WR); }
    // Closes with RST instead of FIN.
    void reset() {
        linger l{1, 0};
        setsockopt(fd_, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        close(fd_);
        fd_ = -1;
    }

private:
    int fd_ = -1;
    bool connected_ = false;
    std::string received_;
};

// A listening TCP socket on 127.0.0.1 that never accepts: the kernel completes connections into
// its backlog and nobody answers.
class SilentListener {
public:
    SilentListener() {
        fd_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        bind(fd_, reinterpret_cast<sockaddr *>(&a), sizeof a);
        listen(fd_, 16);
        socklen_t len = sizeof a;
        getsockname(fd_, reinterpret_cast<sockaddr *>(&a), &len);
        port_ = ntohs(a.sin_port);
    }
    ~SilentListener() { close(fd_); }
    uint16_t port() const { return port_; }

private:
    int fd_ = -1;
    uint16_t port_ = 0;
};

// Ports this process listens on over IPv4 (from /proc/net/tcp, matched to our socket inodes).
inline std::set<uint16_t> listening_ports() {
    std::set<std::string> inodes;
    if (DIR *d = opendir("/proc/self/fd")) {
        while (dirent *e = readdir(d)) {
            char target[256];
            std::string link = std::string("/proc/self/fd/") + e->d_name;
            ssize_t n = readlink(link.c_str(), target, sizeof target - 1);
            if (n <= 0) continue;
            target[n] = '\0';
            std::string t(target);
            if (t.rfind("socket:[", 0) == 0) inodes.insert(t.substr(8, t.size() - 9));
        }
        closedir(d);
    }
    std::set<uint16_t> ports;
    std::ifstream in("/proc/self/net/tcp");
    std::string line;
    std::getline(in, line);  // header
    while (std::getline(in, line)) {
        std::istringstream s(line);
        std::string sl, local, remote, state, queues, timer, retr, uid, timeout, inode;
        s >> sl >> local >> remote >> state >> queues >> timer >> retr >> uid >> timeout >> inode;
        if (state != "0A" || !inodes.count(inode)) continue;  // 0A: LISTEN
        ports.insert(static_cast<uint16_t>(std::strtoul(local.substr(local.find(':') + 1).c_str(), nullptr, 16)));
    }
    return ports;
}

inline std::vector<uint8_t> junk(size_t n, uint32_t seed) {
    std::vector<uint8_t> v(n);
    for (auto &b : v) {
        seed = seed * 1103515245u + 12345u;
        b = static_cast<uint8_t>(seed >> 16);
    }
    return v;
}

}  // namespace ferry_fault
