// The target's side of staged device memory (staged.hpp): regions registered without FI_HMEM
// are never given to the provider (a peer's RMA cannot reach device memory, and no device address
// is dereferenced here); a peer's StageRead/StageWrite is checked against them and served slice
// by slice through one StageWindow per peer, each slice in a host buffer registered for that one
// grant. What a peer cannot make this side do:
// - touch anything but the range it asked for inside a region registered for staging with the
//   right it needs, or a buffer after its grant ended (the grant's MR is closed first);
// - hold more than kMaxStagedServedPerRemote requests (kMaxStagedServed for all peers), or more
//   than the window's depth of buffers: the host's bound (gpu_staging_max_bytes) caps them all;
// - keep buffers: a grant not done within op_timeout_ms (30 s when 0) takes back every buffer
//   of that peer, after closing their MRs and cutting the connections to it; a peer whose
//   messages cannot be delivered, or that is found unreachable, loses them at once;
// - starve others: buffers are acquired round robin, the peer after the last one served first.
#include "transport.hpp"

#include "conn_cut.hpp"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace ferry_efa {

namespace {

const char *kind_of(const LocalRegion &r) { return ferry_staged::kind_name(r.kind); }

unsigned grant_timeout_ms(const Config &c) { return c.op_timeout_ms ? c.op_timeout_ms : 30000u; }

}  // namespace

int Transport::stage_register(const ferry_mem_region_t &r, LocalRegion &region, std::string *why) {
    if (int rc = stager_.check_region(r, why)) {
        *why += strprintf(", and provider %s does not report FI_HMEM", fab_.info->fabric_attr->prov_name);
        return rc;
    }
    region.staged = true;  // no MR: peers reach it only through grants
    return 0;
}

void Transport::stage_on_request(Remote &r, const CtrlHeader &h, bool write, const StageReqBody &b) {
    auto refuse = [&](int code, const std::string &why) {
        send_ctrl(r, CtrlType::StageAck, h.req_id, code, why.data(), std::min(why.size(), kCtrlSize / 2));
    };
    const char *what = write ? "WRITE" : "READ";
    if (h.to_token != token_) return refuse(-ESTALE, "efa: the request was meant for an instance that is gone");
    auto it = serving_.find(&r);
    if (it != serving_.end()) {
        if (it->second->reqs.size() >= kMaxStagedServedPerRemote || served_ >= kMaxStagedServed)
            return refuse(-EBUSY, strprintf("efa: %zu staged requests of this peer are served already (at most %u "
                                            "per peer, %zu in all); send fewer at once",
                                            it->second->reqs.size(), kMaxStagedServedPerRemote, kMaxStagedServed));
        for (const ServeReq &q : it->second->reqs)
            if (q.id == h.req_id) {  // an honest peer never reuses a live id
                ++ignored_.malformed[static_cast<size_t>(CtrlBad::Body)];
                ++ignored_.total;
                return;
            }
    } else if (served_ >= kMaxStagedServed) {
        return refuse(-EBUSY, strprintf("efa: %zu staged requests are served already; try again later", served_));
    }
    std::shared_ptr<LocalRegion> region;
    bool in_range = false;
    for (auto &[handle, reg] : regions_)
        if (reg->staged && reg->contains(b.addr, b.len)) {
            in_range = true;
            if (reg->access & (write ? FERRY_ACCESS_REMOTE_WRITE : FERRY_ACCESS_REMOTE_READ)) region = reg;
            break;
        }
    if (!region)
        return refuse(in_range ? -EACCES : -EFAULT,
                      strprintf("efa: staged %s of [0x%" PRIx64 ", +%" PRIu64 "): %s", what, b.addr, b.len,
                                in_range ? (write ? "its region is not registered for remote write"
                                                  : "its region is not registered for remote read")
                                         : "not inside a device region registered for staging"));
    if (!region->pin())
        return refuse(-EFAULT, strprintf("efa: staged %s of [0x%" PRIx64 ", +%" PRIu64 "): the region is being "
                                         "deregistered",
                                         what, b.addr, b.len));
    auto &sv = serving_[&r];
    if (!sv) {
        sv = std::make_unique<Serving>();
        sv->window = std::make_unique<ferry_staged::StageWindow>(stager_, ferry_staged::kDefaultDepth, [this] {
            stage_kick_.store(true);  // the host's thread, under the window's lock: only wake
            wake();
        });
    }
    sv->heard = Clock::now();
    ServeReq q;
    q.id = h.req_id;
    q.write = write;
    q.region = std::move(region);
    q.addr = b.addr;
    q.len = b.len;
    sv->reqs.push_back(std::move(q));
    ++served_;
    stage_kick_.store(true);
}

