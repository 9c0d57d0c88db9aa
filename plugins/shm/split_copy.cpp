#include "split_copy.hpp"

#include <cstring>

namespace ferry_shm {

SplitCopier::~SplitCopier() {
    {
        std::lock_guard lock(mu_);
        stop_ = true;
    }
    work_cv_.notify_all();
    for (auto &t : threads_) t.join();
}

// Bytes [from, to) of the pieces laid end to end.
void SplitCopier::copy_range(std::span<const Piece> pieces, size_t from, size_t to) {
    size_t at = 0;
    for (const Piece &p : pieces) {
        const size_t lo = std::max(from, at), hi = std::min(to, at + p.len);
        if (lo < hi) memcpy(p.dst + (lo - at), p.src + (lo - at), hi - lo);
        at += p.len;
        if (at >= to) break;
    }
}

void SplitCopier::copy(std::span<const Piece> pieces, unsigned helpers) {
    size_t total = 0;
    for (const Piece &p : pieces) total += p.len;
    std::unique_lock use(use_mu_, std::try_to_lock);
    if (helpers == 0 || total < kMinSplit || !use.owns_lock()) {
        copy_range(pieces, 0, total);
        return;
    }
    {
        std::lock_guard lock(mu_);
        while (threads_.size() < helpers) {
            unsigned i = static_cast<unsigned>(threads_.size());
            threads_.emplace_back([this, i] { helper_loop(i); });
        }
        job_ = pieces;
        total_ = total;
        parts_ = helpers + 1;
        pending_ = helpers;
        ++generation_;
    }
    work_cv_.notify_all();
    copy_range(pieces, 0, total / parts_);  // part 0: ours
    std::unique_lock lock(mu_);
    done_cv_.wait(lock, [&] { return pending_ == 0; });
    job_ = {};
}

void SplitCopier::helper_loop(unsigned index) {
    uint64_t seen = 0;
    std::unique_lock lock(mu_);
    for (;;) {
        work_cv_.wait(lock, [&] { return stop_ || generation_ != seen; });
        if (stop_) return;
        seen = generation_;
        if (index + 1 >= parts_) continue;  // more helpers than this batch uses
        auto job = job_;
        const size_t from = total_ * (index + 1) / parts_, to = total_ * (index + 2) / parts_;
        lock.unlock();
        copy_range(job, from, to);
        lock.lock();
        if (--pending_ == 0) done_cv_.notify_all();
    }
}

}  // namespace ferry_shm
