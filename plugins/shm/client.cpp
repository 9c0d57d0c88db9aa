// The initiating side of shm.so: connect (handshake + the peer's access probe of us), imports,
// submit, answers, disconnect, op timeouts. Our local regions stay pinned while a serving side
// may still copy into or out of them.
#include "transport.hpp"

#include <poll.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace ferry_shm {

int read_full(int fd, void *buf, size_t len, Clock::time_point deadline) {
    char *p = static_cast<char *>(buf);
    while (len > 0) {
        auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now()).count();
        if (left <= 0) return -ETIMEDOUT;
        pollfd pf{fd, POLLIN, 0};
        int r = ::poll(&pf, 1, static_cast<int>(left));
        if (r < 0 && errno == EINTR) continue;
        if (r == 0) return -ETIMEDOUT;
        ssize_t n = recv(fd, p, len, MSG_DONTWAIT);
        if (n < 0 && (errno == EINTR || errno == EAGAIN)) continue;
        if (n <= 0) return n == 0 ? -ECONNRESET : -errno;
        p += n;
        len -= static_cast<size_t>(n);
    }
    return 0;
}

// A connection to the instance `ep` names, handshaken with a Hello of `hello_magic` (a data
// connection, or a map channel: map_wire.hpp). 0 and *out, or an error naming `who`.
int Transport::open_channel(const EndpointBytes &ep, uint32_t hello_magic, const std::string &who, int *out,
                            ferry_error_t *err) {
    int fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0) return set_error(err, -errno, "shm: socket: %s", errno_string(errno).c_str());
    auto fail = [&](int code, const std::string &m) {
        close(fd);
        return set_error(err, code, "shm: %s: %s", who.c_str(), m.c_str());
    };
    std::string name = socket_name(ep.pid, ep.token);
    sockaddr_un sa{};
    sa.sun_family = AF_UNIX;
    memcpy(sa.sun_path, name.data(), name.size());
    if (::connect(fd, reinterpret_cast<sockaddr *>(&sa),
                  static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + name.size())) != 0) {
        int e = errno;
        return fail(-e, strprintf("cannot reach its shm instance (abstract socket @%s): %s; the process exited or "
                                  "destroyed its transport, or it runs in another network namespace (container)",
                                  name.c_str() + 1, errno_string(e).c_str()));
    }
    ucred cred{};
    socklen_t cl = sizeof cred;
    if (getsockopt(fd, SOL_SOCKET, SO_PEERCRED, &cred, &cl) == 0 && cred.pid != static_cast<pid_t>(ep.pid))
        return fail(-EHOSTUNREACH,
                    strprintf("the socket belongs to pid %d here: the peer runs in another PID namespace "
                              "(container); shm needs both processes in one",
                              cred.pid));
    Hello h{hello_magic,
            kWireVersion,
            0,
            ep.token,
            reinterpret_cast<uint64_t>(probe_),
            probe_[0],
            static_cast<uint32_t>(pid_),
            static_cast<uint32_t>(uid_)};
    // A serving side at its connection cap answers before our Hello and closes, so a failed send
    // still reads what it said.
    const bool sent = ::send(fd, &h, sizeof h, MSG_NOSIGNAL) == static_cast<ssize_t>(sizeof h);
    const int send_errno = errno;
    HelloAck ack{};
    auto deadline = Clock::now() + std::chrono::milliseconds(cfg_.connect_timeout_ms);
    if (int rc = read_full(fd, &ack, sizeof ack, deadline)) {
        if (!sent) return fail(-ECONNRESET, strprintf("handshake: %s", errno_string(send_errno).c_str()));
        return fail(rc, rc == -ETIMEDOUT ? strprintf("no handshake answer within %u ms (the process is stopped or "
                                                     "overloaded)",
                                                     cfg_.connect_timeout_ms)
                                         : strprintf("handshake: %s", errno_string(-rc).c_str()));
    }
    ack.message[sizeof ack.message - 1] = '\0';
    if (ack.magic != kAckMagic) return fail(-EPROTO, "handshake answer is not from shm.so");
    if (ack.status != 0)
        return fail(ack.status < 0 ? ack.status : -EIO, strprintf("refused the connection: %s", ack.message));
    *out = fd;
    return 0;
}

