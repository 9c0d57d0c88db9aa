// The initiator's side of staged small ops (stage.hpp): the area offered at connect, blocks
// taken from it as a ring, answers (a READ's bytes copied out only for an op not reported
// failed), revocation of blocks it gave up on.
#include "transport.hpp"

#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace ferry_shm {

namespace {

std::string local_fault_message(const StagedOp &op) {
    return strprintf("shm: pid %d could not %s its buffer [0x%" PRIx64 ", +%u): %s (the page is not accessible)",
                     getpid(), op.opcode == FERRY_OP_WRITE ? "read" : "write", reinterpret_cast<uint64_t>(op.local),
                     op.length, errno_string(EFAULT).c_str());
}

}  // namespace

// The answer (a Done with id 0) is read by the I/O thread like any other (on_dones); ops use the
// area only from then on, so a serving side that never answers the offer costs nothing.
int Transport::offer_stage(ClientConn &c, ferry_error_t *err) {
    std::string why;
    auto area = create_stage(kStageBytes, &why);
    if (!area) {
        log_.log(FERRY_LOG_INFO, "%s: no staging area (small ops use cross-memory attach): %s", c.who.c_str(),
                 why.c_str());
        return 0;
    }
    Request r{};
    r.opcode = kOpStageOffer;
    r.local_fd = -1;
    r.length = area->size;
    ssize_t n = send_with_fd(c.fd, &r, sizeof r, area->fd, MSG_NOSIGNAL);
    if (n != static_cast<ssize_t>(sizeof r))
        return set_error(err, -ECONNRESET, "shm: %s: sending the staging area: %s", c.who.c_str(),
                         errno_string(n < 0 ? errno : EPIPE).c_str());
    c.stage = std::move(area);
    c.scratch.resize(kStageMaxOp);
    return 0;
}

size_t Transport::stage_locked(ClientConn &c, const ferry_xfer_op_t *ops, size_t n, std::vector<char> &stage,
                               const std::shared_ptr<PinHold> &pins, std::string &wire) {
    StageArea &a = *c.stage;
    const uint64_t max_block = a.size / 4;  // so that a few blocks can be in flight
    const auto now = Clock::now();
    size_t staged = 0;
    std::vector<iovec> iov;
    std::vector<int> status;
    for (size_t i = 0; i < n;) {
        // The ops of one block: [i, end) among those to stage.
        uint64_t count = 0, payload = 0;
        size_t end = i;
        for (; end < n && count < kStageMaxOps; ++end) {
            if (!stage[end]) continue;
            const uint64_t p = ops[end].length;
            if (count > 0 && stage_block_bytes(count + 1, payload + p) > max_block) break;
            ++count;
            payload += p;
        }
        if (count == 0) break;
        const uint64_t bytes = stage_block_bytes(count, payload);
        uint64_t head = c.stage_head, pos = head % a.size;
        if (pos + bytes > a.size) head += a.size - pos, pos = 0;  // blocks do not wrap: skip the end
        if (head + bytes - c.stage_tail > a.size) {               // full (answers pending): CMA for the rest
            for (; i < n; ++i) stage[i] = 0;
            break;
        }
        c.stage_head = head + bytes;
        StagedBatch b;
        b.id = c.next_id++;
        b.off = pos;
        b.end = c.stage_head;
        b.start = now;
        b.pins = pins;
        b.ops.reserve(count);
        uint8_t *blk = a.ptr + pos;
        StageHead h{};
        h.state = kStagePosted;
        h.count = static_cast<uint32_t>(count);
        h.id = b.id;
        memcpy(blk, &h, sizeof h);
        auto *list = reinterpret_cast<StageOp *>(blk + sizeof h);
        const uint64_t data_start = pos + sizeof h + count * sizeof(StageOp);
        uint64_t data = data_start;
        iov.clear();
        for (size_t k = i; k < end; ++k) {
            if (!stage[k]) continue;
            const ferry_xfer_op_t &op = ops[k];
            const auto len = static_cast<uint32_t>(op.length);
            list[b.ops.size()] = StageOp{op.remote_addr, data, len, op.opcode};
            auto *local = reinterpret_cast<uint8_t *>(op.local_addr);
            iov.push_back({op.opcode == FERRY_OP_WRITE ? local : c.scratch.data(), len});
            StagedOp s;
            s.user_data = op.user_data;
            s.local = local;
            s.data_off = data;
            s.length = len;
            s.opcode = op.opcode;
            b.ops.push_back(std::move(s));
            data += len;
        }
        // A WRITE's bytes into the block; a buffer that faults fails its op (not sent as one).
        status.assign(iov.size(), 0);
        stage_file_copy(a.fd, true, iov.data(), iov.size(), data_start, status.data());
        for (size_t j = 0; j < iov.size(); ++j)
            if (status[j] != 0) {
                list[j].opcode = 0;  // the serving side refuses it; our status is the one reported
                b.ops[j].status = status[j];
                b.ops[j].message = local_fault_message(b.ops[j]);
            }
        Request rec{};
        rec.id = b.id;
        rec.opcode = kOpStageBatch;
        rec.local_fd = -1;
        rec.remote_addr = pos;
        rec.length = bytes;
        rec.local_addr = count;
        wire.append(reinterpret_cast<const char *>(&rec), sizeof rec);
        c.staged.push_back(std::move(b));
        staged += count;
        i = end;
    }
    return staged;
}

