// Submitting copies on the GPU IPC transport: a submit is checked whole, then each device's ops
// go to the copy kernel (the small ones) or to the copy engines (in runs on the device's
// streams, batched where the runtime can), each run behind one event.
#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cinttypes>

#include "ipc_transport.hpp"
#include "ipc_util.hpp"

namespace ferry_gpu {

int IpcTransport::streams_for(int device, std::vector<Stream> *&out, std::string &error) {
    auto &streams = streams_[device];
    if (streams.empty()) {
        if (int rc = rt_->set_device(device, error)) return rc;
        for (size_t i = 0; i < streams_per_device_; ++i) {
            Stream s;
            if (int rc = rt_->stream_create(s, error)) return rc;
            streams.push_back(s);
        }
    }
    out = &streams;
    return 0;
}

int IpcTransport::acquire_event(Event &event, std::string &error) {
    {
        std::lock_guard lock(pending_mu_);
        if (!free_events_.empty()) {
            event = free_events_.back();
            free_events_.pop_back();
            return 0;
        }
    }
    return rt_->event_create(event, error);
}

int IpcTransport::submit(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err) {
    std::vector<Planned> plan;
    plan.reserve(n);
    std::lock_guard lock(mu_);
    if (!peers_.count(peer)) return fail(err, -ENOENT, "unknown peer " + std::to_string(peer));
    // Validate everything first: submit is all-or-nothing.
    // KV-cache batches name the same two regions op after op: the previous op's lookups are
    // reused while its handles repeat (no hash lookup per op).
    auto lr = regions_.end();
    auto im = imports_.end();
    for (size_t i = 0; i < n; ++i) {
        const auto &op = ops[i];
        if (lr == regions_.end() || lr->first != op.local_mem) lr = regions_.find(op.local_mem);
        if (im == imports_.end() || im->first != op.remote_mem) im = imports_.find(op.remote_mem);
        if (lr == regions_.end() || im == imports_.end() || im->second.peer != peer)
            return fail(err, -EINVAL, "op " + std::to_string(i) + ": unknown local or remote memory handle");
        const auto &l = lr->second.region;
        const auto &r = im->second.region;
        if (op.length == 0 || op.local_addr < l.addr || op.length > l.length ||
            op.local_addr - l.addr > l.length - op.length)
            return fail(err, -EFAULT, "op " + std::to_string(i) + ": local range outside its registered region");
        if (op.remote_addr < r.addr || op.length > r.length || op.remote_addr - r.addr > r.length - op.length)
            return fail(err, -EFAULT,
                        "op " + std::to_string(i) + ": remote range [" + hex(op.remote_addr) + ", +" +
                            std::to_string(op.length) + ") outside the peer's registered region");
        uint32_t need = op.opcode == FERRY_OP_READ ? FERRY_ACCESS_REMOTE_READ : FERRY_ACCESS_REMOTE_WRITE;
        if (!(r.access & need))
            return fail(err, -EACCES, "op " + std::to_string(i) + ": the peer did not grant that access");
        void *remote = im->second.alloc_mapped + (op.remote_addr - im->second.alloc_base);
        void *local = reinterpret_cast<void *>(op.local_addr);
        bool read = op.opcode == FERRY_OP_READ;
        plan.push_back({read ? local : remote, read ? remote : local, op.length, l.device_id, op.user_data});
        // Copies run on the local device; it needs peer access to a mapping on another GPU.
        int mapped_dev = im->second.device;
        if (mapped_dev >= 0 && mapped_dev != l.device_id) {
            auto key = std::make_pair(l.device_id, mapped_dev);
            auto pa = peer_access_.find(key);
            if (pa == peer_access_.end()) {
                std::string e;
                DeviceGuard guard(*rt_);
                int rc = rt_->enable_peer_access(l.device_id, mapped_dev, e);
                if (rc) log_.log(FERRY_LOG_WARN, "%s", e.c_str());
                pa = peer_access_.emplace(key, rc).first;
            }
            if (pa->second != 0)
                return fail(err, pa->second,
                            "op " + std::to_string(i) + ": device " + std::to_string(l.device_id) +
                                " has no peer access to device " + std::to_string(mapped_dev));
        }
    }
    return queue_plan(plan, err);
}

int IpcTransport::copy_local(int device, const ferry_local_copy_t *copies, size_t n, uint64_t user_data,
                             ferry_error_t *err) {
    std::vector<Planned> plan(n);
    for (size_t i = 0; i < n; ++i) {
        const auto &c = copies[i];
        if (c.length == 0 || c.dst == 0 || c.src == 0)
            return fail(err, -EINVAL, "copy " + std::to_string(i) + ": needs a length and both addresses");
        plan[i] = {reinterpret_cast<void *>(c.dst), reinterpret_cast<const void *>(c.src), c.length, device, 0};
    }
    std::lock_guard lock(mu_);
    return queue_group(plan, user_data, err);
}

int IpcTransport::queue_group(std::vector<Planned> &plan, uint64_t user_data, ferry_error_t *err) {
    // queue_plan gives every run it queues this group, and the last one its completion.
    issuing_group_ = std::make_shared<BlockGroup>();
    issuing_group_->user_data = user_data;
    int rc = queue_plan(plan, err);
    issuing_group_.reset();
    return rc;
}

int IpcTransport::queue_plan(std::vector<Planned> &plan, ferry_error_t *err) {
    DeviceGuard guard(*rt_);
    std::string e;
    int current = -1;
    for (auto &p : plan) {
        if (p.device == current) continue;
        std::vector<Stream> *streams = nullptr;
        if (int rc = streams_for(p.device, streams, e)) return fail(err, rc, e);
        if (int rc = rt_->set_device(p.device, e)) return fail(err, rc, e);
        current = p.device;
    }
    // From here on an op that cannot start completes with its error instead: earlier ones are
    // already queued on the GPU. Ops of one device are cut into contiguous runs, one event each.
    std::vector<Pending> queued;
    for (size_t begin = 0; begin < plan.size();) {
        size_t end = begin;
        while (end < plan.size() && plan[end].device == plan[begin].device) ++end;
        const int device = plan[begin].device;
        rt_->set_device(device, e);
        size_t copies = begin;
        if (kernel_.max_op_bytes && kernel_ready(device)) {
            // Small ops go to the copy kernel, a launch per kKernelTableOps of them; one alone
            // costs less as a single copy than as a table copy and a launch. The ops of a submit
            // are unordered, so a plain partition (no allocation, unlike a stable one) will do.
            auto small_end =
                std::partition(plan.begin() + static_cast<ptrdiff_t>(begin), plan.begin() + static_cast<ptrdiff_t>(end),
                               [&](const Planned &p) { return p.bytes <= kernel_.max_op_bytes; });
            const size_t small = static_cast<size_t>(small_end - plan.begin()) - begin;
            if (small >= 2) {
                // Every launch on the device's first stream: launches of batches in flight run
                // one after another, so the block cap bounds the SMs copies take at any moment.
                Stream s = streams_[device][0];
                for (size_t a = begin; a < begin + small; a += kKernelTableOps)
                    issue_kernel_run(plan.data() + a, std::min(kKernelTableOps, begin + small - a), device, s, queued);
                copies = begin + small;
            }
        }
        if (copies < end) issue_copies(plan.data() + copies, end - copies, device, queued);
        begin = end;
    }
    publish(queued);
    return 0;
}

int IpcTransport::queue_inline_group(size_t n, int device, uint64_t user_data, ferry_error_t *err) {
    DeviceGuard guard(*rt_);
    std::string e;
    std::vector<Stream> *streams = nullptr;
    if (int rc = streams_for(device, streams, e)) return fail(err, rc, e);
    if (int rc = rt_->set_device(device, e)) return fail(err, rc, e);
    issuing_group_ = std::make_shared<BlockGroup>();
    issuing_group_->user_data = user_data;
    std::vector<Pending> queued;
    for (size_t a = 0; a < n; a += kKernelTableOps)
        launch_inline(a, std::min(kKernelTableOps, n - a), device, (*streams)[0], nullptr, queued);
    publish(queued);
    issuing_group_.reset();
    return 0;
}

void IpcTransport::publish(std::vector<Pending> &queued) {
    if (issuing_group_) {
        // Before the runs are visible to the completion side, which may report them at once.
        if (!queued.empty()) queued.back().reports_group = true;
        else push_completion(issuing_group_->user_data, issuing_group_->status, issuing_group_->message);
    }
    bool was_empty = false;
    {
        std::lock_guard pl(pending_mu_);
        was_empty = pending_.empty();
        for (auto &q : queued) {
            q.seq = next_seq_++;
            pending_.push_back(std::move(q));
        }
        if (!queued.empty() && poll_window_.count() > 0) poll_until_ = Clock::now() + poll_window_;
    }
    // Only an empty queue has the completion thread waiting for runs (behind others it waits
    // for the head's event, or stands back for the poll window, whose end it sees itself).
    if (was_empty && !queued.empty()) pending_cv_.notify_all();
    if (!queued.empty() && poll_window_.count() > 0) cq_.signal();  // the engine's wait polls from the start
}

void IpcTransport::issue_copies(const Planned *ops, size_t n, int device, std::vector<Pending> &queued) {
    uint64_t bytes = 0;
    for (size_t i = 0; i < n; ++i) bytes += ops[i].bytes;
    // Large ops gain from several streams (copy engines in parallel); small ones lose by it
    // (H200: 64 KiB ops on 4 streams 0.76x of raw batches, on one 1.04x), so they share one.
    const size_t streams = bytes / n >= kSpreadOpBytes ? std::min(streams_per_device_, n) : 1;
    const size_t runs = std::max(streams, (n + kMaxRunOps - 1) / kMaxRunOps);
    const uint64_t first = next_stream_.fetch_add(streams);
    for (size_t r = 0; r < runs; ++r) {
        size_t a = n * r / runs, b = n * (r + 1) / runs;
        Stream s = streams_[device][(first + r % streams) % streams_per_device_];
        issue_run(ops + a, b - a, s, queued);
    }
}

bool IpcTransport::kernel_ready(int device) {
    auto it = kernel_state_.find(device);
    if (it != kernel_state_.end()) return it->second == 0;
    std::string e;
    DeviceGuard guard(*rt_);
    auto t0 = Clock::now();
    int rc = rt_->copy_kernel_load(device, e);
    kernel_state_[device] = rc;
    if (rc != 0) {
        log_.log(FERRY_LOG_WARN, "no copy kernel on device %d, copying op by op: %s", device, e.c_str());
        return false;
    }
    std::string why = std::string(name_) + ".kernel_table_in_launch is off";
    const bool in_launch = kernel_.table_in_launch && rt_->copy_kernel_inline(device, why);
    kernel_inline_[device] = in_launch;
    log_.log(FERRY_LOG_INFO,
             "copy kernel ready on device %d in %.1f ms: ops of up to %" PRIu64
             " bytes are copied by one kernel launch per batch, on at most %s thread blocks; %s%s",
             device, std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), kernel_.max_op_bytes,
             kernel_.max_blocks ? std::to_string(kernel_.max_blocks).c_str() : "one per 64 KiB chunk of",
             in_launch ? "each launch carries its table" : "each launch's table is copied before it: ",
             in_launch ? "" : why.c_str());
    return true;
}

