// Pure planning of rdma.so, unit-tested in CI without hardware: where registrations split
// (max_mr_size), how an op becomes work requests (split at both sides' registration chunks and
// at the largest message, striped over equally near NICs by their measured throughput and queue,
// around paused ones: plugins/common/rail_balance.hpp), and which work requests are signalled
// (a send window per queue pair).
#pragma once

#include "rail_balance.hpp"

#include <cstddef>
#include <cstdint>
#include <deque>
#include <vector>

namespace ferry_rdma {

struct Span {
    uint64_t addr = 0, len = 0;
    bool operator==(const Span &) const = default;
};

// The registration size limit: the option when set (never above the device's), else the
// device's max_mr_size; rounded down to whole 4 KiB pages so chunk boundaries stay page aligned
// (dma-buf offsets must be).
uint64_t effective_mr_limit(uint64_t device_max_mr_size, uint64_t option);

// [addr, addr+len) cut into back-to-back chunks of at most `limit` bytes; boundaries fall on
// multiples of `limit` counted from addr.
std::vector<Span> plan_mr_chunks(uint64_t addr, uint64_t len, uint64_t limit);

// Index of the chunk holding addr (chunks ascending, back to back), or SIZE_MAX.
size_t chunk_index(const std::vector<Span> &chunks, uint64_t addr);

struct WrPiece {
    uint64_t local_addr = 0, remote_addr = 0, len = 0;
    uint32_t local_chunk = 0, remote_chunk = 0;
    uint16_t local_nic = 0, remote_nic = 0;
    bool operator==(const WrPiece &) const = default;
};

struct WrPlanInput {
    uint64_t local_addr = 0, remote_addr = 0, len = 0;
    const std::vector<Span> *local_chunks = nullptr;   // the local region's registrations
    const std::vector<Span> *remote_chunks = nullptr;  // the imported region's registrations
    std::vector<uint16_t> local_nics;                  // nearest the local memory, best first (non-empty)
    std::vector<uint16_t> remote_nics;                 // the owner's NICs nearest the remote memory (non-empty)
    uint64_t stripe_min = 1u << 20;                    // stripe only ops of at least 2x this
    uint64_t max_wr_size = 1u << 30;                   // and the ports' max_msg_sz
    uint32_t rotation = 0;                             // where ties start, so equal NICs take turns
    // The other local NICs (the memory is registered on every NIC): used only while every one
    // of local_nics is paused.
    std::vector<uint16_t> other_nics;
    // Per local NIC, indexed by its number: bytes queued on it, its measured throughput, and
    // whether it takes new work (RailBalancer::loads; nullptr, or NICs past its end: idle,
    // unknown throughput, usable).
    const std::vector<RailLoad> *nic_load = nullptr;
};

// Work requests for one op (ranges already validated to lie inside the chunks). The candidates
// are the usable NICs of local_nics in rotation order (none usable: those of other_nics; none
// of those either: local_nics, the probe). Ops of at least 2 x stripe_min are cut into page-
// aligned stripes of >= stripe_min over up to as many candidates, sized so that every NIC
// finishes its stripe at the same time given its queue and throughput (split_by_finish; equal
// NICs get equal stripes); smaller ops go whole to the NIC that will finish them first
// (earliest_finish; equal NICs: the rotation's). A stripe on local_nics[j] goes to the remote
// NIC round robin would have paired with it; each stripe is then split at chunk boundaries on
// either side and at max_wr_size.
std::vector<WrPiece> plan_work_requests(const WrPlanInput &in);

// Selective signalling for one RC send queue. Completions of an RC queue pair arrive in order,
// so a signalled work request's completion retires every earlier one: only the last work
// request of each op on the queue (its completion finishes the op's part there) and one in
// every `interval` (so send-queue slots come back while long ops run) are signalled.
class SendWindow {
public:
    SendWindow(uint32_t depth, uint32_t interval);
    uint32_t depth() const { return depth_; }
    uint32_t in_flight() const { return static_cast<uint32_t>(posted_.size()); }
    // Room for one more, keeping a slot for a forced signal when the run is about to hit the
    // depth without one.
    bool can_post() const { return posted_.size() < depth_; }
    // Whether the next work request must be signalled (it is the last of its op on this queue,
    // or the unsignalled run reached the interval, or the queue would fill up without one).
    bool must_signal(bool last_of_op) const;
    // Records a posted work request; returns its sequence number (its wr_id).
    uint64_t post(bool signalled);
    // A signalled completion for `seq`: retires it and everything before it. Returns how many
    // were retired (0 for an unknown or unsignalled seq: a bug or a stale completion).
    uint32_t complete(uint64_t seq);
    // An error completion for `seq` (errors complete even unsignalled requests): every earlier
    // request succeeded and is retired (*before = how many), `seq` itself is removed. False for
    // an unknown seq (a flush of a queue already handled).
    bool fail(uint64_t seq, uint32_t *before);
    // Forgets the newest `n` posts (ibv_post_send refused them).
    void rollback(uint32_t n);
    // Everything in flight, oldest first (after a queue error: flushed, never executed).
    std::vector<uint64_t> drain();

private:
    struct Posted {
        uint64_t seq;
        bool signalled;
    };
    uint32_t depth_, interval_;
    uint32_t run_ = 0;  // unsignalled since the last signalled
    uint64_t next_ = 1;
    std::deque<Posted> posted_;
};

}  // namespace ferry_rdma
