// Registered memory of one instance: the local handles used by submit, and the server-side
// lookup that is the security boundary for remote requests.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>
#include <string>
#include <unordered_map>

namespace ferry_tcp {

struct Region {
    uint64_t handle = 0;
    uint64_t addr = 0;
    uint64_t len = 0;
    uint32_t access = 0;  // FERRY_ACCESS_REMOTE_* granted to peers
    uint32_t kind = 0;    // ferry_mem_kind_t: not host memory is never dereferenced (staged)
    int32_t device_id = -1;
    std::atomic<uint64_t> refs{0};
    std::atomic<bool> removed{false};  // set once remove() has started
};

class RegionTable {
public:
    RegionTable() = default;
    RegionTable(const RegionTable &) = delete;
    RegionTable &operator=(const RegionTable &) = delete;

    uint64_t add(uint64_t addr, uint64_t len, uint32_t access, uint32_t kind = 0, int32_t device_id = -1);

    // Makes the handle unknown at once (later lookups fail), then waits until every transfer
    // holding a reference on the region has released it. Returns false for an unknown handle.
    bool remove(uint64_t handle);

    // Serving side: a region that contains all of [addr, addr+len) and grants `need`. Takes a
    // reference (release() it). On refusal returns nullptr, *code = -EFAULT (no region holds
    // the range) or -EACCES (a region holds it without the right), *why = the reason.
    Region *acquire_remote(uint64_t addr, uint64_t len, uint32_t need, int *code, std::string *why);

    // Initiator side: the region of `handle`, which must contain [addr, addr+len).
    Region *acquire_local(uint64_t handle, uint64_t addr, uint64_t len, int *code, std::string *why);

    void release(Region *r);

    bool contains(uint64_t handle);

private:
    std::shared_mutex mu_;  // guards the maps
    std::unordered_map<uint64_t, std::unique_ptr<Region>> by_handle_;
    std::multimap<uint64_t, Region *> by_addr_;
    uint64_t max_len_ = 0;  // longest region ever added: bounds the backwards scan
    uint64_t next_handle_ = 1;

    std::atomic<unsigned> waiters_{0};  // remove() calls waiting for references to drop
    std::mutex wait_mu_;
    std::condition_variable wait_cv_;
};

}  // namespace ferry_tcp
