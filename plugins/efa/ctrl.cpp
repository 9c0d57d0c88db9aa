// Control messages of efa.so (wire.hpp): sending them (in order per peer, sharing the send
// buffers fairly), receiving them from peers (on_ctrl, with what an unauthenticated peer may make
// an instance hold bounded, and ignored messages counted and logged once per interval) and the
// revocation of keys on deregister_mem.
#include "transport.hpp"

#include "conn_cut.hpp"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace ferry_efa {

namespace {
bool is_answer(CtrlType t) {
    return t == CtrlType::HelloAck || t == CtrlType::QueryReply || t == CtrlType::RevokeAck || t == CtrlType::StageAck;
}
}  // namespace

void Transport::send_ctrl(Remote &r, CtrlType type, uint64_t req_id, int status, const void *body, size_t len) {
    if (is_answer(type)) {
        if (r.answers >= kMaxAnswersPerRemote || queued_answers_ >= kMaxQueuedAnswers) {
            ++ignored_.flooded;  // it sends requests but does not take our answers
            ++ignored_.total;
            return;
        }
        ++r.answers;
        ++queued_answers_;
    }
    CtrlHeader h{kCtrlMagic, kWireVersion, static_cast<uint16_t>(type), req_id, token_,
                 r.token,    status,       static_cast<uint32_t>(len)};
    OutMsg m{&r, type, req_id, std::vector<uint8_t>(sizeof h + len)};
    memcpy(m.bytes.data(), &h, sizeof h);
    if (len) memcpy(m.bytes.data() + sizeof h, body, len);
    ctrl_out_.push_back(std::move(m));
}

// Hands queued control messages to the provider, in order per peer. A peer gets at most
// kMaxSendsPerRemote send buffers, and peers never reached yet kMaxUnverifiedSends together: a
// Hello can name any address (one that never answers, or a listener that is not libfabric), and
// the sends to it must not hold every buffer while honest peers wait behind them.
bool Transport::post_ctrl_sends() {
    bool did = false;
    std::vector<const Remote *> skipped;  // kept waiting this round: their later messages wait too
    for (size_t i = 0; i < ctrl_out_.size() && !free_sends_.empty();) {
        OutMsg &m = ctrl_out_[i];
        Remote &r = *m.to;
        if (std::find(skipped.begin(), skipped.end(), &r) != skipped.end()) {
            ++i;
            continue;
        }
        if (r.addr == FI_ADDR_NOTAVAIL) {
            OutMsg gone = std::move(m);
            ctrl_out_.erase(ctrl_out_.begin() + static_cast<ptrdiff_t>(i));
            if (is_answer(gone.type)) {
                --r.answers;
                --queued_answers_;
            }
            ctrl_send_failed(r, gone.type, gone.req_id, FI_ENOTCONN);
            did = true;
            continue;
        }
        if (r.sending >= kMaxSendsPerRemote || (!r.verified && unverified_sending_ >= kMaxUnverifiedSends)) {
            skipped.push_back(&r);
            ++i;
            continue;
        }
        CtrlBuf *b = free_sends_.back();
        memcpy(b->data, m.bytes.data(), m.bytes.size());
        b->len = m.bytes.size();
        b->to = &r;
        b->req_id = m.req_id;
        b->type = m.type;
        int rc;
        {
            auto lk = fab_.lock();
            rc = fi_send(fab_.ep, b->data, b->len, ctrl_desc_, r.addr, &b->fi);
        }
        if (rc == -FI_EAGAIN) break;
        free_sends_.pop_back();
        OutMsg sent = std::move(m);
        ctrl_out_.erase(ctrl_out_.begin() + static_cast<ptrdiff_t>(i));
        if (is_answer(sent.type)) {
            --r.answers;
            --queued_answers_;
        }
        did = true;
        if (rc != 0) {
            free_sends_.push_back(b);
            ctrl_send_failed(r, sent.type, sent.req_id, -rc);
            continue;
        }
        ++r.sending;
        b->unverified = !r.verified;
        if (b->unverified) ++unverified_sending_;
    }
    return did;
}

void Transport::on_ctrl_send_done(CtrlBuf &b, int fi_err) {
    free_sends_.push_back(&b);
    --b.to->sending;
    if (b.unverified) --unverified_sending_;
    b.unverified = false;
    if (fi_err == 0) b.to->verified = true;
    if (fi_err != 0) ctrl_send_failed(*b.to, b.type, b.req_id, fi_err);
}

