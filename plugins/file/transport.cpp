#include "transport.hpp"

#include <sys/eventfd.h>
#include <sys/uio.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry_file {

namespace {

// The kernel takes fixed buffers of up to 1 GiB each: a larger region gets one slot per GiB, and
// a request that crosses a GiB boundary inside it goes without.
constexpr unsigned kSlotShift = 30;
constexpr uint64_t kSlotBytes = uint64_t{1} << kSlotShift;
constexpr unsigned kMaxSlots = 16384;  // IORING_MAX_REG_BUFFERS

// Each request may take a linked timeout with it: two entries, two completions.
unsigned ring_entries(const Config &cfg) { return cfg.queue_depth * (cfg.op_timeout_ms ? 2 : 1); }

const char *fix_for(int code) {
    switch (code) {
        case -ENOSPC: return "; free space on the file's filesystem, or write elsewhere";
        case -EDQUOT: return "; the user's disk quota is used up";
        case -EFBIG: return "; the file would grow past its size limit (RLIMIT_FSIZE or the filesystem's)";
        case -EIO: return "; the device reported an I/O error (see the kernel log, dmesg)";
        case -EBADF: return "; the file was opened read-only (this process may not write it)";
        default: return "";
    }
}

}  // namespace

int Transport::probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result) {
    Config cfg;
    ferry_error_t err{};
    if (parse_config(options, n, &cfg, &err) != 0) {
        result->available = 0;
        copy_message(result->reason, err.message);
        return 0;
    }
    io_uring ring{};
    int rc = io_uring_queue_init(2, &ring, 0);
    if (rc < 0) {
        result->available = 0;
        copy_message(result->reason, strprintf("io_uring_setup failed: %s%s", errno_string(-rc).c_str(),
                                               rc == -EPERM || rc == -ENOSYS
                                                   ? " (io_uring disabled: kernel.io_uring_disabled, seccomp, or a "
                                                     "kernel older than 5.6)"
                                                   : "")
                                         .c_str());
        return 0;
    }
    io_uring_queue_exit(&ring);
    result->available = 1;
    copy_message(result->reason, "io_uring (liburing); O_DIRECT where aligned; storage segments file:<path>");
    return 0;
}

Transport::Transport(const Config &cfg, const ferry_host_api_t *host) : cfg_(cfg), log_(host, kName) {}

int Transport::create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err) {
    Config cfg;
    if (int rc = parse_config(options, n, &cfg, err)) return rc;
    std::unique_ptr<Transport> t(new Transport(cfg, host));
    if (int rc = t->init(err)) return rc;
    *out = t.release();
    return 0;
}

int Transport::init(ferry_error_t *err) {
    efd_ = ::eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    if (efd_ < 0) return set_error(err, -errno, "file: eventfd: %s", errno_string(errno).c_str());
    io_uring_params params{};
    params.flags = IORING_SETUP_CQSIZE;
    params.cq_entries = ring_entries(cfg_) * 2;
    if (int rc = io_uring_queue_init_params(ring_entries(cfg_), &ring_, &params); rc < 0)
        return set_error(err, rc, "file: io_uring_setup(%u entries): %s", ring_entries(cfg_),
                         errno_string(-rc).c_str());
    ring_ok_ = true;
    if (int rc = io_uring_register_eventfd(&ring_, efd_); rc < 0)
        return set_error(err, rc, "file: io_uring_register_eventfd: %s", errno_string(-rc).c_str());
    if (cfg_.fixed_buffers) {
        // A sparse table, filled as regions register (Linux 5.19; older kernels go without).
        int rc = io_uring_register_buffers_sparse(&ring_, kMaxSlots);
        fixed_ok_ = rc == 0;
        if (!fixed_ok_)
            log_.log(FERRY_LOG_INFO, "fixed buffers unavailable (%s): requests pin their pages each time",
                     errno_string(-rc).c_str());
        else
            for (unsigned i = kMaxSlots; i-- > 0;) free_slots_.push_back(i);  // slot 0 first
    }
    uint64_t ms = cfg_.op_timeout_ms;
    timeout_.tv_sec = static_cast<int64_t>(ms / 1000);
    timeout_.tv_nsec = static_cast<long long>(ms % 1000) * 1000000;
    return 0;
}

