#include "staging/stage_service.hpp"

#include <cerrno>
#include <cstring>
#include <vector>

#include "util/log.hpp"

namespace ferry {

// One (kind, device): copies in start order, waited on by one thread.
struct StagingService::Lane {
    struct Pending {
        void *event;
        Done done;
    };
    GpuStager *stager = nullptr;
    int device = 0;
    std::mutex m;  // held across copy_async so the queue order is the stream order
    std::condition_variable cv;
    std::deque<Pending> queue;
    bool stop = false;
    std::thread thread;

    void run(StagingService &svc) {
        std::unique_lock lock(m);
        for (;;) {
            cv.wait(lock, [&] { return stop || !queue.empty(); });
            if (queue.empty()) return;  // stopping, and every started copy reported
            Pending p = std::move(queue.front());
            queue.pop_front();
            lock.unlock();
            auto r = stager->wait(device, p.event);
            if (!r) {
                std::lock_guard sl(svc.mutex_);
                ++svc.copy_failures_;
            }
            p.done(r ? 0 : r.error().code, r ? std::string() : r.error().message);
            lock.lock();
        }
    }
};

StagingService::StagingService(uint64_t max_bytes, uint64_t slice_bytes)
    : max_bytes_(max_bytes), slice_bytes_(slice_bytes) {}

StagingService::~StagingService() {
    stop();
    for (auto &[buf, slice] : slices_) {
        if (slice.lent) FERRY_WARN("GPU staging: a pinned slice was never given back; freeing it at shutdown");
        stagers_[slice.kind]->free_pinned(slice.device, buf);
    }
    lanes_.clear();
    stagers_.clear();
}

GpuStager *StagingService::stager(uint32_t kind, std::string &why) {
    std::lock_guard lock(mutex_);
    if (auto it = stagers_.find(kind); it != stagers_.end()) return it->second.get();
    if (auto it = stager_errors_.find(kind); it != stager_errors_.end()) {
        why = it->second;
        return nullptr;
    }
    auto s = GpuStager::open(kind, why);
    if (!s) {
        stager_errors_[kind] = why;
        return nullptr;
    }
    return (stagers_[kind] = std::move(s)).get();
}

bool StagingService::offers(uint32_t kind, std::string &why) {
    if (max_bytes_ == 0) {
        why = "GPU staging is disabled (gpu_staging_max_bytes = 0)";
        return false;
    }
    return stager(kind, why) != nullptr;
}

Result<void *> StagingService::acquire(uint32_t kind, int device) {
    std::string why;
    GpuStager *s = nullptr;
    if (!offers(kind, why) || !(s = stager(kind, why))) return fail(-ENOTSUP, "GPU staging: " + why);
    {
        std::lock_guard lock(mutex_);
        if (stopping_) return fail(-ECANCELED, "GPU staging: the engine is shutting down");
        if (lent_ + slice_bytes_ > max_bytes_) {
            ++acquire_refused_;
            return fail(-EAGAIN, cat("GPU staging: all ", max_bytes_,
                                     " bytes of pinned memory (gpu_staging_max_bytes) are lent out"));
        }
        auto &pool = free_[{kind, device}];
        lent_ += slice_bytes_;
        peak_ = std::max(peak_, lent_);
        if (!pool.empty()) {
            void *buf = pool.back();
            pool.pop_back();
            slices_[buf].lent = true;
            return buf;
        }
    }
    // A new slice: allocated outside the lock (pinning takes milliseconds).
    auto buf = s->alloc_pinned(device, slice_bytes_);
    std::lock_guard lock(mutex_);
    if (!buf) {
        lent_ -= slice_bytes_;
        return fail(buf.error().code, "GPU staging: " + buf.error().message);
    }
    slices_[*buf] = Slice{kind, device, true};
    FERRY_DEBUG("GPU staging: pinned a slice of ", slice_bytes_, " bytes; ", lent_, " bytes lent, peak ", peak_);
    return *buf;
}

void StagingService::release(void *buf, bool inline_retry) {
    {
        std::lock_guard lock(mutex_);
        auto it = slices_.find(buf);
        if (it == slices_.end() || !it->second.lent) {
            FERRY_ERROR("GPU staging: release of ", hex(reinterpret_cast<uintptr_t>(buf)),
                        ", which is not a lent slice; ignored");
            return;
        }
        it->second.lent = false;
        lent_ -= slice_bytes_;
        free_[{it->second.kind, it->second.device}].push_back(buf);
        if (!inline_retry) {
            retry_pending_ = true;
            retry_cv_.notify_one();
            return;
        }
    }
    if (on_release_) on_release_();
}

void StagingService::retry_loop() {
    std::unique_lock lock(mutex_);
    for (;;) {
        retry_cv_.wait(lock, [&] { return retry_stop_ || retry_pending_; });
        if (retry_stop_) return;
        retry_pending_ = false;
        lock.unlock();
        if (on_release_) on_release_();
        lock.lock();
    }
}

StagingService::Lane *StagingService::lane(uint32_t kind, int device, GpuStager *s) {
    std::lock_guard lock(mutex_);
    if (stopping_) return nullptr;
    auto &l = lanes_[{kind, device}];
    if (!l) {
        l = std::make_unique<Lane>();
        l->stager = s;
        l->device = device;
        Lane *raw = l.get();
        raw->thread = std::thread([this, raw] { raw->run(*this); });
    }
    return l.get();
}

Result<void> StagingService::copy(uint32_t kind, int device, void *dst, const void *src, uint64_t bytes, Done done) {
    GpuStager::CopyRange c{reinterpret_cast<uintptr_t>(dst), reinterpret_cast<uintptr_t>(src), bytes};
    return copy(kind, device, std::span(&c, 1), std::move(done));
}

Result<void> StagingService::copy(uint32_t kind, int device, std::span<const GpuStager::CopyRange> copies, Done done) {
    std::string why;
    GpuStager *s = stager(kind, why);
    if (!s) return fail(-ENOTSUP, "GPU staging: " + why);
    Lane *l = lane(kind, device, s);
    if (!l) return fail(-ECANCELED, "GPU staging: the engine is shutting down");
    std::lock_guard lock(l->m);
    if (l->stop) return fail(-ECANCELED, "GPU staging: the engine is shutting down");
    auto event = s->copy_async(device, copies);
    {
        std::lock_guard sl(mutex_);
        copies_ += copies.size();
        if (!event) ++copy_failures_;
    }
    if (!event) {
        // Copies before the failed one may be queued already: the caller hears of the failure
        // only once none of them can still write.
        if (copies.size() > 1)
            if (auto fence = s->copy_async(device, std::span<const GpuStager::CopyRange>()); fence)
                (void)s->wait(device, *fence);
        return std::unexpected(event.error());
    }
    l->queue.push_back({*event, std::move(done)});
    l->cv.notify_one();
    return {};
}

StagingStats StagingService::stats() {
    std::lock_guard lock(mutex_);
    return StagingStats{max_bytes_,    slice_bytes_,           lent_,    peak_,         acquire_refused_,
                        copies_,       copy_failures_,         gathers_, gathered_ops_, gathers_by_transport_,
                        served_packs_, served_packed_requests_};
}

void StagingService::stop() {
    std::vector<Lane *> lanes;
    {
        std::lock_guard lock(mutex_);
        stopping_ = true;
        retry_stop_ = true;
        for (auto &[key, l] : lanes_) lanes.push_back(l.get());
    }
    retry_cv_.notify_all();
    if (retry_thread_.joinable()) retry_thread_.join();
    for (Lane *l : lanes) {
        {
            std::lock_guard lock(l->m);
            l->stop = true;
        }
        l->cv.notify_all();
        if (l->thread.joinable()) l->thread.join();
    }
}

std::vector<void *> StagingService::slices() {
    std::lock_guard lock(mutex_);
    std::vector<void *> out;
    for (auto &[buf, slice] : slices_) out.push_back(buf);
    return out;
}

namespace {

StagingService &service(void *ctx) { return *static_cast<StagingService *>(ctx); }

void put_error(ferry_error_t *err, const std::string &message) {
    if (!err) return;
    size_t n = std::min(message.size(), sizeof err->message - 1);
    std::memcpy(err->message, message.data(), n);
    err->message[n] = '\0';
}

int host_stage_acquire(void *ctx, uint32_t kind, int32_t device, uint64_t bytes, void **buf, ferry_error_t *err) {
    auto &svc = service(ctx);
    if (bytes == 0 || bytes > svc.slice_bytes()) {
        put_error(err, cat("stage_acquire: ", bytes, " bytes; ask for 1..", svc.slice_bytes(), " (stage_slice_bytes)"));
        return -EINVAL;
    }
    auto b = svc.acquire(kind, device);
    if (!b) {
        put_error(err, b.error().message);
        return b.error().code;
    }
    *buf = *b;
    return 0;
}

void host_stage_release(void *ctx, void *buf) { service(ctx).release(buf, false); }

int host_stage_copy(void *ctx, uint32_t kind, int32_t device, uint64_t device_addr, void *buf, uint64_t bytes,
                    int to_device, void (*done)(void *, int, const char *), void *arg, ferry_error_t *err) {
    auto &svc = service(ctx);
    if (!done || bytes == 0 || bytes > svc.slice_bytes()) {
        put_error(err, cat("stage_copy: ", bytes, " bytes with ", done ? "a" : "no", " done callback; copy 1..",
                           svc.slice_bytes(), " bytes (stage_slice_bytes) and pass done"));
        return -EINVAL;
    }
    void *dev = reinterpret_cast<void *>(device_addr);
    auto r = svc.copy(
        kind, device, to_device ? dev : buf, to_device ? buf : dev, bytes,
        [done, arg](int status, const std::string &message) { done(arg, status, status ? message.c_str() : nullptr); });
    if (!r) {
        put_error(err, r.error().message);
        return r.error().code;
    }
    return 0;
}

int host_stage_copy_parts(void *ctx, uint32_t kind, int32_t device, const ferry_stage_part_t *parts, size_t n,
                          void *buf, int to_device, void (*done)(void *, int, const char *), void *arg,
                          ferry_error_t *err) {
    auto &svc = service(ctx);
    const uint64_t slice = svc.slice_bytes();
    if (!done || n == 0 || !parts) {
        put_error(err, cat("stage_copy_parts: ", n, " parts with ", done ? "a" : "no",
                           " done callback; pass at least one part and done"));
        return -EINVAL;
    }
    std::vector<GpuStager::CopyRange> copies(n);
    auto *base = static_cast<uint8_t *>(buf);
    for (size_t i = 0; i < n; ++i) {
        const ferry_stage_part_t &p = parts[i];
        if (p.length == 0 || p.length > slice || p.buf_offset > slice - p.length) {
            put_error(err, cat("stage_copy_parts: part ", i, " of ", p.length, " bytes at offset ", p.buf_offset,
                               " does not fit the ", slice, "-byte buffer (stage_slice_bytes)"));
            return -EINVAL;
        }
        const uintptr_t host = reinterpret_cast<uintptr_t>(base + p.buf_offset);
        copies[i] = to_device ? GpuStager::CopyRange{p.device_addr, host, p.length}
                              : GpuStager::CopyRange{host, p.device_addr, p.length};
    }
    auto r = svc.copy(kind, device, copies, [done, arg](int status, const std::string &message) {
        done(arg, status, status ? message.c_str() : nullptr);
    });
    if (!r) {
        put_error(err, r.error().message);
        return r.error().code;
    }
    svc.count_served_pack(n);
    return 0;
}

}  // namespace

void StagingService::fill_host_api(ferry_host_api_t &host) {
    // The HIP runtime is opened only where no CUDA driver loads: a process holding both
    // (ROCm libraries on an NVIDIA host) aborts in their two LLVMs' option registries.
    std::string why;
    bool any = offers(FERRY_MEM_CUDA, why) || offers(FERRY_MEM_ROCM, why);
    if (!any) return;
    {
        std::lock_guard lock(mutex_);
        if (!retry_thread_.joinable() && !stopping_) retry_thread_ = std::thread([this] { retry_loop(); });
    }
    host.ctx = this;
    host.stage_slice_bytes = slice_bytes_;
    host.stage_acquire = host_stage_acquire;
    host.stage_release = host_stage_release;
    host.stage_copy = host_stage_copy;
    host.stage_copy_parts = host_stage_copy_parts;
}

}  // namespace ferry