void Transport::ctrl_send_failed(Remote &r, CtrlType type, uint64_t req_id, int fi_err) {
    if (stage_send_failed(r, type, req_id)) return;
    if (type == CtrlType::Hello) {
        if (r.state == Remote::State::Checking && req_id == r.ping_req)
            remote_failed(r, strprintf("cannot reach it: %s", fi_error_string(fi_err).c_str()),
                          fi_err == FI_ECONNREFUSED || fi_err == FI_EHOSTUNREACH || fi_err == FI_ENETUNREACH);
        return;
    }
    if (type == CtrlType::Query || type == CtrlType::Revoke) {
        if (auto it = waiters_.find(req_id); it != waiters_.end()) {
            it->second->done = true;
            it->second->status = -ECONNRESET;
            cv_.notify_all();
        }
        return;
    }
    // One of our answers did not get through: is the connection still there?
    if (r.state == Remote::State::Up) ping(r);
}

// A Hello's remote: the known one if the address matches, else a new one. An instance's
// address never changes (its token is random per instance), so a Hello that names a known
// token from another address is an impostor and gets nothing: it must not redirect our ops or
// answers. One address holds at most kMaxRemotesPerAddress remotes (an instance that restarted
// there has a new token while the old entry may still be owed revocations): a peer inventing
// tokens from its address gets that many and then cheap refusals, not a new entry, address
// vector slot and connection for each. Across addresses the table is bounded by kMaxRemotes.
Remote *Transport::remote_for_hello(uint64_t token, const uint8_t *name, size_t len) {
    auto refuse = [&](uint64_t &counter) -> Remote * {
        ++counter;
        ++ignored_.total;
        return nullptr;
    };
    if (auto it = remotes_.find(token); it != remotes_.end()) {
        Remote &r = *it->second;
        if (r.name.size() != len || memcmp(r.name.data(), name, len) != 0) return refuse(ignored_.impostor);
        return &r;
    }
    size_t here = 0;
    Remote *spare = nullptr;  // one at this address that can go now (nothing queued for it)
    for (auto &[t, rp] : remotes_)
        if (rp->name.size() == len && memcmp(rp->name.data(), name, len) == 0) {
            ++here;
            if (spare == nullptr && rp->answers == 0 && forgettable(*rp)) spare = rp.get();
        }
    if (here >= kMaxRemotesPerAddress) {
        if (spare == nullptr) return refuse(ignored_.crowded);
        forget(*spare);
    }
    if (remotes_.size() >= kMaxRemotes && !evict_one()) return refuse(ignored_.crowded);
    return remote_for(token, name, len);
}

// Whether r can go: nothing refers to it but answers still queued for it (dropped with it).
// A peer that said Hello and was reached at its address may hold our keys: it must hear of
// every revocation, so it stays (until a revocation finds it silent); otherwise a Hello with
// its address and a new token would make deregister_mem skip it.
bool Transport::forgettable(const Remote &r) const {
    if (revoking_ > 0 || r.users != 0 || r.connecting != 0 || r.outstanding != 0 || !r.held.empty() || r.revokes != 0 ||
        r.sending != 0 || r.state != Remote::State::Idle || (r.initiates && r.verified) ||
        serving_.count(const_cast<Remote *>(&r)) != 0)
        return false;
    for (auto &m : ctrl_out_)
        if (m.to == &r && !is_answer(m.type)) return false;  // our own request: someone waits for its answer
    for (auto &[p, op] : ops_)
        if (op->remote == &r) return false;
    for (auto &[id, peer] : peers_)
        if (peer.token == r.token) return false;
    return true;
}

void Transport::forget(Remote &r) {
    for (auto it = ctrl_out_.begin(); it != ctrl_out_.end();)
        if (it->to == &r) {
            --queued_answers_;
            it = ctrl_out_.erase(it);
        } else {
            ++it;
        }
    remove_addr(r);
    remotes_.erase(r.token);  // r is gone from here
}

