#include "region_table.hpp"

#include "plugin_util.hpp"

#include <ferry/plugin.h>

#include <cerrno>

namespace ferry_tcp {

namespace {
const char *access_name(uint32_t need) { return need == FERRY_ACCESS_REMOTE_WRITE ? "remote write" : "remote read"; }
}  // namespace

uint64_t RegionTable::add(uint64_t addr, uint64_t len, uint32_t access, uint32_t kind, int32_t device_id) {
    auto r = std::make_unique<Region>();
    r->kind = kind;
    r->device_id = device_id;
    r->addr = addr;
    r->len = len;
    r->access = access;
    std::unique_lock lk(mu_);
    r->handle = next_handle_++;
    uint64_t h = r->handle;
    by_addr_.emplace(addr, r.get());
    if (len > max_len_) max_len_ = len;
    by_handle_.emplace(h, std::move(r));
    return h;
}

bool RegionTable::remove(uint64_t handle) {
    std::unique_ptr<Region> r;
    {
        std::unique_lock lk(mu_);
        auto it = by_handle_.find(handle);
        if (it == by_handle_.end()) return false;
        r = std::move(it->second);
        by_handle_.erase(it);
        auto [b, e] = by_addr_.equal_range(r->addr);
        for (; b != e; ++b) {
            if (b->second == r.get()) {
                by_addr_.erase(b);
                break;
            }
        }
        // Set under the exclusive lock: no new reference can be taken from here on.
        r->removed.store(true);
    }
    waiters_.fetch_add(1);
    {
        std::unique_lock lk(wait_mu_);
        wait_cv_.wait(lk, [&] { return r->refs.load() == 0; });
    }
    waiters_.fetch_sub(1);
    return true;
}

Region *RegionTable::acquire_remote(uint64_t addr, uint64_t len, uint32_t need, int *code, std::string *why) {
    const char *what = access_name(need);
    if (len == 0 || addr + len < addr) {
        *code = -EFAULT;
        *why = strprintf("%s of %llu bytes at 0x%llx refused: the range wraps the address space", what,
                         static_cast<unsigned long long>(len), static_cast<unsigned long long>(addr));
        return nullptr;
    }
    const uint64_t end = addr + len;
    bool found_without_right = false;
    Region *no_right = nullptr;
    {
        std::shared_lock lk(mu_);
        auto it = by_addr_.upper_bound(addr);  // first region starting after addr
        while (it != by_addr_.begin()) {
            --it;
            Region *r = it->second;
            if (addr - r->addr >= max_len_) break;  // neither r nor any region starting before it can reach addr
            if (r->addr <= addr && end <= r->addr + r->len) {
                if ((r->access & need) == need) {
                    r->refs.fetch_add(1);
                    return r;
                }
                found_without_right = true;
                no_right = r;
            }
        }
        if (found_without_right) {
            *code = -EACCES;
            *why = strprintf(
                "%s of %llu bytes at 0x%llx refused: region [0x%llx, 0x%llx) is "
                "not registered for %s",
                what, static_cast<unsigned long long>(len), static_cast<unsigned long long>(addr),
                static_cast<unsigned long long>(no_right->addr),
                static_cast<unsigned long long>(no_right->addr + no_right->len), what);
            return nullptr;
        }
    }
    *code = -EFAULT;
    *why = strprintf(
        "%s of %llu bytes at 0x%llx refused: [0x%llx, 0x%llx) is not inside one "
        "registered region",
        what, static_cast<unsigned long long>(len), static_cast<unsigned long long>(addr),
        static_cast<unsigned long long>(addr), static_cast<unsigned long long>(end));
    return nullptr;
}

Region *RegionTable::acquire_local(uint64_t handle, uint64_t addr, uint64_t len, int *code, std::string *why) {
    std::shared_lock lk(mu_);
    auto it = by_handle_.find(handle);
    if (it == by_handle_.end()) {
        *code = -EINVAL;
        *why = strprintf("local_mem %llu is not a registered region of this instance",
                         static_cast<unsigned long long>(handle));
        return nullptr;
    }
    Region *r = it->second.get();
    if (addr < r->addr || addr + len < addr || addr + len > r->addr + r->len) {
        *code = -EFAULT;
        *why = strprintf(
            "local range [0x%llx, +%llu) is outside local region %llu "
            "[0x%llx, 0x%llx)",
            static_cast<unsigned long long>(addr), static_cast<unsigned long long>(len),
            static_cast<unsigned long long>(handle), static_cast<unsigned long long>(r->addr),
            static_cast<unsigned long long>(r->addr + r->len));
        return nullptr;
    }
    r->refs.fetch_add(1);
    return r;
}

bool RegionTable::contains(uint64_t handle) {
    std::shared_lock lk(mu_);
    return by_handle_.count(handle) != 0;
}

void RegionTable::release(Region *r) {
    // r may be freed by remove() as soon as the count drops: touch only the table afterwards.
    // Both sides use sequentially consistent atomics, so either remove() sees zero references
    // or this sees its waiter count.
    if (r->refs.fetch_sub(1) == 1 && waiters_.load() > 0) {
        std::lock_guard lk(wait_mu_);
        wait_cv_.notify_all();
    }
}

}  // namespace ferry_tcp