Transport::~Transport() {
    if (ring_ok_) {
        std::lock_guard lock(mu_);
        // The kernel may still be writing into callers' memory: cancel what it holds and wait for
        // every request to end before the ring (and the caller's buffers) go away.
        for (auto *p : pending_) finish_locked(p, -ECANCELED, "");
        pending_.clear();
        if (inflight_) {
            if (io_uring_sqe *sqe = io_uring_get_sqe(&ring_)) {
                io_uring_prep_cancel64(sqe, 0, IORING_ASYNC_CANCEL_ANY);
                io_uring_sqe_set_data64(sqe, 0);
                io_uring_submit(&ring_);
            }
        }
        while (inflight_) {
            io_uring_cqe *cqe = nullptr;
            int rc = io_uring_wait_cqe(&ring_, &cqe);
            if (rc < 0 && rc != -EINTR && rc != -EAGAIN) break;
            reap_locked();
        }
        io_uring_queue_exit(&ring_);
    }
    if (efd_ >= 0) ::close(efd_);
}

int Transport::register_mem(const ferry_mem_region_t *r, uint64_t *handle, ferry_error_t *err) {
    if (r->kind != FERRY_MEM_HOST)
        return set_error(err, -ENOTSUP, "file: register_mem: only host memory (gds.so moves GPU memory to files)");
    auto region = std::make_unique<Region>();
    region->addr = r->addr;
    region->length = r->length;
    // Fixed buffers are registered when a request first uses each GiB of the region (slot_for):
    // the engine registers every host region with every transport, and pinning memory that never
    // meets a file would cost an engine that uses no file at all.
    if (fixed_ok_) region->slots.assign((r->length + kSlotBytes - 1) >> kSlotShift, Region::kNotYet);
    std::lock_guard lock(mu_);
    uint64_t id = next_id_++;
    regions_[id] = std::move(region);
    *handle = id;
    return 0;
}

int Transport::slot_for_locked(Region &r, uint64_t addr, uint64_t length) {
    uint64_t chunk = (addr - r.addr) >> kSlotShift;
    if (r.slots.empty() || chunk != (addr + length - 1 - r.addr) >> kSlotShift) return -1;
    int &slot = r.slots[chunk];
    if (slot != Region::kNotYet) return slot;  // a slot, or kRefused
    slot = Region::kRefused;
    if (free_slots_.empty()) return -1;
    uint64_t off = chunk << kSlotShift;
    iovec iov{reinterpret_cast<void *>(r.addr + off), std::min(kSlotBytes, r.length - off)};
    __u64 tag = 0;
    int rc = io_uring_register_buffers_update_tag(&ring_, free_slots_.back(), &iov, &tag, 1);
    if (rc < 0) {
        // Most often RLIMIT_MEMLOCK: the memory works, only without fixed buffers.
        log_.log(FERRY_LOG_INFO, "[0x%llx, +%zu) not a fixed buffer (%s): requests on it pin its pages each time",
                 static_cast<unsigned long long>(r.addr + off), iov.iov_len, errno_string(-rc).c_str());
        return -1;
    }
    slot = static_cast<int>(free_slots_.back());
    free_slots_.pop_back();
    if (log_.enabled(FERRY_LOG_DEBUG))
        log_.log(FERRY_LOG_DEBUG, "[0x%llx, +%zu) is fixed buffer %d", static_cast<unsigned long long>(r.addr + off),
                 iov.iov_len, slot);
    return slot;
}

