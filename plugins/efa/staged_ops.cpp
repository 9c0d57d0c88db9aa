// The initiator's side of staged device memory (staged.hpp): an op on a remote region the target
// serves through its staging calls is a request (StageRead/StageWrite) answered slice by slice
// with grants; each grant becomes RMA pieces on the op, posted like any other (post_ops), and a
// StageDone once they completed. The target's messages are checked before anything is posted:
// grants must come in order, back to back, inside the op, and at most kMaxGrantsInFlight open.
// A READ completes when every byte landed here; a WRITE when the target acknowledged it (every
// byte in its device memory). A failed op gives its request up (StageDone with a status) once
// the provider holds none of its pieces.
#include "transport.hpp"

#include <rdma/fi_errno.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace ferry_efa {

namespace {
const char *op_name(uint32_t opcode) { return opcode == FERRY_OP_READ ? "READ" : "WRITE"; }
}  // namespace

void Transport::stage_submit(std::unique_ptr<Op> op) {
    Op *raw = op.get();
    raw->st.id = next_stage_id_++;
    raw->st.waiting = true;
    stage_ops_[raw->st.id] = raw;
    raw->remote->stage_wait.push_back(raw);
    ++stage_waiting_;
    ops_.emplace(raw, std::move(op));
}

// Sends waiting requests to remotes that are up, at most kMaxStagedPerRemote at each.
bool Transport::stage_pump() {
    if (stage_waiting_ == 0) return false;
    bool did = false;
    for (auto &[token, rp] : remotes_) {
        Remote &r = *rp;
        while (!r.stage_wait.empty() && r.state == Remote::State::Up && r.stage_inflight < kMaxStagedPerRemote) {
            Op &op = *r.stage_wait.front();
            r.stage_wait.pop_front();
            --stage_waiting_;
            op.st.waiting = false;
            did = true;
            if (op.doomed) {
                maybe_finish(op);
                continue;
            }
            StageReqBody b{op.st.remote_addr, op.st.length};
            send_ctrl(r, op.opcode == FERRY_OP_READ ? CtrlType::StageRead : CtrlType::StageWrite, op.st.id, 0, &b,
                      sizeof b);
            op.st.sent = true;
            if (r.stage_inflight++ == 0) r.stage_heard = Clock::now();
        }
    }
    return did;
}

void Transport::stage_on_grant(Remote &r, const CtrlHeader &h, const StageGrantBody &g) {
    auto it = stage_ops_.find(h.req_id);
    // Unknown: late for an op that ended (its give-up crossed this grant); the give-up frees it.
    if (it == stage_ops_.end() || it->second->st.over) return;
    if (it->second->remote != &r || !it->second->st.sent) {
        ++ignored_.unknown;  // not the target of that op: forged
        ++ignored_.total;
        return;
    }
    Op &op = *it->second;
    StagedInit &st = op.st;
    r.stage_heard = Clock::now();
    if (g.slice != st.grants || g.offset != st.granted || g.len > st.length - st.granted ||
        st.open.size() >= kMaxGrantsInFlight) {
        fail_op(op, -EPROTO,
                strprintf("efa: peer %s sent a staging grant that does not fit the %s (slice %u at +%" PRIu64
                          ", %" PRIu64 " bytes; expected slice %u at +%" PRIu64 " of %" PRIu64 ")",
                          r.name_str.c_str(), op_name(op.opcode), g.slice, g.offset, g.len, st.grants, st.granted,
                          st.length));
        maybe_finish(op);
        return;
    }
    ++st.grants;
    st.granted += g.len;
    if (op.doomed) return;  // given up once the provider holds nothing of it
    // The slice becomes pieces that each stay inside one local MR and max_msg_size.
    StagedInit::Grant gr{g.slice, g.len, 0};
    uint64_t local = st.local_addr + g.offset, raddr = g.rma_addr, left = g.len;
    while (left > 0) {
        const MrChunk &lc = op.pin->chunk_at(local);
        const uint64_t seg = std::min({left, lc.addr + lc.len - local, static_cast<uint64_t>(fab_.max_msg_size)});
        SubOp &s = op.stage_subs.emplace_back();
        s.op = &op;
        s.local = reinterpret_cast<void *>(local);
        s.len = seg;
        s.desc = lc.desc;
        s.raddr = raddr;
        s.key = g.key;
        s.slice = g.slice;
        ++op.unposted;
        ++gr.left;
        ready_.push_back(&s);
        local += seg;
        raddr += seg;
        left -= seg;
    }
    st.open.push_back(gr);
}

