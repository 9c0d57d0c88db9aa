// rdma.so instance lifecycle, memory registration and the initiator's side: connect, import
// (querying the owner), disconnect. Serving other instances' requests is in server.cpp, posting
// and completions in datapath.cpp.
#include "transport.hpp"

#include "control.hpp"

#include <arpa/inet.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/resource.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cinttypes>
#include <cstring>

namespace ferry_rdma {

namespace {

std::string hex(uint64_t v) { return strprintf("0x%" PRIx64, v); }

std::string memlock_limit() {
    rlimit rl{};
    if (getrlimit(RLIMIT_MEMLOCK, &rl) != 0) return "unknown";
    return rl.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(rl.rlim_cur) + " bytes";
}

}  // namespace

Pair *Peer::pair(uint16_t l, uint16_t r) const {
    size_t n = ep.nics.size();
    if (l * n + r < pairs.size() && pairs[l * n + r] && pairs[l * n + r]->state != Pair::State::Dead)
        return pairs[l * n + r].get();
    // No direct pair (link layers differ) or it is dead: another pair from the same NIC, then any.
    for (size_t j = 0; j < n; ++j)
        if (auto &p = pairs[l * n + j]; p && p->state != Pair::State::Dead) return p.get();
    for (const auto &p : pairs)
        if (p && p->state != Pair::State::Dead) return p.get();
    return nullptr;
}

// ---- lifecycle ----

int Transport::probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result) {
    Config cfg;
    ferry_error_t err{};
    if (parse_config(options, n, &cfg, &err) != 0) {
        result->available = 0;
        copy_message(result->reason, err.message);
        return 0;
    }
    std::string why;
    RegDmabufMrFn reg = resolve_reg_dmabuf_mr(&why);
    auto nics = open_nics(cfg, reg, &why);
    result->available = nics.empty() ? 0 : 1;
    copy_message(result->reason, nics.empty() ? why.c_str() : describe_nics(nics).c_str());
    return 0;
}

Transport::Transport(const Config &cfg, const ferry_host_api_t *host) : cfg_(cfg), log_(host, kName) {}

int Transport::create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err) {
    Config cfg;
    if (int rc = parse_config(options, n, &cfg, err); rc != 0) return rc;
    std::unique_ptr<Transport> t(new Transport(cfg, host));
    if (int rc = t->start(err); rc != 0) return rc;
    *out = t.release();
    return 0;
}

int Transport::start(ferry_error_t *err) {
    std::string why;
    reg_dmabuf_ = resolve_reg_dmabuf_mr(&why);
    if (reg_dmabuf_ == nullptr) log_.log(FERRY_LOG_INFO, "GPU memory unavailable: %s", why.c_str());
    nics_ = open_nics(cfg_, reg_dmabuf_, &why);
    if (nics_.empty()) return set_error(err, -ENODEV, "rdma: %s", why.c_str());
    nic_balance_ = RailBalancer(nics_.size());
    nic_stats_ = NicStats(nics_.size());
    log_.log(FERRY_LOG_INFO, "NICs: %s", describe_nics(nics_).c_str());

    if (getrandom(&self_.token, sizeof self_.token, 0) != static_cast<ssize_t>(sizeof self_.token))
        return set_error(err, -EIO, "rdma: getrandom failed");
    for (const auto &nic : nics_) self_.nics.push_back(nic->addr);
    uint16_t port = 0;
    if (int rc = listen_tcp(cfg_.bind_ip, cfg_.port, &listen_fd_, &port, &why); rc != 0)
        return set_error(err, rc, "rdma: %s", why.c_str());
    inet_pton(AF_INET, cfg_.advertise_ip.c_str(), self_.ip);
    self_.port = port;

    wake_fd_ = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK);
    epoll_fd_ = epoll_create1(EPOLL_CLOEXEC);
    if (wake_fd_ < 0 || epoll_fd_ < 0)
        return set_error(err, -errno, "rdma: eventfd/epoll: %s", errno_string(errno).c_str());
    epoll_event ev{};
    ev.events = EPOLLIN;
    ev.data.u64 = UINT64_MAX;
    epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, wake_fd_, &ev);
    for (size_t i = 0; i < nics_.size(); ++i) {
        int fd = nics_[i]->channel->fd;
        fcntl(fd, F_SETFL, fcntl(fd, F_GETFL) | O_NONBLOCK);
        ev.data.u64 = i;
        epoll_ctl(epoll_fd_, EPOLL_CTL_ADD, fd, &ev);
    }
    progress_ = std::thread([this] { progress_loop(); });
    server_ =
        std::make_unique<ControlServer>(listen_fd_, &cfg_.auth_key, cfg_.control, log_,
                                        [this](ServedConn &c, const CtrlHeader &h, const std::vector<uint8_t> &body) {
                                            return serve_request(c, h, body);
                                        });
    if (int rc = server_->start(&why); rc != 0) return set_error(err, rc, "rdma: control server: %s", why.c_str());
    repairer_ = std::thread([this] { repair_loop(); });
    return 0;
}

