// Helpers every C++ transport plugin (shm.so, efa.so, rdma.so) compiles in: host logging, ABI
// error messages, option parsing, the completion queue behind poll()/completion_fd. Builds
// against plugin.h alone; each plugin links its own copy (nothing here is exported).
#pragma once

#include <ferry/plugin.h>

#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace ferry_plugin {

// The plugin's name for log lines; each plugin defines it once (in its util.cpp).
const char *plugin_name();

// Routes log lines through ferry_host_api_t::log; lines above the host's level are not formatted.
class Logger {
public:
    explicit Logger(const ferry_host_api_t *host) : host_(host) {}
    bool enabled(int level) const { return host_ != nullptr && host_->log != nullptr && level <= host_->log_level; }
    void log(int level, const char *fmt, ...) const __attribute__((format(printf, 3, 4)));

private:
    const ferry_host_api_t *host_;
};

std::string strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Copies msg into a FERRY_MESSAGE_MAX buffer, truncated and NUL-terminated.
void copy_message(char *dst, const char *msg);
// Writes the message into err (when not NULL) and returns code (a negative errno).
int set_error(ferry_error_t *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
std::string errno_string(int e);  // thread-safe strerror

// Unsigned decimal; with `sizes`, an optional k/m/g suffix (KiB/MiB/GiB). False when malformed.
bool parse_u64(const char *s, bool sizes, uint64_t *out);
bool parse_bool(const char *s, bool *out);

// Finished ops waiting for poll(). The eventfd is readable exactly while the queue is not empty
// (both change under one lock).
class CompletionQueue {
public:
    CompletionQueue();  // throws std::system_error when no eventfd can be made
    ~CompletionQueue();
    CompletionQueue(const CompletionQueue &) = delete;
    CompletionQueue &operator=(const CompletionQueue &) = delete;
    int fd() const { return efd_; }
    void push(uint64_t user_data, int status, const std::string &message);
    void push(std::vector<ferry_completion_t> &batch);
    size_t poll(ferry_completion_t *out, size_t max);

private:
    void signal_locked();
    int efd_ = -1;
    std::mutex mu_;
    bool signaled_ = false;
    std::deque<ferry_completion_t> q_;
};

ferry_completion_t make_completion(uint64_t user_data, int status, const std::string &message);

}  // namespace ferry_plugin