// Forgets one remote that only said Hello, preferring one without queued answers, so a peer
// that invents tokens and addresses cannot fill the table for good.
bool Transport::evict_one() {
    for (bool with_answers : {false, true})
        for (auto &[t, rp] : remotes_)
            if ((with_answers || rp->answers == 0) && forgettable(*rp)) {
                forget(*rp);
                return true;
            }
    return false;
}

void Transport::log_ignored(bool force) {
    const auto now = Clock::now();
    if (ignored_.total == 0 || (!force && now < ignored_.next_log)) return;
    std::string what;
    for (size_t i = 1; i < static_cast<size_t>(CtrlBad::Count); ++i)
        if (ignored_.malformed[i])
            what += strprintf("%s%" PRIu64 " %s", what.empty() ? "" : ", ", ignored_.malformed[i],
                              ctrl_bad_name(static_cast<CtrlBad>(i)));
    const std::pair<uint64_t, const char *> rest[] = {
        {ignored_.impostor, "Hello naming a known instance from another address"},
        {ignored_.unreachable, "Hello with an address the provider does not take"},
        {ignored_.unknown, "from an instance that never said Hello"},
        {ignored_.crowded, "new instance while the peer table is full or its address's entry is busy"},
        {ignored_.flooded, "answers dropped for peers that do not read them"}};
    for (auto [n, name] : rest)
        if (n) what += strprintf("%s%" PRIu64 " %s", what.empty() ? "" : ", ", n, name);
    log_.log(FERRY_LOG_WARN,
             "ignored %" PRIu64
             " control message(s) from peers since the last such line (one every %lld s at most): %s",
             ignored_.total,
             static_cast<long long>(std::chrono::duration_cast<std::chrono::seconds>(kIgnoredLogInterval).count()),
             what.c_str());
    const auto next = now + kIgnoredLogInterval;
    ignored_ = IgnoredCtrl{};
    ignored_.next_log = next;
}

