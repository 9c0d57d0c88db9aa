// A log line about peers that misbehave, at most once per interval: the first event of an
// interval is logged in full, the rest are counted and summed up in the next line. A flood of
// bad connections then costs a few lines a minute, not one line each.
#pragma once

#include "plugin_util.hpp"

#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace ferry_plugin {

class RateLimitedLog {
public:
    using Clock = std::chrono::steady_clock;
    RateLimitedLog(const Logger &log, int level, std::chrono::milliseconds interval = std::chrono::seconds(10))
        : log_(log), level_(level), interval_(interval) {}

    // One event; `what` is formatted only when it will be logged.
    template <class MakeText>
    void event(MakeText &&what) {
        std::lock_guard lock(mu_);
        auto now = Clock::now();
        if (logged_once_ && now - last_ < interval_) {
            ++suppressed_;
            return;
        }
        std::string text = what();
        if (suppressed_ > 0)
            log_.log(level_, "%s (and %llu more like it in the last %lld s)", text.c_str(),
                     static_cast<unsigned long long>(suppressed_),
                     static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(now - last_).count()));
        else log_.log(level_, "%s", text.c_str());
        suppressed_ = 0;
        last_ = now;
        logged_once_ = true;
    }
    uint64_t suppressed() const {
        std::lock_guard lock(mu_);
        return suppressed_;
    }

private:
    const Logger &log_;
    const int level_;
    const std::chrono::milliseconds interval_;
    mutable std::mutex mu_;
    Clock::time_point last_{};
    bool logged_once_ = false;
    uint64_t suppressed_ = 0;
};

}  // namespace ferry_plugin
