#include "plugin_util.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <cstdarg>
#include <cstddef>
#include <cstdio>
#include <cstring>
#include <limits>
#include <system_error>

namespace ferry_plugin {

namespace {
constexpr size_t kLogFieldEnd = FERRY_HOST_API_SIZE_UNTIL(log);
constexpr size_t kLevelFieldEnd = FERRY_HOST_API_SIZE_UNTIL(log_level);

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

Logger::Logger(const ferry_host_api_t *host, const char *plugin_name) : host_(host), name_(plugin_name) {
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
    host_->log(host_->ctx, level, name_, line.c_str());
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

ferry_completion_t make_completion(uint64_t user_data, int status, const std::string &message) {
    ferry_completion_t c{};
    c.user_data = user_data;
    c.status = status;
    if (status != 0) copy_message(c.message, message.c_str());
    return c;
}

CompletionQueue::CompletionQueue() {
    efd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd for completions");
}

CompletionQueue::~CompletionQueue() {
    if (efd_ >= 0) close(efd_);
}

void CompletionQueue::signal_locked() {
    if (signaled_ || head_ == q_.size()) return;
    uint64_t one = 1;
    if (write(efd_, &one, sizeof one) == static_cast<ssize_t>(sizeof one)) signaled_ = true;
}

void CompletionQueue::push(uint64_t user_data, int status, const std::string &message) {
    std::lock_guard lock(mu_);
    q_.push_back({user_data, status});
    if (status != 0) copy_message(msgs_.emplace_back().data(), message.c_str());
    signal_locked();
}

void CompletionQueue::push(std::vector<ferry_completion_t> &batch) {
    if (batch.empty()) return;
    {
        std::lock_guard lock(mu_);
        for (const ferry_completion_t &c : batch) {
            q_.push_back({c.user_data, c.status});
            if (c.status != 0) copy_message(msgs_.emplace_back().data(), c.message);
        }
        signal_locked();
    }
    batch.clear();
}

void CompletionQueue::push(std::span<const uint64_t> user_data, int status, const std::string &message) {
    if (user_data.empty()) return;
    std::lock_guard lock(mu_);
    for (uint64_t u : user_data) {
        q_.push_back({u, status});
        if (status != 0) copy_message(msgs_.emplace_back().data(), message.c_str());
    }
    signal_locked();
}

void CompletionQueue::signal() {
    std::lock_guard lock(mu_);
    if (signaled_) return;
    uint64_t one = 1;
    if (write(efd_, &one, sizeof one) == static_cast<ssize_t>(sizeof one)) signaled_ = true;
}

size_t CompletionQueue::poll(ferry_completion_t *out, size_t max) {
    std::lock_guard lock(mu_);
    const size_t waiting = q_.size() - head_;
    size_t n = waiting < max ? waiting : max;
    for (size_t i = 0; i < n; ++i) {
        const Entry &e = q_[head_++];
        out[i].user_data = e.user_data;
        out[i].status = e.status;
        out[i].reserved = 0;
        if (e.status != 0) {
            memcpy(out[i].message, msgs_.front().data(), sizeof out[i].message);
            msgs_.pop_front();
        } else {
            out[i].message[0] = '\0';
        }
    }
    if (head_ == q_.size()) {
        q_.clear();
        head_ = 0;
    } else if (head_ >= 4096 && 2 * head_ >= q_.size()) {  // a consumer that never drains all
        q_.erase(q_.begin(), q_.begin() + static_cast<std::ptrdiff_t>(head_));
        head_ = 0;
    }
    if (head_ == q_.size() && signaled_) {
        uint64_t v;
        if (read(efd_, &v, sizeof v) == static_cast<ssize_t>(sizeof v) || errno == EAGAIN) signaled_ = false;
    }
    return n;
}

}  // namespace ferry_plugin
