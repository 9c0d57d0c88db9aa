// Remotes and the connection state machine of efa.so (see transport.hpp), plus connect /
// disconnect / import_mem / release_mem (queries). Control messages: ctrl.cpp.
#include "transport.hpp"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <set>
#include <utility>

namespace ferry_efa {

namespace {
constexpr unsigned kMaxAttempts = 5;
}  // namespace

Remote *Transport::remote_for(uint64_t token, const uint8_t *name, size_t name_len) {
    auto &slot = remotes_[token];
    if (!slot) {
        slot = std::make_unique<Remote>();
        slot->token = token;
    }
    if (name != nullptr && (slot->name.size() != name_len || memcmp(slot->name.data(), name, name_len) != 0)) {
        slot->name.assign(name, name + name_len);
        slot->name_str = fab_.addr_string(name);
    }
    return slot.get();
}

bool Transport::insert_addr(Remote &r) {
    if (r.addr != FI_ADDR_NOTAVAIL) return true;
    fi_addr_t a = FI_ADDR_NOTAVAIL;
    int rc;
    {
        auto lk = fab_.lock();
        rc = fi_av_insert(fab_.av, r.name.data(), 1, &a, 0, nullptr);
    }
    if (rc != 1) {
        r.why = strprintf("fi_av_insert: %s", fi_error_string(rc < 0 ? rc : FI_EINVAL).c_str());
        return false;
    }
    r.addr = a;
    return true;
}

// Dropping the address makes the provider close its connection to that peer and flush the
// operations it still held (they come back as errors): the way to get buffers back from a peer
// that stopped answering, and to recover a connection the provider gave up on.
void Transport::remove_addr(Remote &r) {
    if (r.addr == FI_ADDR_NOTAVAIL) return;
    {
        auto lk = fab_.lock();
        fi_av_remove(fab_.av, &r.addr, 1, 0);
    }
    r.addr = FI_ADDR_NOTAVAIL;
}

void Transport::ping(Remote &r) {
    if (!insert_addr(r)) {
        kill_remote(r, r.why);
        return;
    }
    r.state = Remote::State::Checking;
    r.ping_req = next_req_++;
    r.ping_sent = Clock::now();
    send_ctrl(r, CtrlType::Hello, r.ping_req, 0, fab_.name.data(), fab_.name.size());
}

void Transport::remote_up(Remote &r) {
    r.state = Remote::State::Up;
    r.verified = true;
    r.attempts = 0;
    r.why.clear();
    ready_.insert(ready_.begin(), r.held.begin(), r.held.end());
    r.held.clear();
    cv_.notify_all();
}

void Transport::remote_failed(Remote &r, const std::string &why, bool refused) {
    if (refused || r.attempts + 1 >= kMaxAttempts) kill_remote(r, why);
    else reset(r, why);
}

void Transport::reset(Remote &r, const std::string &why) {
    log_.log(FERRY_LOG_INFO, "resetting the connection to %s: %s", r.name_str.c_str(), why.c_str());
    remove_addr(r);
    r.state = Remote::State::Resetting;
    r.why = why;
    ++r.attempts;
    r.next_try = Clock::now() + std::chrono::milliseconds(20 * r.attempts);
}

void Transport::drop_held(Remote &r, int status, const std::string &message) {
    std::deque<SubOp *> held;
    held.swap(r.held);
    for (SubOp *s : held) {
        Op &op = *s->op;
        --op.unposted;
        fail_op(op, status, message);
        maybe_finish(op);
    }
}

void Transport::kill_remote(Remote &r, const std::string &why) {
    log_.log(FERRY_LOG_INFO, "peer %s is unreachable: %s", r.name_str.c_str(), why.c_str());
    remove_addr(r);
    r.state = Remote::State::Dead;
    r.why = why;
    drop_held(r, -ECONNRESET, strprintf("efa: peer %s is unreachable: %s", r.name_str.c_str(), why.c_str()));
    stage_remote_gone(r, why);
    cv_.notify_all();
}

bool Transport::run_remotes() {
    bool did = false;
    const auto now = Clock::now();
    log_ignored(false);
    for (auto &[token, rp] : remotes_) {
        Remote &r = *rp;
        if (r.state == Remote::State::Resetting && now >= r.next_try) {
            ping(r);
            did = true;
        } else if (r.state == Remote::State::Checking &&
                   now - r.ping_sent > std::chrono::milliseconds(cfg_.connect_timeout_ms)) {
            // A Hello the provider neither delivers nor fails (tcp keeps retrying a peer that is
            // gone): unreachable. Explicit failures are retried in remote_failed instead.
            kill_remote(r, strprintf("no answer within %u ms", cfg_.connect_timeout_ms));
            did = true;
        }
    }
    return did;
}

int Transport::wait_reply(uint64_t req_id, Waiter &w, std::unique_lock<std::mutex> &lock) {
    waiters_[req_id] = &w;
    wake();
    auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.connect_timeout_ms);
    cv_.wait_until(lock, deadline, [&] { return w.done || stop_.load(); });
    waiters_.erase(req_id);
    return w.done ? w.status : -ETIMEDOUT;
}

