#include "plugin_util.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>

namespace ferry_plugin {

void Logger::log(int level, const char *fmt, ...) const {
    if (!enabled(level)) return;
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    host_->log(host_->ctx, level, plugin_name(), buf);
}

std::string strprintf(const char *fmt, ...) {
    char buf[1024];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(buf, sizeof buf, fmt, ap);
    va_end(ap);
    return buf;
}

void copy_message(char *dst, const char *msg) { snprintf(dst, FERRY_MESSAGE_MAX, "%s", msg ? msg : ""); }

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
    return strerror_r(e, buf, sizeof buf);  // GNU variant returns the string
}

bool parse_u64(const char *s, bool sizes, uint64_t *out) {
    if (s == nullptr || *s == '\0') return false;
    uint64_t v = 0;
    const char *p = s;
    for (; *p >= '0' && *p <= '9'; ++p) {
        uint64_t d = static_cast<uint64_t>(*p - '0');
        if (v > (std::numeric_limits<uint64_t>::max() - d) / 10) return false;
        v = v * 10 + d;
    }
    if (p == s) return false;
    if (*p != '\0') {
        if (!sizes || p[1] != '\0') return false;
        unsigned shift = 0;
        switch (*p) {
            case 'k':
            case 'K': shift = 10; break;
            case 'm':
            case 'M': shift = 20; break;
            case 'g':
            case 'G': shift = 30; break;
            default: return false;
        }
        if (v > (std::numeric_limits<uint64_t>::max() >> shift)) return false;
        v <<= shift;
    }
    *out = v;
    return true;
}

bool parse_bool(const char *s, bool *out) {
    if (s == nullptr) return false;
    for (const char *t : {"1", "true", "yes", "on"})
        if (strcmp(s, t) == 0) return *out = true, true;
    for (const char *f : {"0", "false", "no", "off"})
        if (strcmp(s, f) == 0) return *out = false, true;
    return false;
}

ferry_completion_t make_completion(uint64_t user_data, int status, const std::string &message) {
    ferry_completion_t c{};
    c.user_data = user_data;
    c.status = status;
    if (status != 0) copy_message(c.message, message.c_str());
    return c;
}

CompletionQueue::CompletionQueue() {
    efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd");
}

CompletionQueue::~CompletionQueue() {
    if (efd_ >= 0) close(efd_);
}

void CompletionQueue::signal_locked() {
    if (signaled_ || q_.empty()) return;
    uint64_t one = 1;
    if (write(efd_, &one, sizeof one) == static_cast<ssize_t>(sizeof one)) signaled_ = true;
}

void CompletionQueue::push(uint64_t user_data, int status, const std::string &message) {
    ferry_completion_t c = make_completion(user_data, status, message);
    std::lock_guard lock(mu_);
    q_.push_back(c);
    signal_locked();
}

void CompletionQueue::push(std::vector<ferry_completion_t> &batch) {
    if (batch.empty()) return;
    std::lock_guard lock(mu_);
    q_.insert(q_.end(), batch.begin(), batch.end());
    signal_locked();
}

size_t CompletionQueue::poll(ferry_completion_t *out, size_t max) {
    std::lock_guard lock(mu_);
    size_t n = q_.size() < max ? q_.size() : max;
    for (size_t i = 0; i < n; ++i) {
        out[i] = q_.front();
        q_.pop_front();
    }
    if (q_.empty() && signaled_) {
        uint64_t v;
        if (read(efd_, &v, sizeof v) == static_cast<ssize_t>(sizeof v) || errno == EAGAIN) signaled_ = false;
    }
    return n;
}

}  // namespace ferry_plugin