int Transport::connect(const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err) {
    EndpointBytes ep;
    if (len != sizeof ep)
        return set_error(err, -EINVAL, "shm: endpoint is %zu bytes, a shm endpoint has %zu", len, sizeof ep);
    memcpy(&ep, endpoint, sizeof ep);
    if (ep.magic != kEndpointMagic || ep.version != kWireVersion)
        return set_error(err, -EPROTO, "shm: not a shm.so version %u endpoint", kWireVersion);
    const std::string who = strprintf("peer pid %u", ep.pid);
    int fd = -1;
    if (int rc = open_channel(ep, kHelloMagic, who, &fd, err)) return rc;
    auto fail = [&](int code, const std::string &m) {
        close(fd);
        return set_error(err, code, "shm: %s: %s", who.c_str(), m.c_str());
    };
    auto c = std::make_shared<ClientConn>();
    c->gate = Gate::make();
    if (!c->gate) return fail(-ENOMEM, strprintf("cannot map a gate page: %s", errno_string(errno).c_str()));
    c->fd = fd;
    c->pid = static_cast<pid_t>(ep.pid);
    c->who = who;
    c->ep = ep;
    if (int rc = offer_stage(*c, err)) {  // stage_client.cpp
        close(fd);
        return rc;
    }
    {
        std::unique_lock lock(peers_mu_);
        c->peer_id = next_peer_++;
        peers_[c->peer_id] = c;
    }
    add_conn(c, EPOLLIN | EPOLLRDHUP);
    *peer = c->peer_id;
    log_.log(FERRY_LOG_DEBUG, "connected to %s as peer %" PRIu64, who.c_str(), c->peer_id);
    return 0;
}

int Transport::disconnect(uint64_t peer, ferry_error_t *err) {
    std::shared_ptr<ClientConn> c;
    std::vector<ferry_completion_t> done;
    {
        std::unique_lock lock(peers_mu_);
        auto it = peers_.find(peer);
        if (it == peers_.end())
            return set_error(err, -ENOENT, "shm: no peer %" PRIu64 " (never connected or already disconnected)", peer);
        c = it->second;
        peers_.erase(it);
        for (auto i = imports_.begin(); i != imports_.end();)
            i = i->second.peer == peer ? imports_.erase(i) : std::next(i);
    }
    {
        std::lock_guard lock(c->mu);
        c->closing = true;
        // Reported -ECANCELED by the I/O thread once the serving side can no longer copy for them
        // (check_timeouts): its EOF, or kRevokeGrace after the gate closed.
        const std::string why = strprintf("shm: op canceled: disconnected from %s", c->who.c_str());
        revoke_locked(*c, -ECANCELED, why, Clock::now() - kRevokeGrace / 2);
        for (auto &b : c->staged) revoke_staged_locked(*c, b, -ECANCELED, why, Clock::now() - kRevokeGrace / 2, done);
        // Requests not handed to the socket yet are simply dropped; the serving side drops the
        // rest when it sees our shutdown, and closes once its running copies are done.
        std::lock_guard out(c->out_mu);
        c->out.clear();
        if (c->fd >= 0) ::shutdown(c->fd, SHUT_WR);
    }
    cq_.push(done);
    wake();
    return 0;
}

int Transport::import_mem(uint64_t peer, const ferry_mem_region_t *r, const void *desc, size_t desc_len,
                          uint64_t *remote_mem, ferry_error_t *err) {
    // A device region in a peer's descriptor was registered there with staging (shm.so refuses
    // device memory otherwise): the peer serves it like host memory.
    if (r->kind != FERRY_MEM_HOST && r->kind != FERRY_MEM_CUDA && r->kind != FERRY_MEM_ROCM)
        return set_error(err, -ENOTSUP, "shm: imported region of unknown memory kind %u", r->kind);
    if (r->length == 0 || r->addr + r->length < r->addr)
        return set_error(err, -EINVAL, "shm: imported region [0x%" PRIx64 ", +%" PRIu64 ") is empty or wraps", r->addr,
                         r->length);
    // A peer's managed buffer: its memfd mapped once, memcpy from then on (shared_client.cpp).
    auto map = r->kind == FERRY_MEM_HOST && parse_shared_desc(desc, desc_len) ? map_shared(peer, *r) : nullptr;
    std::unique_lock lock(peers_mu_);
    if (!peers_.count(peer)) return set_error(err, -ENOENT, "shm: no peer %" PRIu64, peer);
    uint64_t id = next_import_++;
    imports_[id] = Import{peer, r->addr, r->length, r->access, std::move(map), r->kind};
    *remote_mem = id;
    return 0;
}

