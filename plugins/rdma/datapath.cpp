// rdma.so's data path: submit turns ops into RDMA READ/WRITE work requests (split at both
// sides' registrations, striped over the nearest NICs by their measured throughput and queue,
// around NICs paused after a path error) and posts them with selective signalling; one progress
// thread polls every NIC's CQ, sleeping on the completion channels when idle, and counts each
// NIC's completed bytes; failed queue pairs are re-created over the control channel by the
// repair thread.
#include "transport.hpp"

#include <sys/epoll.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>

namespace ferry_rdma {

namespace {

constexpr unsigned kSeqBits = 48;
constexpr uint64_t kSeqMask = (1ull << kSeqBits) - 1;

std::string hex(uint64_t v) { return strprintf("0x%" PRIx64, v); }

// Status and words for a failed work completion.
int wc_status_code(ibv_wc_status s) {
    switch (s) {
        case IBV_WC_REM_ACCESS_ERR: return -EACCES;
        case IBV_WC_LOC_PROT_ERR:
        case IBV_WC_LOC_ACCESS_ERR: return -EFAULT;
        case IBV_WC_REM_INV_REQ_ERR:
        case IBV_WC_LOC_LEN_ERR: return -EINVAL;
        case IBV_WC_RETRY_EXC_ERR:
        case IBV_WC_RNR_RETRY_EXC_ERR: return -EHOSTUNREACH;
        case IBV_WC_WR_FLUSH_ERR: return -ECANCELED;
        default: return -EIO;
    }
}

const char *wc_status_hint(ibv_wc_status s) {
    switch (s) {
        case IBV_WC_REM_ACCESS_ERR:
            return "the peer's NIC refused the access: the region was deregistered there, or lacks the right";
        case IBV_WC_LOC_PROT_ERR:
        case IBV_WC_LOC_ACCESS_ERR: return "the local buffer is not covered by its registration";
        case IBV_WC_RETRY_EXC_ERR:
            return "no acknowledgement after the transport retries: the peer is gone or the fabric cannot reach it";
        case IBV_WC_RNR_RETRY_EXC_ERR: return "the peer's queue pair is not ready";
        case IBV_WC_REM_INV_REQ_ERR: return "the peer's NIC found the request invalid";
        default: return "";
    }
}

}  // namespace

int Transport::refusal(const Import &im, uint64_t ra, uint64_t len, uint32_t need, std::string *why) const {
    // Registrations must cover [ra, ra+len) without a gap and grant the right throughout.
    const uint64_t end = ra + len;
    size_t c = chunk_index(im.spans, ra);
    if (c == SIZE_MAX) {
        *why = strprintf("[%s, +%" PRIu64 ") starts outside memory the peer registered", hex(ra).c_str(), len);
        return -EFAULT;
    }
    for (;;) {
        const RemoteChunk &ch = im.desc.chunks[c];
        if (!(ch.access & need)) {
            *why = strprintf("the peer registered [%s, +%" PRIu64 ") without remote %s access", hex(ch.addr).c_str(),
                             ch.len, need == FERRY_ACCESS_REMOTE_READ ? "read" : "write");
            return -EACCES;
        }
        uint64_t at = ch.addr + ch.len;
        if (at >= end) return 0;
        if (++c >= im.spans.size() || im.spans[c].addr != at) {
            *why = strprintf("[%s, +%" PRIu64 ") is not inside memory the peer registered (none from %s on)",
                             hex(ra).c_str(), len, hex(at).c_str());
            return -EFAULT;
        }
    }
}

std::string Transport::pair_name(const Pair &p) const {
    return nics_[p.lnic]->name() + " -> " + p.peer->name + " " + p.peer->ep.nics[p.rnic].name;
}

void Transport::wake() {
    if (wake_fd_ >= 0) {
        uint64_t one = 1;
        (void)!write(wake_fd_, &one, sizeof one);
    }
}

int Transport::submit(uint64_t peer_id, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    auto pit = peers_.find(peer_id);
    if (pit == peers_.end())
        return set_error(err, -ENOENT, "rdma: submit: no peer %" PRIu64 " (disconnected, or never connected)", peer_id);
    Peer &peer = *pit->second;
    // Validate everything first: all or nothing.
    struct Planned {
        std::shared_ptr<LocalRegion> region;
        const Import *import = nullptr;
        std::vector<WrPiece> pieces;
        int refused = 0;
        std::string refusal;
    };
    std::vector<Planned> plan(n);
    // Each NIC's queue, throughput and pause now; the ops of this batch add to the queues as
    // they are planned, so they spread too.
    const auto now = Clock::now();
    nic_balance_.sample(now);
    std::vector<RailLoad> nic_load = nic_balance_.loads(now);
    for (size_t i = 0; i < n; ++i) {
        const ferry_xfer_op_t &o = ops[i];
        if (o.opcode != FERRY_OP_READ && o.opcode != FERRY_OP_WRITE)
            return set_error(err, -EINVAL, "rdma: submit: op %zu has unknown opcode %u", i, o.opcode);
        if (o.length == 0) return set_error(err, -EINVAL, "rdma: submit: op %zu has length 0", i);
        auto rit = regions_.find(o.local_mem);
        if (rit == regions_.end())
            return set_error(err, -ENOENT,
                             "rdma: submit: op %zu: no local region with handle %" PRIu64 " (deregistered?)", i,
                             o.local_mem);
        const LocalRegion &lr = *rit->second;
        if (!lr.contains(o.local_addr, o.length))
            return set_error(err, -EFAULT,
                             "rdma: submit: op %zu: local [%s, +%" PRIu64 ") is outside its region [%s, +%" PRIu64 ")",
                             i, hex(o.local_addr).c_str(), o.length, hex(lr.addr).c_str(), lr.length);
        auto iit = imports_.find(o.remote_mem);
        if (iit == imports_.end() || iit->second.peer != peer_id)
            return set_error(err, -ENOENT, "rdma: submit: op %zu: no imported region %" PRIu64 " of peer %s", i,
                             o.remote_mem, peer.name.c_str());
        const Import &im = iit->second;
        // The initiator enforces the descriptor: the target's CPU never sees the op.
        uint64_t ra = o.remote_addr;
        if (ra < im.addr || o.length > im.length || ra - im.addr > im.length - o.length)
            return set_error(err, -EFAULT,
                             "rdma: submit: op %zu: remote [%s, +%" PRIu64 ") is outside the region [%s, +%" PRIu64
                             ") imported from %s",
                             i, hex(ra).c_str(), o.length, hex(im.addr).c_str(), im.length, peer.name.c_str());
        uint32_t need = o.opcode == FERRY_OP_READ ? FERRY_ACCESS_REMOTE_READ : FERRY_ACCESS_REMOTE_WRITE;
        plan[i].refused = refusal(im, ra, o.length, need, &plan[i].refusal);
        plan[i].region = rit->second;
        plan[i].import = &im;
        if (plan[i].refused != 0) continue;  // completes with the refusal; the peer's NIC would refuse it the same way
        WrPlanInput in;
        in.local_addr = o.local_addr;
        in.remote_addr = ra;
        in.len = o.length;
        in.local_chunks = &lr.chunks;
        in.remote_chunks = &im.spans;
        in.local_nics = lr.nearest;
        in.other_nics = lr.farther;
        in.remote_nics = im.nearest;
        in.nic_load = &nic_load;
        in.stripe_min = cfg_.stripe_min;
        in.max_wr_size = cfg_.max_wr_size;
        for (const auto &nic : nics_)
            if (nic->max_msg_size != 0) in.max_wr_size = std::min<uint64_t>(in.max_wr_size, nic->max_msg_size);
        in.rotation = rotation_++;
        plan[i].pieces = plan_work_requests(in);
        if (plan[i].pieces.empty()) return set_error(err, -EINVAL, "rdma: submit: op %zu could not be planned", i);
        for (const auto &pc : plan[i].pieces) nic_load[pc.local_nic].queued += pc.len;
        for (const auto &pc : plan[i].pieces)
            if (peer.pair(pc.local_nic, pc.remote_nic) == nullptr)
                return set_error(err, -ENOTCONN, "rdma: submit: the peer %s is unreachable: every queue pair failed",
                                 peer.name.c_str());
    }
    for (size_t i = 0; i < n; ++i)
        if (!plan[i].region->pin()) {
            for (size_t j = 0; j < i; ++j) plan[j].region->unpin();
            return set_error(err, -ENOENT, "rdma: submit: op %zu: its local region is being deregistered", i);
        }
    std::vector<Pair *> touched;
    for (size_t i = 0; i < n; ++i) {
        auto op = std::make_unique<Op>();
        op->user_data = ops[i].user_data;
        op->opcode = ops[i].opcode;
        op->pin = plan[i].region;
        op->remaining = static_cast<uint32_t>(plan[i].pieces.size());
        if (plan[i].refused != 0) {
            cq_.push(op->user_data, plan[i].refused, strprintf("rdma: op %zu refused: %s", i, plan[i].refusal.c_str()));
            plan[i].region->unpin();
            continue;
        }
        const LocalRegion &lr = *plan[i].region;
        std::vector<Wr *> last_on(peer.pairs.size(), nullptr);
        for (const auto &pc : plan[i].pieces) {
            Pair *p = peer.pair(pc.local_nic, pc.remote_nic);
            Wr w;
            w.op = op.get();
            w.piece = pc;
            w.piece.local_nic = p->lnic;  // the pair may differ from the plan's choice (fallback)
            w.piece.remote_nic = p->rnic;
            w.lkey = lr.mrs[pc.local_chunk][p->lnic]->lkey;
            w.rkey = plan[i].import->desc.chunks[pc.remote_chunk].rkeys[p->rnic];
            w.queued = now;
            p->pending.push_back(w);
            nic_balance_.queue(p->lnic, w.piece.len);
            last_on[p->lnic * peer.ep.nics.size() + p->rnic] = &p->pending.back();
            if (std::find(touched.begin(), touched.end(), p) == touched.end()) touched.push_back(p);
        }
        for (Wr *w : last_on)
            if (w != nullptr) w->last_on_pair = true;
        Op *raw = op.get();
        ops_[raw] = std::move(op);
    }
    for (Pair *p : touched) post_pending(*p);
    return 0;
}

void Transport::post_pending(Pair &p) {
    if (p.state != Pair::State::Ready) return;
    constexpr size_t kChain = 32;
    while (!p.pending.empty() && p.window.can_post()) {
        ibv_send_wr wrs[kChain];
        ibv_sge sges[kChain];
        size_t k = 0;
        for (; k < kChain && k < p.pending.size() && p.window.can_post(); ++k) {
            const Wr &w = p.pending[k];
            bool signal = p.window.must_signal(w.last_on_pair);
            uint64_t seq = p.window.post(signal);
            sges[k] = {w.piece.local_addr, static_cast<uint32_t>(w.piece.len), w.lkey};
            wrs[k] = {};
            wrs[k].wr_id = (static_cast<uint64_t>(p.generation) << kSeqBits) | (seq & kSeqMask);
            wrs[k].sg_list = &sges[k];
            wrs[k].num_sge = 1;
            wrs[k].opcode = w.op->opcode == FERRY_OP_READ ? IBV_WR_RDMA_READ : IBV_WR_RDMA_WRITE;
            wrs[k].send_flags = signal ? IBV_SEND_SIGNALED : 0;
            wrs[k].wr.rdma.remote_addr = w.piece.remote_addr;
            wrs[k].wr.rdma.rkey = w.rkey;
            wrs[k].next = nullptr;
            if (k > 0) wrs[k - 1].next = &wrs[k];
        }
        ibv_send_wr *bad = nullptr;
        int rc = ibv_post_send(p.qp->get(), &wrs[0], &bad);
        size_t posted = rc == 0 ? k : static_cast<size_t>(bad - wrs);
        for (size_t i = 0; i < posted; ++i) {
            p.inflight.push_back(p.pending.front());
            p.pending.pop_front();
        }
        if (rc != 0) {
            p.window.rollback(static_cast<uint32_t>(k - posted));
            // The queue refused it (it is in error, or the device is gone): re-create it.
            pair_failed(p, "ibv_post_send on " + pair_name(p) + ": " + errno_string(rc));
            return;
        }
    }
}

void Transport::finish_wr(const Wr &w, int status, const std::string &message) {
    nic_stats_.finished(nic_balance_, w.piece.local_nic, w.op->opcode, w.piece.len, status == 0);
    Op *op = w.op;
    if (status != 0 && op->status == 0) {
        op->status = status;
        op->message = message;
    }
    if (--op->remaining > 0) return;
    cq_.push(op->user_data, op->status, op->message);
    op->pin->unpin();
    ops_.erase(op);
}

void Transport::on_wc(size_t nic, const ibv_wc &wc) {
    // Each NIC's CQ is polled separately; queue pair numbers are unique per device.
    auto it = by_qpn_[nic].find(wc.qp_num);
    Pair *p = it == by_qpn_[nic].end() ? nullptr : it->second;
    if (p == nullptr || (wc.wr_id >> kSeqBits) != p->generation)
        return;  // a queue pair already replaced: its flushed requests were requeued
    uint64_t seq = wc.wr_id & kSeqMask;
    if (wc.status == IBV_WC_SUCCESS) {
        uint32_t done = p->window.complete(seq);
        for (uint32_t i = 0; i < done && !p->inflight.empty(); ++i) {
            finish_wr(p->inflight.front(), 0, {});
            p->inflight.pop_front();
        }
        post_pending(*p);
        return;
    }
    uint32_t before = 0;
    if (!p->window.fail(seq, &before)) return;
    for (uint32_t i = 0; i < before && !p->inflight.empty(); ++i) {
        finish_wr(p->inflight.front(), 0, {});
        p->inflight.pop_front();
    }
    if (p->inflight.empty()) return;
    Wr failed = p->inflight.front();
    p->inflight.pop_front();
    int code = wc_status_code(wc.status);
    const char *hint = wc_status_hint(wc.status);
    std::string msg =
        strprintf("rdma: %s of [%s, +%" PRIu64 ") at %s on %s failed: %s (vendor error 0x%x)%s%s",
                  failed.op->opcode == FERRY_OP_READ ? "READ" : "WRITE", hex(failed.piece.remote_addr).c_str(),
                  failed.piece.len, p->peer->name.c_str(), pair_name(*p).c_str(), ibv_wc_status_str(wc.status),
                  wc.vendor_err, *hint ? ": " : "", hint);
    finish_wr(failed, code, msg);
    if (wc_path_error(wc.status)) pause_nic(p->lnic, msg);
    pair_failed(*p, msg);
}

void Transport::pause_nic(uint16_t nic, const std::string &why) {
    // Its other queue pairs' failures of the same outage (work posted before the pause) find
    // it paused already: logged once.
    auto pause = nic_stats_.path_error(nic_balance_, nic, Clock::now());
    if (pause <= Clock::duration::zero()) return;
    log_.log(FERRY_LOG_WARN,
             "NIC %s paused for %lld ms after a path error (%s): new work requests go to the other NICs until then, "
             "then it is tried again (each failure in a row doubles the pause, up to 30 s)",
             nics_[nic]->name().c_str(),
             static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(pause).count()), why.c_str());
}

