// Registered local regions. The same table serves both roles: the serving side looks requests
// up by address (and refuses what no region with the right access covers); the initiator
// checks its ops' local ranges by handle. A region in use is pinned (users > 0) and
// deregistration waits for the pins to go.
#pragma once

#include "memfd.hpp"
#include "pin_count.hpp"

#include <condition_variable>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <shared_mutex>

namespace ferry_plugin {
class Logger;
}

namespace ferry_shm {

using ferry_plugin::Logger;  // (regions.hpp does not include the kit)

struct Region {
    uint64_t handle = 0, addr = 0, length = 0;
    uint32_t access = 0;
    uint32_t kind = 0;  // ferry_mem_kind_t: device memory is only ever staged (never touched)
    int32_t device_id = -1;
    MemfdBacking memfd;    // set when the region was moved into a memfd (closed with the region)
    SharedBacking shared;  // a managed buffer (register_mem_fd): its memfd, handed to peers
    Region() = default;
    Region(const Region &) = delete;
    Region &operator=(const Region &) = delete;
    ~Region();

    bool contains(uint64_t a, uint64_t len) const { return a >= addr && len <= length && a - addr <= length - len; }
    bool pin() { return pins_.pin(); }  // false once retired
    void unpin() { pins_.unpin(); }
    // Refuses new pins, then waits until the last one is gone (logging every few seconds).
    void retire_and_wait(const Logger &log);

private:
    ferry_plugin::PinCount pins_;
};

class RegionTable {
public:
    uint64_t add(uint64_t addr, uint64_t length, uint32_t access, MemfdBacking memfd = {}, uint32_t kind = 0,
                 int32_t device_id = -1, SharedBacking shared = {});
    // nullptr when unknown. A managed region's liveness word is 0 once this returns.
    std::shared_ptr<Region> remove(uint64_t handle);
    // The managed region (one with a memfd for peers) holding [addr, +len), or nullptr.
    std::shared_ptr<Region> find_shared(uint64_t addr, uint64_t len) const;
    std::shared_ptr<Region> find(uint64_t handle) const;
    // Finds and pins the region holding [addr, +len) with `need` access: 0, -EFAULT (no live
    // region holds it) or -EACCES (one does, without that right).
    int lookup_pin(uint64_t addr, uint64_t len, uint32_t need, std::shared_ptr<Region> *out) const;

private:
    mutable std::shared_mutex mu_;
    uint64_t next_ = 1;
    std::map<uint64_t, std::shared_ptr<Region>> by_handle_;
    std::multimap<uint64_t, std::shared_ptr<Region>> by_addr_;
};

}  // namespace ferry_shm