int Transport::release_mem(uint64_t peer, uint64_t remote_mem, ferry_error_t *err) {
    std::unique_lock lock(peers_mu_);
    auto it = imports_.find(remote_mem);
    if (it == imports_.end() || it->second.peer != peer)
        return set_error(err, -ENOENT, "shm: peer %" PRIu64 " has no imported region %" PRIu64, peer, remote_mem);
    imports_.erase(it);
    return 0;
}

int Transport::submit(uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err) {
    if (int rc = submit_mapped(peer, ops, n, err); rc != kNotMapped) return rc;  // shared_client.cpp
    std::shared_ptr<ClientConn> c;
    // Each local region once (pinned), however many ops use it; unpinned with the last op.
    auto pins = std::make_shared<PinHold>();
    std::vector<char> stage(n, 0);      // through the staging area (stage_client.cpp)
    std::vector<const Region *> lr(n);  // each op's local region (held by pins)
    size_t n_stage = 0;
    {
        std::shared_lock lock(peers_mu_);
        auto it = peers_.find(peer);
        if (it == peers_.end())
            return set_error(err, -ENOTCONN, "shm: no peer %" PRIu64 " (not connected, or disconnected)", peer);
        c = it->second;
        const bool can_stage = c->stage != nullptr;  // set before the peer was published
        const Import *m = nullptr;
        uint64_t m_id = 0, l_handle = 0;
        const Region *local = nullptr;
        for (size_t i = 0; i < n; ++i) {
            const ferry_xfer_op_t &op = ops[i];
            if (op.opcode != FERRY_OP_READ && op.opcode != FERRY_OP_WRITE)
                return set_error(err, -EINVAL, "shm: op %zu: unknown opcode %u", i, op.opcode);
            if (op.length == 0) return set_error(err, -EINVAL, "shm: op %zu: length is 0", i);
            if (m == nullptr || m_id != op.remote_mem) {
                auto imp = imports_.find(op.remote_mem);
                if (imp == imports_.end() || imp->second.peer != peer)
                    return set_error(err, -EINVAL,
                                     "shm: op %zu: remote_mem %" PRIu64 " is not imported from peer %" PRIu64, i,
                                     op.remote_mem, peer);
                m = &imp->second;
                m_id = op.remote_mem;
            }
            if (op.remote_addr < m->addr || op.length > m->length || op.remote_addr - m->addr > m->length - op.length)
                return set_error(err, -EINVAL,
                                 "shm: op %zu: remote [0x%" PRIx64 ", +%" PRIu64 ") is outside the imported region", i,
                                 op.remote_addr, op.length);
            if (local == nullptr || l_handle != op.local_mem) {
                auto r = regions_.find(op.local_mem);
                if (r && r->kind != FERRY_MEM_HOST)
                    return set_error(err, -ENOTSUP,
                                     "shm: op %zu: local region %" PRIu64
                                     " is device memory: shm serves peers' access to it "
                                     "through the host's staging but does not move it as an initiator (the core "
                                     "stages initiator-side GPU buffers; load cuda_ipc/hip_ipc for GPU-to-GPU on one "
                                     "host)",
                                     i, op.local_mem);
                if (r && !r->pin())
                    return set_error(err, -EINVAL, "shm: op %zu: local region %" PRIu64 " is being deregistered", i,
                                     op.local_mem);
                local = r.get();
                l_handle = op.local_mem;
                if (r) pins->regions.push_back(std::move(r));
            }
            if (local == nullptr || !local->contains(op.local_addr, op.length))
                return set_error(err, -EINVAL,
                                 "shm: op %zu: local [0x%" PRIx64 ", +%" PRIu64
                                 ") is not inside registered region %" PRIu64,
                                 i, op.local_addr, op.length, op.local_mem);
            lr[i] = local;
            if (can_stage && op.length <= kStageMaxOp && m->kind == FERRY_MEM_HOST) stage[i] = 1, ++n_stage;
        }
    }
    std::string wire;
    std::lock_guard lock(c->mu);
    if (c->dead || c->closing || !c->gate)
        return set_error(err, -ECONNRESET, "shm: %s: %s", c->who.c_str(),
                         c->dead_reason.empty() ? "connection closed" : c->dead_reason.c_str());
    if (n_stage && !c->stage_ok) std::fill(stage.begin(), stage.end(), 0), n_stage = 0;
    const auto now = Clock::now();
    const size_t staged_before = c->staged.size();
    const uint64_t next_before = c->next_id, head_before = c->stage_head;
    const size_t staged = n_stage ? stage_locked(*c, ops, n, stage, pins, wire) : 0;  // stage_client.cpp
    const size_t n_cma = n - staged;
    const size_t wire_staged = wire.size();
    const uint64_t first = c->next_id;
    auto undo = [&] {  // nothing was sent: forget what this submit added
        c->staged.resize(staged_before);
        c->stage_head = head_before;
        for (uint64_t id = first; id < first + n_cma; ++id) c->pending.erase(id);
        c->next_id = next_before;
    };
    try {
        wire.resize(wire_staged + n_cma * sizeof(Request));
        uint64_t id = first;
        for (size_t i = 0; i < n; ++i) {
            if (stage[i]) continue;
            const Region &l = *lr[i];
            Request r{id,          ops[i].opcode, l.memfd.fd, ops[i].remote_addr, ops[i].length, ops[i].local_addr,
                      l.memfd.ino, l.addr,        l.length,   c->gate->addr()};
            memcpy(wire.data() + wire_staged + (id - first) * sizeof r, &r, sizeof r);
            Pending p;
            p.user_data = ops[i].user_data;
            p.local = pins;
            p.start = now;
            p.gate = c->gate;
            c->pending.emplace(id++, std::move(p));
        }
        c->next_id = id;
    } catch (...) {
        undo();
        throw;
    }
    // The I/O thread sleeps without a timeout while nothing is in flight: wake it, so that this
    // op's op_timeout_ms is watched even if the peer never answers.
    if (in_flight_.fetch_add(n, std::memory_order_relaxed) == 0) wake();
    if (!send(*c, wire.data(), wire.size())) {
        // Closed under us: the I/O thread already failed what it saw; fail ours the same way.
        undo();
        in_flight_.fetch_sub(n, std::memory_order_relaxed);
        return set_error(err, -ECONNRESET, "shm: %s: connection closed", c->who.c_str());
    }
    return 0;
}