int Transport::deregister_mem(uint64_t handle, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    auto it = regions_.find(handle);
    if (it == regions_.end())
        return set_error(err, -EINVAL, "file: deregister_mem: unknown handle %llu",
                         static_cast<unsigned long long>(handle));
    Region &r = *it->second;
    // Returns once no request touches the region: the kernel may be writing into it.
    while (r.inflight) {
        flush_locked();
        io_uring_cqe *cqe = nullptr;
        int rc = io_uring_wait_cqe(&ring_, &cqe);
        if (rc < 0 && rc != -EINTR && rc != -EAGAIN)
            return set_error(err, rc, "file: deregister_mem: waiting for the region's requests: %s",
                             errno_string(-rc).c_str());
        reap_locked();
    }
    for (int slot : r.slots) {
        if (slot < 0) continue;
        iovec none{nullptr, 0};
        __u64 tag = 0;
        (void)io_uring_register_buffers_update_tag(&ring_, static_cast<unsigned>(slot), &none, &tag, 1);
        free_slots_.push_back(static_cast<unsigned>(slot));
    }
    regions_.erase(it);
    if (!finished_.empty()) signal();
    return 0;
}

int Transport::connect(const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err) {
    std::unique_ptr<FileSet> files;
    if (int rc = FileSet::open(std::string_view(static_cast<const char *>(endpoint), len), cfg_, files, err)) return rc;
    auto seg = std::make_unique<Segment>();
    seg->files = std::move(files);
    std::lock_guard lock(mu_);
    uint64_t id = next_id_++;
    segments_[id] = std::move(seg);
    *peer = id;
    return 0;
}

int Transport::disconnect(uint64_t peer, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    auto it = segments_.find(peer);
    if (it == segments_.end())
        return set_error(err, -EINVAL, "file: disconnect: unknown segment %llu", static_cast<unsigned long long>(peer));
    it->second->closing = true;
    // Queued requests end now; the kernel's end as they do, then the files close.
    std::deque<Piece *> keep;
    for (auto *p : pending_) {
        if (p->seg == it->second.get()) finish_locked(p, -ECANCELED, describe(*p, "the segment was closed"));
        else keep.push_back(p);
    }
    pending_.swap(keep);
    close_idle_locked();
    if (!finished_.empty()) signal();
    return 0;
}

int Transport::import_mem(uint64_t peer, const ferry_mem_region_t *, const void *, size_t, uint64_t *remote_mem,
                          ferry_error_t *err) {
    std::lock_guard lock(mu_);
    auto it = segments_.find(peer);
    if (it == segments_.end() || it->second->closing)
        return set_error(err, -EINVAL, "file: import_mem: unknown segment %llu", static_cast<unsigned long long>(peer));
    *remote_mem = peer;  // the segment's one region is its offsets: nothing to look up
    return 0;
}

int Transport::submit(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    auto it = segments_.find(peer);
    if (it == segments_.end() || it->second->closing)
        return set_error(err, -EINVAL, "file: submit: segment %llu is not open", static_cast<unsigned long long>(peer));
    // All or nothing: check every op before queuing any.
    std::vector<Region *> regions(n);
    for (size_t i = 0; i < n; ++i) {
        auto r = regions_.find(ops[i].local_mem);
        if (r == regions_.end() || ops[i].local_addr < r->second->addr ||
            ops[i].local_addr + ops[i].length > r->second->addr + r->second->length)
            return set_error(err, -EINVAL, "file: submit: op %zu's local range is not inside its registered region", i);
        if (ops[i].opcode != FERRY_OP_READ && ops[i].opcode != FERRY_OP_WRITE)
            return set_error(err, -EINVAL, "file: submit: op %zu has opcode %u", i, ops[i].opcode);
        regions[i] = r->second.get();
    }
    for (size_t i = 0; i < n; ++i) plan_locked(ops[i], *it->second, *regions[i]);
    flush_locked();
    if (!finished_.empty()) signal();
    return 0;
}

