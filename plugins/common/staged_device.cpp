#include "staged_device.hpp"

#include <cerrno>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <deque>

namespace ferry_staged {

namespace {

std::string fmt(const char *f, ...) __attribute__((format(printf, 1, 2)));
std::string fmt(const char *f, ...) {
    char buf[512];
    va_list ap;
    va_start(ap, f);
    vsnprintf(buf, sizeof buf, f, ap);
    va_end(ap);
    return buf;
}

}  // namespace

const char *kind_name(uint32_t kind) {
    switch (kind) {
        case FERRY_MEM_HOST: return "host";
        case FERRY_MEM_CUDA: return "CUDA";
        case FERRY_MEM_ROCM: return "ROCm";
        default: return "unknown";
    }
}

// ---- Slice ----

bool Slice::copied() const {
    std::lock_guard lk(core_->mu);
    return phase_ == Phase::Copied;
}
int Slice::status() const {
    std::lock_guard lk(core_->mu);
    return status_;
}
std::string Slice::message() const {
    std::lock_guard lk(core_->mu);
    return message_;
}

// ---- Stager ----

Stager::Stager(const ferry_host_api_t *host, const char *plugin) : host_(host), plugin_(plugin) {
    offered_ = host != nullptr && host->struct_size >= FERRY_HOST_API_SIZE_UNTIL(stage_copy) &&
               host->stage_slice_bytes > 0 && host->stage_acquire != nullptr && host->stage_release != nullptr &&
               host->stage_copy != nullptr;
}

Stager::~Stager() { wait_idle(); }

int Stager::check_region(const ferry_mem_region_t &r, std::string *why) const {
    if (r.kind == FERRY_MEM_HOST) return 0;
    if (r.kind != FERRY_MEM_CUDA && r.kind != FERRY_MEM_ROCM) {
        *why = fmt("%s: unknown memory kind %u", plugin_, r.kind);
        return -EINVAL;
    }
    if (host_ == nullptr || host_->struct_size < FERRY_HOST_API_SIZE_UNTIL(stage_copy)) {
        *why =
            fmt("%s: cannot serve %s device memory: the host is older than plugin ABI 1.1 and offers "
                "no staging calls (ferry_host_api_t of %u bytes, %zu needed); run a Ferry core of the "
                "same release as the plugin",
                plugin_, kind_name(r.kind), host_ == nullptr ? 0u : host_->struct_size,
                FERRY_HOST_API_SIZE_UNTIL(stage_copy));
        return -ENOTSUP;
    }
    if (!offered_) {
        *why =
            fmt("%s: cannot serve %s device memory: the host offers no staging (no GPU runtime "
                "loaded, or GPU staging disabled in the engine)",
                plugin_, kind_name(r.kind));
        return -ENOTSUP;
    }
    return 0;
}

uint64_t Stager::held() const {
    std::lock_guard lk(mu_);
    return held_;
}

void Stager::released() {
    std::lock_guard lk(mu_);
    --held_;
    ++releases_;
    cv_.notify_all();
}

bool Stager::wait_release(unsigned ms) {
    std::unique_lock lk(mu_);
    if (held_ == 0) return false;
    const uint64_t was = held_;
    cv_.wait_for(lk, std::chrono::milliseconds(ms), [&] { return held_ < was; });
    return true;
}

void Stager::wait_idle() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return held_ == 0; });
}

// ---- StageWindow ----

StageWindow::StageWindow(Stager &s, unsigned depth, std::function<void()> notify)
    : stager_(s), depth_(depth == 0 ? 1 : depth), core_(std::make_shared<WindowCore>()) {
    core_->stager = &s;
    core_->notify = std::move(notify);
}

StageWindow::~StageWindow() { detach(); }

void StageWindow::detach() {
    std::lock_guard lk(core_->mu);
    core_->notify = nullptr;
}

unsigned StageWindow::held() const {
    std::lock_guard lk(core_->mu);
    return core_->held;
}

