// The GPU IPC transport's life and its memory: start and stop, the endpoint, local regions
// (registered, exported), peers, and the peer allocations imported and mapped. Submitting
// copies is in ipc_submit.cpp, reporting them in ipc_completions.cpp.
#include "ipc_transport.hpp"

#include <unistd.h>

#include <cerrno>
#include <cstring>

#include "ipc_util.hpp"

namespace ferry_gpu {
namespace {

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
    stale_block_lists(handle);
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
    stale_block_lists(handle);
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

}  // namespace ferry_gpu
