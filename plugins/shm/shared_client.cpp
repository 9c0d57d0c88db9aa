// Managed buffers, the initiating side: a peer's memfd asked for over a map channel
// (map_wire.hpp), checked before it is mapped, cached per (peer, inode), and ops into it copied
// with memcpy right in submit, watching the region's liveness word before and after each copy.
#include "transport.hpp"

#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>
#include <vector>

namespace ferry_shm {

namespace {

// The reply to one map request. Every descriptor that arrives is collected (and closed by the
// caller unless exactly one was expected); anything else in the ancillary data, or a truncated
// one, refuses the reply. 0, or -errno with *why.
int read_reply(int sock, MapReply *rep, std::vector<int> *fds, Clock::time_point deadline, std::string *why) {
    char *p = reinterpret_cast<char *>(rep);
    size_t left = sizeof *rep;
    bool odd = false;
    while (left > 0) {
        auto ms = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        pollfd pf{sock, POLLIN, 0};
        if (ms <= 0 || ::poll(&pf, 1, static_cast<int>(ms)) == 0) return *why = "no answer in time", -ETIMEDOUT;
        iovec iov{p, left};
        alignas(cmsghdr) char control[CMSG_SPACE(sizeof(int) * 4)];
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = control;
        mh.msg_controllen = sizeof control;
        ssize_t n = recvmsg(sock, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        for (cmsghdr *cm = n >= 0 ? CMSG_FIRSTHDR(&mh) : nullptr; cm != nullptr; cm = CMSG_NXTHDR(&mh, cm)) {
            if (cm->cmsg_level == SOL_SOCKET && cm->cmsg_type == SCM_RIGHTS) {
                size_t k = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
                for (size_t i = 0; i < k; ++i) {
                    int fd;
                    memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof fd);
                    fds->push_back(fd);
                }
            } else {
                odd = true;  // SCM_CREDENTIALS and the like: never asked for
            }
        }
        if (n >= 0 && (mh.msg_flags & MSG_CTRUNC)) return *why = "it sent more descriptors than one", -EPROTO;
        if (odd) return *why = "it sent ancillary data other than one descriptor", -EPROTO;
        if (n <= 0)
            return n == 0 ? (*why = "it closed the channel", -ECONNRESET) : (*why = errno_string(errno), -errno);
        p += n;
        left -= static_cast<size_t>(n);
    }
    return 0;
}

void close_all(std::vector<int> &fds) {
    for (int fd : fds) close(fd);
    fds.clear();
}

}  // namespace

// Asks the peer for the memfd of the managed buffer holding r, on a fresh map channel. nullptr
// when anything is off: the import then goes over cross-memory attach, as for any memory.
std::shared_ptr<SharedMapping> Transport::map_shared(uint64_t peer, const ferry_mem_region_t &r) {
    EndpointBytes ep{};
    std::string who;
    {
        std::shared_lock lock(peers_mu_);
        auto it = peers_.find(peer);
        if (it == peers_.end()) return nullptr;
        ep = it->second->ep;
        who = it->second->who;
    }
    std::string why;
    std::shared_ptr<SharedMapping> m;
    std::vector<int> fds;
    auto done = [&](std::shared_ptr<SharedMapping> got) {
        close_all(fds);
        if (!got)
            refused_log_.event(strprintf("%s's managed buffer [0x%" PRIx64 ", +%" PRIu64
                                         ") is copied with cross-memory attach: %s",
                                         who.c_str(), r.addr, r.length, why.c_str()));
        return got;
    };
    if (!(r.access & FERRY_ACCESS_REMOTE_READ)) return why = "it is write-only (a mapping is readable)", done(nullptr);
    ferry_error_t err{};
    int sock = -1;
    if (open_channel(ep, kMapHelloMagic, who, &sock, &err) != 0) return why = err.message, done(nullptr);
    MapRequest req{kMapRequestMagic, r.access & (FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE), r.addr,
                   r.length};
    MapReply rep{};
    const auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.connect_timeout_ms);
    int rc = ::send(sock, &req, sizeof req, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof req)
                 ? read_reply(sock, &rep, &fds, deadline, &why)
                 : (why = "cannot send the request: " + errno_string(errno), -EIO);
    close(sock);
    const uint64_t page = static_cast<uint64_t>(sysconf(_SC_PAGESIZE));
    if (rc != 0) return done(nullptr);
    MapReply checked{};
    if (!parse_map_reply(&rep, sizeof rep, page, &checked, &why)) return why = "malformed reply: " + why, done(nullptr);
    if (checked.status != 0) {
        if (!fds.empty()) return why = "it refused and sent a descriptor anyway", done(nullptr);
        return why = checked.message, done(nullptr);
    }
    if (fds.size() != 1) return why = strprintf("it sent %zu descriptors, not one", fds.size()), done(nullptr);
    if (checked.base > r.addr || r.length > checked.length || r.addr - checked.base > checked.length - r.length)
        return why = "the region it names does not hold the imported one", done(nullptr);
    if ((checked.access & r.access) != (r.access & (FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE)))
        return why = "it granted less access than its descriptor says", done(nullptr);
    uint64_t ino = 0;
    if (check_received_memfd(fds[0], checked, &ino, &why) != 0)
        return why = "refused its descriptor: " + why, done(nullptr);
    std::lock_guard lock(shared_mu_);
    for (auto it = shared_maps_.begin(); it != shared_maps_.end();)  // forget mappings nobody holds
        it = it->second.expired() ? shared_maps_.erase(it) : std::next(it);
    auto &slot = shared_maps_[{peer, ino}];
    if (auto cached = slot.lock(); cached && cached->base == checked.base && cached->length == checked.length &&
                                   cached->live_value == checked.live_value &&
                                   cached->writable == bool(checked.access & FERRY_ACCESS_REMOTE_WRITE))
        return done(cached);
    m = map_checked_memfd(fds[0], checked, ino, &why);
    if (m) {
        slot = m;
        log_.log(FERRY_LOG_INFO,
                 "mapped %s's managed buffer [0x%" PRIx64 ", +%" PRIu64 ") (memfd inode %" PRIu64
                 ", %s): its transfers are memcpy",
                 who.c_str(), checked.base, checked.length, ino, m->writable ? "read-write" : "read-only");
    }
    return done(m);
}