uint32_t IpcTransport::launch_blocks(uint64_t chunks) const {
    return static_cast<uint32_t>(
        std::min<uint64_t>(kernel_.max_blocks ? std::min<uint64_t>(kernel_.max_blocks, chunks) : chunks, 65535));
}

void IpcTransport::inline_begin(size_t n) {
    inline_launches_.resize((n + kInlineTableOps - 1) / kInlineTableOps);
    for (auto &l : inline_launches_) l.n = l.chunks = 0;
}

void IpcTransport::issue_inline_run(const Planned *ops, size_t n, int device, Stream stream,
                                    std::vector<Pending> &queued) {
    inline_begin(n);
    for (size_t i = 0; i < n; ++i)
        inline_launches_[i / kInlineTableOps].add(reinterpret_cast<uintptr_t>(ops[i].src),
                                                  reinterpret_cast<uintptr_t>(ops[i].dst), ops[i].bytes);
    launch_inline(0, n, device, stream, ops, queued);
}

void IpcTransport::launch_inline(size_t first, size_t n, int device, Stream stream, const Planned *ops,
                                 std::vector<Pending> &queued) {
    static_assert(kKernelTableOps % kInlineTableOps == 0, "a run starts a launch");
    std::string e;
    size_t done = 0;
    while (done < n && kernel_inline_[device]) {
        const InlineLaunch &launch = inline_launches_[(first + done) / kInlineTableOps];
        if (rt_->copy_kernel_launch_inline(device, launch, launch_blocks(launch.chunks), stream, e)) {
            log_.log(FERRY_LOG_WARN,
                     "copy kernel with its table in the launch failed to start on device %d; copying each launch's "
                     "table before it from now on: %s",
                     device, e.c_str());
            kernel_inline_[device] = false;
            break;
        }
        done += launch.n;
    }
    if (done > 0) {
        Pending run;
        if (!issuing_group_) {  // a block transfer's runs report through their group instead
            run.user_data.reserve(done);
            for (size_t i = 0; i < done; ++i) run.user_data.push_back(ops[i].user_data);
        }
        finish_run(std::move(run), stream, queued);
    }
    if (done == n) return;
    // The rest go the table-copying way: as planned ops (a block transfer's, rebuilt from the
    // entries, report through their group).
    std::vector<Planned> rest;
    if (ops) rest.assign(ops + done, ops + n);
    else
        for (size_t i = first + done; i < first + n; ++i) {
            const InlineCopyOp &op = inline_launches_[i / kInlineTableOps].ops[i % kInlineTableOps];
            rest.push_back(
                {reinterpret_cast<void *>(op.dst), reinterpret_cast<const void *>(op.src), op.bytes, device, 0});
        }
    issue_kernel_run(rest.data(), rest.size(), device, stream, queued);
}