// Whole Done records of data (each followed by its message) are answered under one lock; *used
// says how many bytes they took.
void Transport::on_dones(ClientConn &c, const uint8_t *data, size_t len, size_t *used) {
    std::vector<ferry_completion_t> done;
    std::vector<std::shared_ptr<PinHold>> unpin;
    size_t at = 0, ended = 0;
    done.reserve(len / sizeof(Done));
    unpin.reserve(len / sizeof(Done));
    {
        std::lock_guard lock(c.mu);
        while (len - at >= sizeof(Done)) {
            Done d;
            memcpy(&d, data + at, sizeof d);
            if (len - at - sizeof d < d.message_len) break;
            std::string_view message(reinterpret_cast<const char *>(data + at + sizeof d), d.message_len);
            at += sizeof d + d.message_len;
            if (d.id == 0 && c.stage) {  // the answer to our staging offer (stage_client.cpp)
                c.stage_ok = d.status == 0;
                if (!c.stage_ok)
                    log_.log(FERRY_LOG_DEBUG, "%s refused the staging area (small ops use cross-memory attach): %.*s",
                             c.who.c_str(), static_cast<int>(message.size()), message.data());
                continue;
            }
            auto it = c.pending.find(d.id);
            if (it == c.pending.end()) {
                if (!c.staged.empty()) ended += on_staged_done(c, d, message, done, unpin);  // stage_client.cpp
                continue;
            }
            Pending &p = it->second;
            unpin.push_back(std::move(p.local));
            ++ended;
            if (!p.reported) {
                // A revoked op whose copy had finished before the gate closed did complete: say so.
                if (p.revoked_status != 0 && d.status != 0)
                    done.push_back(make_completion(p.user_data, p.revoked_status, p.revoked_message));
                else
                    done.push_back(
                        make_completion(p.user_data, d.status, d.status == 0 ? std::string() : std::string(message)));
            }
            c.pending.erase(it);
        }
    }
    *used = at;
    unpin.clear();
    in_flight_.fetch_sub(ended, std::memory_order_relaxed);
    cq_.push(done);
}

void Transport::client_dead(ClientConn &c, const std::string &reason) {
    std::vector<ferry_completion_t> done;
    {
        std::lock_guard lock(c.mu);
        c.dead = true;
        c.dead_reason = reason;
        for (auto &[id, p] : c.pending) {
            if (!p.reported)
                done.push_back(p.revoked_status != 0
                                   ? make_completion(p.user_data, p.revoked_status, p.revoked_message)
                                   : make_completion(p.user_data, -ECONNRESET,
                                                     strprintf("shm: %s: %s", c.who.c_str(), reason.c_str())));
        }
        in_flight_.fetch_sub(c.pending.size(), std::memory_order_relaxed);
        c.pending.clear();  // unpins
        const std::string why = strprintf("shm: %s: %s", c.who.c_str(), reason.c_str());
        for (auto &b : c.staged) {
            if (!b.answered) in_flight_.fetch_sub(b.ops.size(), std::memory_order_relaxed);
            if (b.revoked_status != 0) report_staged(b, b.revoked_status, b.revoked_message, done);
            else report_staged(b, -ECONNRESET, why, done);
        }
        c.staged.clear();
    }
    cq_.push(done);
    close_conn(c);
}

