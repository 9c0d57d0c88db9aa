// The serving side of shm.so: the handshake (with its access probe), the check of every request
// against this instance's registered regions, and the copies, done here with
// process_vm_readv/writev against the initiator's memory.
#include "transport.hpp"

#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace ferry_shm {

std::string Transport::access_hint(uid_t them) const {
    if (them != uid_ && uid_ != 0)
        return strprintf(
            "the processes run as different users (uid %u there, uid %u here); cross-memory attach "
            "needs one user or CAP_SYS_PTRACE",
            static_cast<unsigned>(uid_), static_cast<unsigned>(them));
    int scope = yama_ptrace_scope();
    if (scope == 1)
        return "Yama ptrace_scope=1 allows it only towards descendants: set shm.ptracer_any=true in the engines, or "
               "sysctl kernel.yama.ptrace_scope=0";
    if (scope >= 2) return strprintf("Yama ptrace_scope=%d forbids it without CAP_SYS_PTRACE", scope);
    return "ptrace access was denied (a security module, or a container without CAP_SYS_PTRACE)";
}

namespace {

std::string copy_failure(int e) {
    switch (e) {
        case EPERM: return "no ptrace permission towards that process";
        case ESRCH: return "that process has exited";
        case EFAULT: return "part of the range is not mapped in one of the processes";
        case ENOSYS: return "process_vm_readv/writev are blocked (seccomp)";
        case ENOMEM: return "the kernel could not pin the pages";
        case ECANCELED: return "the initiator revoked the op (it timed out or was canceled there)";
        default: return errno_string(e);
    }
}

}  // namespace

void Transport::on_hello(ServerConn &c, const Hello &h) {
    HelloAck ack{};
    ack.magic = kAckMagic;
    auto refuse = [&](int code, const std::string &why) {
        ack.status = code;
        snprintf(ack.message, sizeof ack.message, "%s", why.c_str());
        refused_log_.event(strprintf("refused a connection from pid %d: %s", c.pid, why.c_str()));
    };
    if ((h.magic != kHelloMagic && h.magic != kMapHelloMagic) || h.version != kWireVersion) {
        refuse(-EPROTO, strprintf("not a shm.so version %u handshake", kWireVersion));
    } else if (h.target_token != token_) {
        refuse(-ESTALE, strprintf("pid %d: the endpoint was published by another instance", pid_));
    } else if (cfg_.same_user_only && c.uid != uid_) {
        refuse(-EACCES,
               strprintf("authentication failed: this engine has a cluster secret (auth_secret) and shm serves "
                         "only processes of its own user (uid %u); the initiator runs as uid %u",
                         static_cast<unsigned>(uid_), static_cast<unsigned>(c.uid)));
    } else if (c.pid <= 0) {
        refuse(-EHOSTUNREACH, strprintf("pid %d cannot see the initiator's pid: it runs in another PID namespace "
                                        "(container); shm needs both processes in one",
                                        pid_));
    } else if (c.pidfd < 0) {
        refuse(-ENOSYS, strprintf("pid %d cannot pin pid %d with a pidfd (SO_PEERPIDFD, pidfd_open: Linux >= 5.3)",
                                  pid_, c.pid));
    } else {
        uint64_t got[2] = {0, 0};
        iovec local{got, sizeof got}, remote{reinterpret_cast<void *>(h.probe_addr), sizeof got};
        ssize_t n = process_vm_readv(c.pid, &local, 1, &remote, 1, 0);
        int e = errno;
        if (n != static_cast<ssize_t>(sizeof got)) {
            std::string why = e == EPERM ? access_hint(c.uid) : copy_failure(e);
            refuse(-(n < 0 ? e : EFAULT), strprintf("it cannot access pid %d with process_vm_readv (%s): %s", c.pid,
                                                    errno_string(n < 0 ? e : EFAULT).c_str(), why.c_str()));
        } else if (!process_alive(c.pidfd)) {
            refuse(-ECONNRESET, strprintf("pid %d exited during the handshake", c.pid));
        } else if (got[0] != h.probe_token || got[1] != h.probe_token) {
            refuse(-EHOSTUNREACH,
                   strprintf("pid %d read pid %d's probe but found other bytes: the socket's peer is not "
                             "the initiator (PID namespaces differ?)",
                             pid_, c.pid));
        } else {
            c.hello_done = true;
            c.map_channel = h.magic == kMapHelloMagic;  // authenticated like any connection
        }
    }
    send(c, &ack, sizeof ack);  // a fresh socket takes these bytes at once
}

