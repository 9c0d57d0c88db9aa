#include "peer.hpp"

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdint>

namespace ferry_tcp {

// Rails use rail_balance's tuning as it is: a failed rail is paused 1 s, doubled on each failure
// within 30 s of the previous one, at most 30 s; lanes' throughput is sampled at most every
// 2 ms, each sample weighing 0.3 in the average.
Peer::Peer(uint64_t id, std::vector<Rail> rails, const Config &cfg, const Logger &log, RegionTable &regions,
           WaitSet &waiters, CompletionQueue &cq, RailTally &tally)
    : id_(id),
      rails_(std::move(rails)),
      cfg_(cfg),
      log_(log),
      regions_(regions),
      waiters_(waiters),
      cq_(cq),
      tally_(tally),
      health_(rails_.size()) {}

Peer::~Peer() = default;

void Peer::add_lane(Reactor &reactor, unsigned rail) {
    lanes_.push_back(std::make_unique<Lane>(*this, reactor, waiters_, static_cast<unsigned>(lanes_.size()), rail));
}

int Peer::connect_lanes(std::string *why) {
    {
        std::lock_guard lk(hs_mu_);
        hs_rail_failed_.assign(rails_.size(), 0);
    }
    for (auto &lane : lanes_) {
        Lane *l = lane.get();
        l->reactor().post([l] { l->start(); });
    }
    // The lanes enforce connect_timeout_ms themselves; the extra second only guards against
    // a reactor that cannot run. With several rails every lane answers (one rail that connects
    // is enough); with one, the first failure decides.
    const bool railed = rails_.size() > 1;
    auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.connect_timeout_ms + 1000);
    std::unique_lock lk(hs_mu_);
    bool done = hs_cv_.wait_until(lk, deadline, [&] {
        return railed ? hs_answered_ >= lanes_.size() : hs_status_ != 0 || hs_ok_ >= lanes_.size();
    });
    if (railed && done) {
        std::string failed;
        for (size_t r = 0; r < rails_.size(); ++r)
            if (hs_rail_failed_[r]) failed += (failed.empty() ? "" : ", ") + rails_[r].name;
        if (failed.size() && std::count(hs_rail_failed_.begin(), hs_rail_failed_.end(), 1) < ptrdiff_t(rails_.size())) {
            log_.log(FERRY_LOG_WARN, "peer %s: rails %s could not connect (%s); paused, the others carry its ops",
                     endpoint().name.c_str(), failed.c_str(), hs_why_.c_str());
            std::lock_guard rl(rails_mu_);
            for (size_t r = 0; r < rails_.size(); ++r)
                if (hs_rail_failed_[r]) {
                    health_.pause(r, Clock::now());
                    tally_.paused(rails_[r].local);
                }
            return 0;
        }
    }
    if (hs_status_ != 0) {
        *why = hs_why_;
        return hs_status_;
    }
    if (!done) {
        *why = strprintf("connect to peer %s timed out after %u ms", endpoint().name.c_str(), cfg_.connect_timeout_ms);
        return -ETIMEDOUT;
    }
    return 0;
}

void Peer::on_handshake(unsigned lane, int status, const std::string &why) {
    std::lock_guard lk(hs_mu_);
    ++hs_answered_;
    if (status == 0) {
        ++hs_ok_;
    } else {
        if (hs_status_ == 0) {
            hs_status_ = status;
            hs_why_ = why;
        }
        unsigned r = lane < lanes_.size() ? lanes_[lane]->rail() : 0;
        if (r < hs_rail_failed_.size()) hs_rail_failed_[r] = 1;
    }
    hs_cv_.notify_all();
}

void Peer::close(int status, const std::string &why) {
    {
        std::lock_guard lk(rails_mu_);
        closing_ = true;
    }
    {
        std::lock_guard lk(submit_mu_);
        closed_ = true;
    }
    for (auto &lane : lanes_) {
        Lane *l = lane.get();
        l->reactor().run_sync([&] { l->shutdown(status, why); });
    }
    waiters_.barrier();  // no host poll() still parses on a lane: they may be freed
}

