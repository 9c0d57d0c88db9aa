// Small shared helpers of the tcp transport: host logging, ABI error messages, clocks.
#pragma once

#include <ferry/plugin.h>

#include <chrono>
#include <cstdint>
#include <string>

namespace ferry_tcp {

inline constexpr const char *kPluginName = "tcp";
inline constexpr const char *kPluginVersion = "1.0.0";

using Clock = std::chrono::steady_clock;

inline int64_t ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

// Routes log lines through ferry_host_api_t::log. The host's level is read live, so lines
// above it are never formatted.
class Logger {
public:
    explicit Logger(const ferry_host_api_t *host);
    bool enabled(int level) const;
    void log(int level, const char *fmt, ...) const __attribute__((format(printf, 3, 4)));

private:
    const ferry_host_api_t *host_ = nullptr;
    bool has_log_ = false;
    bool has_level_ = false;
};

std::string strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));

// Copies `msg` into a FERRY_MESSAGE_MAX buffer, truncating, always NUL-terminated.
void copy_message(char *dst, const char *msg);

// Writes the message into err (when not NULL) and returns `code` (negative errno).
int set_error(ferry_error_t *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));

// strerror() that is thread safe.
std::string errno_string(int e);

}  // namespace ferry_tcp