void Transport::on_client_event(const std::shared_ptr<ClientConn> &c, uint32_t events) {
    (void)events;
    uint8_t buf[64 * 1024];
    for (;;) {
        ssize_t n = recv(c->fd, buf, sizeof buf, MSG_DONTWAIT);
        if (n < 0 && errno == EINTR) continue;
        if (n < 0 && errno == EAGAIN) return;
        if (n <= 0) {
            client_dead(*c, n == 0 ? "the connection closed with ops in flight (the process exited or destroyed its "
                                     "transport)"
                                   : strprintf("connection error: %s", errno_string(errno).c_str()));
            return;
        }
        c->rx.insert(c->rx.end(), buf, buf + n);
        size_t at = 0;
        on_dones(*c, c->rx.data(), c->rx.size(), &at);
        c->rx.erase(c->rx.begin(), c->rx.begin() + static_cast<ptrdiff_t>(at));
    }
}

// With cross-memory attach the SERVING side writes an initiator's READ into its buffer, so
// failing the op here does not stop it. Therefore an overdue op is first revoked: the gate its
// request names is closed (wire.hpp), with every other op naming it, and a fresh gate serves new
// ops. A revoked op is reported once the serving side cannot copy for it any more: it answered
// (a copy that had finished reports its success), its socket closed, or kRevokeGrace passed
// since the gate closed: by then every copy syscall that began before has returned, unless the
// serving side is stopped in the middle of one (docs/DESIGN.md states this exactly).
void Transport::revoke_locked(ClientConn &c, int status, const std::string &message, Clock::time_point now) {
    if (!c.gate) return;
    auto old = c.gate;
    old->revoke();
    c.gate = Gate::make();  // nullptr: submit fails with ECONNRESET, "connection closed"
    for (auto &[id, p] : c.pending)
        if (p.gate == old && !p.reported && p.revoked_status == 0) {
            p.revoked_status = status;
            p.revoked_message = message;
            p.revoke_at = now;
        }
}

void Transport::check_timeouts() {
    std::vector<std::shared_ptr<ClientConn>> clients;
    {
        std::lock_guard lock(conns_mu_);
        for (auto &[p, c] : conns_)
            if (c->kind == Conn::Kind::Client) clients.push_back(std::static_pointer_cast<ClientConn>(c));
    }
    const auto now = Clock::now();
    const auto limit = std::chrono::milliseconds(cfg_.op_timeout_ms);
    std::vector<ferry_completion_t> done;
    for (auto &c : clients) {
        std::lock_guard lock(c->mu);
        if (cfg_.op_timeout_ms)
            for (auto &[id, p] : c->pending)
                if (!p.reported && p.revoked_status == 0 && now - p.start > limit) {
                    revoke_locked(*c, -ETIMEDOUT,
                                  strprintf("shm: %s did not answer within %u ms (stopped or overloaded)",
                                            c->who.c_str(), cfg_.op_timeout_ms),
                                  now);
                    break;
                }
        for (auto &[id, p] : c->pending)
            if (!p.reported && p.revoked_status != 0 && now - p.revoke_at >= kRevokeGrace) {
                p.reported = true;  // stays pinned until the serving side answers or goes away
                done.push_back(make_completion(p.user_data, p.revoked_status, p.revoked_message));
            }
        for (auto &b : c->staged) {  // stage_client.cpp
            if (cfg_.op_timeout_ms && !b.reported && b.revoked_status == 0 && now - b.start > limit)
                revoke_staged_locked(*c, b, -ETIMEDOUT,
                                     strprintf("shm: %s did not answer within %u ms (stopped or overloaded)",
                                               c->who.c_str(), cfg_.op_timeout_ms),
                                     now, done);
            if (!b.reported && b.revoked_status != 0 && now - b.revoke_at >= kRevokeGrace)
                report_staged(b, b.revoked_status, b.revoked_message, done);
        }
    }
    cq_.push(done);
}

}  // namespace ferry_shm