// Copies bytes [off, off+len) of a job. The initiator's WRITE lands in our region: read it out of
// the initiator. Its READ: write our region into the initiator. With the initiator's memfd mapped
// here that is a memcpy; otherwise cross-memory attach. The copy passes the initiator's gate
// first (wire.hpp) and is made only while the pidfd says the initiator still lives, so a pid
// reused since is never copied to or from.
int Transport::copy(const Job &job, uint64_t off, uint64_t len, uint8_t *mine) {
    return copy(*job.conn, job.req, job.map.get(), off, len, mine);
}

int Transport::copy(const ServerConn &c, const Request &r, const PeerMapping *map, uint64_t off, uint64_t len,
                    uint8_t *mine) {
    const pid_t pid = c.pid;
    if (!process_alive(c.pidfd)) return -ESRCH;
    if (mine == nullptr) mine = reinterpret_cast<uint8_t *>(r.remote_addr + off);
    uint8_t gate_byte = 0;
    iovec gate_local{&gate_byte, 1}, gate_remote{reinterpret_cast<void *>(r.gate_addr), 1};
    auto gate_open = [&] { return process_vm_readv(pid, &gate_local, 1, &gate_remote, 1, 0) == 1; };
    if (map) {
        // memcpy is not one syscall with the gate: a check just before it is the best there is.
        if (r.gate_addr != 0 && !gate_open()) return -ECANCELED;
        uint8_t *theirs = map->ptr + (r.local_addr - r.local_base) + off;
        if (r.opcode == FERRY_OP_WRITE) memcpy(mine, theirs, len);
        else memcpy(theirs, mine, len);
        return 0;
    }
    // The gate byte first, in the same syscall: once the initiator revoked it, the kernel stops
    // at that iovec and not a byte of the buffer moves.
    const int g = r.gate_addr != 0 ? 1 : 0;
    iovec local[2] = {gate_local, {mine, len}};
    iovec remote[2] = {gate_remote, {reinterpret_cast<void *>(r.local_addr + off), len}};
    ssize_t n = r.opcode == FERRY_OP_WRITE ? process_vm_readv(pid, local + 1 - g, 1 + g, remote + 1 - g, 1 + g, 0)
                                           : process_vm_writev(pid, local + 1 - g, 1 + g, remote + 1 - g, 1 + g, 0);
    int e = n < 0 ? errno : EFAULT;
    if (!process_alive(c.pidfd)) return -ESRCH;
    if (n == static_cast<ssize_t>(len) + g) return 0;
    if (g && n <= 0 && !gate_open()) return -ECANCELED;
    return -e;
}

// The initiator's memfd for this request (mapped once per connection), or nullptr: then the copy
// uses cross-memory attach.
std::shared_ptr<PeerMapping> Transport::peer_mapping(ServerConn &c, const Request &r) {
    // Only when this engine opted in too: otherwise the request's descriptor fields are ignored
    // and the op is copied with cross-memory attach, like any other.
    if (!cfg_.adopt_memfd || r.local_fd < 0 || c.no_memfd || r.local_addr < r.local_base ||
        r.local_addr - r.local_base > r.local_len || r.length > r.local_len - (r.local_addr - r.local_base))
        return nullptr;
    auto it = c.maps.find(r.local_fd);
    if (it != c.maps.end() && it->second->ino == r.local_ino && it->second->len == r.local_len) return it->second;
    std::string why;
    auto m = map_peer_memfd(c.pidfd, r.local_fd, r.local_ino, r.local_len, &why);
    if (!m) {
        c.no_memfd = true;
        refused_log_.event(
            strprintf("pid %d's memfd regions are copied with cross-memory attach: %s", c.pid, why.c_str()));
        return nullptr;
    }
    if (c.maps.size() >= 256)  // regions the initiator deregistered since: drop those no job uses
        for (auto i = c.maps.begin(); i != c.maps.end();)
            i = i->second.use_count() == 1 ? c.maps.erase(i) : std::next(i);
    c.maps[r.local_fd] = m;
    return m;
}

