#include "reactor.hpp"

#include "plugin_util.hpp"

#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <unistd.h>

#include <pthread.h>

#include <algorithm>
#include <cerrno>
#include <csignal>
#include <cstring>
#include <future>
#include <system_error>

namespace ferry_tcp {

Reactor::Reactor(const Logger &log, CompletionQueue &cq, unsigned tick_ms, unsigned index)
    : log_(log), cq_(cq), tick_ms_(tick_ms ? tick_ms : 1), index_(index) {}

Reactor::~Reactor() {
    stop();
    adopted_.clear();
    graveyard_.clear();
    if (wakefd_ >= 0) close(wakefd_);
    if (epfd_ >= 0) close(epfd_);
}

void Reactor::start() {
    epfd_ = epoll_create1(EPOLL_CLOEXEC);
    if (epfd_ < 0) throw std::system_error(errno, std::generic_category(), "epoll_create1");
    wakefd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (wakefd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.ptr = nullptr;  // the wake-up eventfd
    if (epoll_ctl(epfd_, EPOLL_CTL_ADD, wakefd_, &ev) != 0)
        throw std::system_error(errno, std::generic_category(), "epoll_ctl(wake eventfd)");
    thread_ = std::thread([this] {
        // splice() into a socket the peer has reset raises SIGPIPE (it takes no MSG_NOSIGNAL),
        // whose default action kills the whole host process: this thread blocks it and gets
        // EPIPE instead. Only this thread's mask changes; the host's SIGPIPE handling is its own.
        sigset_t pipe_signal;
        sigemptyset(&pipe_signal);
        sigaddset(&pipe_signal, SIGPIPE);
        pthread_sigmask(SIG_BLOCK, &pipe_signal, nullptr);
        loop();
    });
}

void Reactor::stop() {
    if (!thread_.joinable()) return;
    post([this] { stop_ = true; });
    thread_.join();
}

int Reactor::add_fd(int fd, uint32_t events, Handler *h) {
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = h;
    return epoll_ctl(epfd_, EPOLL_CTL_ADD, fd, &ev) == 0 ? 0 : -errno;
}

void Reactor::mod_fd(int fd, uint32_t events, Handler *h) {
    epoll_event ev{};
    ev.events = events;
    ev.data.ptr = h;
    if (epoll_ctl(epfd_, EPOLL_CTL_MOD, fd, &ev) != 0)
        log_.log(FERRY_LOG_ERROR, "epoll_ctl(MOD, fd %d): %s", fd, errno_string(errno).c_str());
}

void Reactor::del_fd(int fd) { epoll_ctl(epfd_, EPOLL_CTL_DEL, fd, nullptr); }

void Reactor::want_timer(Handler *h) {
    if (h->in_timers_) return;
    h->in_timers_ = true;
    if (timers_.empty()) next_tick_ = Clock::now() + std::chrono::milliseconds(tick_ms_);
    timers_.push_back(h);
}

void Reactor::mark_ready(Handler *h) {
    if (h->in_ready_) return;
    h->in_ready_ = true;
    ready_.push_back(h);
}

// A kick queued from another thread (a staging copy that ended) must not reach a handler that
// is about to be deleted.
void Reactor::unkick(Handler *h) {
    {
        std::lock_guard lk(inbox_mu_);
        if (h->kick_queued_) {
            Handler *prev = nullptr;
            for (Handler *k = kick_head_; k != nullptr; prev = k, k = k->kick_next_) {
                if (k != h) continue;
                (prev != nullptr ? prev->kick_next_ : kick_head_) = k->kick_next_;
                if (kick_tail_ == k) kick_tail_ = prev;
                break;
            }
            h->kick_queued_ = false;
            h->kick_next_ = nullptr;
        }
    }
}

void Reactor::forget(Handler *h) {
    if (h->in_ready_) {
        h->in_ready_ = false;
        ready_.erase(std::remove(ready_.begin(), ready_.end(), h), ready_.end());
    }
    if (h->in_timers_) {
        h->in_timers_ = false;
        timers_.erase(std::remove(timers_.begin(), timers_.end(), h), timers_.end());
    }
}

void Reactor::adopt(std::unique_ptr<Handler> h) {
    Handler *p = h.get();
    adopted_.emplace(p, std::move(h));
}

void Reactor::dispose(Handler *h) {
    forget(h);
    unkick(h);
    auto it = adopted_.find(h);
    if (it != adopted_.end()) {
        graveyard_.push_back(std::move(it->second));
        adopted_.erase(it);
    }
}

void Reactor::dispose_all() {
    for (auto &[p, h] : adopted_) {
        forget(p);
        unkick(p);
        graveyard_.push_back(std::move(h));
    }
    adopted_.clear();
}

void Reactor::wake() noexcept {
    uint64_t one = 1;
    ssize_t rc = write(wakefd_, &one, sizeof one);
    (void)rc;
}

void Reactor::kick(Handler *h) noexcept {
    bool was_empty;
    {
        std::lock_guard lk(inbox_mu_);
        if (h->kick_queued_) return;
        was_empty = kick_head_ == nullptr && tasks_.empty();
        h->kick_queued_ = true;
        h->kick_next_ = nullptr;
        if (kick_tail_ != nullptr) kick_tail_->kick_next_ = h;
        else kick_head_ = h;
        kick_tail_ = h;
    }
    if (was_empty) wake();
}

void Reactor::post(std::function<void()> fn) {
    bool was_empty;
    {
        std::lock_guard lk(inbox_mu_);
        was_empty = kick_head_ == nullptr && tasks_.empty();
        tasks_.push_back(std::move(fn));
    }
    if (was_empty) wake();
}

void Reactor::run_sync(std::function<void()> fn) {
    if (!thread_.joinable() || in_loop()) {
        fn();
        flush();
        return;
    }
    std::promise<void> done;
    auto fut = done.get_future();
    post([&] {
        try {
            fn();
            flush();  // completions fn produced are pollable when run_sync returns
            done.set_value();
        } catch (...) {
            done.set_exception(std::current_exception());
        }
    });
    fut.get();  // rethrows what fn threw
}

// Nothing may escape the loop thread (std::terminate); a callback that threw (in practice
// std::bad_alloc) is logged and the loop goes on.
template <class F>
void Reactor::guarded(const char *what, F &&fn) {
    try {
        fn();
    } catch (const std::exception &e) {
        log_.log(FERRY_LOG_ERROR, "reactor %u: %s callback failed: %s", index_, what, e.what());
    } catch (...) {
        log_.log(FERRY_LOG_ERROR, "reactor %u: %s callback failed", index_, what);
    }
}

void Reactor::run_inbox() {
    {
        std::lock_guard lk(inbox_mu_);
        tasks_work_.swap(tasks_);
        // Clear the flags now: a kick arriving while this batch runs queues the handler again.
        for (Handler *h = kick_head_; h != nullptr; h = h->kick_next_) {
            h->kick_queued_ = false;
            kicks_work_.push_back(h);
        }
        kick_head_ = kick_tail_ = nullptr;
    }
    for (Handler *h : kicks_work_) guarded("kick", [h] { h->on_kick(); });
    kicks_work_.clear();
    for (auto &task : tasks_work_) guarded("task", task);
    tasks_work_.clear();
}

void Reactor::run_ready() {
    if (ready_.empty()) return;
    std::vector<Handler *> batch;
    batch.swap(ready_);
    for (Handler *h : batch) h->in_ready_ = false;
    for (Handler *h : batch) guarded("resume", [h] { h->on_ready(); });
}

void Reactor::run_timers(Clock::time_point now) {
    std::vector<Handler *> snapshot = timers_;
    for (Handler *h : snapshot) {
        if (!h->in_timers_) continue;  // forgotten by an earlier callback of this round
        bool keep = true;
        guarded("timer", [&] { keep = h->on_timer(now); });
        if (!keep && h->in_timers_) {
            h->in_timers_ = false;
            timers_.erase(std::remove(timers_.begin(), timers_.end(), h), timers_.end());
        }
    }
    next_tick_ = now + std::chrono::milliseconds(tick_ms_);
}

void Reactor::flush() {
    if (!done_.empty()) cq_.push(done_);
}

// Event loop. Sleeps in epoll_wait unless postponed work is ready; wakes once per tick only
// while some handler has a deadline to check.
void Reactor::loop() {
    epoll_event evs[64];
    while (!stop_) {
        int timeout = -1;
        if (!ready_.empty()) {
            timeout = 0;
        } else if (!timers_.empty()) {
            auto left = std::chrono::duration_cast<std::chrono::milliseconds>(next_tick_ - Clock::now());
            timeout = static_cast<int>(std::max<int64_t>(0, left.count()) + 1);
        }
        int n = epoll_wait(epfd_, evs, 64, timeout);
        if (n < 0) {
            if (errno != EINTR) log_.log(FERRY_LOG_ERROR, "epoll_wait: %s", errno_string(errno).c_str());
            n = 0;
        }
        for (int i = 0; i < n; ++i) {
            auto *h = static_cast<Handler *>(evs[i].data.ptr);
            if (h == nullptr) {
                uint64_t v;
                ssize_t rc = read(wakefd_, &v, sizeof v);
                (void)rc;
                continue;
            }
            uint32_t events = evs[i].events;
            guarded("event", [h, events] { h->on_events(events); });
        }
        run_inbox();
        run_ready();
        if (!timers_.empty()) {
            auto now = Clock::now();
            if (now >= next_tick_) run_timers(now);
        }
        flush();
        graveyard_.clear();
    }
    flush();
}

}  // namespace ferry_tcp
