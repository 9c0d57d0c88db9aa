// efa.so instance life cycle, registration, the probe, and the progress thread.
#include "transport.hpp"

#include "device.hpp"
#include "fabric_api.hpp"

#include <rdma/fi_cm.h>
#include <rdma/fi_errno.h>
#include <sched.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/timerfd.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace ferry_efa {

namespace {
constexpr size_t kRecvBufs = 32;
constexpr size_t kSendBufs = 32;
}  // namespace

Transport::Transport(const Config &cfg, const ferry_host_api_t *host)
    : cfg_(cfg), log_(host, kName), stager_(host, "efa") {}

int Transport::probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result) {
    Config cfg;
    ferry_error_t err{};
    if (parse_config(options, n, &cfg, &err) != 0) {
        result->available = 0;
        copy_message(result->reason, err.message);
        return 0;
    }
    // The default provider on a host without an EFA device: say so without initialising
    // libfabric. A provider the caller named (efa.provider, FERRY_EFA_PROVIDER) is always asked.
    if (std::string where; !cfg.provider_chosen && !efa_device_present(&where)) {
        result->available = 0;
        copy_message(result->reason,
                     ("no EFA device: " + where +
                      "; efa.provider=tcp (or FERRY_EFA_PROVIDER) runs efa.so over another libfabric provider")
                         .c_str());
        return 0;
    }
    fi_info *info = nullptr;
    std::string why;
    if (get_info(cfg, &info, &why) != 0) {
        result->available = 0;
        copy_message(result->reason, why.c_str());
        return 0;
    }
    result->available = 1;
    copy_message(result->reason, ("libfabric " + std::to_string(FI_MAJOR(fabric::version())) + "." +
                                  std::to_string(FI_MINOR(fabric::version())) + ", " + describe(info))
                                     .c_str());
    fabric::freeinfo(info);
    return 0;
}

int Transport::create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err) {
    Config cfg;
    if (int rc = parse_config(options, n, &cfg, err)) return rc;
    std::unique_ptr<Transport> t(new Transport(cfg, host));
    if (int rc = t->start(err)) return rc;
    *out = t.release();
    return 0;
}

int Transport::start(ferry_error_t *err) {
    std::string why;
    if (int rc = fab_.open(cfg_, &why)) return set_error(err, rc == -FI_ENODATA ? -ENODEV : rc, "efa: %s", why.c_str());
    keys_ = std::make_unique<KeySource>(fab_.mr_key_size);
    if (getrandom(&token_, sizeof token_, 0) != static_cast<ssize_t>(sizeof token_))
        token_ = static_cast<uint64_t>(Clock::now().time_since_epoch().count()) * 0x9e3779b97f4a7c15ull;
    token_ |= 1;

    ctrl_slab_.resize((kRecvBufs + kSendBufs) * kCtrlSize);
    uint64_t key = (fab_.mr_mode & FI_MR_PROV_KEY) ? 0 : keys_->next();
    int rc =
        fi_mr_reg(fab_.domain, ctrl_slab_.data(), ctrl_slab_.size(), FI_SEND | FI_RECV, 0, key, 0, &ctrl_mr_, nullptr);
    if (rc == 0 && (fab_.mr_mode & FI_MR_ENDPOINT) && (rc = fi_mr_bind(ctrl_mr_, &fab_.ep->fid, 0)) == 0)
        rc = fi_mr_enable(ctrl_mr_);
    if (rc != 0)
        return set_error(err, rc < 0 ? rc : -rc, "efa: registering control buffers: %s", fi_error_string(rc).c_str());
    ctrl_desc_ = fi_mr_desc(ctrl_mr_);
    for (size_t i = 0; i < kRecvBufs + kSendBufs; ++i) {
        auto b = std::make_unique<CtrlBuf>(i < kRecvBufs ? CtxKind::CtrlRecv : CtxKind::CtrlSend);
        b->data = ctrl_slab_.data() + i * kCtrlSize;
        if (i < kRecvBufs) {
            unposted_recvs_.push_back(b.get());
            recv_bufs_.push_back(std::move(b));
        } else {
            free_sends_.push_back(b.get());
            send_bufs_.push_back(std::move(b));
        }
    }
    post_recvs();

    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    timer_fd_ = timerfd_create(CLOCK_MONOTONIC, TFD_CLOEXEC | TFD_NONBLOCK);
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (wake_fd_ < 0 || timer_fd_ < 0 || epoll_fd_ < 0)
        return set_error(err, -errno, "efa: eventfd/timerfd/epoll: %s", errno_string(errno).c_str());
    epoll_event ev{};
    ev.events = EPOLLIN;
    for (int fd : {wake_fd_, timer_fd_}) {
        ev.data.fd = fd;
        epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    }
    if (fab_.wait_fd >= 0) {
        ev.data.fd = fab_.wait_fd;
        epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fab_.wait_fd, &ev);
        // The host's completion fd (host_progress) and the progress thread's sleep beside it.
        host_fd_ = epoll_create1(EPOLL_CLOEXEC);
        aside_fd_ = epoll_create1(EPOLL_CLOEXEC);
        if (host_fd_ < 0 || aside_fd_ < 0) return set_error(err, -errno, "efa: epoll: %s", errno_string(errno).c_str());
        for (int fd : {cq_.fd(), fab_.wait_fd}) {
            ev.data.fd = fd;
            if (epoll_ctl(host_fd_, EPOLL_CTL_ADD, fd, &ev) != 0)
                return set_error(err, -errno, "efa: epoll_ctl: %s", errno_string(errno).c_str());
        }
        for (int fd : {wake_fd_, timer_fd_}) {
            ev.data.fd = fd;
            epoll_ctl(aside_fd_, EPOLL_CTL_ADD, fd, &ev);
        }
    }
    next_timeout_scan_ = Clock::now();
    progress_ = std::thread([this] { progress_loop(); });
    log_.log(FERRY_LOG_INFO, "endpoint %s: %s%s", fab_.name_str.c_str(), describe(fab_.info).c_str(),
             fab_.wait_fd >= 0 ? "" : ", no CQ wait object (polling)");
    return 0;
}