Transport::~Transport() {
    stop_ = true;
    wake();
    if (server_) server_->stop();  // closes served connections: their queue pairs go before the NICs
    repair_cv_.notify_all();
    for (auto *t : {&progress_, &repairer_})
        if (t->joinable()) t->join();
    // Queue pairs first: after ibv_destroy_qp the NIC touches none of our memory.
    {
        std::lock_guard lock(mu_);
        for (auto &[id, peer] : peers_) {
            for (auto &p : peer->pairs)
                if (p) p->qp.reset();
            if (peer->ctrl_fd >= 0) close(peer->ctrl_fd);
            peer->ctrl_fd = -1;
        }
        for (auto &[op, owned] : ops_)
            if (owned->pin) owned->pin->unpin();
        ops_.clear();
        peers_.clear();
    }
    server_.reset();
    for (auto &[h, r] : regions_) deregister_chunks(*r);
    regions_.clear();
    for (int fd : {wake_fd_, epoll_fd_, listen_fd_})
        if (fd >= 0) close(fd);
    nics_.clear();
}

int Transport::export_endpoint(void *buf, size_t *len, ferry_error_t *err) {
    std::vector<uint8_t> b = encode_endpoint(self_);
    if (*len < b.size()) {
        *len = b.size();
        return set_error(err, -ENOSPC, "rdma: the endpoint needs %zu bytes", b.size());
    }
    memcpy(buf, b.data(), b.size());
    *len = b.size();
    return 0;
}

// ---- memory ----

GpuRuntime *Transport::runtime_for(uint32_t kind) {
    std::lock_guard lock(runtime_mu_);
    auto &rt = kind == FERRY_MEM_CUDA ? cuda_ : rocm_;
    if (!rt) rt = kind == FERRY_MEM_CUDA ? make_cuda_runtime(cfg_.cuda_library) : make_rocm_runtime(cfg_.hsa_library);
    return rt.get();
}

int Transport::register_chunks(LocalRegion &r, std::string *why) {
    uint64_t limit = UINT64_MAX;
    for (const auto &nic : nics_) limit = std::min(limit, effective_mr_limit(nic->max_mr_size, cfg_.max_mr_size));
    r.chunks = plan_mr_chunks(r.addr, r.length, limit);
    int flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_RELAXED_ORDERING;
    if (r.access & FERRY_ACCESS_REMOTE_READ) flags |= IBV_ACCESS_REMOTE_READ;
    if (r.access & FERRY_ACCESS_REMOTE_WRITE) flags |= IBV_ACCESS_REMOTE_WRITE;
    bool gpu = r.kind != FERRY_MEM_HOST;
    r.mrs.assign(r.chunks.size(), std::vector<ibv_mr *>(nics_.size(), nullptr));
    for (size_t c = 0; c < r.chunks.size(); ++c) {
        const Span &s = r.chunks[c];
        for (size_t i = 0; i < nics_.size(); ++i) {
            Nic &nic = *nics_[i];
            ibv_mr *mr = nullptr;
            if (gpu) {
                mr = reg_dmabuf_(nic.pd, r.dmabuf.offset + (s.addr - r.dmabuf.base), s.len, s.addr, r.dmabuf.fd, flags);
            } else {
                mr = ibv_reg_mr(nic.pd, reinterpret_cast<void *>(s.addr), s.len, flags);
                // Read-only pages (a const buffer) cannot take LOCAL_WRITE; a region peers only
                // read can do without it (it is then no destination of local READs).
                if (mr == nullptr && errno == EFAULT && !(r.access & FERRY_ACCESS_REMOTE_WRITE))
                    mr = ibv_reg_mr(nic.pd, reinterpret_cast<void *>(s.addr), s.len, flags & ~IBV_ACCESS_LOCAL_WRITE);
            }
            if (mr == nullptr) {
                int e = errno;
                if (gpu) *why = describe_dmabuf_reg_failure(e, nic.name(), r.kind, r.device, s.addr, s.len);
                else
                    *why = "ibv_reg_mr on " + nic.name() + " failed for [" + hex(s.addr) + ", +" +
                           std::to_string(s.len) + "): " + errno_string(e) +
                           (e == ENOMEM || e == EPERM ? " (locked-memory limit ulimit -l is " + memlock_limit() +
                                                            "; raise it, e.g. LimitMEMLOCK=infinity)"
                            : e == EFAULT ? " (not mapped memory?)"
                                          : "");
                deregister_chunks(r);
                return e == 0 ? -EIO : -e;
            }
            r.mrs[c][i] = mr;
        }
    }
    return 0;
}