void Transport::append_done(std::string &out, uint64_t id, int status, const std::string &message) {
    Done d{};
    d.id = id;
    d.status = status;
    size_t mlen = status == 0 ? 0 : std::min(message.size(), static_cast<size_t>(FERRY_MESSAGE_MAX - 1));
    d.message_len = static_cast<uint16_t>(mlen);
    out.append(reinterpret_cast<const char *>(&d), sizeof d);
    out.append(message.data(), mlen);
}

void Transport::send_done(ServerConn &c, uint64_t id, int status, const std::string &message) {
    if (c.gone.load(std::memory_order_acquire)) return;
    std::string buf;
    append_done(buf, id, status, message);
    send(c, buf.data(), buf.size());
}

std::string Transport::copy_failure_message(const ServerConn &c, const Request &r, int e) const {
    return strprintf("shm: pid %d could not %s [0x%" PRIx64 ", +%" PRIu64 ") %s pid %d: %s (%s)", pid_,
                     r.opcode == FERRY_OP_WRITE ? "copy into" : "copy out of", r.remote_addr, r.length,
                     r.opcode == FERRY_OP_WRITE ? "from" : "to", c.pid, errno_string(e).c_str(),
                     copy_failure(e).c_str());
}

// A piece of a job, in a worker: host memory is copied directly; a device region (never touched
// here) goes through the host's staging buffers: READ device -> buffer -> initiator, WRITE
// initiator -> buffer -> device, up to kDefaultDepth slices overlapping (staged_device.hpp).
int Transport::copy_piece(Job &job, uint64_t off, uint64_t len) {
    if (job.region->kind == FERRY_MEM_HOST) return copy(job, off, len);
    ferry_staged::StageWindow w(stager_, ferry_staged::kDefaultDepth);
    std::string why;
    int cma = 0;  // the initiator side failed (its errno, for finish()'s message)
    int rc = ferry_staged::stage_run(
        w, job.region->kind, job.region->device_id, job.req.remote_addr + off, len, job.req.opcode == FERRY_OP_WRITE,
        [&](void *buf, uint64_t o, uint64_t n, std::string *) {
            if (job.conn->gone.load(std::memory_order_acquire) || job.status.load(std::memory_order_relaxed) != 0)
                return cma = -ECANCELED;
            return cma = copy(job, off + o, n, static_cast<uint8_t *>(buf));
        },
        &why);
    if (rc != 0 && cma == 0) {  // the staging failed, not the initiator: say what the host said
        std::lock_guard lock(job.why_mu);
        if (job.why.empty())
            job.why =
                strprintf("shm: pid %d could not %s %s device memory [0x%" PRIx64 ", +%" PRIu64 "): %s", pid_,
                          job.req.opcode == FERRY_OP_WRITE ? "write into" : "read out of",
                          ferry_staged::kind_name(job.region->kind), job.req.remote_addr, job.req.length, why.c_str());
    }
    return rc;
}

void Transport::finish(Job &job) {
    int status = job.status.load();
    std::string message;
    {
        std::lock_guard lock(job.why_mu);
        message = job.why;
    }
    if (status != 0 && message.empty()) message = copy_failure_message(*job.conn, job.req, job.sys_errno.load());
    send_done(*job.conn, job.req.id, status, message);
    job.region->unpin();
    job.region.reset();
    uint64_t was = job.conn->active.fetch_sub(1);
    if ((was == 1 && job.conn->gone.load()) || was == kMaxActivePerConn / 2)
        wake();  // the I/O thread closes it, or reads its requests again (resume_paused)
}