void Transport::stage_on_ack(Remote &r, const CtrlHeader &h, const uint8_t *text, size_t len) {
    auto it = stage_ops_.find(h.req_id);
    if (it == stage_ops_.end() || it->second->st.over) return;  // late: the op ended
    if (it->second->remote != &r || !it->second->st.sent) {
        ++ignored_.unknown;
        ++ignored_.total;
        return;
    }
    Op &op = *it->second;
    op.st.over = true;
    r.stage_heard = Clock::now();
    if (h.status == 0 && op.opcode == FERRY_OP_WRITE && op.st.landed == op.st.length) {
        op.st.acked = true;
    } else if (h.status == 0) {
        fail_op(op, -EPROTO,
                strprintf("efa: peer %s acknowledged a staged %s before it had all its bytes", r.name_str.c_str(),
                          op_name(op.opcode)));
    } else {
        std::string msg(reinterpret_cast<const char *>(text), strnlen(reinterpret_cast<const char *>(text), len));
        fail_op(op, h.status < 0 ? h.status : -EIO,
                strprintf("efa: peer %s failed the staged %s of [0x%" PRIx64 ", +%" PRIu64 "): %s", r.name_str.c_str(),
                          op_name(op.opcode), op.st.remote_addr, op.st.length,
                          msg.empty() ? "no reason given" : msg.c_str()));
        // Pieces not posted yet are never posted now (post_ops drops them).
    }
    maybe_finish(op);
}

void Transport::stage_sub_done(SubOp &s, const fi_cq_err_entry *e) {
    Op &op = *s.op;
    Remote &r = *op.remote;
    if (!sub_returned(s, e) && !op.doomed) {
        auto g = std::find_if(op.st.open.begin(), op.st.open.end(),
                              [&](const StagedInit::Grant &x) { return x.slice == s.slice; });
        if (g != op.st.open.end() && --g->left == 0) {
            op.st.landed += g->len;
            StageDoneBody d{g->slice, 0};
            send_ctrl(r, CtrlType::StageDone, op.st.id, 0, &d, sizeof d);
            op.st.open.erase(g);
        }
    }
    const SubOp *gone = &s;
    op.stage_subs.remove_if([&](const SubOp &x) { return &x == gone; });
    maybe_finish(op);
}

// Whether the staged op can be reported now (the provider holds none of its pieces): a READ
// when every byte landed, a WRITE once acknowledged, a failed op at once. Ending it gives the
// request up at the target when the target still holds it, and lets the next one go.
bool Transport::stage_end(Op &op) {
    StagedInit &st = op.st;
    const bool ok = !op.doomed && (op.opcode == FERRY_OP_READ ? st.landed == st.length : st.acked);
    if (!ok && !op.doomed) return false;
    Remote &r = *op.remote;
    if (st.waiting) {
        r.stage_wait.erase(std::find(r.stage_wait.begin(), r.stage_wait.end(), &op));
        --stage_waiting_;
        st.waiting = false;
    }
    if (st.sent) {
        // Even after its failure answer the target holds the grants we did not finish.
        if (!ok && !st.gone && r.addr != FI_ADDR_NOTAVAIL) {
            StageDoneBody d{0, -ECANCELED};
            send_ctrl(r, CtrlType::StageDone, st.id, 0, &d, sizeof d);
        }
        --r.stage_inflight;
        st.sent = false;
    }
    stage_ops_.erase(st.id);
    return true;
}

// A request or StageDone could not be delivered: the op fails (the target drops its grants when
// their time runs out). The target's grants and answers not delivered: that peer's staged
// requests are dropped. Returns whether `type` was a staging message.
bool Transport::stage_send_failed(Remote &r, CtrlType type, uint64_t req_id) {
    switch (type) {
        case CtrlType::StageRead:
        case CtrlType::StageWrite:
        case CtrlType::StageDone: {
            auto it = stage_ops_.find(req_id);
            if (it != stage_ops_.end() && it->second->remote == &r) {
                Op &op = *it->second;
                fail_op(op, -ECONNRESET,
                        strprintf("efa: peer %s is unreachable: a staging message to it failed", r.name_str.c_str()));
                maybe_finish(op);
            }
            if (r.state == Remote::State::Up) ping(r);
            return true;
        }
        case CtrlType::StageGrant:
        case CtrlType::StageAck:
            stage_drop_peer(r, "a staging message to it could not be delivered", true);
            return true;
        default: return false;
    }
}

// r is unreachable: our staged ops to it fail (reported once the provider gave their pieces
// back), and what it was lent comes back.
void Transport::stage_remote_gone(Remote &r, const std::string &why) {
    std::vector<Op *> mine;
    for (auto &[id, op] : stage_ops_)
        if (op->remote == &r) mine.push_back(op);
    for (Op *op : mine) {
        op->st.gone = true;  // nothing to give up at a peer that is gone
        fail_op(*op, -ECONNRESET, strprintf("efa: peer %s is unreachable: %s", r.name_str.c_str(), why.c_str()));
        maybe_finish(*op);
    }
    stage_drop_peer(r, "it is unreachable: " + why, true);
}

}  // namespace ferry_efa