void Transport::deregister_chunks(LocalRegion &r) {
    for (auto &per_nic : r.mrs)
        for (auto *&mr : per_nic)
            if (mr != nullptr) {
                ibv_dereg_mr(mr);
                mr = nullptr;
            }
    r.mrs.clear();
    if (r.dmabuf.fd >= 0 && r.runtime != nullptr) r.runtime->close_dmabuf(r.dmabuf.fd);
    r.dmabuf.fd = -1;
}

int Transport::register_mem(const ferry_mem_region_t *region, uint64_t *handle, ferry_error_t *err) {
    const ferry_mem_region_t &m = *region;
    if (m.length == 0 || m.addr == 0 || m.addr + m.length < m.addr)
        return set_error(err, -EINVAL, "rdma: register_mem: [%s, +%" PRIu64 ") is empty, null or wraps",
                         hex(m.addr).c_str(), m.length);
    if (m.kind > FERRY_MEM_ROCM) return set_error(err, -EINVAL, "rdma: register_mem: unknown memory kind %u", m.kind);
    if (m.access & ~(FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE))
        return set_error(err, -EINVAL, "rdma: register_mem: access %u has unknown bits", m.access);
    auto r = std::make_shared<LocalRegion>();
    r->addr = m.addr;
    r->length = m.length;
    r->access = m.access;
    r->kind = m.kind;
    r->device = m.device_id;
    std::vector<NicTopology> topos;
    for (const auto &nic : nics_) topos.push_back(nic->topo);
    MemLocation where;
    std::string why;
    if (m.kind == FERRY_MEM_HOST) {
        where.numa_node = numa_node_of(reinterpret_cast<void *>(m.addr));
    } else {
        const char *kind = kind_name(m.kind);
        if (reg_dmabuf_ == nullptr) {
            resolve_reg_dmabuf_mr(&why);
            return set_error(err, -ENOTSUP, "rdma: cannot register %s memory: %s", kind, why.c_str());
        }
        for (const auto &nic : nics_)
            if (nic->dmabuf.support != DmabufSupport::Supported)
                return set_error(err, -ENOTSUP, "rdma: cannot register %s memory: %s", kind, nic->dmabuf.why.c_str());
        GpuRuntime *rt = runtime_for(m.kind);
        if (!rt->available(&why))
            return set_error(err, -ENOTSUP, "rdma: cannot register %s memory: %s", kind, why.c_str());
        if (int rc = rt->export_dmabuf(m.addr, m.length, m.device_id, &r->dmabuf, &why); rc != 0)
            return set_error(err, rc, "rdma: cannot register %s memory [%s, +%" PRIu64 "): %s", kind,
                             hex(m.addr).c_str(), m.length, why.c_str());
        r->runtime = rt;
        int node = -1;
        if (!r->dmabuf.pci_bus_id.empty() &&
            !read_pci_function(cfg_.sysfs_root, r->dmabuf.pci_bus_id, &where.pci_path, &node, &why))
            log_.log(FERRY_LOG_INFO, "GPU %s: %s; NIC choice by NUMA only", r->dmabuf.pci_bus_id.c_str(), why.c_str());
        where.numa_node = node;
    }
    r->nearest = nearest_nics(topos, where);
    for (size_t i = 0; i < nics_.size(); ++i)
        if (std::find(r->nearest.begin(), r->nearest.end(), i) == r->nearest.end())
            r->farther.push_back(static_cast<uint16_t>(i));
    if (int rc = register_chunks(*r, &why); rc != 0) {
        log_.log(FERRY_LOG_DEBUG, "register_mem failed: %s", why.c_str());
        return set_error(err, rc, "rdma: register_mem: %s", why.c_str());
    }
    std::lock_guard lock(mu_);
    r->handle = next_region_++;
    regions_[r->handle] = r;
    *handle = r->handle;
    return 0;
}

