// Buffers the engine allocates to share (Engine::alloc_shared): a sealed memfd mapped
// MAP_SHARED. The mapping and the descriptor live here until free_shared or the engine's end.
#pragma once

#include <cstdint>
#include <map>
#include <mutex>
#include <string>

#include "ferry/result.hpp"
#include "util/fd.hpp"

namespace ferry {

struct SharedBuffer {
    Fd fd;
    uint64_t length = 0;      // what was asked, rounded up to pages (the registered region)
    uint64_t map_length = 0;  // length + the plugins' page (ferry_plugin_v1_t.register_mem_fd)
};

// A memfd of `length` bytes rounded up to pages plus one page, fully allocated, sealed
// (F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_SEAL) and mapped read-write, shared. *addr: the mapping.
Result<SharedBuffer> make_shared_buffer(uint64_t length, void **addr);
void unmap_shared_buffer(void *addr, const SharedBuffer &b);

class SharedBuffers {
public:
    ~SharedBuffers();  // unmaps what was never freed (after the transports are gone)
    void add(void *addr, SharedBuffer b);
    // The buffer at exactly addr, removed from the table; false when there is none.
    bool take(void *addr, SharedBuffer *out);
    // Its descriptor, -1 when addr starts no buffer.
    int fd_of(void *addr, uint64_t *length) const;

private:
    mutable std::mutex mu_;
    std::map<uintptr_t, SharedBuffer> by_addr_;
};

}  // namespace ferry