StageWindow::Got StageWindow::acquire(uint32_t kind, int32_t device_id, uint64_t offset, uint64_t len, SlicePtr *out,
                                      int *code, std::string *why) {
    {
        std::lock_guard lk(core_->mu);
        if (core_->held >= depth_) return Got::Wait;
    }
    void *buf = nullptr;
    ferry_error_t e{};
    const ferry_host_api_t *h = stager_.host_;
    int rc;
    for (;;) {
        uint64_t gen;
        {
            // Counted before the host is asked, so that an owner whose attempt fails meanwhile
            // sees this one (and waits for it) instead of concluding that none of ours is out.
            std::lock_guard lk(stager_.mu_);
            gen = stager_.releases_;
            ++stager_.held_;
        }
        rc = h->stage_acquire(h->ctx, kind, device_id, len, &buf, &e);
        if (rc == 0 && buf != nullptr) break;
        {
            std::lock_guard lk(stager_.mu_);
            --stager_.held_;
            stager_.cv_.notify_all();
        }
        if (rc != -EAGAIN) break;
        if (held() > 0) return Got::Wait;  // ours come back and make room
        std::lock_guard lk(stager_.mu_);
        if (stager_.held_ > 0) return Got::Wait;  // other owners of this instance give theirs back
        if (stager_.releases_ == gen) break;  // the bound is held outside this instance: nothing of ours will free it
        // one came back since the attempt: try again
    }
    if (rc == -EAGAIN) {
        *code = -EAGAIN;
        *why =
            fmt("%s: no pinned host buffer to stage %s device memory: the engine's bound "
                "(gpu_staging_max_bytes) is reached by other transfers and this one holds none (%s); "
                "raise gpu_staging_max_bytes or move fewer GPU bytes at once",
                stager_.plugin_, kind_name(kind), e.message);
        return Got::Fail;
    }
    if (rc != 0 || buf == nullptr) {
        *code = rc != 0 ? rc : -EIO;
        *why = fmt("%s: cannot borrow a staging buffer for %s device memory %d: %s", stager_.plugin_, kind_name(kind),
                   device_id, rc != 0 ? e.message : "the host lent a NULL buffer");
        return Got::Fail;
    }
    auto s = std::make_shared<Slice>();
    s->core_ = core_;
    s->buf_ = buf;
    s->kind_ = kind;
    s->device_id_ = device_id;
    s->off_ = offset;
    s->len_ = len;
    {
        std::lock_guard lk(core_->mu);
        ++core_->held;
    }
    *out = std::move(s);
    return Got::Slice;
}

void on_copy_done(void *arg, int status, const char *message) {
    auto *s = static_cast<Slice *>(arg);
    std::shared_ptr<WindowCore> core = s->core_;
    SlicePtr keep;
    bool give_back = false;
    {
        std::lock_guard lk(core->mu);
        s->status_ = status;
        if (status != 0) s->message_ = message != nullptr && *message ? message : "the staging copy failed";
        s->phase_ = Slice::Phase::Copied;
        keep = std::move(s->self_);
        if (s->release_when_copied_) {
            s->phase_ = Slice::Phase::Released;
            --core->held;
            give_back = true;
        }
        if (core->notify) core->notify();
        core->cv.notify_all();
    }
    if (give_back) {
        const ferry_host_api_t *h = core->stager->host_;
        h->stage_release(h->ctx, s->buf_);
        if (s->on_release) s->on_release();
        core->stager->released();  // the instance may be destroyed from here on
    }
}

int StageWindow::start_copy(const SlicePtr &s, bool to_device, std::string *why,
                            const std::function<int(ferry_error_t *)> &call) {
    {
        std::lock_guard lk(core_->mu);
        s->phase_ = Slice::Phase::Copying;
        s->self_ = s;
    }
    ferry_error_t e{};
    int rc = call(&e);
    if (rc != 0) {
        std::lock_guard lk(core_->mu);
        s->phase_ = Slice::Phase::Held;
        s->self_.reset();  // the caller still holds s
        *why = fmt("%s: cannot start the staging copy %s %s device memory: %s", stager_.plugin_,
                   to_device ? "into" : "out of", kind_name(s->kind_), e.message);
    }
    return rc;
}

int StageWindow::copy(const SlicePtr &s, uint64_t device_addr, bool to_device, std::string *why) {
    const ferry_host_api_t *h = stager_.host_;
    return start_copy(s, to_device, why, [&](ferry_error_t *e) {
        return h->stage_copy(h->ctx, s->kind_, s->device_id_, device_addr, s->buf_, s->len_, to_device ? 1 : 0,
                             on_copy_done, s.get(), e);
    });
}

