#include "regions.hpp"

#include "plugin_util.hpp"

#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cinttypes>

namespace ferry_shm {

Region::~Region() {
    if (memfd.fd >= 0) close(memfd.fd);
}

void Region::retire_and_wait(const Logger &log) {
    pins_.retire_and_wait([&](uint64_t users) {
        log.log(FERRY_LOG_WARN,
                "deregister of [0x%" PRIx64 ", +%" PRIu64 ") waits for %" PRIu64
                " op(s) still using it (a peer that is stopped keeps them)",
                addr, length, users);
    });
}

uint64_t RegionTable::add(uint64_t addr, uint64_t length, uint32_t access, MemfdBacking memfd, uint32_t kind,
                          int32_t device_id, SharedBacking shared) {
    auto r = std::make_shared<Region>();
    r->shared = std::move(shared);
    r->kind = kind;
    r->device_id = device_id;
    r->addr = addr;
    r->length = length;
    r->access = access;
    r->memfd = memfd;
    std::unique_lock lock(mu_);
    r->handle = next_++;
    by_handle_[r->handle] = r;
    by_addr_.emplace(addr, r);
    return r->handle;
}

std::shared_ptr<Region> RegionTable::remove(uint64_t handle) {
    std::unique_lock lock(mu_);
    auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) return nullptr;
    auto r = it->second;
    by_handle_.erase(it);
    auto range = by_addr_.equal_range(r->addr);
    for (auto a = range.first; a != range.second; ++a)
        if (a->second == r) {
            by_addr_.erase(a);
            break;
        }
    r->shared.revoke();  // under the lock: find_shared never hands out a revoked region's memfd
    return r;
}

std::shared_ptr<Region> RegionTable::find_shared(uint64_t addr, uint64_t len) const {
    std::shared_lock lock(mu_);
    for (auto it = by_addr_.upper_bound(addr); it != by_addr_.begin();) {
        --it;
        if (it->second->shared.valid() && it->second->contains(addr, len)) return it->second;
    }
    return nullptr;
}

std::shared_ptr<Region> RegionTable::find(uint64_t handle) const {
    std::shared_lock lock(mu_);
    auto it = by_handle_.find(handle);
    return it == by_handle_.end() ? nullptr : it->second;
}

int RegionTable::lookup_pin(uint64_t addr, uint64_t len, uint32_t need, std::shared_ptr<Region> *out) const {
    std::shared_lock lock(mu_);
    int rc = -EFAULT;
    // Every region starting at or below addr may hold the range (regions may overlap).
    for (auto it = by_addr_.upper_bound(addr); it != by_addr_.begin();) {
        --it;
        const auto &r = it->second;
        if (!r->contains(addr, len)) continue;
        if ((r->access & need) != need) {
            rc = -EACCES;
            continue;
        }
        if (r->pin()) {
            *out = r;
            return 0;
        }
    }
    return rc;
}

}  // namespace ferry_shm