// The buffer goes back (a running copy: when it ends); its grant's key dies first.
void Transport::stage_drop_slot(Serving &sv, ServeSlot &slot) {
    if (slot.mr) {
        auto lk = fab_.lock();
        fi_close(&slot.mr->fid);
        slot.mr = nullptr;
    }
    if (slot.s) sv.window->release(slot.s);
    slot.s.reset();
    stage_kick_.store(true);  // room in the window
}

void Transport::stage_on_done(Remote &r, const CtrlHeader &h, const StageDoneBody &b) {
    auto unknown = [&] {
        if (b.status != 0) return;  // a give-up crossing the request's end: nothing left to free
        ++ignored_.unknown;
        ++ignored_.total;
    };
    auto it = serving_.find(&r);
    if (it == serving_.end()) return unknown();
    Serving &sv = *it->second;
    auto q = std::find_if(sv.reqs.begin(), sv.reqs.end(), [&](const ServeReq &x) { return x.id == h.req_id; });
    if (q == sv.reqs.end()) return unknown();
    sv.heard = Clock::now();
    if (b.status != 0) {  // the initiator gave the request up: none of its RMA is in flight
        for (ServeSlot &s : q->slots)
            if (s.st == ServeSlot::St::Granted) stage_drop_slot(sv, s);
        q->slots.erase(std::remove_if(q->slots.begin(), q->slots.end(), [](const ServeSlot &s) { return !s.s; }),
                       q->slots.end());
        q->answered = true;  // it does not wait for an answer
        if (!q->failed) {
            q->failed = true;
            q->status = -ECANCELED;
        }
        stage_kick_.store(true);
        return;
    }
    auto s = std::find_if(q->slots.begin(), q->slots.end(),
                          [&](const ServeSlot &x) { return x.idx == b.slice && x.st == ServeSlot::St::Granted; });
    if (s == q->slots.end()) return unknown();
    if (!q->write || q->failed) {  // READ: the peer has the bytes; a failed WRITE is not copied on
        stage_drop_slot(sv, *s);
        q->slots.erase(s);
        return;
    }
    {
        auto lk = fab_.lock();
        fi_close(&s->mr->fid);  // the bytes are in: no more RMA on this buffer
        s->mr = nullptr;
    }
    std::string why;
    if (int rc = sv.window->copy(s->s, q->addr + s->off, true, &why)) {
        stage_drop_slot(sv, *s);
        q->slots.erase(s);
        stage_fail_req(sv, *q, rc, why);
        return;
    }
    s->st = ServeSlot::St::Writing;
}

// No new slice, no new copy; answered once no copy of it runs any more (so nothing lands in the
// device after the peer heard of the failure). Granted slices stay until the peer is done with
// them (StageDone, or its giving up), or the grant's time runs out.
void Transport::stage_fail_req(Serving &sv, ServeReq &q, int code, const std::string &why) {
    (void)sv;
    if (q.failed) return;
    q.failed = true;
    q.status = code < 0 ? code : -EIO;
    q.why = why;
    log_.log(FERRY_LOG_WARN, "staged %s of [0x%" PRIx64 ", +%" PRIu64 ") of %s device memory failed: %s",
             q.write ? "WRITE" : "READ", q.addr, q.len, kind_of(*q.region), why.c_str());
    stage_kick_.store(true);
}