void Transport::on_ctrl(const uint8_t *data, size_t len) {
    CtrlMsg m;
    if (CtrlBad bad = decode_ctrl(data, len, fab_.name.size(), &m); bad != CtrlBad::None) {
        ++ignored_.malformed[static_cast<size_t>(bad)];
        ++ignored_.total;
        return;
    }
    const CtrlHeader &h = m.h;
    const uint8_t *body = m.body;
    auto unknown = [&] {
        ++ignored_.unknown;
        ++ignored_.total;
    };
    switch (m.type) {
        case CtrlType::Hello: {
            if (!same_address_family(fab_.name, body, h.body_len)) {
                ++ignored_.unreachable;
                ++ignored_.total;
                return;
            }
            Remote *r = remote_for_hello(h.from_token, body, h.body_len);
            if (r == nullptr) return;
            if (!insert_addr(*r)) {  // its address is not one the provider takes: nobody to answer
                ++ignored_.unreachable;
                ++ignored_.total;
                if (r->users == 0 && r->state == Remote::State::Idle && !r->initiates)
                    remotes_.erase(h.from_token);  // new, and nothing refers to it yet
                return;
            }
            r->initiates = true;
            send_ctrl(*r, CtrlType::HelloAck, h.req_id, h.to_token == token_ ? 0 : -ESTALE, nullptr, 0);
            if (r->state == Remote::State::Dead && r->users > 0) ping(*r);  // it is back
            break;
        }
        case CtrlType::HelloAck: {
            auto it = remotes_.find(h.from_token);
            if (it == remotes_.end() || it->second->state != Remote::State::Checking ||
                it->second->ping_req != h.req_id)
                return;
            if (h.status == 0) remote_up(*it->second);
            else kill_remote(*it->second, "the endpoint belongs to an instance that no longer exists there");
            break;
        }
        case CtrlType::Query: {
            auto it = remotes_.find(h.from_token);
            QueryBody q;
            if (it == remotes_.end() || it->second->addr == FI_ADDR_NOTAVAIL) return unknown();
            memcpy(&q, body, sizeof q);
            const uint64_t q_end =
                q.len > UINT64_MAX - q.addr ? UINT64_MAX : q.addr + q.len;  // the peer's numbers may wrap
            std::vector<RemoteChunk> found;
            for (auto &[handle, region] : regions_)
                for (auto &c : region->chunks)
                    if (c.addr < q_end && c.addr + c.len > q.addr) found.push_back(to_remote(*region, c));
            std::sort(found.begin(), found.end(),
                      [](const RemoteChunk &a, const RemoteChunk &b) { return a.addr < b.addr; });
            QueryReplyHead head{0, static_cast<uint32_t>(std::min(found.size(), kChunksPerReply)), 0};
            if (found.size() > kChunksPerReply) head.next = found[kChunksPerReply].addr;
            std::vector<uint8_t> reply(sizeof head + head.count * sizeof(RemoteChunk));
            memcpy(reply.data(), &head, sizeof head);
            if (head.count) memcpy(reply.data() + sizeof head, found.data(), head.count * sizeof(RemoteChunk));
            send_ctrl(*it->second, CtrlType::QueryReply, h.req_id, h.to_token == token_ ? 0 : -ESTALE, reply.data(),
                      reply.size());
            break;
        }
        case CtrlType::Revoke: {
            auto it = remotes_.find(h.from_token);
            if (it == remotes_.end() || !insert_addr(*it->second))
                return unknown();  // we never talked to it: nothing of ours uses its keys
            if (it->second->revokes >= kMaxRevokesPerRemote) {
                ++ignored_.flooded;
                ++ignored_.total;
                return;
            }
            std::vector<uint64_t> keys(h.body_len / sizeof(uint64_t));
            memcpy(keys.data(), body, keys.size() * sizeof(uint64_t));
            on_revoke(*it->second, h.req_id, std::move(keys));
            break;
        }
        case CtrlType::StageRead:
        case CtrlType::StageWrite:
        case CtrlType::StageDone:
        case CtrlType::StageGrant:
        case CtrlType::StageAck: {
            // Requests re-insert an address a dropped peer lost (stage_drop_peer cuts it), as Revoke does.
            auto it = remotes_.find(h.from_token);
            const bool request = m.type == CtrlType::StageRead || m.type == CtrlType::StageWrite;
            if (it == remotes_.end() || (request ? !insert_addr(*it->second) : it->second->addr == FI_ADDR_NOTAVAIL))
                return unknown();
            Remote &r = *it->second;
            if (m.type == CtrlType::StageGrant) {
                StageGrantBody g;
                memcpy(&g, body, sizeof g);
                stage_on_grant(r, h, g);
            } else if (m.type == CtrlType::StageAck) {
                stage_on_ack(r, h, body, h.body_len);
            } else if (m.type == CtrlType::StageDone) {
                StageDoneBody d;
                memcpy(&d, body, sizeof d);
                stage_on_done(r, h, d);
            } else {
                StageReqBody b;
                memcpy(&b, body, sizeof b);
                stage_on_request(r, h, m.type == CtrlType::StageWrite, b);
            }
            break;
        }
        case CtrlType::RevokeAck:
        case CtrlType::QueryReply: {
            auto it = waiters_.find(h.req_id);
            if (it == waiters_.end()) return;
            if (m.type == CtrlType::RevokeAck && h.status == -EINPROGRESS) {
                it->second->busy = true;
                cv_.notify_all();
                break;
            }
            it->second->done = true;
            it->second->status = h.status;
            it->second->body.assign(body, body + h.body_len);
            cv_.notify_all();
            break;
        }
    }
}

// The peer is about to close these registrations: no new op may use them, and it gets its answer
// once the RMA we already handed to the provider on them has completed.
void Transport::on_revoke(Remote &from, uint64_t req_id, std::vector<uint64_t> keys) {
    std::sort(keys.begin(), keys.end());
    auto revoked = [&](uint64_t key) { return std::binary_search(keys.begin(), keys.end(), key); };
    for (auto &[id, imp] : imports_) {
        auto p = peers_.find(imp.peer);
        if (p == peers_.end() || p->second.token != from.token) continue;
        for (auto &c : imp.chunks)
            if (revoked(c.key)) c.revoked = 1;
    }
    const std::string msg =
        strprintf("efa: peer %s deregistered the region before the op reached it", from.name_str.c_str());
    for (auto &[p, op] : ops_)
        if (op->remote == &from)
            for (auto &s : op->subs)
                if (!s.posted && revoked(s.key))
                    fail_op(*op, -EFAULT, msg);  // its unposted pieces are dropped, never posted
    settle(from);
    ++from.revokes;
    revokes_.push_back(PendingRevoke{&from, req_id, std::move(keys)});
    check_revokes();
}

