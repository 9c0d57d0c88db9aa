// Rate-limited logging of what peers cause (bad connections, refused requests): a peer that
// opens thousands of bad connections must not fill the host's log. Up to `burst` lines per
// window go out as they are; the rest are counted and reported as one line when the window
// ends. Thread safe.
#pragma once

#include "util.hpp"

#include <cstdint>
#include <functional>
#include <mutex>

namespace ferry_tcp {

class LogLimiter {
public:
    LogLimiter(const Logger &log, const char *what, unsigned burst, unsigned window_ms)
        : log_(log), what_(what), burst_(burst), window_ms_(window_ms) {}

    // Called (from the logging thread) when a window starts holding lines back, so the owner
    // can arrange a flush() once the window is over. Set before any log().
    void set_on_hold(std::function<void()> fn) { on_hold_ = std::move(fn); }

    void log(int level, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
    // Reports the lines held back once their window is over. True while lines are held.
    bool flush();

private:
    void roll(Clock::time_point now);  // under mu_

    const Logger &log_;
    const char *what_;
    const unsigned burst_;
    const unsigned window_ms_;
    std::function<void()> on_hold_;
    std::mutex mu_;
    Clock::time_point window_start_{};
    unsigned logged_ = 0;               // lines logged in this window
    uint64_t held_ = 0;                 // lines held back in this window
    int held_level_ = FERRY_LOG_DEBUG;  // most severe level held back
};

}  // namespace ferry_tcp
