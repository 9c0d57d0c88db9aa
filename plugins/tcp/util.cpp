#include "util.hpp"

#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>

namespace ferry_tcp {

namespace {
constexpr size_t kLogFieldEnd = offsetof(ferry_host_api_t, log) + sizeof(ferry_host_api_t::log);
constexpr size_t kLevelFieldEnd = offsetof(ferry_host_api_t, log_level) + sizeof(ferry_host_api_t::log_level);

std::string vformat(const char *fmt, va_list ap) {
    char small[512];
    va_list ap2;
    va_copy(ap2, ap);
    int n = vsnprintf(small, sizeof small, fmt, ap);
    if (n < 0) {
        va_end(ap2);
        return std::string("(bad log format)");
    }
    if (static_cast<size_t>(n) < sizeof small) {
        va_end(ap2);
        return std::string(small, static_cast<size_t>(n));
    }
    std::string s(static_cast<size_t>(n) + 1, '\0');
    vsnprintf(s.data(), s.size(), fmt, ap2);
    va_end(ap2);
    s.resize(static_cast<size_t>(n));
    return s;
}
}  // namespace

Logger::Logger(const ferry_host_api_t *host) : host_(host) {
    if (host_ != nullptr) {
        has_log_ = host_->struct_size >= kLogFieldEnd && host_->log != nullptr;
        has_level_ = host_->struct_size >= kLevelFieldEnd;
    }
}

bool Logger::enabled(int level) const {
    if (!has_log_) return false;
    int current = has_level_ ? __atomic_load_n(&host_->log_level, __ATOMIC_RELAXED) : FERRY_LOG_INFO;
    return level <= current;
}

void Logger::log(int level, const char *fmt, ...) const {
    if (!enabled(level)) return;
    va_list ap;
    va_start(ap, fmt);
    std::string line = vformat(fmt, ap);
    va_end(ap);
    host_->log(host_->ctx, level, kPluginName, line.c_str());
}

std::string strprintf(const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    std::string s = vformat(fmt, ap);
    va_end(ap);
    return s;
}

void copy_message(char *dst, const char *msg) {
    size_t n = msg ? strnlen(msg, FERRY_MESSAGE_MAX - 1) : 0;
    if (n) memcpy(dst, msg, n);
    dst[n] = '\0';
}

int set_error(ferry_error_t *err, int code, const char *fmt, ...) {
    if (err != nullptr) {
        va_list ap;
        va_start(ap, fmt);
        vsnprintf(err->message, sizeof err->message, fmt, ap);
        va_end(ap);
    }
    return code;
}

std::string errno_string(int e) {
    char buf[128];
    // GNU strerror_r returns a pointer that may or may not be buf.
    const char *s = strerror_r(e, buf, sizeof buf);
    return std::string(s ? s : "unknown error");
}

}  // namespace ferry_tcp
