#include "rate_limited_log.hpp"

#include <cstdarg>
#include <cstdio>

namespace ferry_plugin {

RateLimitedLog::RateLimitedLog(const Logger &log, int level, std::chrono::milliseconds interval)
    : log_(log), level_(level), what_(nullptr), burst_(1), window_(interval), held_level_(level) {}

RateLimitedLog::RateLimitedLog(const Logger &log, const char *what, unsigned burst, unsigned window_ms)
    : log_(log), level_(FERRY_LOG_WARN), what_(what), burst_(burst), window_(window_ms), held_level_(FERRY_LOG_DEBUG) {}

void RateLimitedLog::report_held(Clock::time_point now) {
    if (held_ == 0) return;
    const int64_t ms = ms_between(window_start_, now);
    if (what_ != nullptr)
        log_.log(held_level_,
                 "%llu more lines about %s in the last %.1f s were not logged one "
                 "by one (at most %u per %u s)",
                 static_cast<unsigned long long>(held_), what_, static_cast<double>(ms) / 1000.0, burst_,
                 static_cast<unsigned>(window_.count() / 1000));
    else if (!last_line_.empty())
        log_.log(level_, "%llu more like this in the last %lld s; the last: %s", static_cast<unsigned long long>(held_),
                 static_cast<long long>(ms / 1000), last_line_.c_str());
    else
        log_.log(level_, "%llu more like this in the last %lld s", static_cast<unsigned long long>(held_),
                 static_cast<long long>(ms / 1000));
    held_ = 0;
    last_line_.clear();
}

bool RateLimitedLog::admit(int level, bool *first_held) {
    const auto now = Clock::now();
    if (!started_ || now - window_start_ >= window_) {  // a new window
        if (what_ != nullptr) {
            report_held(now);
        } else {  // the line about to be logged carries the count
            carried_ = held_;
            carried_ms_ = started_ ? ms_between(window_start_, now) : 0;
            held_ = 0;
            last_line_.clear();
        }
        started_ = true;
        window_start_ = now;
        logged_ = 0;
        held_level_ = what_ != nullptr ? FERRY_LOG_DEBUG : level_;
    }
    if (logged_ < burst_) {
        ++logged_;
        return true;
    }
    *first_held = held_++ == 0;
    if (level < held_level_) held_level_ = level;
    return false;
}

void RateLimitedLog::emit(int level, const std::string &text) {
    if (carried_ > 0)
        log_.log(level, "%s (and %llu more like it in the last %lld s)", text.c_str(),
                 static_cast<unsigned long long>(carried_), static_cast<long long>(carried_ms_ / 1000));
    else log_.log(level, "%s", text.c_str());
    carried_ = 0;
}

void RateLimitedLog::event(const std::string &line) {
    bool first_held = false;
    {
        std::lock_guard lock(mu_);
        if (admit(level_, &first_held)) emit(level_, line);
        else if (what_ == nullptr) last_line_ = line;
    }
    if (first_held && on_hold_) on_hold_();
}

void RateLimitedLog::log(int level, const char *fmt, ...) {
    if (!log_.enabled(level)) return;
    bool first_held = false;
    {
        std::lock_guard lock(mu_);
        if (admit(level, &first_held)) {
            char line[1024];
            va_list ap;
            va_start(ap, fmt);
            vsnprintf(line, sizeof line, fmt, ap);
            va_end(ap);
            emit(level, line);
        }
    }
    if (first_held && on_hold_) on_hold_();
}

bool RateLimitedLog::flush(bool force) {
    std::lock_guard lock(mu_);
    const auto now = Clock::now();
    if (held_ != 0 && (force || now - window_start_ >= window_)) {
        report_held(now);
        window_start_ = now;
        logged_ = what_ != nullptr ? 0 : burst_;  // attached: the next line waits for a new interval
        held_level_ = what_ != nullptr ? FERRY_LOG_DEBUG : level_;
    }
    return held_ != 0;
}

}  // namespace ferry_plugin