int Transport::query(uint64_t peer, Remote &r, uint64_t addr, uint64_t len, std::vector<RemoteChunk> *out,
                     std::unique_lock<std::mutex> &lock, std::string *why) {
    // The peer's answers steer this loop (where to ask next): bounded rounds, so a peer that
    // answers one fake chunk at a time cannot keep import_mem busy forever.
    constexpr unsigned kMaxRounds = 1024;
    const uint64_t end = addr + len;
    std::set<std::pair<uint64_t, uint64_t>> seen;  // (addr, key)
    for (const auto &o : *out) seen.emplace(o.addr, o.key);
    for (unsigned round = 0; addr < end; ++round) {
        if (round == kMaxRounds) {
            *why = strprintf("its registrations of the range took more than %u answers", kMaxRounds);
            return -EPROTO;
        }
        if (!peers_.count(peer) || r.state == Remote::State::Dead) {
            *why = "the peer went away";
            return -ECONNRESET;
        }
        uint64_t req = next_req_++;
        QueryBody q{addr, end - addr};
        send_ctrl(r, CtrlType::Query, req, 0, &q, sizeof q);
        Waiter w;
        int rc = wait_reply(req, w, lock);
        QueryReplyHead head;
        if (rc != 0) {
            *why = rc == -ETIMEDOUT ? strprintf("no answer within %u ms", cfg_.connect_timeout_ms)
                                    : strprintf("%s", errno_string(-rc).c_str());
            return rc;
        }
        if (w.body.size() < sizeof head) return *why = "malformed answer", -EPROTO;
        memcpy(&head, w.body.data(), sizeof head);
        if (w.body.size() < sizeof head + head.count * sizeof(RemoteChunk)) return *why = "truncated answer", -EPROTO;
        for (uint32_t i = 0; i < head.count; ++i) {
            RemoteChunk c;
            memcpy(&c, w.body.data() + sizeof head + i * sizeof c, sizeof c);
            c.revoked = 0;
            if (seen.emplace(c.addr, c.key).second) out->push_back(c);
        }
        if (head.next == 0 || head.next <= addr || head.count == 0) break;
        addr = head.next;
    }
    std::sort(out->begin(), out->end(), [](const RemoteChunk &a, const RemoteChunk &b) { return a.addr < b.addr; });
    return 0;
}

