// Ops of efa.so: submit splits each op at registration boundaries (ours and the peer's) and at
// the provider's message size, the progress thread posts the pieces (fi_writemsg with
// FI_DELIVERY_COMPLETE, so a WRITE completes once its bytes are in the peer's memory; fi_readmsg)
// and reports each op once all its pieces came back.
#include "transport.hpp"

#include "conn_cut.hpp"

#include <rdma/fi_errno.h>
#include <rdma/fi_rma.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace ferry_efa {

namespace {

const RemoteChunk *chunk_holding(const std::vector<RemoteChunk> &chunks, uint64_t a) {
    auto it =
        std::upper_bound(chunks.begin(), chunks.end(), a, [](uint64_t x, const RemoteChunk &c) { return x < c.addr; });
    if (it == chunks.begin()) return nullptr;
    --it;
    return a - it->addr < it->len ? &*it : nullptr;
}

const char *op_name(uint32_t opcode) { return opcode == FERRY_OP_READ ? "READ" : "WRITE"; }

}  // namespace

int Transport::submit(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    auto pit = peers_.find(peer);
    if (pit == peers_.end())
        return set_error(err, -ENOTCONN, "efa: no peer %" PRIu64 " (not connected, or disconnected)", peer);
    Remote &r = *remotes_.at(pit->second.token);
    if (r.state == Remote::State::Dead) {
        // It stopped answering earlier (a cut link, a restart): ask again, as connect() does.
        // These ops wait for the answer and fail as unreachable if none comes in
        // connect_timeout_ms; without this a peer, once given up on, stayed unusable.
        r.attempts = 0;
        r.state = Remote::State::Resetting;
        r.next_try = Clock::now();
    }
    // Check everything first: nothing starts unless every op is well-formed.
    std::vector<std::shared_ptr<LocalRegion>> locals(n);
    std::vector<const Import *> imports(n);
    for (size_t i = 0; i < n; ++i) {
        const ferry_xfer_op_t &op = ops[i];
        if (op.opcode != FERRY_OP_READ && op.opcode != FERRY_OP_WRITE)
            return set_error(err, -EINVAL, "efa: op %zu: unknown opcode %u", i, op.opcode);
        if (op.length == 0) return set_error(err, -EINVAL, "efa: op %zu: length is 0", i);
        auto imp = imports_.find(op.remote_mem);
        if (imp == imports_.end() || imp->second.peer != peer)
            return set_error(err, -EINVAL, "efa: op %zu: remote_mem %" PRIu64 " is not imported from peer %" PRIu64, i,
                             op.remote_mem, peer);
        const Import &m = imp->second;
        if (op.remote_addr < m.addr || op.length > m.length || op.remote_addr - m.addr > m.length - op.length)
            return set_error(err, -EINVAL,
                             "efa: op %zu: remote [0x%" PRIx64 ", +%" PRIu64 ") is outside the imported region", i,
                             op.remote_addr, op.length);
        auto reg = regions_.find(op.local_mem);
        if (reg == regions_.end() || !reg->second->contains(op.local_addr, op.length))
            return set_error(err, -EINVAL,
                             "efa: op %zu: local [0x%" PRIx64 ", +%" PRIu64
                             ") is not inside registered region %" PRIu64,
                             i, op.local_addr, op.length, op.local_mem);
        if (reg->second->staged)
            return set_error(err, -ENOTSUP,
                             "efa: op %zu: local region %" PRIu64
                             " is %s device memory, which efa.so serves to peers but does not move as an "
                             "initiator without FI_HMEM (the core stages initiator-side GPU buffers)",
                             i, op.local_mem, ferry_staged::kind_name(reg->second->kind));
        locals[i] = reg->second;
        imports[i] = &m;
    }
    for (size_t i = 0; i < n; ++i)
        if (!locals[i]->pin()) {
            for (size_t j = 0; j < i; ++j) locals[j]->unpin();
            return set_error(err, -EINVAL, "efa: op %zu: local region %" PRIu64 " is being deregistered", i,
                             ops[i].local_mem);
        }
    const auto now = Clock::now();
    std::vector<std::unique_ptr<Op>> built(n);
    std::vector<ferry_completion_t> refused;
    try {
        for (size_t i = 0; i < n; ++i) {
            const ferry_xfer_op_t &x = ops[i];
            auto op = std::make_unique<Op>();
            op->user_data = x.user_data;
            op->peer = peer;
            op->opcode = x.opcode;
            op->remote = &r;
            op->pin = locals[i];
            op->start = now;
            const uint32_t need = x.opcode == FERRY_OP_READ ? FERRY_ACCESS_REMOTE_READ : FERRY_ACCESS_REMOTE_WRITE;
            uint64_t at = x.remote_addr, local = x.local_addr, left = x.length;
            if (imports[i]->staged) {  // request/response with the target (staged_ops.cpp)
                op->staged = true;
                op->st.local_addr = x.local_addr;
                op->st.remote_addr = x.remote_addr;
                op->st.length = x.length;
                if ((imports[i]->access & need) != need) {
                    op->status = -EACCES;
                    op->message = strprintf("efa: peer %s refused %s [0x%" PRIx64 ", +%" PRIu64
                                            "): its region is not registered for remote %s",
                                            r.name_str.c_str(), op_name(x.opcode), x.remote_addr, x.length,
                                            need == FERRY_ACCESS_REMOTE_WRITE ? "write" : "read");
                    op->staged = false;
                }
                left = 0;
            }
            while (left > 0) {
                // The serving side published its registrations (export_mem bytes or a query):
                // ranges outside them, or without the right, are refused here rather than sent,
                // because some providers (tcp) drop the whole connection on a refused access.
                const RemoteChunk *c = chunk_holding(imports[i]->chunks, at);
                if (c == nullptr || c->revoked || (c->access & need) != need) {
                    op->status = c == nullptr || c->revoked ? -EFAULT : -EACCES;
                    op->message = strprintf("efa: peer %s refused %s [0x%" PRIx64 ", +%" PRIu64 "): %s",
                                            r.name_str.c_str(), op_name(x.opcode), x.remote_addr, x.length,
                                            c == nullptr ? "not inside a region it registered"
                                            : c->revoked ? "it deregistered that region"
                                                         : (need == FERRY_ACCESS_REMOTE_WRITE
                                                                ? "its region is not registered for remote write"
                                                                : "its region is not registered for remote read"));
                    op->subs.clear();
                    break;
                }
                const MrChunk &lc = locals[i]->chunk_at(local);
                uint64_t seg = std::min(
                    {left, c->addr + c->len - at, lc.addr + lc.len - local, static_cast<uint64_t>(fab_.max_msg_size)});
                SubOp s;
                s.local = reinterpret_cast<void *>(local);
                s.len = seg;
                s.desc = lc.desc;
                s.raddr = c->rma_base + (at - c->addr);
                s.key = c->key;
                op->subs.push_back(s);
                at += seg;
                local += seg;
                left -= seg;
            }
            built[i] = std::move(op);
        }
    } catch (...) {
        for (auto &l : locals) l->unpin();
        throw;
    }
    // From here nothing fails: every op completes exactly once.
    bool staged = false;
    uint64_t bytes = 0;
    for (auto &op : built) {
        bytes += ops[&op - built.data()].length;
        if (op->staged) {
            stage_submit(std::move(op));
            staged = true;
            continue;
        }
        if (op->subs.empty()) {
            refused.push_back(make_completion(op->user_data, op->status, op->message));
            op->pin->unpin();
            continue;
        }
        op->unposted = static_cast<uint32_t>(op->subs.size());
        for (auto &s : op->subs) {
            s.op = op.get();
            ready_.push_back(&s);
        }
        Op *raw = op.get();
        ops_.emplace(raw, std::move(op));
    }
    cq_.push(refused);
    // Hand the ops to the provider right away (it starts sending inside the post) instead of
    // waiting for the progress thread to wake up; it then drives the rest. It needs waking only
    // when it has work of ours to do (pieces the provider pushed back, staged requests, a peer
    // to reach): otherwise it sleeps on the CQ's wait object, which the provider signals for
    // what we posted (its completion, or a socket ready for the rest of a partial send). If it
    // sleeps without a deadline, a timer gives it one for our timeouts. A wake-up per op was a
    // third of the progress thread's wake-ups with one op in flight. Large submits
    // still wake it: the provider holds the rest of a partial send, and the thread pushing it
    // at once measured faster at 1 MiB than waiting for the socket to drain.
    post_ops();
    // Spinning: the host thread that waits for these reads the CQ (host_progress); the
    // completion fd made readable sends it there at once instead of into poll(2)'s sleep. A host
    // that polls and spins also pushes a large submit's rest (fi_cq_read progresses the
    // provider's sends): waking the progress thread as well only had it contend for mu_ (1 MiB,
    // one in flight: 2 futex calls and a context switch per op in each of the two threads).
    int unused;
    const bool host_spins = cfg_.spin_us > 0 && host_leased(now, &unused);
    if (cfg_.spin_us > 0 && host_fd_ >= 0) {
        host_work_ = now;
        cq_.signal();
    }
    if (staged || (bytes > kQuietSubmitBytes && !host_spins) || !ready_.empty() || r.state != Remote::State::Up) {
        wake();
    } else if (parked_) {
        arm_timer();
        parked_ = false;
    }
    return 0;
}

