#include "completion_queue.hpp"

#include <sys/eventfd.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

namespace ferry_tcp {

CompletionQueue::CompletionQueue() {
    efd_ = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
    if (efd_ < 0) throw std::system_error(errno, std::generic_category(), "eventfd for completions");
}

CompletionQueue::~CompletionQueue() {
    if (efd_ >= 0) close(efd_);
}

// The eventfd is written and read under the queue mutex, only on the transitions
// empty -> non-empty (push) and non-empty -> empty (poll), so it is readable exactly while
// completions are waiting: a host sleeping on it neither misses one nor wakes for nothing.
void CompletionQueue::push(std::vector<ferry_completion_t> &batch) {
    if (batch.empty()) return;
    {
        std::lock_guard lk(mu_);
        q_.insert(q_.end(), batch.begin(), batch.end());
        if (!signaled_) {
            uint64_t one = 1;
            // Cannot fail short of a counter overflow (2^64 - 2 writes without a read).
            ssize_t rc = write(efd_, &one, sizeof one);
            (void)rc;
            signaled_ = true;
        }
    }
    batch.clear();
}

size_t CompletionQueue::poll(ferry_completion_t *out, size_t max) {
    std::lock_guard lk(mu_);
    size_t n = 0;
    while (n < max && !q_.empty()) {
        out[n++] = q_.front();
        q_.pop_front();
    }
    if (q_.empty() && signaled_) {
        uint64_t v;
        ssize_t rc = read(efd_, &v, sizeof v);
        (void)rc;
        signaled_ = false;
    }
    return n;
}

}  // namespace ferry_tcp