void Transport::report_staged(StagedBatch &b, int status, const std::string &message,
                              std::vector<ferry_completion_t> &done) {
    if (b.reported) return;
    b.reported = true;
    for (auto &op : b.ops) done.push_back(make_completion(op.user_data, status, message));
    b.pins.reset();  // nothing touches our buffers for a reported batch
}

size_t Transport::on_staged_done(ClientConn &c, const Done &d, std::string_view message,
                                 std::vector<ferry_completion_t> &done, std::vector<std::shared_ptr<PinHold>> &unpin) {
    auto it = c.staged.begin();
    while (it != c.staged.end() && it->id != d.id) ++it;
    if (it == c.staged.end() || it->answered) return 0;  // not ours (a peer's mistake): ignored
    StagedBatch &b = *it;
    if (d.reserved != 0) {  // one op failed
        const size_t i = d.reserved - 1u;
        if (i < b.ops.size() && d.status < 0) {
            b.ops[i].status = d.status;
            b.ops[i].message.assign(message);
        }
        return 0;
    }
    b.answered = true;
    if (!b.reported) {
        b.reported = true;
        const bool revoked = b.revoked_status != 0;
        // READs' bytes out of the block, for ops that succeeded (others into the scratch buffer).
        std::vector<iovec> iov;
        std::vector<int> status(b.ops.size(), 0);
        bool reads = false;
        iov.reserve(b.ops.size());
        for (auto &op : b.ops) {
            const bool out = op.opcode == FERRY_OP_READ && op.status == 0 && d.status == 0;
            iov.push_back({out ? op.local : c.scratch.data(), op.length});
            reads |= out;
        }
        if (reads && !b.ops.empty())
            stage_file_copy(c.stage->fd, false, iov.data(), iov.size(), b.ops[0].data_off, status.data());
        for (size_t i = 0; i < b.ops.size(); ++i)
            if (status[i] != 0 && iov[i].iov_base != c.scratch.data() && b.ops[i].status == 0) {
                b.ops[i].status = status[i];
                b.ops[i].message = local_fault_message(b.ops[i]);
            }
        for (auto &op : b.ops) {
            int st = op.status != 0 ? op.status : d.status < 0 ? d.status : 0;
            if (st != 0) {
                // A revoked batch whose copy had finished before we gave up did complete: say so.
                done.push_back(
                    revoked ? make_completion(op.user_data, b.revoked_status, b.revoked_message)
                            : make_completion(op.user_data, st, op.status != 0 ? op.message : std::string(message)));
                continue;
            }
            done.push_back(make_completion(op.user_data, 0, {}));
        }
        unpin.push_back(std::move(b.pins));
    }
    const size_t ended = b.ops.size();
    while (!c.staged.empty() && c.staged.front().answered) {  // the area is free up to the oldest unanswered block
        c.stage_tail = c.staged.front().end;
        c.staged.pop_front();
    }
    return ended;
}

// The serving side copies a block only after claiming it (stage.hpp): a block still posted is
// revoked here and never copied, so its ops are reported now. A claimed one is being copied or
// was: reported once it is answered, the connection ends, or kRevokeGrace passed (check_timeouts),
// as revoked CMA ops are. Either way a READ's bytes are copied out only for an unreported op.
void Transport::revoke_staged_locked(ClientConn &c, StagedBatch &b, int status, const std::string &message,
                                     Clock::time_point now, std::vector<ferry_completion_t> &done) {
    if (b.reported || b.revoked_status != 0) return;
    if (c.stage && stage_swap(c.stage->ptr, b.off, kStagePosted, kStageRevoked)) {
        report_staged(b, status, message, done);
        return;
    }
    b.revoked_status = status;
    b.revoked_message = message;
    b.revoke_at = now;
}

}  // namespace ferry_shm