Transport::~Transport() {
    if (progress_.joinable()) {
        stop_ = true;
        wake();
        progress_.join();
    }
    quiesce();
    stage_teardown();  // buffers back to the host (those still copying: when the copy ends)
    stager_.wait_idle();
    {
        std::lock_guard lock(mu_);
        log_ignored(true);
    }
    // Closing the endpoint first: after it the provider touches none of our buffers.
    if (fab_.ep) {
        fi_close(&fab_.ep->fid);
        fab_.ep = nullptr;
    }
    for (auto &[h, r] : regions_) close_region(fab_, *r);
    if (ctrl_mr_) fi_close(&ctrl_mr_->fid);
    for (auto &[p, op] : ops_)
        if (op->pin) op->pin->unpin();
    for (int fd : {wake_fd_, timer_fd_, epoll_fd_, host_fd_, aside_fd_})
        if (fd >= 0) close(fd);
}

// Before the endpoint is closed, the provider hands back everything it holds: the tcp provider
// (rxm) crashed in fi_close(ep) when connections still had RMA queued while a peer that had been
// stopped resumed and answered (8 of 11 teardowns). Connections holding our RMA are cut, and
// the CQ is read (the progress thread is gone: this is the only caller) until every piece and
// control send came back, for at most connect_timeout_ms (capped at 5 s).
void Transport::quiesce() {
    if (fab_.ep == nullptr || fab_.cq == nullptr) return;
    std::lock_guard lock(mu_);
    for (auto &[p, op] : ops_) fail_op(*op, -ECANCELED, "efa: op canceled: the transport is being destroyed");
    for (auto &[t, r] : remotes_) reclaim(*r);
    // StageDones still queued go out too: without them the targets hold our last grants until
    // they find us gone.
    auto stage_dones = [&] {
        for (const OutMsg &m : ctrl_out_)
            if (m.type == CtrlType::StageDone && m.to->addr != FI_ADDR_NOTAVAIL) return true;
        return false;
    };
    auto held = [&] { return !ops_.empty() || free_sends_.size() < send_bufs_.size() || stage_dones(); };
    const auto deadline = Clock::now() + std::chrono::milliseconds(std::min(cfg_.connect_timeout_ms, 5000u));
    fi_cq_msg_entry entries[64];
    while (held() && Clock::now() < deadline) {
        ready_.clear();  // unposted pieces: never posted now
        for (auto &[p, op] : ops_) op->unposted = 0;
        for (auto &[t, r] : remotes_) r->held.clear();
        std::vector<Op *> idle;
        for (auto &[p, op] : ops_)
            if (op->outstanding == 0) idle.push_back(op.get());
        for (Op *op : idle) maybe_finish(*op);
        if (stage_dones()) post_ctrl_sends();
        ssize_t n;
        {
            auto lk = fab_.lock();
            n = fi_cq_read(fab_.cq, entries, 64);
        }
        if (n > 0) {
            for (ssize_t i = 0; i < n; ++i) on_completion(entries[i]);
        } else if (n == -FI_EAVAIL) {
            fi_cq_err_entry e{};
            auto lk = fab_.lock();
            if (fi_cq_readerr(fab_.cq, &e, 0) == 1) {
                lk = {};
                on_error(e);
            }
        } else {
            sched_yield();
        }
    }
    if (held())
        log_.log(FERRY_LOG_WARN, "destroy: the provider still holds %zu op(s) and %zu control message(s) after %u ms",
                 ops_.size(), send_bufs_.size() - free_sends_.size(), std::min(cfg_.connect_timeout_ms, 5000u));
}