int Transport::submit_mapped(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err) {
    struct Mapped {
        std::shared_ptr<SharedMapping> map;
        std::shared_ptr<Region> local;
    };
    std::vector<Mapped> todo(n);
    {
        std::shared_lock lock(peers_mu_);
        auto p = peers_.find(peer);
        if (p == peers_.end()) return kNotMapped;  // the usual path says what is wrong
        {
            std::lock_guard cl(p->second->mu);
            if (p->second->dead || p->second->closing) return kNotMapped;
        }
        for (size_t i = 0; i < n; ++i) {
            const ferry_xfer_op_t &op = ops[i];
            auto imp = imports_.find(op.remote_mem);
            if (imp == imports_.end() || imp->second.peer != peer || !imp->second.map) return kNotMapped;
            const Import &m = imp->second;
            if ((op.opcode != FERRY_OP_READ && op.opcode != FERRY_OP_WRITE) || op.length == 0 ||
                op.remote_addr < m.addr || op.length > m.length || op.remote_addr - m.addr > m.length - op.length)
                return kNotMapped;
            if (op.opcode == FERRY_OP_WRITE && !m.map->writable) return kNotMapped;
            auto local = regions_.find(op.local_mem);
            if (!local || local->kind != FERRY_MEM_HOST || !local->contains(op.local_addr, op.length))
                return kNotMapped;
            todo[i] = {m.map, std::move(local)};
        }
    }
    for (size_t i = 0; i < n; ++i)
        if (!todo[i].local->pin()) {
            for (size_t j = 0; j < i; ++j) todo[j].local->unpin();
            return set_error(err, -EINVAL, "shm: op %zu: local region %" PRIu64 " is being deregistered", i,
                             ops[i].local_mem);
        }
    // Liveness before, the copies (split over the helpers), liveness after: an op whose region
    // was freed meanwhile fails (its bytes went to the orphaned memfd only).
    std::vector<SplitCopier::Piece> pieces;
    std::vector<bool> live(n);
    pieces.reserve(n);
    for (size_t i = 0; i < n; ++i) {
        const ferry_xfer_op_t &op = ops[i];
        SharedMapping &m = *todo[i].map;
        auto *theirs = m.ptr + (op.remote_addr - m.base);
        auto *mine = reinterpret_cast<uint8_t *>(op.local_addr);
        live[i] = m.alive();
        if (live[i])
            pieces.push_back(op.opcode == FERRY_OP_WRITE ? SplitCopier::Piece{theirs, mine, op.length}
                                                         : SplitCopier::Piece{mine, theirs, op.length});
    }
    copier_.copy(pieces, cfg_.copy_threads > 1 ? cfg_.copy_threads - 1 : 0);
    std::vector<ferry_completion_t> done;
    done.reserve(n);
    std::vector<std::shared_ptr<SharedMapping>> gone;
    for (size_t i = 0; i < n; ++i) {
        const ferry_xfer_op_t &op = ops[i];
        SharedMapping &m = *todo[i].map;
        todo[i].local->unpin();
        if (live[i] && m.alive()) {
            done.push_back(make_completion(op.user_data, 0, {}));
            continue;
        }
        done.push_back(
            make_completion(op.user_data, -EFAULT,
                            strprintf("shm: peer %" PRIu64 " unregistered or freed its managed buffer [0x%" PRIx64
                                      ", +%" PRIu64 "): the region is gone (open the segment again)",
                                      peer, m.base, m.length)));
        gone.push_back(todo[i].map);
    }
    if (!gone.empty()) {  // dropped: later ops on these imports go to the serving side, which refuses them
        std::unique_lock lock(peers_mu_);
        for (auto &[id, imp] : imports_)
            for (auto &g : gone)
                if (imp.map == g) imp.map.reset();
    }
    cq_.push(done);
    return 0;
}

}  // namespace ferry_shm
