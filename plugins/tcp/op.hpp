// An op posted by submit and the slices it is cut into. An op completes once all its slices
// have finished; the first failing slice decides its status and message.
#pragma once

#include "region_table.hpp"
#include "wire.hpp"

#include <ferry/plugin.h>

#include <atomic>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <vector>

namespace ferry_tcp {

struct OpBlock;

struct Op {
    uint64_t user_data = 0;
    RegionTable *table = nullptr;
    Region *local = nullptr;   // reference held until the op completes
    OpBlock *block = nullptr;  // the allocation this op lives in
    std::atomic<uint32_t> remaining{0};
    std::atomic<bool> failed{false};
    int status = 0;                   // written by the first failing slice only
    char message[FERRY_MESSAGE_MAX];  // idem (read only when status != 0: not cleared)
};

// The ops of one submit to one peer, allocated together (one allocation per batch, not per
// op); freed when its last op completed.
struct OpBlock {
    explicit OpBlock(size_t n) : live(n), ops(new Op[n]) {
        for (size_t i = 0; i < n; ++i) ops[i].block = this;
    }
    std::atomic<size_t> live;
    std::unique_ptr<Op[]> ops;
};

struct Slice {
    Op *op = nullptr;
    uint8_t opcode = FERRY_OP_READ;
    uint64_t local_addr = 0;
    uint64_t remote_addr = 0;
    uint64_t len = 0;
    bool copy_only = false;         // the kernel cannot reference the source pages: send by copy
    uint64_t id = 0;                // request id, set by the lane
    uint8_t hdr[kHeaderSize] = {};  // encoded request, set by the lane
};

// Finishes one slice; the op's last slice releases the local region and appends the completion
// to `done` (a reactor's list, or the list of a thread that drove a lane itself). Thread safe
// across slices of one op on different lanes.
void finish_slice(std::vector<ferry_completion_t> &done, Op *op, int status, const char *message);

}  // namespace ferry_tcp