int Transport::export_endpoint(void *buf, size_t *len, ferry_error_t *err) {
    EndpointHead h{kEndpointMagic, kWireVersion, static_cast<uint16_t>(fab_.name.size()), token_};
    size_t need = sizeof h + fab_.name.size();
    if (*len < need) {
        *len = need;
        return set_error(err, -ENOSPC, "efa: the endpoint needs %zu bytes", need);
    }
    memcpy(buf, &h, sizeof h);
    memcpy(static_cast<uint8_t *>(buf) + sizeof h, fab_.name.data(), fab_.name.size());
    *len = need;
    return 0;
}

int Transport::register_mem(const ferry_mem_region_t *r, uint64_t *handle, ferry_error_t *err) {
    if (r->kind != FERRY_MEM_HOST && r->kind != FERRY_MEM_CUDA && r->kind != FERRY_MEM_ROCM)
        return set_error(err, -EINVAL, "efa: unknown memory kind %u", r->kind);
    const bool staged = r->kind != FERRY_MEM_HOST && !fab_.hmem;  // served through the host's staging calls
    if (r->length == 0 || r->addr == 0 || r->addr + r->length < r->addr)
        return set_error(err, -EINVAL, "efa: region [0x%" PRIx64 ", +%" PRIu64 ") is empty or wraps", r->addr,
                         r->length);
    if (r->access & ~(FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE))
        return set_error(err, -EINVAL, "efa: unknown access bits 0x%x", r->access);
    auto region = std::make_shared<LocalRegion>();
    region->addr = r->addr;
    region->length = r->length;
    region->access = r->access;
    region->kind = r->kind;
    region->device = r->device_id;
    std::string why;
    if (int rc = staged ? stage_register(*r, *region, &why)
                        : register_region(fab_, cfg_.max_mr_size, *keys_, *r, *region, &why))
        return set_error(err, rc, "%s%s", staged ? "" : "efa: ", why.c_str());
    std::lock_guard lock(mu_);
    region->handle = next_region_++;
    regions_[region->handle] = region;
    *handle = region->handle;
    if (region->chunks.size() > 1)
        log_.log(FERRY_LOG_DEBUG, "region [0x%" PRIx64 ", +%" PRIu64 ") registered as %zu MRs", r->addr, r->length,
                 region->chunks.size());
    return 0;
}

int Transport::deregister_mem(uint64_t handle, ferry_error_t *err) {
    std::shared_ptr<LocalRegion> r;
    {
        std::lock_guard lock(mu_);
        auto it = regions_.find(handle);
        if (it == regions_.end())
            return set_error(err, -ENOENT, "efa: no registered region has handle %" PRIu64, handle);
        r = it->second;
        regions_.erase(it);
        if (r->staged) stage_region_gone(*r);
    }
    if (r->staged) wake();
    r->retire_and_wait(log_);  // our own ops using it as the local side, and staged requests
    if (!r->staged) {
        std::unique_lock lock(mu_);
        revoke(*r, lock);  // peers' RMA into it
    }
    close_region(fab_, *r);  // from here the provider refuses peers' RMA to it
    return 0;
}

