// The serving side of staged small ops (stage.hpp): it maps the staging area an initiator offers
// over its authenticated data connection, and copies each block's ops between the area and this
// instance's own registered memory with memcpy, every range checked against both.
#include "transport.hpp"

#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <utility>

namespace ferry_shm {

ServerConn::~ServerConn() {
    if (stage_fd >= 0) close(stage_fd);
}

// A read can bring descriptors only as the start of a StageOffer (its sendmsg carries one). At
// most one waits for its record; any other descriptor is closed at once, so a peer cannot make
// us hold more.
void Transport::keep_stage_fds(ServerConn &c, const int *fds, size_t n) {
    for (size_t i = 0; i < n; ++i) {
        if (i == 0 && n == 1 && c.hello_done && !c.map_channel && !c.stage && c.stage_fd < 0) {
            c.stage_fd = fds[i];
            continue;
        }
        close(fds[i]);
    }
}

void Transport::take_stage(ServerConn &c, const Request &r, std::string &reply) {
    const int fd = std::exchange(c.stage_fd, -1);
    std::string why;
    std::unique_ptr<StageArea> area;
    if (c.stage) why = "the connection has one already";
    else if (fd < 0) why = "no descriptor came with the offer";
    else area = map_peer_stage(fd, r.length, &why);
    if (fd >= 0) close(fd);  // the mapping keeps the file
    if (area) {
        c.stage = std::move(area);
        append_done(reply, r.id, 0, {});
        return;
    }
    refused_log_.event(
        strprintf("refused pid %d's staging area (its small ops use cross-memory attach): %s", c.pid, why.c_str()));
    append_done(reply, r.id, -EBADF, strprintf("shm: pid %d refused the staging area: %s", pid_, why.c_str()));
}

namespace {

void append_op_failure(std::string &out, uint64_t id, size_t index, int status, const std::string &message) {
    Done d{};
    d.id = id;
    d.status = status;
    d.message_len = static_cast<uint16_t>(std::min(message.size(), static_cast<size_t>(FERRY_MESSAGE_MAX - 1)));
    d.reserved = static_cast<uint16_t>(index + 1);
    out.append(reinterpret_cast<const char *>(&d), sizeof d);
    out.append(message.data(), d.message_len);
}

}  // namespace

// One block: checked against the area, claimed (unless the initiator revoked it), its op list
// copied here (the initiator can change the shared one at any time), then every op checked
// against the area and our regions and copied with memcpy. Regions are looked up and pinned once
// per block while ops stay inside the last one found. Answers: a Done per failed op, then the
// batch's Done.
void Transport::serve_stage(ServerConn &c, const Request &r, std::string &reply) {
    StageArea *a = c.stage.get();
    const uint64_t off = r.remote_addr, len = r.length, count = r.local_addr;
    if (a == nullptr || off % kStageAlign != 0 || off > a->size || len > a->size - off || count == 0 ||
        count > kStageMaxOps || len < sizeof(StageHead) + count * sizeof(StageOp)) {
        append_done(reply, r.id, -EINVAL,
                    a == nullptr ? strprintf("shm: pid %d: a staged batch without a staging area", pid_)
                                 : strprintf("shm: pid %d: staged block [%" PRIu64 ", +%" PRIu64 ") of %" PRIu64
                                             " ops does not fit the staging area (%" PRIu64 " bytes)",
                                             pid_, off, len, count, a->size));
        return;
    }
    if (!stage_swap(a->ptr, off, kStagePosted, kStageClaimed)) {
        append_done(reply, r.id, -ECANCELED,
                    strprintf("shm: pid %d: the initiator revoked the op (it timed out or was canceled there)", pid_));
        return;
    }
    stage_ops_.resize(count);
    memcpy(stage_ops_.data(), a->ptr + off + sizeof(StageHead), count * sizeof(StageOp));
    std::vector<std::shared_ptr<Region>> held;
    const Region *cur = nullptr;
    for (size_t i = 0; i < count; ++i) {
        const StageOp op = stage_ops_[i];
        const bool read = op.opcode == FERRY_OP_READ;
        if ((!read && op.opcode != FERRY_OP_WRITE) || op.length == 0) {
            append_op_failure(
                reply, r.id, i, -EINVAL,
                strprintf("shm: pid %d: malformed staged op (opcode %u, length %u)", pid_, op.opcode, op.length));
            continue;
        }
        if (op.data_off < off || op.length > len || op.data_off - off > len - op.length) {
            append_op_failure(reply, r.id, i, -EINVAL,
                              strprintf("shm: pid %d: staged op's bytes [%" PRIu64 ", +%u) are outside its block", pid_,
                                        op.data_off, op.length));
            continue;
        }
        const uint32_t need = read ? FERRY_ACCESS_REMOTE_READ : FERRY_ACCESS_REMOTE_WRITE;
        if (cur == nullptr || !cur->contains(op.remote_addr, op.length) || (cur->access & need) != need) {
            std::shared_ptr<Region> region;
            int rc = regions_.lookup_pin(op.remote_addr, op.length, need, &region);
            if (rc == 0 && region->kind != FERRY_MEM_HOST) {  // device memory is staged by workers, not here
                region->unpin();
                rc = -ENOTSUP;
            }
            if (rc != 0) {
                append_op_failure(reply, r.id, i, rc,
                                  strprintf("shm: pid %d refused %s [0x%" PRIx64 ", +%u): %s", pid_,
                                            read ? "READ of" : "WRITE to", op.remote_addr, op.length,
                                            rc == -EACCES    ? (read ? "the region is not registered for remote read"
                                                                     : "the region is not registered for remote write")
                                            : rc == -ENOTSUP ? "device memory is not served through the staging area"
                                                             : "not inside a registered region"));
                continue;
            }
            cur = region.get();
            held.push_back(std::move(region));
        }
        uint8_t *mine = reinterpret_cast<uint8_t *>(op.remote_addr), *theirs = a->ptr + op.data_off;
        if (read) memcpy(theirs, mine, op.length);
        else memcpy(mine, theirs, op.length);
    }
    for (auto &h : held) h->unpin();
    append_done(reply, r.id, 0, {});
}

}  // namespace ferry_shm