int Transport::deregister_mem(uint64_t handle, ferry_error_t *err) {
    std::shared_ptr<LocalRegion> r;
    {
        std::lock_guard lock(mu_);
        auto it = regions_.find(handle);
        if (it == regions_.end())
            return set_error(err, -ENOENT, "rdma: deregister_mem: no region with handle %" PRIu64, handle);
        r = it->second;
        regions_.erase(it);
    }
    // Ops already posted from it finish first; then the NIC refuses its keys (peers' later
    // accesses fail with a remote access error).
    r->retire_and_wait();
    deregister_chunks(*r);
    return 0;
}

MemDescriptor Transport::describe(const LocalRegion &r) const {
    MemDescriptor d;
    for (uint16_t i : r.nearest) d.nearest_nics |= 1ull << i;
    for (size_t c = 0; c < r.chunks.size(); ++c) {
        RemoteChunk rc;
        rc.addr = r.chunks[c].addr;
        rc.len = r.chunks[c].len;
        rc.access = r.access;
        for (auto *mr : r.mrs[c]) rc.rkeys.push_back(mr->rkey);
        d.chunks.push_back(std::move(rc));
    }
    return d;
}

int Transport::export_mem(uint64_t handle, void *buf, size_t *len, ferry_error_t *err) {
    std::vector<uint8_t> b;
    {
        std::lock_guard lock(mu_);
        auto it = regions_.find(handle);
        if (it == regions_.end())
            return set_error(err, -ENOENT, "rdma: export_mem: no region with handle %" PRIu64, handle);
        b = encode_mem(describe(*it->second), nics_.size());
    }
    if (*len < b.size()) {
        *len = b.size();
        return set_error(err, -ENOSPC, "rdma: export_mem needs %zu bytes", b.size());
    }
    memcpy(buf, b.data(), b.size());
    *len = b.size();
    return 0;
}

// ---- connecting ----

int Transport::request(Peer &p, CtrlType type, const std::vector<uint8_t> &body, CtrlType reply_type,
                       std::vector<uint8_t> *reply, std::string *why) {
    CtrlHeader h;
    h.type = static_cast<uint16_t>(type);
    h.req_id = p.next_req++;
    int timeout = static_cast<int>(cfg_.connect_timeout_ms);
    if (int rc = send_msg(p.ctrl_fd, h, body, timeout, why); rc != 0) return rc;
    CtrlHeader got;
    if (int rc = recv_msg(p.ctrl_fd, &got, reply, timeout, why); rc != 0) return rc;
    if (got.type != static_cast<uint16_t>(reply_type) || got.req_id != h.req_id) {
        *why = "unexpected control reply (type " + std::to_string(got.type) + ")";
        return -EPROTO;
    }
    if (got.status != 0) {
        *why = std::string(reply->begin(), reply->end());
        return got.status < 0 ? got.status : -EIO;
    }
    return 0;
}

