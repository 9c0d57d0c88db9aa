// What the GPU IPC transport's files share: the guard that keeps the caller's current device,
// and addresses as messages print them.
#pragma once

#include <cinttypes>
#include <cstdio>
#include <string>

#include "gpu_runtime.hpp"

namespace ferry_gpu {

// Restores the caller's current device when it goes out of scope: the application's device
// choice is never changed behind its back.
class DeviceGuard {
public:
    explicit DeviceGuard(Runtime &rt) : rt_(rt) {
        std::string ignored;
        ok_ = rt_.current_device(saved_, ignored) == 0;
    }
    ~DeviceGuard() {
        std::string ignored;
        if (ok_) rt_.set_device(saved_, ignored);
    }

private:
    Runtime &rt_;
    int saved_ = 0;
    bool ok_ = false;
};

inline std::string hex(uint64_t v) {
    char buf[24];
    snprintf(buf, sizeof buf, "0x%" PRIx64, v);
    return buf;
}

}  // namespace ferry_gpu