void Transport::stage_serve_one(Remote &r, Serving &sv) {
    ferry_staged::StageWindow &w = *sv.window;
    // 1. Copies that ended: READ slices are granted in order, WRITE slices go back.
    for (ServeReq &q : sv.reqs) {
        for (auto s = q.slots.begin(); s != q.slots.end();) {
            const bool copying = s->st == ServeSlot::St::Copying || s->st == ServeSlot::St::Writing;
            if (!copying || !s->s->copied()) {
                if (copying && !q.write) break;  // READ grants keep their order
                ++s;
                continue;
            }
            if (s->s->status() != 0)
                stage_fail_req(sv, q, s->s->status(),
                               strprintf("efa: staging copy %s %s device memory failed: %s",
                                         q.write ? "into" : "out of", kind_of(*q.region), s->s->message().c_str()));
            if (s->st == ServeSlot::St::Writing || q.failed) {
                stage_drop_slot(sv, *s);
                s = q.slots.erase(s);
                continue;
            }
            // READ slice copied: register it for this grant and tell the peer.
            LocalRegion tmp;
            std::string why;
            ferry_mem_region_t m{
                reinterpret_cast<uint64_t>(s->s->buf()), s->len, FERRY_MEM_HOST, -1, FERRY_ACCESS_REMOTE_READ, 0};
            if (int rc = register_region(fab_, 0, *keys_, m, tmp, &why); rc != 0 || tmp.chunks.size() != 1) {
                close_region(fab_, tmp);
                stage_fail_req(sv, q, rc ? rc : -EIO, "efa: registering a staging buffer: " + why);
                stage_drop_slot(sv, *s);
                s = q.slots.erase(s);
                continue;
            }
            s->mr = tmp.chunks[0].mr;
            s->st = ServeSlot::St::Granted;
            s->granted_at = Clock::now();
            StageGrantBody g{s->idx, 0, s->off, s->len, tmp.chunks[0].rma_base, tmp.chunks[0].key};
            send_ctrl(r, CtrlType::StageGrant, q.id, 0, &g, sizeof g);
            ++q.granted_idx;
            ++s;
        }
    }
    // 2. Requests that ended.
    for (auto q = sv.reqs.begin(); q != sv.reqs.end();) {
        const bool copies = std::any_of(q->slots.begin(), q->slots.end(),
                                        [](const ServeSlot &s) { return s.st != ServeSlot::St::Granted; });
        const bool all_sliced = q->next_off == q->len;
        if (q->failed && !copies && !q->answered) {
            q->answered = true;
            send_ctrl(r, CtrlType::StageAck, q->id, q->status, q->why.data(), std::min(q->why.size(), kCtrlSize / 2));
        }
        if ((q->failed && q->answered && q->slots.empty()) || (!q->failed && all_sliced && q->slots.empty())) {
            if (!q->failed && q->write) send_ctrl(r, CtrlType::StageAck, q->id, 0, nullptr, 0);
            q->region->unpin();
            --served_;
            q = sv.reqs.erase(q);
            continue;
        }
        ++q;
    }
    // 3. New slices, in request order, while the window and the host's bound have room.
    const uint64_t slice = w.slice_bytes();
    for (ServeReq &q : sv.reqs) {
        while (!q.failed && q.next_off < q.len) {
            const uint64_t n = std::min(slice, q.len - q.next_off);
            ferry_staged::SlicePtr s;
            int code = 0;
            std::string why;
            auto got = w.acquire(q.region->kind, q.region->device, q.next_off, n, &s, &code, &why);
            if (got == ferry_staged::StageWindow::Got::Wait) return;  // a release kicks us again
            if (got == ferry_staged::StageWindow::Got::Fail) {
                stage_fail_req(sv, q, code, why);
                break;
            }
            ServeSlot slot;
            slot.idx = q.next_idx;
            slot.off = q.next_off;
            slot.len = n;
            slot.s = std::move(s);
            if (!q.write) {
                if (int rc = w.copy(slot.s, q.addr + slot.off, false, &why)) {
                    w.release(slot.s);
                    stage_fail_req(sv, q, rc, why);
                    break;
                }
                slot.st = ServeSlot::St::Copying;
            } else {
                LocalRegion tmp;
                ferry_mem_region_t m{
                    reinterpret_cast<uint64_t>(slot.s->buf()), n, FERRY_MEM_HOST, -1, FERRY_ACCESS_REMOTE_WRITE, 0};
                if (int rc = register_region(fab_, 0, *keys_, m, tmp, &why); rc != 0 || tmp.chunks.size() != 1) {
                    close_region(fab_, tmp);
                    w.release(slot.s);
                    stage_fail_req(sv, q, rc ? rc : -EIO, "efa: registering a staging buffer: " + why);
                    break;
                }
                slot.mr = tmp.chunks[0].mr;
                slot.st = ServeSlot::St::Granted;
                slot.granted_at = Clock::now();
                StageGrantBody g{slot.idx, 0, slot.off, n, tmp.chunks[0].rma_base, tmp.chunks[0].key};
                send_ctrl(r, CtrlType::StageGrant, q.id, 0, &g, sizeof g);
                ++q.granted_idx;
            }
            q.slots.push_back(std::move(slot));
            ++q.next_idx;
            q.next_off += n;
        }
    }
}