int Transport::post(SubOp &s) {
    Op &op = *s.op;
    iovec iov{s.local, s.len};
    void *desc = s.desc;
    fi_rma_iov rma{s.raddr, s.len, s.key};
    fi_msg_rma m{};
    m.msg_iov = &iov;
    m.desc = &desc;
    m.iov_count = 1;
    m.addr = op.remote->addr;
    m.rma_iov = &rma;
    m.rma_iov_count = 1;
    m.context = &s.fi;
    auto lk = fab_.lock();
    // FI_DELIVERY_COMPLETE: the completion means the bytes are in the peer's memory (the tcp
    // provider otherwise completes a write once it is handed to the socket).
    return op.opcode == FERRY_OP_WRITE
               ? static_cast<int>(fi_writemsg(fab_.ep, &m, FI_COMPLETION | FI_DELIVERY_COMPLETE))
               : static_cast<int>(fi_readmsg(fab_.ep, &m, FI_COMPLETION));
}

bool Transport::post_ops() {
    bool did = false;
    while (!ready_.empty()) {
        SubOp *s = ready_.front();
        Op &op = *s->op;
        Remote &r = *op.remote;
        if (op.doomed || r.state == Remote::State::Dead) {  // canceled, timed out, or nowhere to go
            ready_.pop_front();
            --op.unposted;
            fail_op(op, -ECONNRESET, strprintf("efa: peer %s is unreachable: %s", r.name_str.c_str(), r.why.c_str()));
            maybe_finish(op);
            did = true;
            continue;
        }
        if (r.state != Remote::State::Up) {
            ready_.pop_front();
            r.held.push_back(s);
            continue;
        }
        int rc = post(*s);
        if (rc == -FI_EAGAIN) break;  // the provider's queue is full or the connection is being set up
        ready_.pop_front();
        --op.unposted;
        did = true;
        if (rc != 0) {
            std::string msg = strprintf("efa: posting a %s to peer %s failed: %s", op_name(op.opcode),
                                        r.name_str.c_str(), fi_error_string(rc).c_str());
            if (op.staged) {
                fail_op(op, -EIO, msg);
            } else if (op.status == 0) {
                op.status = -EIO;
                op.message = msg;
            }
            maybe_finish(op);
        } else {
            s->posted = true;
            ++op.outstanding;
            ++r.outstanding;
        }
    }
    return did;
}