int IpcTransport::acquire_table(int device, TableSlot &slot, std::string &error) {
    {
        std::lock_guard lock(pending_mu_);
        for (auto it = free_tables_.begin(); it != free_tables_.end(); ++it)
            if (it->device == device) {
                slot = *it;
                free_tables_.erase(it);
                return 0;
            }
    }
    slot.device = device;
    return rt_->table_alloc(kKernelTableOps * sizeof(CopyTableEntry), slot.host, slot.device_table, error);
}

void IpcTransport::recycle_locked(Pending &run) {
    if (run.event) free_events_.push_back(run.event);
    if (run.table.host) free_tables_.push_back(run.table);
    run.event = nullptr;
    run.table = {};
}

void IpcTransport::issue_kernel_run(const Planned *ops, size_t n, int device, Stream stream,
                                    std::vector<Pending> &queued) {
    if (kernel_inline_[device]) return issue_inline_run(ops, n, device, stream, queued);
    std::string e;
    Pending run;
    int rc = acquire_table(device, run.table, e);
    if (rc == 0) {
        auto *table = static_cast<CopyTableEntry *>(run.table.host);
        uint64_t chunks = 0;
        for (size_t i = 0; i < n; ++i) {
            table[i] = {reinterpret_cast<uintptr_t>(ops[i].src), reinterpret_cast<uintptr_t>(ops[i].dst), ops[i].bytes,
                        chunks};
            chunks += copy_chunks(ops[i].bytes);
        }
        const uint32_t blocks = launch_blocks(chunks);
        rc = rt_->copy_async(run.table.device_table, run.table.host, n * sizeof(CopyTableEntry), stream, e);
        if (rc == 0) {
            rc = rt_->copy_kernel_launch(device, run.table.device_table, static_cast<uint32_t>(n), chunks, blocks,
                                         stream, e);
            // The table's copy is queued: its slot is free once that ended.
            std::string ignored;
            if (rc != 0) rt_->stream_wait(stream, ignored);
        }
    }
    if (rc != 0) {
        {
            std::lock_guard lock(pending_mu_);
            recycle_locked(run);
        }
        // Nothing of these ops is queued: the copy engines take them, and all later ones.
        log_.log(FERRY_LOG_WARN, "copy kernel on device %d failed to start, copying op by op from now on: %s", device,
                 e.c_str());
        kernel_state_[device] = rc;
        issue_copies(ops, n, device, queued);
        return;
    }
    if (!issuing_group_) {  // a block transfer's runs report through their group instead
        run.user_data.reserve(n);
        for (size_t i = 0; i < n; ++i) run.user_data.push_back(ops[i].user_data);
    }
    finish_run(std::move(run), stream, queued);
}