int Transport::export_mem(uint64_t handle, void *buf, size_t *len, ferry_error_t *err) {
    std::vector<uint8_t> bytes;
    {
        std::lock_guard lock(mu_);
        auto it = regions_.find(handle);
        if (it == regions_.end())
            return set_error(err, -ENOENT, "efa: no registered region has handle %" PRIu64, handle);
        bytes = export_chunks(*it->second);
    }
    if (*len < bytes.size()) {
        *len = bytes.size();
        return set_error(err, -ENOSPC, "efa: the region's keys need %zu bytes", bytes.size());
    }
    memcpy(buf, bytes.data(), bytes.size());
    *len = bytes.size();
    return 0;
}

// A submit to an idle instance: the progress thread sleeps on the CQ's wait object, which the
// provider signals for the new op, but without a deadline; the timer gives it one, so that the
// op's timeout is checked, without waking it now.
void Transport::arm_timer() {
    itimerspec t{};
    t.it_value.tv_nsec = kActiveWaitMs * 1000000L;
    if (timerfd_settime(timer_fd_, 0, &t, nullptr) != 0) wake();
}

void Transport::wake() {
    uint64_t one = 1;
    if (write(wake_fd_, &one, sizeof one) < 0 && errno != EAGAIN)
        log_.log(FERRY_LOG_WARN, "wake eventfd: %s", errno_string(errno).c_str());
}

void Transport::post_recvs() {
    while (!unposted_recvs_.empty()) {
        CtrlBuf *b = unposted_recvs_.back();
        auto lk = fab_.lock();
        int rc = fi_recv(fab_.ep, b->data, kCtrlSize, ctrl_desc_, FI_ADDR_UNSPEC, &b->fi);
        if (rc != 0) {
            if (rc != -FI_EAGAIN) log_.log(FERRY_LOG_WARN, "fi_recv: %s", fi_error_string(rc).c_str());
            return;
        }
        unposted_recvs_.pop_back();
    }
}

void Transport::on_completion(const fi_cq_msg_entry &e) {
    auto *c = static_cast<Ctx *>(e.op_context);
    if (c == nullptr) return;
    switch (c->kind) {
        case CtxKind::SubOp: sub_done(*static_cast<SubOp *>(c), nullptr); break;
        case CtxKind::CtrlRecv: {
            auto *b = static_cast<CtrlBuf *>(c);
            if (stop_) {  // being destroyed: nothing to answer
                unposted_recvs_.push_back(b);
                break;
            }
            on_ctrl(b->data, e.len);
            unposted_recvs_.push_back(b);
            post_recvs();
            break;
        }
        case CtxKind::CtrlSend: on_ctrl_send_done(*static_cast<CtrlBuf *>(c), 0); break;
    }
}

void Transport::on_error(const fi_cq_err_entry &e) {
    auto *c = static_cast<Ctx *>(e.op_context);
    if (c == nullptr) {
        log_.log(FERRY_LOG_WARN, "completion error without context: %s", fi_error_string(e.err).c_str());
        return;
    }
    switch (c->kind) {
        case CtxKind::SubOp: sub_done(*static_cast<SubOp *>(c), &e); break;
        case CtxKind::CtrlRecv:
            unposted_recvs_.push_back(static_cast<CtrlBuf *>(c));
            if (!stop_) post_recvs();
            break;
        case CtxKind::CtrlSend: on_ctrl_send_done(*static_cast<CtrlBuf *>(c), e.err ? e.err : FI_EIO); break;
    }
}