std::string Transport::describe_error(const fi_cq_err_entry &e, const Remote &r, int *status) const {
    char prov[160] = "";
    {
        const char *p = fi_cq_strerror(fab_.cq, e.prov_errno, e.err_data, prov, sizeof prov);
        if (p != nullptr && p != prov) snprintf(prov, sizeof prov, "%s", p);
    }
    const char *meaning;
    switch (e.err) {
        case FI_EACCES:
        case FI_EPERM:
            *status = -EACCES;
            meaning = "the peer refused the access right";
            break;
        case FI_EINVAL:
        case FI_EFAULT:
        case FI_EKEYREJECTED:
        case FI_ENOKEY:
            *status = -EFAULT;
            meaning = "refused by the peer (no registration with that key and range: deregistered or forged)";
            break;
        case FI_ETIMEDOUT:
            *status = -ETIMEDOUT;
            meaning = "the provider timed out";
            break;
        case FI_ECANCELED:
            if (e.prov_errno == ENOENT && r.state == Remote::State::Up) {  // tcp: the peer found no such key
                *status = -EFAULT;
                meaning =
                    "refused by the peer (no registration with that key, range and right: deregistered or "
                    "forged), which dropped the connection";
                break;
            }
            *status = -ECONNRESET;
            meaning = r.state == Remote::State::Up ? "the connection failed" : "the connection was reset";
            break;
        default:
            *status = -ECONNRESET;
            meaning = "the connection failed (peer exited or unreachable)";
            break;
    }
    return strprintf("peer %s: %s: %s (provider: %s)", r.name_str.c_str(), meaning, fi_error_string(e.err).c_str(),
                     prov);
}

// The provider handed piece s back: it holds it no more. A failed piece fails its op (a staged
// op at once, as nothing more of it may go; a keyed op keeps its first failure and ends when its
// other pieces came back), and a Hello to the peer tells a refused op from a broken connection
// (ops submitted meanwhile wait). The prologue of sub_done and stage_sub_done.
bool Transport::sub_returned(SubOp &s, const fi_cq_err_entry *e) {
    Op &op = *s.op;
    Remote &r = *op.remote;
    s.done = true;
    --op.outstanding;
    --r.outstanding;
    if (e == nullptr) return false;
    int status = -EIO;
    std::string msg = describe_error(*e, r, &status);
    msg = strprintf("efa: %s%s of %" PRIu64 " bytes failed: %s", op.staged ? "staged " : "", op_name(op.opcode), s.len,
                    msg.c_str());
    if (op.staged) {
        fail_op(op, status, msg);
    } else if (op.status == 0) {
        op.status = status;
        op.message = std::move(msg);
    }
    if (r.state == Remote::State::Up) ping(r);
    return true;
}

