#include "log_limiter.hpp"

#include <cstdarg>
#include <cstdio>

namespace ferry_tcp {

void LogLimiter::roll(Clock::time_point now) {
    if (ms_between(window_start_, now) < static_cast<int64_t>(window_ms_)) return;
    if (held_ != 0)
        log_.log(held_level_,
                 "%llu more lines about %s in the last %.1f s were not logged one "
                 "by one (at most %u per %u s)",
                 static_cast<unsigned long long>(held_), what_,
                 static_cast<double>(ms_between(window_start_, now)) / 1000.0, burst_, window_ms_ / 1000);
    window_start_ = now;
    logged_ = 0;
    held_ = 0;
    held_level_ = FERRY_LOG_DEBUG;
}

void LogLimiter::log(int level, const char *fmt, ...) {
    if (!log_.enabled(level)) return;
    bool first_held = false;
    {
        std::lock_guard lk(mu_);
        roll(Clock::now());
        if (logged_ >= burst_) {
            first_held = held_++ == 0;
            if (level < held_level_) held_level_ = level;  // lower values are more severe
        } else {
            ++logged_;
            char line[1024];
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(line, sizeof line, fmt, ap);
            va_end(ap);
            log_.log(level, "%s", line);
        }
    }
    if (first_held && on_hold_) on_hold_();
}

bool LogLimiter::flush() {
    std::lock_guard lk(mu_);
    roll(Clock::now());
    return held_ != 0;
}

}  // namespace ferry_tcp