bool Transport::stage_serve() {
    if (serving_.empty()) return false;
    // Round robin: the peer after the one that went first last time goes first now, so the
    // buffers a release frees do not always go to the same peer.
    auto start = serving_.upper_bound(serve_next_);
    std::vector<Remote *> order;
    for (auto it = start; it != serving_.end(); ++it) order.push_back(it->first);
    for (auto it = serving_.begin(); it != start; ++it) order.push_back(it->first);
    serve_next_ = order.front();
    for (Remote *r : order) {
        auto it = serving_.find(r);
        if (it == serving_.end()) continue;
        stage_serve_one(*r, *it->second);
        if (it->second->reqs.empty()) {
            serving_.erase(it);  // its window goes: nothing is lent to it
            // Our Hello (stage_check_grants) made an initiator-only peer Up: it is forgettable again.
            if (r->state == Remote::State::Up && r->users == 0 && r->connecting == 0) r->state = Remote::State::Idle;
        }
    }
    return true;
}

// Takes back everything lent to r: keys closed, connections cut when a grant was open (so no
// RMA already under way lands in a buffer the host lends again), buffers released.
void Transport::stage_drop_peer(Remote &r, const std::string &why, bool cut) {
    auto it = serving_.find(&r);
    if (it == serving_.end()) return;
    Serving &sv = *it->second;
    size_t granted = 0, reqs = sv.reqs.size();
    for (ServeReq &q : sv.reqs)
        for (ServeSlot &s : q.slots) {
            if (s.st == ServeSlot::St::Granted) ++granted;
            if (s.mr) {
                auto lk = fab_.lock();
                fi_close(&s.mr->fid);
                s.mr = nullptr;
            }
        }
    if (cut && granted > 0) {
        remove_addr(r);
        cut_connections_to(r.name);
    }
    for (ServeReq &q : sv.reqs) {
        for (ServeSlot &s : q.slots) stage_drop_slot(sv, s);
        q.region->unpin();
    }
    served_ -= reqs;
    sv.window->detach();
    serving_.erase(it);
    log_.log(FERRY_LOG_WARN, "peer %s: dropped its %zu staged request(s), %zu buffer(s) granted to it: %s",
             r.name_str.c_str(), reqs, granted, why.c_str());
}

// deregister_mem of a staged region: its requests fail now; deregister waits (retire_and_wait)
// until their copies ended and their buffers are back.
void Transport::stage_region_gone(const LocalRegion &region) {
    for (auto &[r, sv] : serving_)
        for (ServeReq &q : sv->reqs)
            if (q.region.get() == &region)
                stage_fail_req(*sv, q, -EFAULT, "efa: the target deregistered the region during the transfer");
}

// Grants not taken in time (target side), and targets silent while our staged ops wait for them
// (initiator side): a Hello tells a live target that is only busy (its bound taken by others)
// from one that is gone, whose ops then fail at once instead of at op_timeout_ms.
void Transport::stage_check_grants() {
    const auto now = Clock::now();
    if ((serving_.empty() && stage_ops_.empty()) || now < next_grant_scan_) return;
    next_grant_scan_ = now + std::chrono::milliseconds(50);
    for (auto &[token, r] : remotes_)
        if (r->stage_inflight > 0 && r->state == Remote::State::Up && now - r->stage_heard > kStageSilence) {
            r->stage_heard = now;
            ping(*r);
        }
    if (serving_.empty()) return;
    stage_kick_.store(true);  // buffers that came back to a dropped window kick nobody
    const auto limit = std::chrono::milliseconds(grant_timeout_ms(cfg_));
    std::vector<Remote *> late, quiet;
    for (auto &[r, sv] : serving_) {
        bool waiting = false;  // a grant open for a while and nothing heard from the peer since
        for (ServeReq &q : sv->reqs)
            for (ServeSlot &s : q.slots)
                if (s.st == ServeSlot::St::Granted) {
                    if (now - s.granted_at > limit && std::find(late.begin(), late.end(), r) == late.end())
                        late.push_back(r);
                    waiting |= now - s.granted_at > kStageSilence;
                }
        if (waiting && now - sv->heard > kStageSilence &&
            (r->state == Remote::State::Idle || r->state == Remote::State::Up)) {
            sv->heard = now;
            quiet.push_back(r);
        }
    }
    // A Hello that fails finds the peer unreachable (kill_remote), which takes its buffers back.
    for (Remote *r : quiet)
        if (std::find(late.begin(), late.end(), r) == late.end()) ping(*r);
    for (Remote *r : late)
        stage_drop_peer(*r, strprintf("a granted slice was not taken within %u ms", grant_timeout_ms(cfg_)), true);
}

bool Transport::stage_progress() {
    bool did = stage_pump();
    stage_check_grants();
    if (stage_kick_.exchange(false)) did |= stage_serve();
    return did;
}

void Transport::stage_teardown() {
    std::lock_guard lock(mu_);
    while (!serving_.empty()) stage_drop_peer(*serving_.begin()->first, "the transport is being destroyed", false);
}

}  // namespace ferry_efa
