// GPU IPC transport shared by cuda_ipc.so and hip_ipc.so: device memory of processes on one
// host, moved by the GPU's own copy path through runtime IPC mappings.
//
// Registration exports an IPC handle for the allocation holding the region plus the region's
// offset in it, so sub-buffers of one allocation work. An importer opens each allocation once
// and shares the mapping among all regions in it. Copies run asynchronously on a pool of
// streams per device. The small ops of one submit on one device go to the copy kernel
// (copy_kernel.cu), one run per kKernelTableOps of them followed by one event (a launch whose
// table is copied before it, or, where the launch can carry it, a launch per kInlineTableOps);
// the others are cut into contiguous runs (one per stream for large ops, all on one stream for
// small ones; at most kMaxRunOps ops each), each run queued with the runtime's batched copy
// where it has one and followed by one event. A completion thread waits on those events in submission order
// and reports each run's ops at once, with one eventfd signal. Every runtime call restores the
// caller's current device. Block lists (ipc_blocks.cpp) name KV pages once: a transfer of them
// by index is planned from resolved addresses (or written straight into launch entries) and
// reported with one completion.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include "ferry/plugin.h"
#include "gpu_runtime.hpp"
#include "plugin_util.hpp"

namespace ferry_gpu {

// export_mem bytes: what a peer needs to map one registered region.
struct RegionKey {
    IpcHandle handle;
    uint64_t owner_pid = 0;
    uint64_t alloc_base = 0;  // allocation start in the owner's address space
    uint64_t alloc_size = 0;
    int32_t device = -1;  // owner's device ordinal
};
inline constexpr size_t kRegionKeyBytes = kIpcHandleBytes + 8 + 8 + 8 + 4;
inline constexpr uint32_t kEndpointMagic = 0x46475049;  // "FGPI"
// Most ops behind one event: a long batch still completes in steps, not all at its very end.
inline constexpr size_t kMaxRunOps = 64;
// Ops of at least this size on average are spread over the device's streams, smaller ones not.
inline constexpr uint64_t kSpreadOpBytes = 4 << 20;
// Most ops in one run of the copy kernel behind one event, and in one launch whose table is
// copied (128 KiB, pinned and on the device).
inline constexpr size_t kKernelTableOps = 4096;

// Which ops the copy kernel (copy_kernel.cu) takes instead of the copy engines: those of up to
// max_op_bytes, when a submit has at least two of them for one device; each launch on at most
// max_blocks thread blocks (0: one per 64 KiB chunk), which bounds the SMs it takes from the
// application's kernels. max_op_bytes 0: never. table_in_launch: where the runtime and GPU
// allow, each launch carries its table in its parameters (no table copy ahead of it).
struct KernelPolicy {
    uint64_t max_op_bytes = 0;
    uint32_t max_blocks = 0;
    bool table_in_launch = true;
};

class IpcTransport {
public:
    using Clock = std::chrono::steady_clock;
    // poll_window: how long after a submit the completion fd stays readable while copies are in
    // flight, so the host keeps calling poll() (which queries the events itself) instead of
    // sleeping until the completion thread wakes it; 0: never.
    IpcTransport(std::unique_ptr<Runtime> runtime, const ferry_host_api_t *host, const char *name,
                 size_t streams_per_device, std::chrono::microseconds poll_window = {}, KernelPolicy kernel = {});
    ~IpcTransport();

