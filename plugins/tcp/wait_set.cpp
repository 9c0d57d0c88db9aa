#include "wait_set.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <cerrno>
#include <mutex>
#include <system_error>

namespace ferry_tcp {

WaitSet::WaitSet(int cq_fd) {
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1 (completion fd)");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;  // the completion queue's eventfd
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, cq_fd, &ev) != 0) {
        int e = errno;
        close(epfd_);
        throw std::system_error(e, std::generic_category(), "epoll_ctl (completion fd)");
    }
}

WaitSet::~WaitSet() {
    if (epfd_ >= 0) close(epfd_);
}

int WaitSet::add(int fd, Lane *lane) {
    epoll_event ev{};
    ev.events = EPOLLIN;  // level-triggered: bytes left unread keep the host's poll() awake
    ev.data.ptr = lane;
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) != 0) return -errno;
    members_.fetch_add(1, std::memory_order_relaxed);
    return 0;
}

void WaitSet::remove(int fd) {
    if (epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr) == 0) members_.fetch_sub(1, std::memory_order_relaxed);
}

void WaitSet::barrier() { std::unique_lock lk(mu_); }

int WaitSet::collect(Lane **out, int max) {
    epoll_event evs[16];
    int n = epoll_wait(epfd_, evs, max < 16 ? max : 16, 0);
    int k = 0;
    for (int i = 0; i < n; ++i)
        if (evs[i].data.ptr != nullptr) out[k++] = static_cast<Lane *>(evs[i].data.ptr);
    return k;
}

}  // namespace ferry_tcp
