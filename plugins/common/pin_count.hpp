// How many ops are using a registered region right now, so deregistration can wait for them:
// pin() before an op touches the region (false once it is retired), unpin() when the op is done;
// retire_and_wait() refuses new pins and returns once the last one is gone.
#pragma once

#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <mutex>

namespace ferry_plugin {

class PinCount {
public:
    bool pin() {
        std::lock_guard lock(mu_);
        if (!live_) return false;
        ++users_;
        return true;
    }
    void unpin() {
        std::lock_guard lock(mu_);
        if (--users_ == 0) cv_.notify_all();
    }
    // Waits for the last user; every 5 s of waiting calls still_waiting(users) (to log why).
    template <class F>
    void retire_and_wait(F &&still_waiting) {
        std::unique_lock lock(mu_);
        live_ = false;
        while (users_ != 0)
            if (!cv_.wait_for(lock, std::chrono::seconds(5), [&] { return users_ == 0; })) still_waiting(users_);
    }
    void retire_and_wait() {
        retire_and_wait([](uint64_t) {});
    }

private:
    std::mutex mu_;
    std::condition_variable cv_;
    uint64_t users_ = 0;
    bool live_ = true;
};

}  // namespace ferry_plugin