bool StageWindow::parts_offered() const {
    const ferry_host_api_t *h = stager_.host_;
    return stager_.offered_ && h->struct_size >= FERRY_HOST_API_SIZE_UNTIL(stage_copy_parts) &&
           h->stage_copy_parts != nullptr;
}

int StageWindow::copy_parts(const SlicePtr &s, const ferry_stage_part_t *parts, size_t n, bool to_device,
                            std::string *why) {
    const ferry_host_api_t *h = stager_.host_;
    return start_copy(s, to_device, why, [&](ferry_error_t *e) {
        return h->stage_copy_parts(h->ctx, s->kind_, s->device_id_, parts, n, s->buf_, to_device ? 1 : 0, on_copy_done,
                                   s.get(), e);
    });
}

void StageWindow::share(const SlicePtr &s, unsigned holders) {
    std::lock_guard lk(core_->mu);
    s->holders_ = holders == 0 ? 1 : holders;
}

void StageWindow::release(const SlicePtr &s) {
    {
        std::lock_guard lk(core_->mu);
        if (s->phase_ == Slice::Phase::Released) return;
        if (s->holders_ > 1) {  // another packed request still sends from it
            --s->holders_;
            return;
        }
        if (s->phase_ == Slice::Phase::Copying) {
            s->release_when_copied_ = true;  // on_copy_done gives it back
            return;
        }
        s->phase_ = Slice::Phase::Released;
        --core_->held;
    }
    const ferry_host_api_t *h = stager_.host_;
    h->stage_release(h->ctx, s->buf_);
    if (s->on_release) s->on_release();
    stager_.released();
}

void StageWindow::wait_copied(const SlicePtr &s) {
    std::unique_lock lk(core_->mu);
    core_->cv.wait(lk, [&] { return s->phase_ != Slice::Phase::Copying; });
}

// ---- stage_run ----

int stage_run(StageWindow &w, uint32_t kind, int32_t device_id, uint64_t device_addr, uint64_t len, bool to_device,
              const std::function<int(void *, uint64_t, uint64_t, std::string *)> &io, std::string *why) {
    std::deque<SlicePtr> pending;  // copies started, in order
    const uint64_t slice = w.slice_bytes();
    uint64_t off = 0;
    int failed = 0;
    auto fail = [&](int code, std::string msg) {
        if (failed == 0) {
            failed = code;
            *why = std::move(msg);
        }
    };
    while (failed == 0 && (off < len || !pending.empty())) {
        bool waiting = false;
        while (failed == 0 && off < len && pending.size() < w.depth()) {
            const uint64_t n = std::min(slice, len - off);
            SlicePtr s;
            int code = 0;
            std::string msg;
            auto got = w.acquire(kind, device_id, off, n, &s, &code, &msg);
            if (got == StageWindow::Got::Wait) {
                waiting = true;
                break;
            }
            if (got == StageWindow::Got::Fail) {
                fail(code, std::move(msg));
                break;
            }
            if (to_device) {
                int rc = io(s->buf(), off, n, &msg);
                if (rc != 0) {
                    w.release(s);
                    fail(rc, std::move(msg));
                    break;
                }
            }
            int rc = w.copy(s, device_addr + off, to_device, &msg);
            if (rc != 0) {
                w.release(s);
                fail(rc, std::move(msg));
                break;
            }
            pending.push_back(std::move(s));
            off += n;
        }
        if (failed != 0) break;
        if (pending.empty()) {
            if (waiting) w.stager_wait_release();  // the bound is held by other owners of this instance
            continue;
        }
        SlicePtr s = std::move(pending.front());
        pending.pop_front();
        w.wait_copied(s);
        if (s->status() != 0) {
            fail(s->status(), s->message());
        } else if (!to_device) {
            std::string msg;
            int rc = io(s->buf(), s->offset(), s->length(), &msg);
            if (rc != 0) fail(rc, std::move(msg));
        }
        w.release(s);
    }
    // After a failure: copies already started still run; the op is reported only once they
    // ended, so no byte lands after the failure is known.
    for (SlicePtr &s : pending) {
        w.wait_copied(s);
        w.release(s);
    }
    return failed;
}

}  // namespace ferry_staged