int Transport::handshake(Peer &p, const std::vector<std::pair<uint16_t, uint16_t>> &which, CtrlType type,
                         std::vector<std::unique_ptr<QueuePair>> *qps, std::string *why) {
    ConnectBody body;
    body.token = self_.token;
    body.nics = self_.nics;
    std::vector<std::unique_ptr<QueuePair>> made;
    for (auto [l, r] : which) {
        auto qp = QueuePair::create(*nics_[l], cfg_.max_wr, why);
        if (!qp) return -ENOMEM;
        body.pairs.push_back({l, r, qp->qpn(), qp->psn()});
        made.push_back(std::move(qp));
    }
    std::vector<uint8_t> reply;
    CtrlType ack_type = type == CtrlType::Connect ? CtrlType::ConnectAck : CtrlType::ReconnectAck;
    if (int rc = request(p, type, encode_connect(body), ack_type, &reply, why); rc != 0) return rc;
    ConnectAckBody ack;
    if (!decode_connect_ack(reply.data(), reply.size(), &ack, why)) return -EPROTO;
    if (ack.pairs.size() != which.size()) {
        *why = "the peer answered for " + std::to_string(ack.pairs.size()) + " queue pairs, asked for " +
               std::to_string(which.size());
        return -EPROTO;
    }
    for (size_t i = 0; i < which.size(); ++i) {
        const PairInfo &a = ack.pairs[i];
        if (a.local_nic != which[i].second || a.remote_nic != which[i].first) {
            *why = "the peer answered for another NIC pair";
            return -EPROTO;
        }
        if (int rc = made[i]->connect(p.ep.nics[a.local_nic], a.qpn, a.psn, cfg_, why); rc != 0) return rc;
    }
    *qps = std::move(made);
    return 0;
}

int Transport::connect(const void *endpoint, size_t len, uint64_t *peer_id, ferry_error_t *err) {
    auto peer = std::make_shared<Peer>();
    std::string why;
    if (!decode_endpoint(endpoint, len, &peer->ep, &why))
        return set_error(err, -EINVAL, "rdma: connect: bad endpoint bytes: %s", why.c_str());
    peer->name = ip_string(peer->ep.ip, peer->ep.port);
    if (int rc =
            connect_tcp(peer->ep.ip, peer->ep.port, static_cast<int>(cfg_.connect_timeout_ms), &peer->ctrl_fd, &why);
        rc != 0)
        return set_error(err, rc, "rdma: connect: %s", why.c_str());
    if (int rc = auth_client(peer->ctrl_fd, cfg_.auth_key, static_cast<int>(cfg_.connect_timeout_ms), &why); rc != 0) {
        close(peer->ctrl_fd);
        return set_error(err, rc, "rdma: connect to %s: %s", peer->name.c_str(), why.c_str());
    }
    // One RC queue pair per (local NIC, remote NIC) of the same link layer.
    size_t nl = nics_.size(), nr = peer->ep.nics.size();
    std::vector<std::pair<uint16_t, uint16_t>> which;
    for (size_t l = 0; l < nl; ++l)
        for (size_t r = 0; r < nr; ++r)
            if (nics_[l]->addr.link == peer->ep.nics[r].link)
                which.emplace_back(static_cast<uint16_t>(l), static_cast<uint16_t>(r));
    auto fail = [&](int rc, const std::string &msg) {
        close(peer->ctrl_fd);
        peer->ctrl_fd = -1;
        return set_error(err, rc, "rdma: connect to %s: %s", peer->name.c_str(), msg.c_str());
    };
    if (which.empty())
        return fail(-EPROTO, "no NIC pair shares a link layer (InfiniBand here and RoCE there, or the reverse)");
    std::vector<std::unique_ptr<QueuePair>> qps;
    if (int rc = handshake(*peer, which, CtrlType::Connect, &qps, &why); rc != 0) return fail(rc, why);
    peer->pairs.resize(nl * nr);
    std::lock_guard lock(mu_);
    for (size_t i = 0; i < which.size(); ++i) {
        auto p = std::make_unique<Pair>();
        p->peer = peer.get();
        p->lnic = which[i].first;
        p->rnic = which[i].second;
        p->window = SendWindow(qps[i]->depth(), cfg_.signal_interval);
        by_qpn_[p->lnic][qps[i]->qpn()] = p.get();
        p->qp = std::move(qps[i]);
        peer->pairs[p->lnic * nr + p->rnic] = std::move(p);
    }
    peer->id = next_peer_++;
    *peer_id = peer->id;
    peers_[peer->id] = std::move(peer);
    return 0;
}