    int start(ferry_error_t *err);
    int export_endpoint(void *buf, size_t *len, ferry_error_t *err);
    int register_mem(const ferry_mem_region_t *region, uint64_t *handle, ferry_error_t *err);
    int deregister_mem(uint64_t handle, ferry_error_t *err);
    int export_mem(uint64_t handle, void *buf, size_t *len, ferry_error_t *err);
    int connect(const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err);
    int disconnect(uint64_t peer, ferry_error_t *err);
    int import_mem(uint64_t peer, const ferry_mem_region_t *region, const void *desc, size_t len, uint64_t *handle,
                   ferry_error_t *err);
    int release_mem(uint64_t peer, uint64_t handle, ferry_error_t *err);
    int submit(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err);
    int create_block_list(uint32_t side, uint64_t peer, const ferry_block_t *blocks, size_t n, uint64_t *list,
                          ferry_error_t *err);
    int destroy_block_list(uint64_t list, ferry_error_t *err);
    int submit_blocks(uint64_t peer, uint32_t opcode, uint64_t local_list, const uint32_t *local_index,
                      uint64_t remote_list, const uint32_t *remote_index, size_t n, uint64_t user_data,
                      ferry_error_t *err);
    // ABI 1.6: copies within this process on `device` (a staging slice's gather or scatter),
    // queued like a block transfer's pairs: one completion for all.
    int copy_local(int device, const ferry_local_copy_t *copies, size_t n, uint64_t user_data, ferry_error_t *err);
    int poll(ferry_completion_t *out, size_t max);
    int completion_fd() const { return cq_.fd(); }

private:
    struct LocalRegion {
        ferry_mem_region_t region;
        RegionKey key;
    };
    struct Mapping {  // one opened allocation of a peer
        void *mapped = nullptr;
        int opened_on = -1;
        size_t users = 0;
    };
    struct Import {
        uint64_t peer = 0;
        ferry_mem_region_t region;                  // in the peer's address space
        std::pair<uint64_t, uint64_t> mapping_key;  // (peer pid, alloc base)
        uint8_t *alloc_mapped = nullptr;            // alloc_base as seen here
        uint64_t alloc_base = 0;
        int device = -1;  // device the mapping lives on
    };
    struct Peer {
        uint64_t pid = 0;
    };
    // A copy kernel's table: pinned for the host to fill, on the device for the kernel to read.
    struct TableSlot {
        void *host = nullptr;
        void *device_table = nullptr;
        int device = -1;
    };
    // A block transfer's runs report one completion: the last of them (runs are reported in
    // submission order) carries it, with the first failure of any.
    struct BlockGroup {
        uint64_t user_data = 0;
        int status = 0;
        std::string message;
    };
    // One run of ops on one stream behind one event: they complete (or fail) together.
    struct Pending {
        Event event = nullptr;
        std::vector<uint64_t> user_data;
        uint64_t seq = 0;                   // tells the completion thread whether poll() reported the run meanwhile
        TableSlot table;                    // a kernel run's table, free again once the event completed
        std::shared_ptr<BlockGroup> group;  // a block transfer's run: user_data stays empty
        bool reports_group = false;         // its group's last run
    };
    // Blocks as this process addresses them (a remote list's in the peer's mapping), all on one
    // device, checked once (ipc_blocks.cpp).
    struct BlockList {
        uint32_t side = FERRY_BLOCKS_LOCAL;
        uint64_t peer = 0;
        int device = -1;
        uint32_t access = 0;           // remote: the rights every block's region grants
        std::vector<uint64_t> addr;    // per block
        std::vector<uint64_t> length;  // per block
        uint64_t max_length = 0;       // of its blocks
        std::vector<uint64_t> mems;    // the region handles it uses, sorted
        bool stale = false;            // one of them was deregistered or released since
    };
    struct Planned {
        void *dst;
        const void *src;
        size_t bytes;
        int device;
        uint64_t user_data;
    };

