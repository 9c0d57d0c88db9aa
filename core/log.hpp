// Ferry's logger: one Boost.Log channel ("ferry") with a stderr sink; level from
// FERRY_LOG_LEVEL or the engine config. Boost.Log stays inside log.cpp so its heavy
// templates compile once.
#pragma once

#include <cstdint>
#include <sstream>
#include <string>
#include <string_view>

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

enum class Level : int { Error = 0, Warn = 1, Info = 2, Debug = 3, Trace = 4 };

// Parses "error", "warn", "info", "debug", "trace" (any case) or 0..4.
bool parse_level(std::string_view text, Level &out);
void set_level(Level level);
Level level();
inline bool enabled(Level l) { return static_cast<int>(l) <= static_cast<int>(level()); }

void write(Level level, std::string_view component, std::string_view message);

} // namespace log
} // namespace ferry

// Formats only when the level is enabled.
#define FERRY_LOG(lvl, component, ...)                                                         \
    do {                                                                                       \
        if (::ferry::log::enabled(::ferry::log::Level::lvl))                                   \
            ::ferry::log::write(::ferry::log::Level::lvl, component, ::ferry::cat(__VA_ARGS__)); \
    } while (0)
#define FERRY_ERROR(...) FERRY_LOG(Error, "core", __VA_ARGS__)
#define FERRY_WARN(...) FERRY_LOG(Warn, "core", __VA_ARGS__)
#define FERRY_INFO(...) FERRY_LOG(Info, "core", __VA_ARGS__)
#define FERRY_DEBUG(...) FERRY_LOG(Debug, "core", __VA_ARGS__)
