// One I/O thread: an epoll loop that owns a set of connections (client lanes and served
// connections). A served connection's state is touched only by its reactor thread; a client
// lane's is behind the lane's lock, which the threads of submit and poll may take too
// (lane.hpp, waiter mode). Other threads hand work over with kick() / post().
#pragma once

#include "plugin_util.hpp"

#include <ferry/plugin.h>

#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>
#include <unordered_map>
#include <vector>

namespace ferry_tcp {

class Handler {
public:
    virtual ~Handler() = default;
    virtual void on_events(uint32_t events) = 0;                // epoll events of the handler's fd
    virtual void on_kick() {}                                   // another thread queued work
    virtual bool on_timer(Clock::time_point) { return false; }  // true: keep ticking
    virtual void on_ready() {}                                  // resume work postponed by mark_ready() (fairness)

private:
    friend class Reactor;
    bool in_ready_ = false;
    bool in_timers_ = false;
    // Intrusive kick list, guarded by the reactor's inbox mutex: kick() never allocates, so a
    // submit that has prepared its work cannot fail half-way.
    bool kick_queued_ = false;
    Handler *kick_next_ = nullptr;
};

class Reactor {
public:
    Reactor(const Logger &log, CompletionQueue &cq, unsigned tick_ms, unsigned index);
    ~Reactor();  // stops the loop and deletes adopted handlers
    Reactor(const Reactor &) = delete;
    Reactor &operator=(const Reactor &) = delete;

    void start();  // throws std::system_error
    void stop();   // runs what was posted so far, then joins
    unsigned index() const { return index_; }

    // ---- loop thread only ----
    int add_fd(int fd, uint32_t events, Handler *h);  // 0 or -errno
    void mod_fd(int fd, uint32_t events, Handler *h);
    void del_fd(int fd);
    void want_timer(Handler *h);  // h->on_timer() every tick until it returns false
    void mark_ready(Handler *h);  // h->on_ready() on the next iteration, without sleeping
    void forget(Handler *h);      // drop h from the timer and ready lists
    void adopt(std::unique_ptr<Handler> h);
    void dispose(Handler *h);  // deletes an adopted handler at the end of this iteration
    void dispose_all();        // disposes every adopted handler
    // Completions queued here reach the completion queue once per loop iteration.
    std::vector<ferry_completion_t> &completions() { return done_; }

    // ---- any thread ----
    // Queues h->on_kick() (once, however often it is kicked before it runs). Kicks run before
    // the tasks posted in the same round. Never throws.
    void kick(Handler *h) noexcept;
    void post(std::function<void()> fn);
    void run_sync(std::function<void()> fn);  // post and wait; inline on the loop thread
    // Drops a queued kick. A handler that other threads kick calls it once they no longer can
    // (before it is freed): dispose() unkicks too, but a kick may land between that and the end
    // of the iteration, when the handler is deleted.
    void unkick(Handler *h);
    bool in_loop() const { return std::this_thread::get_id() == thread_.get_id(); }

private:
    void loop();
    template <class F>
    void guarded(const char *what, F &&fn);
    void run_inbox();
    void run_ready();
    void run_timers(Clock::time_point now);
    void flush();

    const Logger &log_;
    CompletionQueue &cq_;
    const unsigned tick_ms_;
    const unsigned index_;
    int epfd_ = -1;
    int wakefd_ = -1;
    std::thread thread_;
    bool stop_ = false;  // loop thread only

    void wake() noexcept;

    std::mutex inbox_mu_;
    std::vector<std::function<void()>> tasks_;
    Handler *kick_head_ = nullptr;
    Handler *kick_tail_ = nullptr;
    std::vector<std::function<void()>> tasks_work_;  // loop thread only: swapped with tasks_
    std::vector<Handler *> kicks_work_;              // loop thread only

    std::vector<Handler *> ready_;
    std::vector<Handler *> timers_;
    Clock::time_point next_tick_{};
    std::unordered_map<Handler *, std::unique_ptr<Handler>> adopted_;
    std::vector<std::unique_ptr<Handler>> graveyard_;
    std::vector<ferry_completion_t> done_;
};

}  // namespace ferry_tcp
