// The listening socket: accepts connections, admits them against the caps of conn_limits.hpp
// and hands them to the reactors as ServerConns. Out of descriptors it sheds connections with
// a refusal (a spare descriptor is kept for that) and pauses accepting, backing off, instead
// of retrying at once.
#pragma once

#include "server.hpp"

namespace ferry_tcp {

class Listener final : public Handler {
public:
    Listener(ServerContext &ctx, std::vector<Reactor *> reactors);
    ~Listener() override;

    // Binds ip:cfg.port and listens. On success *bound is the address bound.
    int open(const std::string &ip_text, sockaddr_storage *bound, std::string *why);
    int start();  // on reactors[0]'s loop thread
    void stop();  // on reactors[0]'s loop thread

    void on_events(uint32_t events) override;
    bool on_timer(Clock::time_point now) override;  // resumes accepting; flushes ctx.peer_log

private:
    ServerContext &ctx_;
    std::vector<Reactor *> reactors_;
    int fd_ = -1;
    void pause(int e);
    void shed_one(int e);  // out of descriptors: take one connection off the backlog and refuse it
    void admit(int fd, const sockaddr_storage &peer);

    bool paused_ = false;  // accepting paused (out of descriptors) until resume_at_
    Clock::time_point resume_at_{};
    unsigned pause_ms_ = 0;  // doubles while accepting keeps failing, reset by a success
    int spare_fd_ = -1;      // a descriptor kept free to shed connections when out of them
    uint64_t shed_ = 0;
    unsigned next_ = 0;
};

}  // namespace ferry_tcp
