// Memory registration for efa.so. A region is registered as one or more chunks, each its own
// libfabric MR: larger than the provider's limit (option max_mr_size, or found by halving when
// a registration fails) it is split. The mr_mode bits the provider RETURNED decide everything:
// FI_MR_PROV_KEY (its keys) or application keys, FI_MR_VIRT_ADDR (remote addresses are virtual
// addresses) or offsets, FI_MR_LOCAL (descriptors for local buffers), FI_MR_ENDPOINT (bind).
#pragma once

#include "fabric.hpp"
#include "fabric_api.hpp"
#include "pin_count.hpp"
#include "plugin_util.hpp"
#include "wire.hpp"

#include <ferry/plugin.h>

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>
#include <vector>

namespace ferry_efa {

struct MrChunk {
    uint64_t addr = 0, len = 0;
    fid_mr *mr = nullptr;
    void *desc = nullptr;  // fi_mr_desc, passed for local buffers
    uint64_t key = 0;
    uint64_t rma_base = 0;
};

class LocalRegion {
public:
    uint64_t handle = 0, addr = 0, length = 0;
    uint32_t access = 0, kind = FERRY_MEM_HOST;
    int32_t device = -1;
    bool staged = false;          // device memory served through the host's staging calls: no MR
    std::vector<MrChunk> chunks;  // ascending, back to back (empty when staged)

    bool contains(uint64_t a, uint64_t len) const { return a >= addr && len <= length && a - addr <= length - len; }
    const MrChunk &chunk_at(uint64_t a) const;  // a must be inside the region
    bool pin() { return pins_.pin(); }          // false once retired
    void unpin() { pins_.unpin(); }
    void retire_and_wait(const Logger &log);

private:
    PinCount pins_;
};

// Hands out application keys (when the provider lacks FI_MR_PROV_KEY), unique per instance.
class KeySource {
public:
    explicit KeySource(size_t key_bytes);
    uint64_t next();

private:
    std::atomic<uint64_t> next_;
    uint64_t mask_;
};

// Registers r into region.chunks. On failure nothing stays registered, *why says what failed.
int register_region(Fabric &fab, uint64_t max_mr_size, KeySource &keys, const ferry_mem_region_t &r,
                    LocalRegion &region, std::string *why);
void close_region(Fabric &fab, LocalRegion &region);

// export_mem bytes of a region, and their parser (false and *why when malformed).
std::vector<uint8_t> export_chunks(const LocalRegion &region);
// *staged (when not NULL): the region is served through the owner's staging calls (kMemStaged).
bool parse_chunks(const void *bytes, size_t len, std::vector<RemoteChunk> *out, std::string *why,
                  bool *staged = nullptr);
RemoteChunk to_remote(const LocalRegion &region, const MrChunk &c);

}  // namespace ferry_efa