std::string Transport::describe(const Piece &p, const char *what) const {
    // The host puts the plugin's name in front; the segment offset only where it differs.
    std::string seg_off =
        p.segment_offset == p.offset
            ? ""
            : strprintf(", segment offset %llu", static_cast<unsigned long long>(p.segment_offset + p.done));
    return strprintf("%s of %s at offset %llu (%llu bytes%s): %s", p.op->write ? "WRITE" : "READ", p.file->path.c_str(),
                     static_cast<unsigned long long>(p.offset + p.done),
                     static_cast<unsigned long long>(p.length - p.done), seg_off.c_str(), what);
}

void Transport::plan_locked(const ferry_xfer_op_t &x, Segment &seg, Region &region) {
    auto *op = new Op;
    op->user_data = x.user_data;
    op->write = x.opcode == FERRY_OP_WRITE;
    op->left = 1;  // held while planning, so no piece can finish the op early
    std::vector<Piece *> pieces;
    uint64_t at = 0;
    while (at < x.length) {
        Extent e = seg.files->locate(x.remote_addr + at);
        auto *p = new Piece;
        p->op = op;
        p->seg = &seg;
        p->region = &region;
        p->file = &seg.files->file(e.file);
        p->segment_offset = x.remote_addr + at;
        p->offset = e.offset;
        p->addr = reinterpret_cast<char *>(x.local_addr + at);
        p->length = std::min({x.length - at, e.run, cfg_.max_io_bytes});
        at += p->length;
        pieces.push_back(p);
    }
    for (auto *p : pieces) {
        ++op->left;
        ++seg.inflight;
        ++region.inflight;
        uint64_t a = reinterpret_cast<uint64_t>(p->addr);
        p->direct = cfg_.direct != Direct::Off && p->file->direct_ok(a, p->offset, p->length);
        p->slot = slot_for_locked(region, a, p->length);
        if (op->write && !p->file->writable) {
            finish_locked(p, -EBADF, describe(*p, "the file is open read-only: this process may not write it"));
        } else if (cfg_.direct == Direct::Require && !p->direct) {
            finish_locked(p, -EINVAL,
                          describe(*p, ("file.direct=require, but " + p->file->misalignment(a, p->offset, p->length) +
                                        "; align it or set file.direct=auto")
                                           .c_str()));
        } else {
            pending_.push_back(p);
        }
    }
    if (--op->left == 0) {
        finished_.push_back({op->user_data, op->status, op->status ? std::move(op->message) : std::string()});
        delete op;
    }
}

void Transport::flush_locked() {
    unsigned queued = 0;
    const unsigned entries = cfg_.op_timeout_ms ? 2 : 1;  // the request, and its linked timeout
    while (!pending_.empty() && inflight_ < cfg_.queue_depth && io_uring_sq_space_left(&ring_) >= entries) {
        Piece *p = pending_.front();
        io_uring_sqe *sqe = io_uring_get_sqe(&ring_);
        pending_.pop_front();
        int fd = p->direct ? p->file->direct_fd : p->file->fd;
        char *addr = p->addr + p->done;
        auto len = static_cast<unsigned>(p->length - p->done);
        uint64_t off = p->offset + p->done;
        if (p->op->write) {
            if (p->slot >= 0) io_uring_prep_write_fixed(sqe, fd, addr, len, off, p->slot);
            else io_uring_prep_write(sqe, fd, addr, len, off);
            if (cfg_.write_through) sqe->rw_flags = RWF_DSYNC;
        } else {
            if (p->slot >= 0) io_uring_prep_read_fixed(sqe, fd, addr, len, off, p->slot);
            else io_uring_prep_read(sqe, fd, addr, len, off);
        }
        io_uring_sqe_set_data(sqe, p);
        if (cfg_.op_timeout_ms) {
            sqe->flags |= IOSQE_IO_LINK;
            io_uring_sqe *t = io_uring_get_sqe(&ring_);  // the ring has two entries per request
            io_uring_prep_link_timeout(t, &timeout_, 0);
            io_uring_sqe_set_data64(t, 0);
        }
        ++inflight_;
        ++queued;
    }
    if (!queued && !io_uring_sq_ready(&ring_)) return;
    int rc;
    do rc = io_uring_submit(&ring_);
    while (rc == -EINTR);
    // What the kernel did not take (-EAGAIN, -EBUSY) stays in the ring for the next submit or
    // poll; ask the host to poll soon in case nothing in flight would wake it.
    if (io_uring_sq_ready(&ring_)) signal();
}

