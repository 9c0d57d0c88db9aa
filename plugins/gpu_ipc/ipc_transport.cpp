#include "ipc_transport.hpp"

#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

namespace ferry_gpu {
namespace {

// Restores the caller's current device when it goes out of scope: the application's device
// choice is never changed behind its back.
class DeviceGuard {
public:
    explicit DeviceGuard(Runtime &rt) : rt_(rt) {
        std::string ignored;
        ok_ = rt_.current_device(saved_, ignored) == 0;
    }
    ~DeviceGuard() {
        std::string ignored;
        if (ok_) rt_.set_device(saved_, ignored);
    }

private:
    Runtime &rt_;
    int saved_ = 0;
    bool ok_ = false;
};

std::string hex(uint64_t v) {
    char buf[24];
    snprintf(buf, sizeof buf, "0x%" PRIx64, v);
    return buf;
}

void put64(uint8_t *&p, uint64_t v) {
    put_le64(p, v);
    p += 8;
}
uint64_t get64(const uint8_t *&p) {
    uint64_t v = get_le64(p);
    p += 8;
    return v;
}

}  // namespace

IpcTransport::IpcTransport(std::unique_ptr<Runtime> runtime, const ferry_host_api_t *host, const char *name,
                           size_t streams_per_device, std::chrono::microseconds poll_window, KernelPolicy kernel)
    : rt_(std::move(runtime)),
      log_(host, name),
      name_(name),
      streams_per_device_(streams_per_device),
      poll_window_(poll_window),
      pid_(static_cast<uint64_t>(getpid())),
      kernel_(kernel) {}

IpcTransport::~IpcTransport() {
    {
        std::lock_guard lock(pending_mu_);
        stopping_ = true;
    }
    pending_cv_.notify_all();
    if (completion_thread_.joinable()) completion_thread_.join();
    std::string ignored;
    for (auto &p : pending_) rt_->event_destroy(p.event);
    for (auto e : free_events_) rt_->event_destroy(e);
    for (auto &p : pending_)
        if (p.table.host) free_tables_.push_back(p.table);
    for (auto &t : free_tables_) rt_->table_free(t.host, t.device_table);
    for (auto &[key, m] : mappings_)
        if (m.mapped && key.first != pid_) rt_->ipc_close(m.mapped, ignored);
    for (auto &[dev, streams] : streams_)
        for (auto s : streams) rt_->stream_destroy(s);
}

int IpcTransport::fail(ferry_error_t *err, int code, const std::string &message) const {
    return set_error(err, code, "%s: %s", name_, message.c_str());
}

int IpcTransport::start(ferry_error_t *) {
    copy_batch_ = rt_->has_copy_batch();
    log_.log(FERRY_LOG_DEBUG, "%s",
             copy_batch_ ? "copies of a run go to the runtime's batched copy in one call"
                         : "copying op by op (this runtime has no batched copy)");
    completion_thread_ = std::thread([this] { completion_loop(); });
    return 0;
}

int IpcTransport::export_endpoint(void *buf, size_t *len, ferry_error_t *err) {
    const size_t need = 12;
    if (*len < need) {
        *len = need;
        return fail(err, -ENOSPC, "endpoint needs 12 bytes");
    }
    auto *p = static_cast<uint8_t *>(buf);
    memcpy(p, &kEndpointMagic, 4);
    memcpy(p + 4, &pid_, 8);
    *len = need;
    return 0;
}

int IpcTransport::register_mem(const ferry_mem_region_t *r, uint64_t *handle, ferry_error_t *err) {
    if (r->kind != rt_->memory_kind())
        return fail(err, -ENOTSUP, std::string(name_) + " moves only " + rt_->name() + " device memory");
    std::string e;
    DeviceGuard guard(*rt_);
    int device = -1;
    bool is_device = false;
    if (int rc = rt_->pointer_device(reinterpret_cast<void *>(r->addr), device, is_device, e)) return fail(err, rc, e);
    if (!is_device)
        return fail(err, -EINVAL,
                    "[" + hex(r->addr) + ", +" + std::to_string(r->length) + ") is not " + rt_->name() +
                        " device memory; register it as host memory");
    if (r->device_id >= 0 && r->device_id != device)
        return fail(err, -EINVAL,
                    hex(r->addr) + " lives on device " + std::to_string(device) + ", not on device " +
                        std::to_string(r->device_id) + " as registered");
    // The driver's range query needs a current context: the caller may hold none (memory from
    // the driver API, or registered from a thread other than the allocating one).
    if (int rc = rt_->set_device(device, e)) return fail(err, rc, e);
    uintptr_t base = 0;
    size_t size = 0;
    if (int rc = rt_->allocation_range(reinterpret_cast<void *>(r->addr), base, size, e)) return fail(err, rc, e);
    if (r->addr + r->length > base + size)
        return fail(err, -EINVAL,
                    "[" + hex(r->addr) + ", +" + std::to_string(r->length) + ") runs past the end of its " +
                        rt_->name() + " allocation [" + hex(base) + ", +" + std::to_string(size) + ")");
    LocalRegion reg{*r, {}};
    reg.region.device_id = device;
    if (int rc = rt_->ipc_export(reinterpret_cast<void *>(base), reg.key.handle, e)) return fail(err, rc, e);
    reg.key.owner_pid = pid_;
    reg.key.alloc_base = base;
    reg.key.alloc_size = size;
    reg.key.device = device;
    std::lock_guard lock(mu_);
    uint64_t h = next_handle_++;
    regions_[h] = reg;
    *handle = h;
    // The copy kernel is compiled for this device now (a JIT of some milliseconds, once), not in
    // the first transfer's submit.
    if (kernel_.max_op_bytes) kernel_ready(device);
    return 0;
}

int IpcTransport::deregister_mem(uint64_t handle, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    if (!regions_.erase(handle))
        return fail(err, -ENOENT, "no registered region with handle " + std::to_string(handle));
    // Peers map whole allocations through IPC; the owner cannot revoke a mapping it handed
    // out, which is why the engine only publishes regions the application chose to share.
    return 0;
}

int IpcTransport::export_mem(uint64_t handle, void *buf, size_t *len, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    auto it = regions_.find(handle);
    if (it == regions_.end()) return fail(err, -ENOENT, "no registered region with handle " + std::to_string(handle));
    if (*len < kRegionKeyBytes) {
        *len = kRegionKeyBytes;
        return fail(err, -ENOSPC, "region key needs " + std::to_string(kRegionKeyBytes) + " bytes");
    }
    const RegionKey &k = it->second.key;
    auto *p = static_cast<uint8_t *>(buf);
    memcpy(p, k.handle.bytes, kIpcHandleBytes);
    p += kIpcHandleBytes;
    put64(p, k.owner_pid);
    put64(p, k.alloc_base);
    put64(p, k.alloc_size);
    memcpy(p, &k.device, 4);
    *len = kRegionKeyBytes;
    return 0;
}

int IpcTransport::connect(const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err) {
    uint32_t magic = 0;
    if (len != 12 || (memcpy(&magic, endpoint, 4), magic != kEndpointMagic))
        return fail(err, -EPROTO, std::string("malformed ") + name_ + " endpoint (" + std::to_string(len) + " bytes)");
    Peer p;
    memcpy(&p.pid, static_cast<const uint8_t *>(endpoint) + 4, 8);
    std::lock_guard lock(mu_);
    uint64_t id = next_handle_++;
    peers_[id] = p;
    *peer = id;
    return 0;
}

int IpcTransport::disconnect(uint64_t peer, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    if (!peers_.erase(peer)) return fail(err, -ENOENT, "unknown peer " + std::to_string(peer));
    return 0;  // copies already queued finish: their memory stays mapped until release_mem
}

int IpcTransport::import_mem(uint64_t peer, const ferry_mem_region_t *region, const void *desc, size_t len,
                             uint64_t *handle, ferry_error_t *err) {
    if (len != kRegionKeyBytes)
        return fail(err, -EPROTO,
                    "region key is " + std::to_string(len) + " bytes, expected " + std::to_string(kRegionKeyBytes));
    RegionKey k;
    const auto *p = static_cast<const uint8_t *>(desc);
    memcpy(k.handle.bytes, p, kIpcHandleBytes);
    p += kIpcHandleBytes;
    k.owner_pid = get64(p);
    k.alloc_base = get64(p);
    k.alloc_size = get64(p);
    memcpy(&k.device, p, 4);
    if (region->addr < k.alloc_base || region->length > k.alloc_size ||
        region->addr - k.alloc_base > k.alloc_size - region->length)
        return fail(err, -EPROTO,
                    "peer region [" + hex(region->addr) + ", +" + std::to_string(region->length) +
                        ") is not inside the allocation its key names");
    std::lock_guard lock(mu_);
    auto pit = peers_.find(peer);
    if (pit == peers_.end()) return fail(err, -ENOENT, "unknown peer " + std::to_string(peer));
    if (pit->second.pid != k.owner_pid)
        return fail(err, -EPROTO, "region key belongs to another process than the peer");
    auto key = std::make_pair(k.owner_pid, k.alloc_base);
    Mapping &m = mappings_[key];
    if (!m.mapped) {
        if (k.owner_pid == pid_) {
            m.mapped = reinterpret_cast<void *>(k.alloc_base);  // our own memory: no IPC needed
            m.opened_on = k.device;
        } else {
            std::string e;
            DeviceGuard guard(*rt_);
            int count = 0;
            if (int rc = rt_->device_count(count, e)) return fail(err, rc, e);
            // Open on the caller's current device (the GPU this process copies with): with
            // lazy peer access the driver maps the peer's memory for that device's copy engines,
            // so cross-GPU copies take NVLink/PCIe peer paths instead of bouncing via the host.
            int dev = 0;
            if (int rc = rt_->current_device(dev, e)) return fail(err, rc, e);
            if (dev < 0 || dev >= count) dev = 0;
            if (int rc = rt_->set_device(dev, e)) return fail(err, rc, e);
            if (int rc = rt_->ipc_open(k.handle, m.mapped, e)) {
                mappings_.erase(key);
                return fail(err, rc, e + " (opening the peer's allocation at " + hex(k.alloc_base) + ")");
            }
            m.opened_on = dev;
        }
    }
    ++m.users;
    Import imp;
    imp.peer = peer;
    imp.region = *region;
    imp.mapping_key = key;
    imp.alloc_mapped = static_cast<uint8_t *>(m.mapped);
    imp.alloc_base = k.alloc_base;
    imp.device = m.opened_on;
    uint64_t h = next_handle_++;
    imports_[h] = imp;
    *handle = h;
    return 0;
}

int IpcTransport::release_mem(uint64_t peer, uint64_t handle, ferry_error_t *err) {
    (void)peer;
    std::lock_guard lock(mu_);
    auto it = imports_.find(handle);
    if (it == imports_.end()) return fail(err, -ENOENT, "unknown imported region " + std::to_string(handle));
    auto m = mappings_.find(it->second.mapping_key);
    if (m != mappings_.end() && --m->second.users == 0) {
        // Copies still queued on this mapping must finish before it is closed.
        {
            std::unique_lock pl(pending_mu_);
            pending_cv_.wait(pl, [&] { return pending_.empty() || stopping_; });
        }
        std::string e;
        if (m->first.first != pid_ && m->second.mapped) rt_->ipc_close(m->second.mapped, e);
        mappings_.erase(m);
    }
    imports_.erase(it);
    return 0;
}

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
    {
        std::lock_guard pl(pending_mu_);
        for (auto &q : queued) {
            q.seq = next_seq_++;
            pending_.push_back(std::move(q));
        }
        if (!queued.empty() && poll_window_.count() > 0) poll_until_ = Clock::now() + poll_window_;
    }
    pending_cv_.notify_all();
    if (!queued.empty() && poll_window_.count() > 0) cq_.signal();  // the engine's wait polls from the start
    return 0;
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
    if (rc == 0)
        log_.log(FERRY_LOG_INFO,
                 "copy kernel ready on device %d in %.1f ms: ops of up to %" PRIu64
                 " bytes are copied by one kernel launch per batch, on at most %s thread blocks",
                 device, std::chrono::duration<double, std::milli>(Clock::now() - t0).count(), kernel_.max_op_bytes,
                 kernel_.max_blocks ? std::to_string(kernel_.max_blocks).c_str() : "one per 64 KiB chunk of");
    else log_.log(FERRY_LOG_WARN, "no copy kernel on device %d, copying op by op: %s", device, e.c_str());
    return rc == 0;
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
    std::string e;
    Pending run;
    int rc = acquire_table(device, run.table, e);
    if (rc == 0) {
        auto *table = static_cast<CopyTableEntry *>(run.table.host);
        uint64_t chunks = 0;
        for (size_t i = 0; i < n; ++i) {
            table[i] = {reinterpret_cast<uintptr_t>(ops[i].src), reinterpret_cast<uintptr_t>(ops[i].dst), ops[i].bytes,
                        chunks};
            chunks += (ops[i].bytes + (uint64_t{1} << kCopyChunkShift) - 1) >> kCopyChunkShift;
        }
        const auto blocks = static_cast<uint32_t>(
            std::min<uint64_t>(kernel_.max_blocks ? std::min<uint64_t>(kernel_.max_blocks, chunks) : chunks, 65535));
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
    run.user_data.reserve(n);
    for (size_t i = 0; i < n; ++i) run.user_data.push_back(ops[i].user_data);
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
                push_completion(ops[i].user_data, rc, e);  // nothing queued for it: nothing lands
                continue;
            }
            run.user_data.push_back(ops[i].user_data);
        }
    }
    if (run.user_data.empty()) return;
    finish_run(std::move(run), stream, queued);
}