// Reads one round of completions (mu_ held): how many entries, errors included.
size_t Transport::read_cq() {
    fi_cq_msg_entry entries[kCqBatch];
    ssize_t n;
    {
        auto lk = fab_.lock();
        n = fi_cq_read(fab_.cq, entries, kCqBatch);
    }
    if (n > 0) {
        for (ssize_t i = 0; i < n; ++i) on_completion(entries[i]);
        return static_cast<size_t>(n);
    }
    if (n == -FI_EAVAIL) {
        fi_cq_err_entry e{};
        ssize_t got;
        {
            auto lk = fab_.lock();
            got = fi_cq_readerr(fab_.cq, &e, 0);
        }
        if (got == 1) on_error(e);
        return 1;
    }
    if (n != -FI_EAGAIN) log_.log(FERRY_LOG_ERROR, "fi_cq_read: %s", fi_error_string(static_cast<int>(n)).c_str());
    return 0;
}

void Transport::progress_loop() {
    while (!stop_.load(std::memory_order_acquire)) {
        bool busy = false;
        {
            std::lock_guard lock(mu_);
            parked_ = false;
            busy |= run_remotes();
            busy |= post_ctrl_sends();
            busy |= stage_progress();
            busy |= post_ops();
            busy |= read_cq() > 0;
            if (cfg_.op_timeout_ms && Clock::now() >= next_timeout_scan_) {
                check_timeouts();
                next_timeout_scan_ = Clock::now() + std::chrono::milliseconds(50);
            }
            if (!ready_.empty()) busy = true;  // the provider pushed back (-FI_EAGAIN): keep progressing
            // Leased to a host: it reads what follows; going round again would only contend
            // with it for mu_ (measured: a futex sleep per op).
            int unused;
            if (busy && ready_.empty() && !cfg_.busy_poll && !stage_active() && host_leased(Clock::now(), &unused))
                busy = false;
        }
        if (busy) last_work_ = Clock::now();
        else idle_wait();
    }
}

int Transport::poll(ferry_completion_t *out, size_t max) {
    // The queue first: it clears the completion eventfd once empty, so a signal host_progress
    // asks for below outlives this call and the host's next poll(2) returns at once.
    size_t n = cq_.poll(out, max);
    if (host_fd_ < 0) return static_cast<int>(n);
    bool again = false;
    n += host_progress(out + n, max - n, &again);
    if (again) cq_.signal();
    return static_cast<int>(n);
}

// A host thread polls, usually because it woke on host_fd_: it reads the CQ itself (the provider
// progresses inside fi_cq_read), so the op completes without waking the progress thread and
// then this thread through the completion eventfd, and re-arms the CQ's wait object before the
// host sleeps on it again. mu_ keeps the CQ to one reader at a time. Staged device memory stays
// with the progress thread (it calls the host's staging functions). Returns how many
// completions it wrote into out (more go to cq_); *again: the host should poll again at once
// rather than sleep (more is waiting, or it spins).
//
// Spinning (spin_us > 0) is the host's here: it is the thread that waits for the op, and the
// progress thread stands aside while it polls. Within spin_us of the last work (a completion
// read, a submit) the host stays on the CQ while ops are in flight, for at most kHostSpinSlice
// per call (its own deadline and other transports come between), and then asks to be called
// again instead of re-arming the wait object: the completion fd stays readable, so its next
// poll(2), after the op completed and the next one was submitted, does not sleep either.
size_t Transport::host_progress(ferry_completion_t *out, size_t max, bool *again) {
    host_polled_.store(Clock::now().time_since_epoch().count(), std::memory_order_relaxed);
    std::unique_lock lock(mu_);
    if (stage_active() || stage_kick_.load()) {
        wake();
        return 0;
    }
    const auto spin = std::chrono::microseconds(cfg_.spin_us);
    const auto start = Clock::now();
    size_t n = 0;
    bool hot = false;
    for (;;) {
        if (host_round(out + n, max - n, &n) > 0) host_work_ = Clock::now();
        const auto now = Clock::now();
        hot = cfg_.spin_us > 0 && !stage_active() && now - host_work_ < spin;
        if (!hot || n > 0 || ops_.empty() || now - start >= kHostSpinSlice) break;
        lock.unlock();  // submit, and the progress thread's timer, may take it in between
        sched_yield();
        lock.lock();
    }
    bool armed = hot;  // a spinning host comes back without sleeping: nothing to re-arm
    for (int round = 0; !armed; ++round) {
        fid *fids[1] = {&fab_.cq->fid};
        {
            auto lk = fab_.lock();
            armed = fi_trywait(fab_.fabric, fids, 1) == FI_SUCCESS;
        }
        if (armed || round == 3 || stage_active()) break;
        host_round(out + n, max - n, &n);  // fi_trywait found more: read it
    }
    *again = hot || !armed;
    // Work that is the progress thread's: pieces the provider pushed back, staged requests.
    if (!ready_.empty() || stage_active() || stage_kick_.load()) wake();
    return n;
}