int Transport::connect(const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err) {
    EndpointHead h;
    if (len < sizeof h)
        return set_error(err, -EINVAL, "efa: endpoint is %zu bytes, too short for an efa.so endpoint", len);
    memcpy(&h, endpoint, sizeof h);
    if (h.magic != kEndpointMagic || h.version != kWireVersion || h.name_len != len - sizeof h)
        return set_error(err, -EPROTO, "efa: not an efa.so version %u endpoint", kWireVersion);
    std::unique_lock lock(mu_);
    Remote &r = *remote_for(h.token, static_cast<const uint8_t *>(endpoint) + sizeof h, h.name_len);
    r.verified = true;  // the host gave us this address
    if (r.state == Remote::State::Idle || r.state == Remote::State::Dead) {
        r.attempts = 0;
        r.state = Remote::State::Resetting;
        r.next_try = Clock::now();
        wake();
    }
    auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.connect_timeout_ms);
    ++r.connecting;  // not evicted while we wait on it
    cv_.wait_until(lock, deadline,
                   [&] { return stop_.load() || r.state == Remote::State::Up || r.state == Remote::State::Dead; });
    --r.connecting;
    if (r.state != Remote::State::Up) {
        std::string why =
            r.state == Remote::State::Dead ? r.why : strprintf("no answer within %u ms", cfg_.connect_timeout_ms);
        int code = r.state == Remote::State::Dead ? -ECONNREFUSED : -ETIMEDOUT;
        if (r.users == 0) {  // nobody else waits for it: stop trying
            remove_addr(r);
            r.state = Remote::State::Idle;
        }
        return set_error(err, code, "efa: cannot connect to peer %s: %s", r.name_str.c_str(), why.c_str());
    }
    ++r.users;
    *peer = next_peer_++;
    peers_[*peer] = Peer{r.token};
    return 0;
}

int Transport::disconnect(uint64_t peer, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end())
        return set_error(err, -ENOENT, "efa: no peer %" PRIu64 " (never connected or already disconnected)", peer);
    Remote &r = *remotes_.at(it->second.token);
    peers_.erase(it);
    for (auto i = imports_.begin(); i != imports_.end();) i = i->second.peer == peer ? imports_.erase(i) : std::next(i);
    const std::string msg = strprintf("efa: op canceled: disconnected from peer %s", r.name_str.c_str());
    for (auto &[p, op] : ops_)
        if (op->peer == peer) fail_op(*op, -ECANCELED, msg);
    if (--r.users == 0) {
        // The provider keeps what it was given until the connection goes: cut it, so those
        // buffers come back (as flushed errors) instead of staying with a peer that may never
        // answer. The canceled ops are reported once they are back.
        reclaim(r);
        if (!r.held.empty()) remove_addr(r);
        drop_held(r, -ECANCELED, msg);
        if (r.state != Remote::State::Dead) r.state = Remote::State::Idle;
    }
    settle(r);
    wake();
    return 0;
}

int Transport::import_mem(uint64_t peer, const ferry_mem_region_t *region, const void *desc, size_t len,
                          uint64_t *remote_mem, ferry_error_t *err) {
    if (region->length == 0 || region->addr + region->length < region->addr)
        return set_error(err, -EINVAL, "efa: imported region [0x%" PRIx64 ", +%" PRIu64 ") is empty or wraps",
                         region->addr, region->length);
    Import imp{peer, region->addr, region->length, region->access, {}, false};
    std::string why;
    if (desc != nullptr && len > 0 && !parse_chunks(desc, len, &imp.chunks, &why, &imp.staged))
        return set_error(err, -EINVAL, "efa: %s", why.c_str());
    std::unique_lock lock(mu_);
    auto it = peers_.find(peer);
    if (it == peers_.end()) return set_error(err, -ENOENT, "efa: no peer %" PRIu64, peer);
    Remote &r = *remotes_.at(it->second.token);
    if (desc == nullptr || len == 0) {  // no keys from the host: ask the peer which registrations cover it
        if (int rc = query(peer, r, region->addr, region->length, &imp.chunks, lock, &why))
            return set_error(err, rc, "efa: asking peer %s for its registrations of [0x%" PRIx64 ", +%" PRIu64 "): %s",
                             r.name_str.c_str(), region->addr, region->length, why.c_str());
    }
    // Device memory that its owner registered without RMA keys is served through its staging
    // calls (staged_ops.cpp).
    if (region->kind != FERRY_MEM_HOST && imp.chunks.empty()) imp.staged = true;
    uint64_t id = next_import_++;
    imports_[id] = std::move(imp);
    *remote_mem = id;
    return 0;
}

int Transport::release_mem(uint64_t peer, uint64_t remote_mem, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    auto it = imports_.find(remote_mem);
    if (it == imports_.end() || it->second.peer != peer)
        return set_error(err, -ENOENT, "efa: peer %" PRIu64 " has no imported region %" PRIu64, peer, remote_mem);
    imports_.erase(it);
    return 0;
}

}  // namespace ferry_efa
