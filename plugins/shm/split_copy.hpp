// The mapped path's copies (shared_client.cpp): a batch of memcpy's split by bytes between the
// submitting thread and helper threads, so one initiator uses the cores a serving side would
// otherwise have used for it. Helpers start on first use; a caller that finds them busy (another
// thread's batch) copies alone rather than wait.
#pragma once

#include <condition_variable>
#include <cstddef>
#include <cstdint>
#include <mutex>
#include <span>
#include <thread>
#include <vector>

namespace ferry_shm {

class SplitCopier {
public:
    struct Piece {
        uint8_t *dst;
        const uint8_t *src;
        size_t len;
    };
    // Below this many bytes in all, the caller copies alone (a handoff costs more than it saves).
    static constexpr size_t kMinSplit = 512 << 10;

    SplitCopier() = default;
    SplitCopier(const SplitCopier &) = delete;
    SplitCopier &operator=(const SplitCopier &) = delete;
    ~SplitCopier();
    // Copies every piece, with up to `helpers` helper threads; returns when all are copied.
    void copy(std::span<const Piece> pieces, unsigned helpers);

private:
    void helper_loop(unsigned index);
    static void copy_range(std::span<const Piece> pieces, size_t from, size_t to);

    std::mutex use_mu_;  // one batch at a time on the helpers
    std::mutex mu_;
    std::condition_variable work_cv_, done_cv_;
    std::vector<std::thread> threads_;
    std::span<const Piece> job_;
    size_t total_ = 0;
    unsigned parts_ = 0, pending_ = 0;
    uint64_t generation_ = 0;
    bool stop_ = false;
};

}  // namespace ferry_shm