int Transport::rail_stats(ferry_rail_stats_t *out, size_t *n, ferry_error_t *err) {
    std::vector<std::string> names;
    for (const auto &nic : nics_) names.push_back(nic->name() + ":" + std::to_string(nic->addr.port));
    std::vector<ferry_rail_stats_t> rails;
    {
        std::lock_guard lock(mu_);
        rails = nic_stats_.report(names, nic_balance_, Clock::now(), peers_.size());
    }
    return ferry_plugin::copy_rail_stats(rails, out, n, err, kName);
}

void Transport::pair_failed(Pair &p, const std::string &why) {
    if (p.state != Pair::State::Ready) return;
    // Requests behind the failed one were flushed, never executed (RC executes in order and
    // stops at the error), so they go back in front of the queue for the new queue pair.
    p.window.drain();
    while (!p.inflight.empty()) {
        p.pending.push_front(p.inflight.back());
        p.inflight.pop_back();
    }
    by_qpn_[p.lnic].erase(p.qp->qpn());
    p.qp->to_error();
    p.state = Pair::State::Repairing;
    p.why = why;
    log_.log(FERRY_LOG_INFO, "re-creating queue pair %s after: %s", pair_name(p).c_str(), why.c_str());
    std::lock_guard lock(repair_mu_);
    to_repair_.emplace_back(peers_.count(p.peer->id) ? peers_[p.peer->id] : nullptr, &p);
    repair_cv_.notify_one();
}

