// file.so's transport: ops between registered host memory and the files of storage segments,
// through one io_uring. submit() cuts each op into requests (at stripe boundaries and every
// max_io_bytes), queues them and hands up to queue_depth to the kernel; poll() reaps what the
// kernel finished, resubmits what it did only in part (short reads and writes), and completes an
// op once all its requests did. The ring's eventfd is the completion fd, so the host sleeps on
// the kernel's own signal; no thread of ours runs.
#pragma once

#include <liburing.h>

#include <cstdint>
#include <deque>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <vector>

#include "files.hpp"
#include "options.hpp"
#include "plugin_util.hpp"
#include "storage_plugin.hpp"

namespace ferry_file {

struct Region {
    uint64_t addr = 0, length = 0;
    // Fixed buffers, one per GiB of the region: its slot in the ring's table, or one of these.
    static constexpr int kNotYet = -1, kRefused = -2;
    std::vector<int> slots;  // empty: no fixed buffers (fixed_buffers=false, or an old kernel)
    unsigned inflight = 0;
};

struct Segment {
    std::unique_ptr<FileSet> files;
    unsigned inflight = 0;
    bool closing = false;  // disconnect ran: closed once nothing is in flight
};

struct Op {
    uint64_t user_data = 0;
    bool write = false;
    unsigned left = 0;  // requests not yet finished
    int status = 0;     // the first failure
    std::string message;
};

// One io_uring request (part of an op), resubmitted from where it stopped when short.
struct Piece {
    Op *op = nullptr;
    Segment *seg = nullptr;
    Region *region = nullptr;
    OpenFile *file = nullptr;
    uint64_t segment_offset = 0;  // for messages
    uint64_t offset = 0;          // in the file
    char *addr = nullptr;
    uint64_t length = 0, done = 0;
    int slot = -1;  // fixed buffer index, or -1
    bool direct = false;
};

class Transport : public StoragePeerless {
public:
    static constexpr const char *kName = "file";
    static int probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result);
    static int create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err);
    ~Transport();

    int register_mem(const ferry_mem_region_t *region, uint64_t *handle, ferry_error_t *err);
    int deregister_mem(uint64_t handle, ferry_error_t *err);
    int connect(const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err);
    int disconnect(uint64_t peer, ferry_error_t *err);
    int import_mem(uint64_t peer, const ferry_mem_region_t *region, const void *desc, size_t len, uint64_t *remote_mem,
                   ferry_error_t *err);
    int submit(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err);
    int poll(ferry_completion_t *out, size_t max);
    int completion_fd() const { return efd_; }

private:
    Transport(const Config &cfg, const ferry_host_api_t *host);
    int init(ferry_error_t *err);
    // The fixed buffer holding [addr, +length) of `r`, registering its GiB on first use; -1: none.
    int slot_for_locked(Region &r, uint64_t addr, uint64_t length);
    void plan_locked(const ferry_xfer_op_t &x, Segment &seg, Region &region);
    void flush_locked();
    void reap_locked();
    void finish_locked(Piece *p, int status, const std::string &message);
    void fail_op_locked(Op *op, int status, std::string message);
    std::string describe(const Piece &p, const char *what) const;
    void close_idle_locked();
    void signal();

    Config cfg_;
    Logger log_;
    std::mutex mu_;  // everything below; the ring's queues are single-threaded
    io_uring ring_{};
    bool ring_ok_ = false;
    int efd_ = -1;
    unsigned inflight_ = 0;  // requests the kernel holds
    std::deque<Piece *> pending_;
    // Ended ops until poll() hands them over: compact (a 272-byte completion is built only in
    // the caller's array), oldest first; a message only where the op failed.
    struct Finished {
        uint64_t user_data;
        int32_t status;
        std::string message;
    };
    std::deque<Finished> finished_;
    std::unordered_map<uint64_t, std::unique_ptr<Region>> regions_;
    std::unordered_map<uint64_t, std::unique_ptr<Segment>> segments_;
    uint64_t next_id_ = 1;
    std::vector<unsigned> free_slots_;  // fixed-buffer slots of the ring's table not in use
    bool fixed_ok_ = false;             // the sparse buffer table was registered
    __kernel_timespec timeout_{};
};

}  // namespace ferry_file
