// State of efa.so's staged device memory (docs/GPU_IPC.md, "efa.so"): a target that has no FI_HMEM
// serves a peer's READ of, and WRITE into, its GPU memory through pinned host buffers the host
// lends (plugin.h ABI 1.1 stage_*), one slice at a time:
//   initiator                               target
//   StageRead/StageWrite{id, addr, len} ->  checks the range against its staged regions
//                                        <- StageGrant{id, slice, offset, len, rma_addr, key}
//                                           READ: once the slice was copied device -> buffer;
//                                           WRITE: once an empty buffer is borrowed
//   fi_read / fi_write of the slice
//   StageDone{id, slice}                 -> READ: buffer back to the host; WRITE: buffer ->
//                                           device copy
//                                        <- StageAck{id, status} (WRITE: all copies ended;
//                                           either: a failure, with its message)
// Every grant has an MR of its own, closed when the slice is done: a key must not outlive the
// grant, because the host lends the same buffer to other transfers afterwards.
#pragma once

#include "memory.hpp"
#include "plugin_util.hpp"
#include "staged_device.hpp"

#include <chrono>
#include <cstdint>
#include <deque>
#include <memory>
#include <string>
#include <vector>

namespace ferry_efa {

// An initiator keeps at most this many staged requests at one target (the rest wait locally);
// a target serves at most twice that per peer (control messages may overtake each other) and
// kMaxStagedServed for all peers together, refusing more with StageAck(-EBUSY).
inline constexpr unsigned kMaxStagedPerRemote = 32;
inline constexpr unsigned kMaxStagedServedPerRemote = 2 * kMaxStagedPerRemote;
inline constexpr size_t kMaxStagedServed = 1024;
// Grants one staged op may have unfinished at once (a target lends at most its window depth).
inline constexpr size_t kMaxGrantsInFlight = 16;
// A target that sent nothing this long while our staged requests wait on it is asked whether
// it is still there (a Hello); so is an initiator that leaves a grant untaken this long.
inline constexpr auto kStageSilence = std::chrono::seconds(1);

// The initiator's side of one staged op.
struct StagedInit {
    uint64_t id = 0;  // request id at the target
    uint64_t local_addr = 0, remote_addr = 0, length = 0;
    bool sent = false;     // the request went out (counted in Remote::stage_inflight)
    bool over = false;     // the target answered it (StageAck)
    bool gone = false;     // the target is unreachable
    bool acked = false;    // WRITE: StageAck(0) came
    bool waiting = false;  // in Remote::stage_wait
    uint32_t grants = 0;   // slices granted so far
    uint64_t granted = 0;  // bytes granted so far (grants are back to back)
    uint64_t landed = 0;   // bytes whose RMA completed
    struct Grant {
        uint32_t slice;
        uint64_t len;
        uint32_t left;  // pieces still with the provider or to post
    };
    std::deque<Grant> open;  // grants whose RMA is not done yet
};

// The target's side: one granted or copying slice.
struct ServeSlot {
    uint32_t idx = 0;
    uint64_t off = 0, len = 0;
    ferry_staged::SlicePtr s;
    fid_mr *mr = nullptr;  // the grant's own registration of the buffer
    enum class St { Copying, Granted, Writing } st = St::Copying;
    Clock::time_point granted_at{};
};

struct ServeReq {
    uint64_t id = 0;
    bool write = false;
    std::shared_ptr<LocalRegion> region;  // pinned while the request lives
    uint64_t addr = 0, len = 0;
    uint64_t next_off = 0;  // first byte without a slice yet
    uint32_t next_idx = 0, granted_idx = 0;
    std::deque<ServeSlot> slots;
    bool failed = false, answered = false;
    int status = 0;
    std::string why;
};

// One peer's staged requests, served in order through one window (ferry_staged::kDefaultDepth
// buffers at most).
struct Serving {
    std::unique_ptr<ferry_staged::StageWindow> window;
    std::deque<ServeReq> reqs;
    Clock::time_point heard{};  // its last request or StageDone (or our last Hello to it)
};

}  // namespace ferry_efa