void Transport::on_request(const std::shared_ptr<ServerConn> &c, const Request &r, std::string &reply,
                           CopyGroup &group) {
    if (r.opcode == kOpStageBatch || r.opcode == kOpStageOffer) {  // stage_server.cpp
        copy_group(*c, group, reply);                              // copies stay in request order
        if (r.opcode == kOpStageBatch) serve_stage(*c, r, reply);
        else take_stage(*c, r, reply);
        return;
    }
    if (r.length == 0 || (r.opcode != FERRY_OP_READ && r.opcode != FERRY_OP_WRITE)) {
        append_done(reply, r.id, -EINVAL,
                    strprintf("shm: pid %d: malformed request (opcode %u, length 0?)", pid_, r.opcode));
        return;
    }
    uint32_t need = r.opcode == FERRY_OP_READ ? FERRY_ACCESS_REMOTE_READ : FERRY_ACCESS_REMOTE_WRITE;
    std::shared_ptr<Region> region;
    int rc = regions_.lookup_pin(r.remote_addr, r.length, need, &region);
    if (rc != 0) {
        append_done(
            reply, r.id, rc,
            strprintf("shm: pid %d refused %s [0x%" PRIx64 ", +%" PRIu64 "): %s", pid_,
                      r.opcode == FERRY_OP_READ ? "READ of" : "WRITE to", r.remote_addr, r.length,
                      rc == -EACCES ? (r.opcode == FERRY_OP_READ ? "the region is not registered for remote read"
                                                                 : "the region is not registered for remote write")
                                    : "not inside a registered region"));
        return;
    }
    const bool small = r.length <= cfg_.inline_size && region->kind == FERRY_MEM_HOST;
    auto map = peer_mapping(*c, r);
    if (small && !map) {  // cross-memory attach, in one syscall with its neighbours (batch.cpp)
        if (!group.ops.empty() &&
            (group.ops.size() >= kMaxGroupOps || group.ops.front().req.opcode != r.opcode ||
             group.ops.front().req.gate_addr != r.gate_addr || group.bytes + r.length > max_group_bytes()))
            copy_group(*c, group, reply);
        group.ops.push_back({r, std::move(region)});
        group.bytes += r.length;
        return;
    }
    copy_group(*c, group, reply);  // copies stay in request order
    // Staged copies wait for the host: never on the I/O thread.
    if (small) {
        int e = copy(*c, r, map.get(), 0, r.length, nullptr);
        region->unpin();
        append_done(reply, r.id, copy_status(e), e == 0 ? std::string() : copy_failure_message(*c, r, -e));
        return;
    }
    auto job = std::make_shared<Job>();
    job->conn = c;
    job->region = std::move(region);
    job->req = r;
    job->map = std::move(map);
    c->active.fetch_add(1);
    uint64_t pieces = (r.length + cfg_.chunk_size - 1) / cfg_.chunk_size;
    job->left = static_cast<uint32_t>(pieces);
    {
        std::lock_guard lock(work_mu_);
        for (uint64_t off = 0; off < r.length; off += cfg_.chunk_size)
            work_.push_back({job, off, std::min(cfg_.chunk_size, r.length - off)});
    }
    if (pieces == 1) work_cv_.notify_one();
    else work_cv_.notify_all();
}

void Transport::worker_loop() {
    for (;;) {
        Piece p;
        {
            std::unique_lock lock(work_mu_);
            work_cv_.wait(lock, [&] { return stop_.load() || !work_.empty(); });
            if (stop_.load()) return;
            p = std::move(work_.front());
            work_.pop_front();
        }
        Job &job = *p.job;
        if (!job.conn->gone.load(std::memory_order_acquire) && job.status.load(std::memory_order_relaxed) == 0) {
            int e = copy_piece(job, p.off, p.len);
            if (e != 0) {
                int expected = 0;
                if (job.status.compare_exchange_strong(expected, copy_status(e))) job.sys_errno = -e;
            }
        }
        if (job.left.fetch_sub(1) == 1) finish(job);
    }
}