int Peer::import_region(uint64_t handle, const RemoteRegion &r) {
    std::unique_lock lk(imp_mu_);
    imported_[handle] = r;
    return 0;
}

bool Peer::release_region(uint64_t handle) {
    std::unique_lock lk(imp_mu_);
    return imported_.erase(handle) != 0;
}

// Early client-side check against the imported description. The serving side checks again
// against what is really registered: that check is the security boundary.
int Peer::check_remote(size_t i, const ferry_xfer_op_t &op, ferry_error_t *err) {
    std::shared_lock lk(imp_mu_);
    auto it = imported_.find(op.remote_mem);
    if (it == imported_.end())
        return set_error(err, -EINVAL, "tcp: op %zu: remote_mem %llu is not a region imported from peer %s", i,
                         static_cast<unsigned long long>(op.remote_mem), endpoint().name.c_str());
    const RemoteRegion &r = it->second;
    if (op.remote_addr < r.addr || op.remote_addr + op.length < op.remote_addr ||
        op.remote_addr + op.length > r.addr + r.len)
        return set_error(err, -EFAULT,
                         "tcp: op %zu: remote range [0x%llx, +%llu) is outside imported region "
                         "[0x%llx, 0x%llx) of peer %s",
                         i, static_cast<unsigned long long>(op.remote_addr), static_cast<unsigned long long>(op.length),
                         static_cast<unsigned long long>(r.addr), static_cast<unsigned long long>(r.addr + r.len),
                         endpoint().name.c_str());
    uint32_t need = op.opcode == FERRY_OP_WRITE ? FERRY_ACCESS_REMOTE_WRITE : FERRY_ACCESS_REMOTE_READ;
    if ((r.access & need) == 0)
        return set_error(err, -EACCES,
                         "tcp: op %zu: imported region [0x%llx, 0x%llx) of peer %s "
                         "does not grant remote %s",
                         i, static_cast<unsigned long long>(r.addr), static_cast<unsigned long long>(r.addr + r.len),
                         endpoint().name.c_str(), op.opcode == FERRY_OP_WRITE ? "write" : "read");
    return 0;
}