void Transport::kill_pair(Pair &p, int status, const std::string &why) {
    p.state = Pair::State::Dead;
    p.why = why;
    while (!p.pending.empty()) {
        finish_wr(p.pending.front(), status, why);
        p.pending.pop_front();
    }
}

void Transport::drop_peer_ops(Peer &peer, int status, const std::string &why) {
    for (auto &p : peer.pairs) {
        if (!p) continue;
        if (p->qp) {
            by_qpn_[p->lnic].erase(p->qp->qpn());
            p->qp.reset();  // after ibv_destroy_qp the NIC touches none of these buffers
        }
        p->window.drain();
        while (!p->inflight.empty()) {
            p->pending.push_front(p->inflight.back());
            p->inflight.pop_back();
        }
        kill_pair(*p, status, why);
    }
}

void Transport::repair_loop() {
    while (!stop_) {
        std::shared_ptr<Peer> peer;
        Pair *p = nullptr;
        {
            std::unique_lock lock(repair_mu_);
            repair_cv_.wait(lock, [&] { return stop_ || !to_repair_.empty(); });
            if (stop_) return;
            peer = to_repair_.front().first;
            p = to_repair_.front().second;
            to_repair_.pop_front();
        }
        if (peer) repair(peer, *p);
    }
}

void Transport::repair(const std::shared_ptr<Peer> &peer, Pair &p) {
    std::lock_guard ctrl(peer->ctrl_mu);
    {
        std::lock_guard lock(mu_);
        if (peer->closing || p.state != Pair::State::Repairing) return;
    }
    std::vector<std::unique_ptr<QueuePair>> qps;
    std::string why;
    int rc = peer->ctrl_fd < 0 ? -ENOTCONN : handshake(*peer, {{p.lnic, p.rnic}}, CtrlType::Reconnect, &qps, &why);
    std::lock_guard lock(mu_);
    if (peer->closing) return;
    if (rc != 0) {
        kill_pair(p, -ECONNRESET,
                  "rdma: " + pair_name(p) + " failed (" + p.why + ") and could not be re-created: " + why);
        return;
    }
    p.qp = std::move(qps[0]);
    p.window = SendWindow(p.qp->depth(), cfg_.signal_interval);
    ++p.generation;
    by_qpn_[p.lnic][p.qp->qpn()] = &p;
    p.state = Pair::State::Ready;
    post_pending(p);
}

