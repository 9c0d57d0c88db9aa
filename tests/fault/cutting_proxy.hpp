// A TCP relay on 127.0.0.1 that cuts the first connection it carries once `cut_after` bytes
// went from the client to the server: with a reset (SO_LINGER 0: both ends get RST, as when a
// middlebox or a crashing host drops the flow) or by closing both ends after a partial frame
// (both ends see EOF in the middle of a frame). Later connections are relayed untouched, so a
// transport that reconnects gets through. With `cut_from`, the first connection from that source
// address is the one cut (one rail of several, each leaving from its own address).
#pragma once

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <cstdint>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

namespace ferry_fault {

// A port nothing on 127.0.0.1 listens on right now, for a peer to bind behind a relay made first
// (the relay must know the port before the peer exists).
inline uint16_t free_port() {
    int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
    sockaddr_in a{};
    a.sin_family = AF_INET;
    inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
    bind(s, reinterpret_cast<sockaddr *>(&a), sizeof a);
    socklen_t len = sizeof a;
    getsockname(s, reinterpret_cast<sockaddr *>(&a), &len);
    close(s);
    return ntohs(a.sin_port);
}

class CuttingProxy {
public:
    enum class Cut { Reset, Truncate };

    CuttingProxy(uint16_t target_port, uint64_t cut_after, Cut how, std::string cut_from = {})
        : target_port_(target_port), cut_after_(cut_after), how_(how), cut_from_(std::move(cut_from)) {
        listener_ = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in a{};
        a.sin_family = AF_INET;
        inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
        bind(listener_, reinterpret_cast<sockaddr *>(&a), sizeof a);
        listen(listener_, 64);
        socklen_t len = sizeof a;
        getsockname(listener_, reinterpret_cast<sockaddr *>(&a), &len);
        port_ = ntohs(a.sin_port);
        stop_ = eventfd(0, EFD_CLOEXEC);
        thread_ = std::thread([this] { accept_loop(); });
    }
    ~CuttingProxy() {
        uint64_t one = 1;
        [[maybe_unused]] ssize_t n = write(stop_, &one, sizeof one);
        thread_.join();
        for (auto &t : relays_) t.join();
        close(listener_);
        close(stop_);
    }
    uint16_t port() const { return port_; }
    bool cut_done() const { return cut_done_.load(); }
    int connections() const { return connections_.load(); }

private:
    void accept_loop() {
        for (;;) {
            pollfd p[2] = {{listener_, POLLIN, 0}, {stop_, POLLIN, 0}};
            if (poll(p, 2, -1) < 0) continue;
            if (p[1].revents) return;
            sockaddr_in from{};
            socklen_t from_len = sizeof from;
            int c = accept4(listener_, reinterpret_cast<sockaddr *>(&from), &from_len, SOCK_CLOEXEC);
            if (c < 0) continue;
            char source[INET_ADDRSTRLEN] = "";
            inet_ntop(AF_INET, &from.sin_addr, source, sizeof source);
            int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
            sockaddr_in a{};
            a.sin_family = AF_INET;
            a.sin_port = htons(target_port_);
            inet_pton(AF_INET, "127.0.0.1", &a.sin_addr);
            if (connect(s, reinterpret_cast<sockaddr *>(&a), sizeof a) != 0) {
                close(c);
                close(s);
                continue;
            }
            connections_.fetch_add(1);
            bool cut_this = !cut_chosen_ && (cut_from_.empty() || cut_from_ == source);
            cut_chosen_ = cut_chosen_ || cut_this;
            relays_.emplace_back([this, c, s, cut_this] { relay(c, s, cut_this); });
        }
    }

    void relay(int client, int server, bool cut_this) {
        uint64_t forwarded = 0;
        std::vector<uint8_t> buf(256 << 10);
        bool open[2] = {true, true};
        while (open[0] || open[1]) {
            pollfd p[3] = {{client, static_cast<short>(open[0] ? POLLIN : 0), 0},
                           {server, static_cast<short>(open[1] ? POLLIN : 0), 0},
                           {stop_, POLLIN, 0}};
            if (poll(p, 3, -1) < 0) continue;
            if (p[2].revents) break;
            for (int side = 0; side < 2; ++side) {
                if (!(p[side].revents & (POLLIN | POLLHUP | POLLERR))) continue;
                int from = side == 0 ? client : server, to = side == 0 ? server : client;
                size_t want = buf.size();
                if (cut_this && side == 0) want = std::min<uint64_t>(want, cut_after_ - forwarded);
                ssize_t n = want == 0 ? 0 : recv(from, buf.data(), want, 0);
                if (n <= 0) {
                    if (want == 0) return cut(client, server);
                    shutdown(to, SHUT_WR);
                    open[side] = false;
                    continue;
                }
                if (!send_all(to, buf.data(), static_cast<size_t>(n))) return finish(client, server);
                if (side == 0) forwarded += static_cast<uint64_t>(n);
                if (cut_this && side == 0 && forwarded >= cut_after_) return cut(client, server);
            }
        }
        finish(client, server);
    }

    void cut(int client, int server) {
        if (how_ == Cut::Reset) {
            linger l{1, 0};
            setsockopt(client, SOL_SOCKET, SO_LINGER, &l, sizeof l);
            setsockopt(server, SOL_SOCKET, SO_LINGER, &l, sizeof l);
        }
        cut_done_ = true;
        finish(client, server);
    }
    static void finish(int client, int server) {
        close(client);
        close(server);
    }
    static bool send_all(int fd, const uint8_t *p, size_t n) {
        while (n > 0) {
            ssize_t k = send(fd, p, n, MSG_NOSIGNAL);
            if (k <= 0) return false;
            p += k;
            n -= static_cast<size_t>(k);
        }
        return true;
    }

    uint16_t target_port_;
    uint64_t cut_after_;
    Cut how_;
    std::string cut_from_;
    bool cut_chosen_ = false;  // accept_loop's: the connection to cut has been picked
    int listener_ = -1;
    int stop_ = -1;
    uint16_t port_ = 0;
    std::atomic<bool> cut_done_{false};
    std::atomic<int> connections_{0};
    std::thread thread_;
    std::vector<std::thread> relays_;
};

}  // namespace ferry_fault