void IpcTransport::issue_run(const Planned *ops, size_t n, Stream stream, std::vector<Pending> &queued) {
    std::string e;
    Pending run;
    run.user_data.reserve(n);
    bool batched = false;
    if (copy_batch_ && n > 1) {
        std::vector<void *> dsts(n);
        std::vector<const void *> srcs(n);
        std::vector<size_t> sizes(n);
        for (size_t i = 0; i < n; ++i) dsts[i] = ops[i].dst, srcs[i] = ops[i].src, sizes[i] = ops[i].bytes;
        if (rt_->copy_batch(dsts.data(), srcs.data(), sizes.data(), n, stream, e) == 0) {
            batched = true;
            for (size_t i = 0; i < n; ++i) run.user_data.push_back(ops[i].user_data);
        } else {
            // Which copies it queued is unknown: let those end (an op refused below is then
            // reported only once nothing of it can still land), queue each one again (the same
            // bytes to the same places), and stop batching.
            log_.log(FERRY_LOG_WARN, "%s; copying op by op from now on", e.c_str());
            copy_batch_ = false;
            std::string ignored;
            rt_->stream_wait(stream, ignored);
        }
    }
    if (!batched) {
        for (size_t i = 0; i < n; ++i) {
            if (int rc = rt_->copy_async(ops[i].dst, ops[i].src, ops[i].bytes, stream, e)) {
                fail_unqueued(ops[i].user_data, rc, e);  // nothing queued for it: nothing lands
                continue;
            }
            run.user_data.push_back(ops[i].user_data);
        }
    }
    if (run.user_data.empty()) return;
    finish_run(std::move(run), stream, queued);
}

void IpcTransport::fail_unqueued(uint64_t user_data, int status, const std::string &message) {
    if (!issuing_group_) return push_completion(user_data, status, message);
    if (issuing_group_->status == 0) issuing_group_->status = status, issuing_group_->message = message;
}

void IpcTransport::finish_run(Pending &&run, Stream stream, std::vector<Pending> &queued) {
    if (issuing_group_) {
        run.group = issuing_group_;
        run.user_data.clear();  // the group's one completion stands for its ops
    }
    std::string e;
    int rc = acquire_event(run.event, e);
    if (rc == 0) rc = rt_->event_record(run.event, stream, e);
    if (rc == 0) {
        queued.push_back(std::move(run));
        return;
    }
    // Copies are queued but nothing can tell when they end: wait for the stream here, so the
    // ops are reported failed only once no byte of theirs can still land.
    std::string ignored;
    rt_->stream_wait(stream, ignored);
    {
        std::lock_guard lock(pending_mu_);
        recycle_locked(run);
    }
    if (run.group) return fail_unqueued(0, rc, e);
    push_completions(run.user_data, rc, e);
}

}  // namespace ferry_gpu