// One pass of host_progress (mu_ held): reads the CQ until a short read, then posts what the
// answers released; completions go into out (room for max), *n counts them. Returns the CQ
// entries read.
size_t Transport::host_round(ferry_completion_t *out, size_t max, size_t *n) {
    host_out_ = out;
    host_room_ = max;
    host_n_ = 0;
    size_t got = 0, r = kCqBatch;
    for (int reads = 0; reads < 16 && r == kCqBatch && !stage_active(); ++reads) got += r = read_cq();
    post_ctrl_sends();  // answers to control messages just read
    post_ops();         // ops a peer's answer released
    *n += host_n_;
    host_out_ = nullptr;
    host_room_ = 0;
    host_n_ = 0;
    return got;
}

// While a host polled within kHostLease the progress thread stays off the CQ; *left_ms: the
// lease's rest, rounded up.
bool Transport::host_leased(Clock::time_point now, int *left_ms) const {
    if (host_fd_ < 0) return false;
    auto since = now - Clock::time_point(Clock::duration(host_polled_.load(std::memory_order_relaxed)));
    if (since >= kHostLease) return false;
    *left_ms = static_cast<int>(std::chrono::ceil<std::chrono::milliseconds>(kHostLease - since).count());
    return true;
}

// Sleeps until the CQ or a submit has something, never longer than the next timer.
void Transport::idle_wait() {
    bool active, staged;
    {
        std::lock_guard lock(mu_);
        staged = stage_active() || stage_kick_.load();
        active = !ops_.empty() || !ctrl_out_.empty() || staged;
        for (auto &[t, r] : remotes_)
            if (r->state == Remote::State::Checking || r->state == Remote::State::Resetting) active = true;
        parked_ = !active;  // from here until the loop's next pass
    }
    // Right after work (ours, or a wake-up by the provider: a peer's RMA into us also needs our
    // polling) more usually follows within microseconds: poll a little longer before paying for
    // a sleep and a wake-up. The tcp provider makes progress only while polled.
    // A host polls the CQ: stand aside (no spinning, no CQ wait fd) until its lease ends; the
    // timer still bounds the sleep while ops are in flight, for their timeouts.
    int lease_ms = 0;
    const auto now = Clock::now();
    const bool aside = !cfg_.busy_poll && !staged && host_leased(now, &lease_ms);
    if (!aside && (cfg_.busy_poll || now - last_work_ < std::chrono::microseconds(cfg_.spin_us))) {
        sched_yield();
        return;
    }
    int timeout = active ? kActiveWaitMs : -1;
    if (aside) {
        timeout = timeout < 0 ? lease_ms : std::min(timeout, lease_ms);
    } else if (fab_.wait_fd >= 0) {
        fid *fids[1] = {&fab_.cq->fid};
        int rc;
        {
            auto lk = fab_.lock();
            rc = fi_trywait(fab_.fabric, fids, 1);
        }
        if (rc != FI_SUCCESS) {
            last_work_ = Clock::now();
            return;  // events are waiting: read them
        }
    } else if (active) {
        timeout = 0;  // no wait object: poll while work is in flight
        sched_yield();
    } else {
        timeout = 1;
    }
    epoll_event ev[4];
    int n = epoll_wait(aside ? aside_fd_ : epoll_fd_, ev, 4, timeout);
    if (n > 0) last_work_ = Clock::now();
    for (int i = 0; i < n; ++i)
        if (ev[i].data.fd == wake_fd_ || ev[i].data.fd == timer_fd_) {
            uint64_t v;
            (void)!read(ev[i].data.fd, &v, sizeof v);
        }
}

}  // namespace ferry_efa
