// The completion fd tcp.so gives its host: an epoll set holding the completion queue's eventfd
// and the sockets of lanes in waiter mode (lane.hpp). A host sleeping on it wakes when
// completions are queued or when responses arrive on such a lane; its poll() then parses those
// responses itself (Transport::poll), so a reply reaches the waiting thread without a detour
// through a reactor thread and the eventfd (one wake-up instead of two).
#pragma once

#include <atomic>
#include <shared_mutex>

namespace ferry_tcp {

class Lane;

class WaitSet {
public:
    explicit WaitSet(int cq_fd);  // throws std::system_error
    ~WaitSet();
    WaitSet(const WaitSet &) = delete;
    WaitSet &operator=(const WaitSet &) = delete;

    int fd() const { return epfd_; }
    // A lane's socket joins (level-triggered EPOLLIN) or leaves; 0 or -errno.
    int add(int fd, Lane *lane);
    void remove(int fd);
    // Returns once no ready() that may have seen a lane removed before this call still runs:
    // after it, such a lane may be freed.
    void barrier();
    bool active() const { return members_.load(std::memory_order_relaxed) > 0; }

    // Calls fn(Lane *) for each member whose socket is readable now; never blocks.
    template <class F>
    void ready(F &&fn) {
        std::shared_lock lk(mu_);
        Lane *lanes[16];
        int n = collect(lanes, 16);
        for (int i = 0; i < n; ++i) fn(lanes[i]);
    }

private:
    int collect(Lane **out, int max);

    int epfd_ = -1;
    std::shared_mutex mu_;
    std::atomic<int> members_{0};
};

}  // namespace ferry_tcp
