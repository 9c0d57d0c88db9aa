// The plugin kit: what every C++ transport plugin (tcp, shm, efa, rdma, cuda_ipc/hip_ipc)
// compiles in besides plugin_entry.hpp. Host logging, ABI error messages, option value parsing,
// the completion queue behind poll()/completion_fd, clocks. Builds against plugin.h alone;
// each plugin links its own copy (nothing here is exported). Also in the kit: byte_order.hpp
// (little-endian loads and stores, included here), rate_limited_log.hpp (log lines about what
// peers cause), staged_device.hpp (serving device memory through the host's staging calls),
// rail_balance.hpp (spreading work over several paths by their throughput, pausing failed ones).
#pragma once

#include <ferry/plugin.h>

#include "byte_order.hpp"

#include <array>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <span>
#include <string>
#include <vector>

namespace ferry_plugin {

using Clock = std::chrono::steady_clock;

inline int64_t ms_between(Clock::time_point a, Clock::time_point b) {
    return std::chrono::duration_cast<std::chrono::milliseconds>(b - a).count();
}

// Routes log lines through ferry_host_api_t::log under the plugin's name (the host puts it in
// front of each line). The host's fields are read only where its struct_size covers them, and its
// level live (atomically: the host may change it at any time), so lines above it are never
// formatted.
class Logger {
public:
    Logger(const ferry_host_api_t *host, const char *plugin_name);
    bool enabled(int level) const;
    void log(int level, const char *fmt, ...) const __attribute__((format(printf, 3, 4)));

private:
    const ferry_host_api_t *host_ = nullptr;
    const char *name_;
    bool has_log_ = false;
    bool has_level_ = false;
};

std::string strprintf(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
// Copies msg into a FERRY_MESSAGE_MAX buffer, truncated and NUL-terminated.
void copy_message(char *dst, const char *msg);
// Writes the message into err (when not NULL) and returns code (a negative errno).
int set_error(ferry_error_t *err, int code, const char *fmt, ...) __attribute__((format(printf, 3, 4)));
std::string errno_string(int e);  // thread-safe strerror

// Finished ops waiting for poll(). The eventfd is readable exactly while the queue is not empty:
// it is written and read under the queue's lock, only on the transitions empty -> non-empty
// (push) and non-empty -> empty (poll), so a host sleeping on it neither misses a completion nor
// wakes for nothing.
class CompletionQueue {
public:
    CompletionQueue();  // throws std::system_error when no eventfd can be made
    ~CompletionQueue();
    CompletionQueue(const CompletionQueue &) = delete;
    CompletionQueue &operator=(const CompletionQueue &) = delete;
    int fd() const { return efd_; }
    void push(uint64_t user_data, int status, const std::string &message);
    // Appends a batch under one lock and empties it.
    void push(std::vector<ferry_completion_t> &batch);
    // Appends one completion per user_data, all with the same outcome, under one lock: a run
    // of ops that ended together (one GPU event) costs no completion struct per op.
    void push(std::span<const uint64_t> user_data, int status, const std::string &message);
    // Moves up to max entries out.
    size_t poll(ferry_completion_t *out, size_t max);
    // Makes the fd readable with nothing queued (until the next poll): the plugin asks its
    // host to call poll() again soon, for completions it finds only by polling.
    void signal();

private:
    // Compact entries (a completion is 272 bytes, mostly its message: a deque of those allocated
    // one node per completion); messages of failed ones wait in msgs_, in the same order.
    struct Entry {
        uint64_t user_data;
        int32_t status;
    };
    void signal_locked();
    int efd_ = -1;
    std::mutex mu_;
    bool signaled_ = false;  // the eventfd holds a count; guarded by mu_
    std::vector<Entry> q_;   // [head_, size) waiting; storage reused once drained
    size_t head_ = 0;
    std::deque<std::array<char, FERRY_MESSAGE_MAX>> msgs_;
};

ferry_completion_t make_completion(uint64_t user_data, int status, const std::string &message);

}  // namespace ferry_plugin

// Each plugin's own namespace (ferry_tcp, ferry_shm, ...) sees the kit unqualified. Only that
// plugin's files include this header, and nothing of it is exported from the .so.
using namespace ferry_plugin;  // NOLINT(google-build-using-namespace)