void Transport::server_gone(const std::shared_ptr<ServerConn> &c) {
    c->gone = true;
    if (c->in_epoll) {
        std::lock_guard lock(c->out_mu);
        if (c->fd >= 0) epoll_ctl(epoll_fd_, EPOLL_CTL_DEL, c->fd, nullptr);
        c->in_epoll = false;
        c->out.clear();
    }
    gone_servers_.push_back(c);
}

// Closes connections whose initiator went away once no copy for them is running, so the
// initiator's EOF means "nothing touches your memory any more".
void Transport::reap_idle_servers() {
    for (size_t i = 0; i < gone_servers_.size();) {
        auto &c = gone_servers_[i];
        if (c->active.load() == 0) {
            close_conn(*c);
            gone_servers_[i] = gone_servers_.back();
            gone_servers_.pop_back();
        } else {
            ++i;
        }
    }
}

void Transport::on_server_event(const std::shared_ptr<ServerConn> &c, uint32_t events) {
    if (!c->in_epoll) return;
    // The initiator shut its side: it has failed (canceled) everything it sent, so requests
    // still buffered are dropped rather than copied.
    if (events & (EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
        server_gone(c);
        return;
    }
    if (!(events & EPOLLIN)) return;
    uint8_t buf[64 * 1024];
    for (;;) {
        bool full;
        {
            std::lock_guard lock(c->out_mu);
            full = throttled(*c);
        }
        if (full) {
            pause_reading(c);
            return;
        }
        // recvmsg: a StageOffer brings the initiator's staging memfd (stage_server.cpp).
        alignas(cmsghdr) char ctrl[CMSG_SPACE(4 * sizeof(int))];
        iovec iov{buf, sizeof buf};
        msghdr mh{};
        mh.msg_iov = &iov;
        mh.msg_iovlen = 1;
        mh.msg_control = ctrl;
        mh.msg_controllen = sizeof ctrl;
        ssize_t n = recvmsg(c->fd, &mh, MSG_DONTWAIT | MSG_CMSG_CLOEXEC);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) break;
        for (cmsghdr *cm = mh.msg_controllen ? CMSG_FIRSTHDR(&mh) : nullptr; cm; cm = CMSG_NXTHDR(&mh, cm)) {
            if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS) continue;
            int fds[4];
            const size_t k = std::min<size_t>((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int), 4);
            memcpy(fds, CMSG_DATA(cm), k * sizeof(int));
            keep_stage_fds(*c, fds, (mh.msg_flags & MSG_CTRUNC) ? 0 : k);
            if (mh.msg_flags & MSG_CTRUNC)
                for (size_t i = 0; i < k; ++i) close(fds[i]);
        }
        if (n <= 0) {
            server_gone(c);
            return;
        }
        c->rx.insert(c->rx.end(), buf, buf + n);
        size_t at = 0;
        if (!c->hello_done) {
            if (c->rx.size() < sizeof(Hello)) continue;
            Hello h;
            memcpy(&h, c->rx.data(), sizeof h);
            at = sizeof h;
            on_hello(*c, h);
            if (!c->hello_done) {
                server_gone(c);
                return;
            }
        }
        if (c->map_channel && !serve_map_requests(*c, &at)) {  // shared_server.cpp
            server_gone(c);
            return;
        }
        if (!c->map_channel) {
            const size_t whole = (c->rx.size() - at) / sizeof(Request) * sizeof(Request);
            on_requests(c, c->rx.data() + at, whole);
            at += whole;
        }
        c->rx.erase(c->rx.begin(), c->rx.begin() + static_cast<ptrdiff_t>(at));
        if (static_cast<size_t>(n) < sizeof buf) break;
    }
}

}  // namespace ferry_shm