int Peer::submit(const ferry_xfer_op_t *ops, size_t n_ops, ferry_error_t *err) {
    // Phase 1: validate every op and take the local region references. Nothing is started.
    std::vector<Region *> locals;
    locals.reserve(n_ops);
    auto release_all = [&] {
        for (Region *r : locals) regions_.release(r);
    };
    for (size_t i = 0; i < n_ops; ++i) {
        const ferry_xfer_op_t &op = ops[i];
        int rc = 0;
        if (op.opcode != FERRY_OP_READ && op.opcode != FERRY_OP_WRITE)
            rc = set_error(err, -EINVAL, "tcp: op %zu: unknown opcode %u", i, op.opcode);
        else if (op.length == 0) rc = set_error(err, -EINVAL, "tcp: op %zu: length is 0", i);
        else if (op.length / cfg_.slice_size >= UINT32_MAX)
            rc = set_error(err, -EINVAL, "tcp: op %zu: length %llu is too large", i,
                           static_cast<unsigned long long>(op.length));
        else rc = check_remote(i, op, err);
        if (rc == 0) {
            int code = 0;
            std::string why;
            Region *r = regions_.acquire_local(op.local_mem, op.local_addr, op.length, &code, &why);
            if (r == nullptr) {
                rc = set_error(err, code, "tcp: op %zu: %s", i, why.c_str());
            } else {
                locals.push_back(r);
                if (r->kind != FERRY_MEM_HOST)  // registered to be served staged, never touched here
                    rc = set_error(err, -ENOTSUP,
                                   "tcp: op %zu: local region %llu is device memory: tcp serves "
                                   "peers' access to it through the host's staging but does not "
                                   "move it as an initiator (the core stages initiator-side GPU "
                                   "buffers)",
                                   i, static_cast<unsigned long long>(op.local_mem));
            }
        }
        if (rc != 0) {
            release_all();
            return rc;
        }
    }

    std::lock_guard lk(submit_mu_);
    if (closed_) {
        release_all();
        return set_error(err, -ENOTCONN, "tcp: peer %s is disconnected", endpoint().name.c_str());
    }
    // Phase 2: build the ops and per-lane batches (may throw std::bad_alloc: then nothing
    // was handed to a lane and everything built is freed).
    const size_t nl = lanes_.size();
    std::vector<Lane::Batch> batches(nl);
    // Each lane's bytes queued and, with several rails, its expected throughput and whether its
    // rail takes new slices now.
    std::vector<RailLoad> load(nl);
    for (size_t l = 0; l < nl; ++l) {
        batches[l].emplace_back();
        load[l].queued = lanes_[l]->load();
    }
    // Several rails: a slice goes to the lane that will have finished it first, by its queue
    // and measured throughput, among the rails not paused.
    const bool railed = rails_.size() > 1;
    if (railed) {
        auto now = Clock::now();
        std::vector<char> usable;
        usable_lanes(now, usable);
        sample_rates(now);
        for (size_t l = 0; l < nl; ++l) {
            load[l].usable = usable[l] != 0;
            load[l].rate = rates_.expected(l);
        }
    }
    std::unique_ptr<OpBlock> block;
    size_t best = 0;                   // lane taking the next slice
    uint64_t given = cfg_.slice_size;  // bytes it took from this batch so far (full: pick again)
    try {
        block = std::make_unique<OpBlock>(n_ops);
        for (size_t i = 0; i < n_ops; ++i) {
            const ferry_xfer_op_t &o = ops[i];
            const uint64_t slices = (o.length + cfg_.slice_size - 1) / cfg_.slice_size;
            Op *op = &block->ops[i];
            op->user_data = o.user_data;
            op->table = &regions_;
            op->local = locals[i];
            op->remaining.store(static_cast<uint32_t>(slices), std::memory_order_relaxed);
            for (uint64_t off = 0; off < o.length; off += cfg_.slice_size) {
                // Lanes are taken a slice's worth of bytes at a time: a batch of small ops goes
                // to one lane (one wake-up and one send on each side instead of one per lane),
                // large ops still spread over all of them.
                if (given >= cfg_.slice_size) {
                    if (!railed) {
                        best = 0;
                        for (size_t l = 1; l < nl; ++l)
                            if (load[l].queued < load[best].queued) best = l;
                    } else {
                        best = earliest_finish(load, cfg_.slice_size);
                    }
                    given = 0;
                }
                Slice s;
                s.op = op;
                s.opcode = static_cast<uint8_t>(o.opcode);
                s.local_addr = o.local_addr + off;
                s.remote_addr = o.remote_addr + off;
                s.len = std::min<uint64_t>(cfg_.slice_size, o.length - off);
                load[best].queued += s.len;
                given += s.len;
                batches[best].front().push_back(s);
            }
        }
    } catch (...) {
        release_all();  // block frees the ops
        throw;
    }
    if (n_ops > 0) (void)block.release();  // its ops own it from here on: the last to complete frees it
    // Phase 3: hand the batches over. Nothing here can fail. A small batch is sent from this
    // thread when its lane is idle (Lane::send_now): no wake-up of the lane's reactor.
    thread_local std::vector<ferry_completion_t> failed;
    for (size_t l = 0; l < nl; ++l) {
        if (batches[l].front().empty()) continue;
        uint64_t bytes = 0;
        bool small = true;
        for (const Slice &s : batches[l].front()) {
            bytes += s.len;
            small = small && s.len <= kSmallPayload;
        }
        lanes_[l]->add_load(bytes);
        if (small && bytes <= kSendNowMax && lanes_[l]->send_now(batches[l].front(), failed)) continue;
        lanes_[l]->push(batches[l]);
    }
    if (!failed.empty()) cq_.push(failed);
    return 0;
}