int Transport::disconnect(uint64_t peer_id, ferry_error_t *err) {
    std::shared_ptr<Peer> peer;
    {
        std::lock_guard lock(mu_);
        auto it = peers_.find(peer_id);
        if (it == peers_.end()) return set_error(err, -ENOENT, "rdma: disconnect: no peer %" PRIu64, peer_id);
        peer = it->second;
        peer->closing = true;
        peers_.erase(it);
    }
    std::lock_guard ctrl(peer->ctrl_mu);  // a repair in progress finishes first
    std::lock_guard lock(mu_);
    drop_peer_ops(*peer, -ECANCELED, "rdma: the peer " + peer->name + " was disconnected");
    for (auto it = imports_.begin(); it != imports_.end();)
        it = it->second.peer == peer_id ? imports_.erase(it) : std::next(it);
    close(peer->ctrl_fd);  // the serving side destroys its queue pairs
    peer->ctrl_fd = -1;
    return 0;
}

int Transport::import_mem(uint64_t peer_id, const ferry_mem_region_t *region, const void *desc, size_t len,
                          uint64_t *remote_mem, ferry_error_t *err) {
    std::shared_ptr<Peer> peer;
    {
        std::lock_guard lock(mu_);
        auto it = peers_.find(peer_id);
        if (it == peers_.end()) return set_error(err, -ENOENT, "rdma: import_mem: no peer %" PRIu64, peer_id);
        peer = it->second;
    }
    if (region->length == 0 || region->addr + region->length < region->addr)
        return set_error(err, -EINVAL, "rdma: import_mem: empty or wrapping range");
    Import im;
    im.peer = peer_id;
    im.addr = region->addr;
    im.length = region->length;
    std::string why;
    if (len > 0) {
        if (!decode_mem(desc, len, peer->ep.nics.size(), &im.desc, &why))
            return set_error(err, -EINVAL, "rdma: import_mem from %s: bad descriptor: %s", peer->name.c_str(),
                             why.c_str());
    } else {
        // No export_mem bytes: ask the owner which registrations hold the range.
        std::vector<uint8_t> body = encode_query(region->addr, region->length), reply;
        std::lock_guard ctrl(peer->ctrl_mu);
        if (peer->ctrl_fd < 0)
            return set_error(err, -ENOTCONN, "rdma: import_mem: the peer %s is disconnected", peer->name.c_str());
        if (int rc = request(*peer, CtrlType::Query, body, CtrlType::QueryReply, &reply, &why); rc != 0)
            return set_error(err, rc, "rdma: import_mem: %s: %s", peer->name.c_str(), why.c_str());
        if (!decode_mem(reply.data(), reply.size(), peer->ep.nics.size(), &im.desc, &why))
            return set_error(err, -EPROTO, "rdma: import_mem from %s: bad reply: %s", peer->name.c_str(), why.c_str());
    }
    // The range may reach beyond what the owner registered: ops there complete with -EFAULT,
    // as the owner's NIC would refuse them.
    const auto &ch = im.desc.chunks;
    for (const auto &c : ch) im.spans.push_back({c.addr, c.len});
    for (size_t i = 0; i < peer->ep.nics.size(); ++i)
        if (im.desc.nearest_nics & (1ull << i)) im.nearest.push_back(static_cast<uint16_t>(i));
    if (im.nearest.empty())
        for (size_t i = 0; i < peer->ep.nics.size(); ++i) im.nearest.push_back(static_cast<uint16_t>(i));
    std::lock_guard lock(mu_);
    uint64_t id = next_import_++;
    imports_[id] = std::move(im);
    *remote_mem = id;
    return 0;
}

int Transport::release_mem(uint64_t peer_id, uint64_t remote_mem, ferry_error_t *err) {
    std::lock_guard lock(mu_);
    auto it = imports_.find(remote_mem);
    if (it == imports_.end() || it->second.peer != peer_id)
        return set_error(err, -ENOENT, "rdma: release_mem: no imported region %" PRIu64 " of peer %" PRIu64, remote_mem,
                         peer_id);
    imports_.erase(it);
    return 0;
}

}  // namespace ferry_rdma
