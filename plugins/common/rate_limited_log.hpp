// Log lines about what peers cause (bad connections, refused requests), rate limited: a peer
// that opens thousands of bad connections must not fill the host's log. Up to `burst` lines per
// window go out as they come; the rest are counted, and the count is logged when the window is
// over. The one limiter of every plugin (tcp, shm, rdma), in two shapes of the count:
// - summed (tcp): a line of its own, "N more lines about <what> in the last T s were not logged
//   one by one (at most B per W s)", at the first event or flush() after the window;
// - attached (shm, rdma; burst 1): the next line logged says "(and N more like it in the last
//   T s)", and flush() logs what is still counted as "N more like this in the last T s".
// Thread safe; lines are formatted only when they are logged.
#pragma once

#include "plugin_util.hpp"

#include <chrono>
#include <concepts>
#include <cstdint>
#include <functional>
#include <mutex>
#include <string>

namespace ferry_plugin {

class RateLimitedLog {
public:
    // Attached count: one line per interval at `level`.
    RateLimitedLog(const Logger &log, int level, std::chrono::milliseconds interval = std::chrono::seconds(10));
    // Summed count: `burst` lines per window, each at its own level (log()).
    RateLimitedLog(const Logger &log, const char *what, unsigned burst, unsigned window_ms);

    // Called (from the logging thread, outside the lock) when a window starts holding lines
    // back, so the owner can arrange a flush() once the window is over. Set before any event.
    void set_on_hold(std::function<void()> fn) { on_hold_ = std::move(fn); }

    // One event at the limiter's level; `make_text()` runs only when the line is logged.
    template <class MakeText>
    requires std::invocable<MakeText &>
    void event(MakeText &&make_text) {
        bool first_held = false;
        {
            std::lock_guard lock(mu_);
            if (admit(level_, &first_held)) emit(level_, make_text());
        }
        if (first_held && on_hold_) on_hold_();
    }
    // One event whose text is at hand; kept as "the last" of the ones counted.
    void event(const std::string &line);
    // One event at its own level, printf-formatted only when logged.
    void log(int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
    // Logs the count of lines held back once their window is over (at once with `force`, for
    // teardown). True while lines are still held.
    bool flush(bool force = false);
    uint64_t suppressed() const {
        std::lock_guard lock(mu_);
        return held_;
    }

private:
    bool admit(int level, bool *first_held);  // under mu_: true when this line is to be logged
    void emit(int level, const std::string &text);
    void report_held(Clock::time_point now);  // under mu_: the count as a line of its own

    const Logger &log_;
    const int level_;
    const char *const what_;  // summed shape; nullptr: attached
    const unsigned burst_;
    const std::chrono::milliseconds window_;
    std::function<void()> on_hold_;
    mutable std::mutex mu_;
    bool started_ = false;
    Clock::time_point window_start_{};
    unsigned logged_ = 0;     // lines logged in this window
    uint64_t held_ = 0;       // lines held back since the last report
    int held_level_ = 0;      // most severe level held back (lower is more severe)
    uint64_t carried_ = 0;    // attached shape: held lines the next logged line reports
    int64_t carried_ms_ = 0;  // over how long they came
    std::string last_line_;   // attached shape: the last line held back, when known
};

}  // namespace ferry_plugin