void IpcTransport::finish_run(Pending &&run, Stream stream, std::vector<Pending> &queued) {
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
    push_completions(run.user_data, rc, e);
}

void IpcTransport::completion_loop() {
    for (;;) {
        Event event;
        uint64_t seq = 0;
        {
            std::unique_lock lock(pending_mu_);
            pending_cv_.wait(lock, [&] { return stopping_ || !pending_.empty(); });
            if (pending_.empty()) return;  // stopping with nothing left
            event = pending_.front().event;
            seq = pending_.front().seq;
        }
        // Even when stopping: the copies are on the GPU already, and their memory must outlive them.
        std::string e;
        int rc = rt_->event_wait(event, e);
        Pending done;
        {
            std::lock_guard lock(pending_mu_);
            // poll() reported this run meanwhile (its event may even be in use again): next one.
            if (pending_.empty() || pending_.front().seq != seq) continue;
            done = std::move(pending_.front());
            pending_.pop_front();
            recycle_locked(done);
        }
        push_completions(done.user_data, rc, e);
        pending_cv_.notify_all();  // release_mem may be waiting for the queue to drain
    }
}

bool IpcTransport::reap_finished() {
    std::vector<Pending> done;
    std::vector<int> codes;
    std::vector<std::string> errors;
    bool keep_polling = false;
    {
        std::lock_guard lock(pending_mu_);
        auto poll_more = [&] { return !pending_.empty() && Clock::now() < poll_until_; };
        while (!pending_.empty()) {
            std::string e;
            int q = rt_->event_query(pending_.front().event, e);
            if (q == 0) break;  // still copying; so are the runs behind it, as far as we report
            done.push_back(std::move(pending_.front()));
            pending_.pop_front();
            recycle_locked(done.back());
            codes.push_back(q < 0 ? q : 0);
            errors.push_back(std::move(e));
        }
        keep_polling = poll_more();
    }
    if (!done.empty()) {
        for (size_t i = 0; i < done.size(); ++i) push_completions(done[i].user_data, codes[i], errors[i]);
        pending_cv_.notify_all();
    }
    return keep_polling;
}

// All of them under one lock and at most one eventfd signal: the engine wakes once per run.
void IpcTransport::push_completions(const std::vector<uint64_t> &user_data, int status, const std::string &message) {
    cq_.push(user_data, status, message);
}

int IpcTransport::poll(ferry_completion_t *out, size_t max) {
    size_t n = cq_.poll(out, max);
    if (n == 0) {
        bool keep_polling = reap_finished();
        n = cq_.poll(out, max);
        // Copies in flight within the poll window: the fd stays readable, so a host sleeping
        // in poll(2) on it calls again at once and sees the run the moment its event completes
        // (no wakeup from the completion thread). After the window, the thread reports it.
        if (keep_polling) cq_.signal();
    }
    return static_cast<int>(n);
}

}  // namespace ferry_gpu