void Transport::sub_done(SubOp &s, const fi_cq_err_entry *e) {
    if (s.op->staged) return stage_sub_done(s, e);
    sub_returned(s, e);
    maybe_finish(*s.op);
    if (!revokes_.empty()) check_revokes();
}

// The op fails with `status`: none of its pieces is posted from now on, and its completion is
// delivered by maybe_finish once the provider holds none of them (the caller's buffer is then
// ours again). The first failure names the op's fate.
void Transport::fail_op(Op &op, int status, const std::string &message) {
    if (op.doomed) return;
    op.doomed = true;
    op.doomed_at = Clock::now();
    op.status = status;
    op.message = message;
}

void Transport::maybe_finish(Op &op) {
    if (op.unposted != 0 || op.outstanding != 0) return;
    if (op.staged && !stage_end(op)) return;
    if (host_n_ < host_room_) {  // a host thread in poll() found it: straight into its array
        ferry_completion_t &c = host_out_[host_n_++];
        c.user_data = op.user_data;
        c.status = op.status;
        c.reserved = 0;
        copy_message(c.message, op.status != 0 ? op.message.c_str() : "");
    } else {
        cq_.push(op.user_data, op.status, op.message);
    }
    op.pin->unpin();
    ops_.erase(&op);
}

// Drops the held (never posted) pieces of r's doomed ops and reports those the provider no
// longer holds.
void Transport::settle(Remote &r) {
    for (auto it = r.held.begin(); it != r.held.end();)
        if ((*it)->op->doomed) {
            --(*it)->op->unposted;
            it = r.held.erase(it);
        } else {
            ++it;
        }
    std::vector<Op *> done;
    for (auto &[p, op] : ops_)
        if (op->remote == &r && op->doomed && op->unposted == 0 && op->outstanding == 0) done.push_back(op.get());
    for (Op *op : done) maybe_finish(*op);
}

// Makes the provider hand back what it holds for r. Removing the address is not enough: the tcp
// provider keeps RMA queued on the connection to a stopped peer and completes it into our
// buffers whenever the peer resumes. Shutting that connection down makes it fail all of it at
// once (as flushed errors). Providers without sockets give ops back on their own errors.
void Transport::reclaim(Remote &r) {
    if (r.outstanding == 0 && r.sending == 0) return;
    remove_addr(r);
    size_t n = cut_connections_to(r.name);
    log_.log(FERRY_LOG_DEBUG,
             "reclaiming %" PRIu64 " RMA piece(s) and %u control message(s) from %s: %zu connection(s) shut down",
             r.outstanding, r.sending, r.name_str.c_str(), n);
}

// Ops past op_timeout_ms fail; their peer's connection is cut, which makes the provider hand
// back what it held (a peer that is stopped would otherwise keep our buffers forever). They are
// reported once it did. A provider that still holds a piece connect_timeout_ms later is named
// in the log (once per op): its op stays pending until the provider lets go of the buffer.
void Transport::check_timeouts() {
    const auto now = Clock::now();
    const auto limit = std::chrono::milliseconds(cfg_.op_timeout_ms);
    std::vector<Remote *> stuck;
    size_t still_held = 0;
    for (auto &[p, op] : ops_) {
        if (!op->doomed && now - op->start > limit) {
            fail_op(*op, -ETIMEDOUT,
                    strprintf("efa: %s on peer %s not done within %u ms (peer stopped, overloaded or gone)",
                              op_name(op->opcode), op->remote->name_str.c_str(), cfg_.op_timeout_ms));
            if (std::find(stuck.begin(), stuck.end(), op->remote) == stuck.end()) stuck.push_back(op->remote);
        } else if (op->doomed && op->outstanding > 0 && !op->warned &&
                   now - op->doomed_at > std::chrono::milliseconds(cfg_.connect_timeout_ms)) {
            op->warned = true;
            ++still_held;
        }
    }
    if (still_held)
        log_.log(FERRY_LOG_WARN,
                 "%zu failed op(s) still held by the provider %u ms after they failed; each is reported once "
                 "the provider hands its buffer back",
                 still_held, cfg_.connect_timeout_ms);
    for (Remote *r : stuck) {
        if (r->state == Remote::State::Up || r->state == Remote::State::Checking)
            remote_failed(*r, strprintf("ops not done within %u ms", cfg_.op_timeout_ms), false);
        reclaim(*r);
        settle(*r);
    }
}

}  // namespace ferry_efa
