#include "staging_host.hpp"

#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>

namespace ferry_test {

namespace {
void log_cb(void *, int level, const char *plugin, const char *message) {
    fprintf(stderr, "[%s %d] %s\n", plugin, level, message);
}
}  // namespace

DeviceMemory::DeviceMemory(size_t len) : len_(len) {
    fd_ = memfd_create("ferry-test-device", MFD_CLOEXEC);
    if (fd_ < 0 || ftruncate(fd_, static_cast<off_t>(len)) != 0)
        throw std::runtime_error("memfd_create/ftruncate failed");
    void *d = mmap(nullptr, len, PROT_NONE, MAP_SHARED, fd_, 0);
    void *a = mmap(nullptr, len, PROT_READ | PROT_WRITE, MAP_SHARED, fd_, 0);
    if (d == MAP_FAILED || a == MAP_FAILED) throw std::runtime_error("mmap of the device memfd failed");
    dev_ = static_cast<uint8_t *>(d);
    alias_ = static_cast<uint8_t *>(a);
}

DeviceMemory::~DeviceMemory() {
    munmap(dev_, len_);
    munmap(alias_, len_);
    close(fd_);
}

StagingHost::StagingHost(uint64_t slice_bytes, uint64_t max_bytes) : slice_(slice_bytes), max_(max_bytes) {
    api_.struct_size = sizeof(ferry_host_api_t);
    api_.ctx = this;
    api_.log = log_cb;
    api_.log_level = FERRY_LOG_WARN;
    api_.stage_slice_bytes = slice_bytes;
    api_.stage_acquire = acquire_cb;
    api_.stage_release = release_cb;
    api_.stage_copy = copy_cb;
    api_.stage_copy_parts = copy_parts_cb;
    thread_ = std::thread([this] { loop(); });
}

StagingHost::~StagingHost() {
    {
        std::lock_guard lk(mu_);
        stop_ = true;
    }
    cv_.notify_all();
    thread_.join();
    for (void *b : lent_) free(b);
}

void StagingHost::add_device(const DeviceMemory &m) {
    std::lock_guard lk(mu_);
    devs_.push_back(&m);
}

void StagingHost::offer_parts(bool on) {
    std::lock_guard lk(mu_);
    api_.stage_copy_parts = on ? copy_parts_cb : nullptr;
    api_.struct_size = on ? sizeof(ferry_host_api_t) : FERRY_HOST_API_SIZE_UNTIL(stage_copy);
}

void StagingHost::fail_copy(uint64_t n, int status) {
    std::lock_guard lk(mu_);
    fail_at_.insert(next_seq_ + n);
    fail_status_ = status;
}

void StagingHost::set_copy_delay(std::chrono::milliseconds d) {
    std::lock_guard lk(mu_);
    delay_ = d;
}

void StagingHost::set_release_delay(std::chrono::milliseconds d) {
    std::lock_guard lk(mu_);
    release_delay_ = d;
}

void StagingHost::on_copy(std::function<void(bool, uint64_t, uint64_t)> fn) {
    std::lock_guard lk(mu_);
    on_copy_ = std::move(fn);
}

StagingStats StagingHost::stats() const {
    std::lock_guard lk(mu_);
    StagingStats s = st_;
    s.held = lent_.size();
    return s;
}

bool StagingHost::wait_idle(std::chrono::milliseconds limit) {
    std::unique_lock lk(mu_);
    return cv_.wait_for(lk, limit, [&] { return lent_.empty() && queue_.empty() && copying_.empty(); });
}

uint8_t *StagingHost::translate(uint64_t dev, uint64_t len) {
    for (const DeviceMemory *m : devs_)
        if (dev >= m->addr() && len <= m->size() && dev - m->addr() <= m->size() - len)
            return m->alias() + (dev - m->addr());
    return nullptr;
}

int StagingHost::acquire_cb(void *ctx, uint32_t kind, int32_t, uint64_t bytes, void **buf, ferry_error_t *err) {
    auto *h = static_cast<StagingHost *>(ctx);
    std::lock_guard lk(h->mu_);
    if (kind != FERRY_MEM_CUDA && kind != FERRY_MEM_ROCM) {
        snprintf(err->message, sizeof err->message, "test host: no runtime for kind %u", kind);
        return -ENOTSUP;
    }
    if (bytes == 0 || bytes > h->slice_) {
        h->st_.misuse.push_back("acquire of " + std::to_string(bytes) + " bytes");
        snprintf(err->message, sizeof err->message, "test host: bad size");
        return -EINVAL;
    }
    if ((h->lent_.size() + 1) * h->slice_ > h->max_) {
        ++h->st_.eagain;
        snprintf(err->message, sizeof err->message, "gpu_staging_max_bytes=%llu reached (test host)",
                 static_cast<unsigned long long>(h->max_));
        return -EAGAIN;
    }
    void *b = aligned_alloc(4096, h->slice_);
    if (b == nullptr) return -ENOMEM;
    memset(b, 0xA5, h->slice_);  // a stale buffer shows up as wrong bytes
    h->lent_.insert(b);
    ++h->st_.acquired;
    h->st_.peak_held_bytes = std::max<uint64_t>(h->st_.peak_held_bytes, h->lent_.size() * h->slice_);
    *buf = b;
    return 0;
}

void StagingHost::release_cb(void *ctx, void *buf) {
    auto *h = static_cast<StagingHost *>(ctx);
    std::chrono::milliseconds delay{0};
    {
        std::lock_guard lk(h->mu_);
        if (h->copying_.count(buf) != 0) h->st_.misuse.push_back("release of a buffer whose copy still runs");
        if (h->lent_.erase(buf) == 0) {
            h->st_.misuse.push_back("release of a buffer not lent");
            return;
        }
        ++h->st_.released;
        delay = h->release_delay_;
    }
    free(buf);
    h->cv_.notify_all();
    if (delay.count() > 0) std::this_thread::sleep_for(delay);  // the plugin's thread, preempted
}

int StagingHost::copy_cb(void *ctx, uint32_t, int32_t, uint64_t addr, void *buf, uint64_t bytes, int to_device,
                         void (*done)(void *, int, const char *), void *arg, ferry_error_t *err) {
    auto *h = static_cast<StagingHost *>(ctx);
    std::lock_guard lk(h->mu_);
    if (h->lent_.count(buf) == 0 || h->copying_.count(buf) != 0 || bytes > h->slice_ || done == nullptr) {
        h->st_.misuse.push_back("copy on a buffer not lent, already copying, or too long");
        snprintf(err->message, sizeof err->message, "test host: bad copy");
        return -EINVAL;
    }
    if (h->translate(addr, bytes) == nullptr) {
        h->st_.misuse.push_back("copy outside every device region");
        snprintf(err->message, sizeof err->message, "test host: not device memory");
        return -EFAULT;
    }
    h->copying_.insert(buf);
    h->queue_.push_back(Copy{addr, buf, bytes, to_device != 0, done, arg, h->next_seq_++, {}});
    h->cv_.notify_all();
    return 0;
}

int StagingHost::copy_parts_cb(void *ctx, uint32_t, int32_t, const ferry_stage_part_t *parts, size_t n, void *buf,
                               int to_device, void (*done)(void *, int, const char *), void *arg, ferry_error_t *err) {
    auto *h = static_cast<StagingHost *>(ctx);
    std::lock_guard lk(h->mu_);
    if (h->lent_.count(buf) == 0 || h->copying_.count(buf) != 0 || done == nullptr || n == 0) {
        h->st_.misuse.push_back("parts copy on a buffer not lent or already copying, or of no parts");
        snprintf(err->message, sizeof err->message, "test host: bad copy");
        return -EINVAL;
    }
    std::vector<ferry_stage_part_t> v(parts, parts + n);
    for (size_t i = 0; i < n; ++i) {
        if (v[i].length == 0 || v[i].length > h->slice_ || v[i].buf_offset > h->slice_ - v[i].length ||
            h->translate(v[i].device_addr, v[i].length) == nullptr) {
            h->st_.misuse.push_back("a part outside its buffer or every device region");
            snprintf(err->message, sizeof err->message, "test host: bad part");
            return -EFAULT;
        }
        for (size_t j = 0; j < i; ++j)
            if (v[j].buf_offset < v[i].buf_offset + v[i].length && v[i].buf_offset < v[j].buf_offset + v[j].length)
                h->st_.misuse.push_back("parts overlapping in the buffer");
    }
    h->copying_.insert(buf);
    h->queue_.push_back(Copy{0, buf, 0, to_device != 0, done, arg, h->next_seq_++, std::move(v)});
    h->cv_.notify_all();
    return 0;
}

void StagingHost::loop() {
    std::unique_lock lk(mu_);
    for (;;) {
        cv_.wait(lk, [&] { return stop_ || !queue_.empty(); });
        if (queue_.empty()) return;
        Copy c = queue_.front();
        queue_.pop_front();
        const bool fail = fail_at_.erase(c.seq) != 0;
        const auto delay = delay_;
        auto hook = on_copy_;
        if (c.parts.empty()) c.parts.push_back({c.dev, 0, c.len});
        std::vector<uint8_t *> dev;
        for (const ferry_stage_part_t &p : c.parts) dev.push_back(translate(p.device_addr, p.length));
        lk.unlock();
        if (delay.count() > 0)
            std::this_thread::sleep_for(delay);  // a slow device: the pipeline is in flight meanwhile
        if (!fail)
            for (size_t i = 0; i < c.parts.size(); ++i) {
                const ferry_stage_part_t &p = c.parts[i];
                uint8_t *b = static_cast<uint8_t *>(c.buf) + p.buf_offset;
                if (hook) hook(c.to_device, p.device_addr, p.length);
                if (c.to_device) memcpy(dev[i], b, p.length);
                else memcpy(b, dev[i], p.length);
            }
        lk.lock();
        ++st_.copies;
        if (c.len == 0) ++st_.part_copies, st_.parts += c.parts.size();
        if (fail) ++st_.failed_copies;
        copying_.erase(c.buf);
        const int status = fail ? fail_status_ : 0;
        lk.unlock();
        c.done(c.arg, status, fail ? kFailText : nullptr);
        lk.lock();
        cv_.notify_all();
    }
}

}  // namespace ferry_test