void Peer::usable_lanes(Clock::time_point now, std::vector<char> &usable) {
    std::vector<char> rails;
    {
        std::lock_guard lk(rails_mu_);
        rails = health_.usable(now);  // every rail paused: they are all tried (the probe)
    }
    usable.resize(lanes_.size());
    for (size_t l = 0; l < lanes_.size(); ++l) usable[l] = rails[lanes_[l]->rail()];
}

void Peer::sample_rates(Clock::time_point now) {
    if (rates_.size() != lanes_.size()) rates_.resize(lanes_.size());
    rates_.sample(now, [&](size_t l) {
        const Lane &lane = *lanes_[l];
        return RailRates::Observed{lane.done_bytes(), lane.load() > 0};
    });
}

std::vector<RailNow> Peer::rails_now(Clock::time_point now) {
    std::vector<RailNow> out(rails_.size());
    for (size_t r = 0; r < rails_.size(); ++r) out[r].local = rails_[r].local;
    {
        std::lock_guard lk(rails_mu_);
        for (size_t r = 0; r < rails_.size(); ++r) out[r].paused = health_.paused(r, now);
    }
    std::lock_guard lk(submit_mu_);  // rates_ is measured by submits
    for (size_t l = 0; l < lanes_.size(); ++l) {
        RailNow &r = out[lanes_[l]->rail()];
        r.queued += lanes_[l]->load();
        if (l < rates_.size()) r.rate += rates_.rate(l);
    }
    return out;
}

bool Peer::reroute(unsigned rail, const std::string &why, std::deque<Slice> &slices) {
    std::lock_guard lk(rails_mu_);
    if (closing_ || rails_.size() < 2) return false;
    const auto now = Clock::now();
    // A failure while the rail is paused already (its other lanes, work sent before the pause)
    // is the same outage: logged and counted once.
    if (auto pause = health_.fail(rail, now); pause > Clock::duration::zero()) {
        tally_.paused(rails_[rail].local);
        log_.log(FERRY_LOG_WARN, "peer %s: rail %s failed (%s); paused %lld ms, %zu slices move to the other rails",
                 endpoint().name.c_str(), rails_[rail].name.c_str(), why.c_str(),
                 static_cast<long long>(std::chrono::duration_cast<std::chrono::milliseconds>(pause).count()),
                 slices.size());
    }
    if (slices.empty()) return true;
    std::vector<size_t> targets;
    for (size_t l = 0; l < lanes_.size(); ++l)
        if (lanes_[l]->rail() != rail && !health_.paused(lanes_[l]->rail(), now)) targets.push_back(l);
    if (targets.empty()) return false;
    try {
        std::vector<Lane::Batch> batches(targets.size());
        std::vector<uint64_t> load(targets.size()), bytes(targets.size(), 0);
        for (size_t k = 0; k < targets.size(); ++k) {
            batches[k].emplace_back();
            load[k] = lanes_[targets[k]]->load();
        }
        for (const Slice &s : slices) {
            size_t k = static_cast<size_t>(std::min_element(load.begin(), load.end()) - load.begin());
            batches[k].front().push_back(s);
            load[k] += s.len;
            bytes[k] += s.len;
        }
        for (size_t k = 0; k < targets.size(); ++k) {
            if (batches[k].front().empty()) continue;
            lanes_[targets[k]]->add_load(bytes[k]);
            lanes_[targets[k]]->push(batches[k]);
        }
    } catch (...) {
        return false;  // nothing was pushed before the allocations: the lane fails them
    }
    return true;
}

}  // namespace ferry_tcp
