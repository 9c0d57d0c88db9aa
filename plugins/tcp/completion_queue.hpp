// Finished ops waiting for poll(), plus the eventfd behind completion_fd.
#pragma once

#include <ferry/plugin.h>

#include <cstddef>
#include <deque>
#include <mutex>
#include <vector>

namespace ferry_tcp {

class CompletionQueue {
public:
    CompletionQueue();  // throws std::system_error when no eventfd can be made
    ~CompletionQueue();
    CompletionQueue(const CompletionQueue &) = delete;
    CompletionQueue &operator=(const CompletionQueue &) = delete;

    int fd() const { return efd_; }

    // Appends a batch (one lock; signals the eventfd when the queue was empty).
    void push(std::vector<ferry_completion_t> &batch);

    // Moves up to max entries out; clears the eventfd when that empties the queue.
    size_t poll(ferry_completion_t *out, size_t max);

private:
    int efd_ = -1;
    std::mutex mu_;
    bool signaled_ = false;  // the eventfd holds a count; guarded by mu_
    std::deque<ferry_completion_t> q_;
};

}  // namespace ferry_tcp