void Transport::check_timeouts() {
    if (cfg_.op_timeout_ms == 0) return;
    auto limit = Clock::now() - std::chrono::milliseconds(cfg_.op_timeout_ms);
    for (auto &[id, peer] : peers_)
        for (auto &p : peer->pairs) {
            if (!p || p->state != Pair::State::Repairing) continue;
            while (!p->pending.empty() && p->pending.front().queued < limit) {
                finish_wr(p->pending.front(), -ETIMEDOUT,
                          strprintf("rdma: op to %s waited %u ms for queue pair %s to be re-created (%s)",
                                    peer->name.c_str(), cfg_.op_timeout_ms, pair_name(*p).c_str(), p->why.c_str()));
                p->pending.pop_front();
            }
        }
}

void Transport::progress_loop() {
    constexpr int kBatch = 32;
    ibv_wc wcs[kBatch];
    auto last_work = Clock::now();
    auto poll_all = [&] {
        bool any = false;
        std::lock_guard lock(mu_);
        for (size_t k = 0; k < nics_.size(); ++k) {
            int got;
            while ((got = ibv_poll_cq(nics_[k]->cq, kBatch, wcs)) > 0) {
                any = true;
                for (int i = 0; i < got; ++i) on_wc(k, wcs[i]);
            }
        }
        auto now = Clock::now();
        nic_balance_.sample(now);  // throughput from the bytes just completed (every 2 ms at most)
        if (now >= next_timeout_scan_) {
            check_timeouts();
            next_timeout_scan_ = now + std::chrono::milliseconds(100);
        }
        return any;
    };
    while (!stop_) {
        if (poll_all()) {
            last_work = Clock::now();
            continue;
        }
        if (cfg_.busy_poll || Clock::now() - last_work < std::chrono::microseconds(cfg_.spin_us)) continue;
        // Arm every CQ, then look once more: a completion that landed before arming raises no event.
        for (auto &nic : nics_) ibv_req_notify_cq(nic->cq, 0);
        if (poll_all()) {
            last_work = Clock::now();
            continue;
        }
        epoll_event evs[kMaxNics + 1];
        int n = epoll_wait(epoll_fd_, evs, static_cast<int>(nics_.size() + 1), 100);
        for (int i = 0; i < n; ++i) {
            if (evs[i].data.u64 == UINT64_MAX) {
                uint64_t v;
                (void)!read(wake_fd_, &v, sizeof v);
                continue;
            }
            Nic &nic = *nics_[evs[i].data.u64];
            ibv_cq *cq = nullptr;
            void *ctx = nullptr;
            if (ibv_get_cq_event(nic.channel, &cq, &ctx) == 0) ibv_ack_cq_events(cq, 1);
        }
    }
}

}  // namespace ferry_rdma