void Transport::check_revokes() {
    for (size_t i = 0; i < revokes_.size();) {
        PendingRevoke &rv = revokes_[i];
        bool busy = false;
        for (auto &[p, op] : ops_) {
            if (op->remote != rv.from) continue;
            for (auto &s : op->subs)
                if (s.posted && !s.done && std::binary_search(rv.keys.begin(), rv.keys.end(), s.key)) busy = true;
        }
        if (busy) {
            if (!rv.told_busy) {
                send_ctrl(*rv.from, CtrlType::RevokeAck, rv.req_id, -EINPROGRESS, nullptr, 0);
                rv.told_busy = true;
            }
            ++i;
            continue;
        }
        send_ctrl(*rv.from, CtrlType::RevokeAck, rv.req_id, 0, nullptr, 0);
        --rv.from->revokes;
        revokes_[i] = std::move(revokes_.back());
        revokes_.pop_back();
    }
}

// Serving side of deregister_mem: tells every instance that may hold the region's keys, and
// waits (bounded by connect_timeout_ms) until each has no RMA on them in flight.
void Transport::revoke(const LocalRegion &region, std::unique_lock<std::mutex> &lock) {
    std::vector<uint64_t> keys;
    for (auto &c : region.chunks) keys.push_back(c.key);
    struct Wait {
        uint64_t req;
        Remote *remote;
        std::unique_ptr<Waiter> w;
    };
    std::vector<Wait> waits;
    for (auto &[token, r] : remotes_) {
        if (!r->initiates || r->state == Remote::State::Dead || r->addr == FI_ADDR_NOTAVAIL) continue;
        uint64_t req = next_req_++;
        auto w = std::make_unique<Waiter>();
        waiters_[req] = w.get();
        send_ctrl(*r, CtrlType::Revoke, req, 0, keys.data(), keys.size() * sizeof(uint64_t));
        waits.push_back(Wait{req, r.get(), std::move(w)});
    }
    if (waits.empty()) return;
    ++revoking_;
    wake();
    // A live peer answers at once, with "busy" while its RMA on the region is in flight; but that
    // answer travels behind the peer's own queued RMA on the same connection, so a peer is given
    // connect_timeout_ms to say anything (the tcp provider neither delivers nor fails messages to
    // a vanished peer: silence is all a dead one gives). A busy peer is waited for until its ops
    // would have timed out: the provider goes on placing an RMA whose header it already accepted
    // even after the registration is closed, so returning early would let those bytes land in
    // memory the caller got back.
    const auto start = Clock::now();
    const auto silent_limit = start + std::chrono::milliseconds(cfg_.connect_timeout_ms);
    const auto busy_limit = start + std::chrono::milliseconds(cfg_.op_timeout_ms ? cfg_.op_timeout_ms : 30000u);
    auto deadline_of = [&](const Wait &w) { return w.w->busy ? busy_limit : silent_limit; };
    while (!stop_.load()) {
        auto next = Clock::time_point::max();
        for (auto &w : waits)
            if (!w.w->done && deadline_of(w) > Clock::now()) next = std::min(next, deadline_of(w));
        if (next == Clock::time_point::max()) break;  // every peer answered or ran out of time
        cv_.wait_until(lock, next);
    }
    --revoking_;
    size_t silent = 0, busy = 0;
    for (auto &w : waits) {
        waiters_.erase(w.req);
        if (!w.w->done) {
            ++(w.w->busy ? busy : silent);
            w.remote->initiates = false;  // not asked again until it says Hello again
        }
    }
    if (silent)
        log_.log(FERRY_LOG_INFO,
                 "deregister of [0x%" PRIx64 ", +%" PRIu64
                 "): %zu peer(s) did not answer within %u ms (gone?); "
                 "closing it anyway, the provider refuses RMA that reaches it from now on",
                 region.addr, region.length, silent, cfg_.connect_timeout_ms);
    if (busy)
        log_.log(FERRY_LOG_WARN,
                 "deregister of [0x%" PRIx64 ", +%" PRIu64
                 "): %zu peer(s) still had RMA on it in flight after "
                 "%u ms; closing it anyway: bytes of those transfers may still land in it",
                 region.addr, region.length, busy, cfg_.op_timeout_ms ? cfg_.op_timeout_ms : 30000u);
}

}  // namespace ferry_efa