    int fail(ferry_error_t *err, int code, const std::string &message) const;
    int streams_for(int device, std::vector<Stream> *&out, std::string &error);
    int acquire_event(Event &event, std::string &error);
    // Queues ops of one device on the copy engines: spread over its streams when large, in runs
    // of at most kMaxRunOps behind one event each.
    void issue_copies(const Planned *ops, size_t n, int device, std::vector<Pending> &queued);
    void issue_run(const Planned *ops, size_t n, Stream stream, std::vector<Pending> &queued);
    // Queues ops of one device (at most kKernelTableOps) as one copy kernel launch; where that
    // cannot start, the copy engines take them, and the device's kernel is off from then on.
    void issue_kernel_run(const Planned *ops, size_t n, int device, Stream stream, std::vector<Pending> &queued);
    // inline_launches_ made ready for n entries, added in order: entry i to launch
    // i / kInlineTableOps (mu_ held).
    void inline_begin(size_t n);
    // The same with the tables in the launches: fills inline_launches_ from the ops, then
    // launch_inline.
    void issue_inline_run(const Planned *ops, size_t n, int device, Stream stream, std::vector<Pending> &queued);
    // Launches entries [first, first + n) of inline_launches_ (first: a multiple of
    // kKernelTableOps), a launch each, behind one event; `ops`: the planned ops they came from,
    // or null for a block transfer's. Where a launch cannot start, the rest go the table-copy
    // way, as do later ones on that device.
    void launch_inline(size_t first, size_t n, int device, Stream stream, const Planned *ops,
                       std::vector<Pending> &queued);
    // A block transfer whose n entries submit_blocks wrote into inline_launches_: their launches
    // on the device's first stream, one completion, `user_data`, for all (mu_ held).
    int queue_inline_group(size_t n, int device, uint64_t user_data, ferry_error_t *err);
    // Hands queued runs to the completion side (a group's last one reports it).
    void publish(std::vector<Pending> &queued);
    // Thread blocks for a launch of `chunks` chunks: the cap, or one a chunk.
    uint32_t launch_blocks(uint64_t chunks) const;
    // Queues planned ops (checked, in any order) by device: the copy kernel or the copy
    // engines. Fails before anything is queued, else queues all (a failure of one op then
    // completes it with its error).
    int queue_plan(std::vector<Planned> &plan, ferry_error_t *err);
    // queue_plan with one completion, `user_data`, for all of the plan (mu_ held).
    int queue_group(std::vector<Planned> &plan, uint64_t user_data, ferry_error_t *err);
    // An op failed before anything of it was queued: its completion, or its block group's.
    void fail_unqueued(uint64_t user_data, int status, const std::string &message);
    // Marks the block lists that use region handle `mem` stale (mu_ held).
    void stale_block_lists(uint64_t mem);
    // A run popped off the queue (pending_mu_ held): folds a block group's run into the group,
    // leaving in `user_data`, `status` and `message` what to report (nothing for a group's
    // earlier runs).
    static void settle_group(Pending &run, int &status, std::string &message);
    // Records the event behind a queued run and hands it to the completion side.
    void finish_run(Pending &&run, Stream stream, std::vector<Pending> &queued);
    // Whether the copy kernel runs on `device`: loads it on first ask (mu_ held).
    bool kernel_ready(int device);
    int acquire_table(int device, TableSlot &slot, std::string &error);
    // Puts a finished run's event and table back for reuse (pending_mu_ held).
    void recycle_locked(Pending &run);
    void push_completions(const std::vector<uint64_t> &user_data, int status, const std::string &message);
    void push_completion(uint64_t user_data, int status, const std::string &message) {
        push_completions({user_data}, status, message);
    }
    void completion_loop();
    // Reports the runs at the head of the queue whose events have completed, without waiting:
    // the caller of poll() sees a finished run at once, with no handoff from the completion
    // thread. True while copies are still in flight within the poll window.
    bool reap_finished();

    std::unique_ptr<Runtime> rt_;
    const Logger log_;
    const char *name_;
    const size_t streams_per_device_;
    const std::chrono::microseconds poll_window_;
    const uint64_t pid_;

    std::mutex mu_;  // regions, peers, imports, mappings, streams, peer access
    std::map<uint64_t, LocalRegion> regions_;
    std::map<uint64_t, Peer> peers_;
    std::map<uint64_t, Import> imports_;
    std::map<std::pair<uint64_t, uint64_t>, Mapping> mappings_;
    std::map<int, std::vector<Stream>> streams_;
    std::map<std::pair<int, int>, int> peer_access_;  // (device, peer) -> result
    uint64_t next_handle_ = 1;
    std::atomic<uint64_t> next_stream_{0};
    bool copy_batch_ = false;  // the runtime's batched copy, until it first fails
    const KernelPolicy kernel_;
    std::map<int, int> kernel_state_;            // device -> 0: the copy kernel runs there, < 0: it does not
    std::map<int, bool> kernel_inline_;          // device -> its launches carry their tables
    std::vector<InlineLaunch> inline_launches_;  // launches' parameters, built in place (mu_ held)
    std::map<uint64_t, BlockList> block_lists_;
    std::shared_ptr<BlockGroup> issuing_group_;  // set while submit_blocks or copy_local queues its runs

    std::mutex pending_mu_;
    std::condition_variable pending_cv_;
    std::deque<Pending> pending_;
    uint64_t next_seq_ = 1;
    Clock::time_point poll_until_{};  // end of the poll window of the last submit
    std::vector<Event> free_events_;
    std::vector<TableSlot> free_tables_;
    bool stopping_ = false;
    std::thread completion_thread_;

    CompletionQueue cq_;  // finished copies, for poll() and completion_fd
};

}  // namespace ferry_gpu