void Transport::reap_locked() {
    io_uring_cqe *cqe = nullptr;
    unsigned head = 0, seen = 0;
    std::vector<std::pair<Piece *, int>> done;
    io_uring_for_each_cqe(&ring_, head, cqe) {
        ++seen;
        if (auto *p = static_cast<Piece *>(io_uring_cqe_get_data(cqe))) done.emplace_back(p, cqe->res);
    }
    io_uring_cq_advance(&ring_, seen);
    for (auto [p, res] : done) {
        --inflight_;
        if (res == -EINTR || res == -EAGAIN) {
            pending_.push_front(p);  // the kernel asks to try again
        } else if (res == -ECANCELED && cfg_.op_timeout_ms) {
            finish_locked(
                p, -ETIMEDOUT,
                describe(*p,
                         strprintf("not finished after file.op_timeout_ms=%u; cancelled", cfg_.op_timeout_ms).c_str()));
        } else if (res < 0) {
            finish_locked(p, res, describe(*p, (errno_string(-res) + fix_for(res)).c_str()));
        } else if (res == 0) {
            if (p->op->write) finish_locked(p, -EIO, describe(*p, "the kernel wrote 0 bytes"));
            else
                finish_locked(p, -ENODATA,
                              describe(*p, "the file ends before it; READ only what was written, or WRITE it first"));
        } else {
            p->done += static_cast<uint64_t>(res);
            if (p->done < p->length) {
                // Short (end of file, a signal, a full device): go on from where it stopped, through
                // the page cache where the rest is no longer aligned for O_DIRECT.
                uint64_t a = reinterpret_cast<uint64_t>(p->addr + p->done);
                if (p->direct && !p->file->direct_ok(a, p->offset + p->done, p->length - p->done)) p->direct = false;
                pending_.push_front(p);
            } else {
                finish_locked(p, 0, "");
            }
        }
    }
}

void Transport::finish_locked(Piece *p, int status, const std::string &message) {
    Op *op = p->op;
    if (status && !op->status) {
        op->status = status;
        op->message = message;
    }
    --p->region->inflight;
    --p->seg->inflight;
    delete p;
    if (--op->left == 0) {
        finished_.push_back({op->user_data, op->status, op->status ? std::move(op->message) : std::string()});
        delete op;
    }
}

void Transport::close_idle_locked() {
    for (auto it = segments_.begin(); it != segments_.end();) {
        if (it->second->closing && it->second->inflight == 0) it = segments_.erase(it);
        else ++it;
    }
}

void Transport::signal() {
    uint64_t one = 1;
    (void)!::write(efd_, &one, sizeof one);
}

int Transport::poll(ferry_completion_t *out, size_t max) {
    uint64_t count = 0;
    (void)!::read(efd_, &count, sizeof count);  // first: a completion after this signals anew
    std::lock_guard lock(mu_);
    reap_locked();
    flush_locked();
    close_idle_locked();
    size_t n = std::min(max, finished_.size());
    for (size_t i = 0; i < n; ++i) {
        const Finished &f = finished_.front();
        out[i].user_data = f.user_data;
        out[i].status = f.status;
        out[i].reserved = 0;
        if (f.status) copy_message(out[i].message, f.message.c_str());
        else out[i].message[0] = '\0';
        finished_.pop_front();
    }
    if (!finished_.empty() || io_uring_cq_ready(&ring_)) signal();
    return static_cast<int>(n);
}

}  // namespace ferry_file
