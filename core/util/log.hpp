// core/util/: what every other folder builds on, knowing nothing of engines: the logger (this
// file), owned file descriptors (fd.hpp), blocking socket helpers, the byte codec, base64 and the
// JSON writer, the start-address index (start_index.hpp) and the file trust check (file_trust.hpp).
// May include: none (include/ferry/ and base/ are open to every folder of core/)
//
// Ferry's logger: one Boost.Log channel ("ferry") with a stderr sink; level from
// FERRY_LOG_LEVEL or the engine config. Boost.Log stays inside log.cpp so its heavy
// templates compile once.
#pragma once

#include <chrono>
#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>
#include <utility>

namespace ferry {

// Concatenates streamable values: cat("region ", addr, " is busy").
template <class... Args>
std::string cat(Args &&...args) {
    std::ostringstream out;
    (out << ... << std::forward<Args>(args));
    return out.str();
}

// 0x-prefixed hexadecimal, for addresses in messages.
inline std::string hex(uint64_t v) {
    std::ostringstream out;
    out << "0x" << std::hex << v;
    return out.str();
}

namespace log {

// Rate limit for a repeated warning (a bad connection, an exhausted limit): the first event of
// each interval is logged; later ones are counted and reported once the interval is over, so
// a flood costs one line plus one count per interval. Not thread-safe: one owner.
class Limiter {
public:
    using Clock = std::chrono::steady_clock;
    explicit Limiter(Clock::duration every) : every_(every) {}
    // True: log this event now. False: it was counted.
    bool admit(Clock::time_point now) {
        if (now >= window_end_ && suppressed_ == 0) {
            window_end_ = now + every_;
            return true;
        }
        ++suppressed_;
        return false;
    }
    // Events counted and not yet reported, once their interval is over (else 0).
    uint64_t take_due(Clock::time_point now) {
        if (suppressed_ == 0 || now < window_end_) return 0;
        window_end_ = now + every_;
        return std::exchange(suppressed_, 0);
    }
    // When take_due has something to report; max() when nothing is counted.
    Clock::time_point due() const { return suppressed_ ? window_end_ : Clock::time_point::max(); }
    Clock::duration every() const { return every_; }

private:
    Clock::duration every_;
    Clock::time_point window_end_{};
    uint64_t suppressed_ = 0;
};

enum class Level : int { Error = 0, Warn = 1, Info = 2, Debug = 3, Trace = 4 };

// Parses "error", "warn", "info", "debug", "trace" (any case) or 0..4.
bool parse_level(std::string_view text, Level &out);
void set_level(Level level);
Level level();
inline bool enabled(Level l) { return static_cast<int>(l) <= static_cast<int>(level()); }

void write(Level level, std::string_view component, std::string_view message);

}  // namespace log
}  // namespace ferry

// Formats only when the level is enabled.
#define FERRY_LOG(lvl, component, ...)                                                           \
    do {                                                                                         \
        if (::ferry::log::enabled(::ferry::log::Level::lvl))                                     \
            ::ferry::log::write(::ferry::log::Level::lvl, component, ::ferry::cat(__VA_ARGS__)); \
    } while (0)
#define FERRY_ERROR(...) FERRY_LOG(Error, "core", __VA_ARGS__)
#define FERRY_WARN(...) FERRY_LOG(Warn, "core", __VA_ARGS__)
#define FERRY_INFO(...) FERRY_LOG(Info, "core", __VA_ARGS__)
#define FERRY_DEBUG(...) FERRY_LOG(Debug, "core", __VA_ARGS__)
