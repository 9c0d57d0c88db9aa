// The serving side's fast path for small ops: the requests of one read from a socket are checked
// one by one (server.cpp, on_request), and the small ones copied with cross-memory attach are
// gathered into groups that one process_vm_readv/writev each moves, their gate's byte first
// (wire.hpp). Their answers leave in one send: Done records back to back, as the initiator reads
// them anyway. The wire format is that of single requests: a batch is what one read returned.
#include "transport.hpp"

#include <sys/uio.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <vector>

namespace ferry_shm {

namespace {

// Appends [base, +len) to v, merged into the last iovec when adjacent: the kernel pins an
// initiator's pages per iovec, so adjacent ops cost one walk.
void add_iov(std::vector<iovec> &v, uint64_t base, uint64_t len) {
    if (!v.empty() && reinterpret_cast<uint64_t>(v.back().iov_base) + v.back().iov_len == base) {
        v.back().iov_len += len;
        return;
    }
    v.push_back({reinterpret_cast<void *>(base), len});
}

}  // namespace

void Transport::on_requests(const std::shared_ptr<ServerConn> &c, const uint8_t *data, size_t n) {
    std::string reply;
    CopyGroup group;
    reply.reserve(n / sizeof(Request) * sizeof(Done));
    group.ops.reserve(std::min(n / sizeof(Request), kMaxGroupOps));
    for (size_t at = 0; at + sizeof(Request) <= n; at += sizeof(Request)) {
        Request r;
        memcpy(&r, data + at, sizeof r);
        on_request(c, r, reply, group);
    }
    copy_group(*c, group, reply);
    if (!reply.empty() && !c->gone.load(std::memory_order_acquire)) send(*c, reply.data(), reply.size());
}

// Copies every op of the group and answers each. One syscall moves ops [i, end) in request
// order; when it stops short, the ops wholly before the byte it stopped at landed, the op it
// stopped in is tried alone (so it fails, or not, with its own error) and the syscall goes on
// from the next one (a peer whose every op faults costs two syscalls an op, as single copies
// did). The pidfd is checked before and after each syscall, as copy() does.
void Transport::copy_group(ServerConn &c, CopyGroup &group, std::string &reply) {
    if (group.ops.empty()) return;
    auto &ops = group.ops;
    std::vector<int> status(ops.size(), 0);
    std::vector<iovec> mine, theirs;
    mine.reserve(ops.size() + 1);
    theirs.reserve(ops.size() + 1);
    const Request &first = ops.front().req;
    const bool write = first.opcode == FERRY_OP_WRITE;  // the initiator's WRITE: read it out of the initiator
    const int g = first.gate_addr != 0 ? 1 : 0;
    uint8_t gate_byte = 0;
    for (size_t i = 0; i < ops.size();) {
        if (!process_alive(c.pidfd)) {
            for (; i < ops.size(); ++i) status[i] = -ESRCH;
            break;
        }
        mine.clear();
        theirs.clear();
        if (g) {
            mine.push_back({&gate_byte, 1});
            theirs.push_back({reinterpret_cast<void *>(first.gate_addr), 1});
        }
        uint64_t total = 0;
        for (size_t k = i; k < ops.size(); ++k) {
            add_iov(mine, ops[k].req.remote_addr, ops[k].req.length);
            add_iov(theirs, ops[k].req.local_addr, ops[k].req.length);
            total += ops[k].req.length;
        }
        ssize_t n = write ? process_vm_readv(c.pid, mine.data(), mine.size(), theirs.data(), theirs.size(), 0)
                          : process_vm_writev(c.pid, mine.data(), mine.size(), theirs.data(), theirs.size(), 0);
        if (!process_alive(c.pidfd)) {
            for (; i < ops.size(); ++i) status[i] = -ESRCH;
            break;
        }
        if (n == static_cast<ssize_t>(total) + g) break;  // all landed
        if (n < 0 && errno != EFAULT) {                   // the call as a whole (EPERM, ENOMEM): each op alike
            const int e = errno;
            for (; i < ops.size(); ++i) status[i] = -e;
            break;
        }
        if (g && n <= 0) {
            iovec gl{&gate_byte, 1}, gr{reinterpret_cast<void *>(first.gate_addr), 1};
            if (process_vm_readv(c.pid, &gl, 1, &gr, 1, 0) != 1) {  // revoked: not a byte moved
                for (; i < ops.size(); ++i) status[i] = -ECANCELED;
                break;
            }
        }
        uint64_t landed = n > g ? static_cast<uint64_t>(n) - g : 0;
        while (i < ops.size() && ops[i].req.length <= landed) landed -= ops[i++].req.length;
        if (i == ops.size()) break;  // (cannot happen: n was short)
        status[i] = copy(c, ops[i].req, nullptr, 0, ops[i].req.length, nullptr);
        ++i;
    }
    for (size_t i = 0; i < ops.size(); ++i) {
        ops[i].region->unpin();
        const int st = copy_status(status[i]);
        append_done(reply, ops[i].req.id, st,
                    st == 0 ? std::string() : copy_failure_message(c, ops[i].req, -status[i]));
    }
    ops.clear();
    group.bytes = 0;
}

}  // namespace ferry_shm
