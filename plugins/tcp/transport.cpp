#include "transport.hpp"

#include "rails.hpp"

#include <arpa/inet.h>
#include <netinet/in.h>

#include <algorithm>
#include <cerrno>
#include <cstring>

namespace ferry_tcp {

namespace {
// Deadline checks run once per tick: fine enough for the smallest timeout configured.
unsigned tick_for(const Config &cfg) {
    unsigned t = std::min(cfg.connect_timeout_ms, cfg.handshake_timeout_ms);
    if (cfg.op_timeout_ms != 0) t = std::min(t, cfg.op_timeout_ms);
    return std::clamp(t / 4, 5u, 100u);
}

bool is_wildcard(const std::string &ip) { return ip == "0.0.0.0" || ip == "::"; }

// Lines about bad connections and refused requests: at most this many per window, then a count.
constexpr unsigned kPeerLogBurst = 10;
constexpr unsigned kPeerLogWindowMs = 10000;
}  // namespace

Transport::Transport(const Config &cfg, const ferry_host_api_t *host)
    : cfg_(cfg),
      log_(host, kName),
      stager_(host, kName),
      limits_(cfg_),
      peer_log_(log_, "peer connections and requests", kPeerLogBurst, kPeerLogWindowMs),
      server_ctx_{cfg_, log_, regions_, limits_, peer_log_, stager_} {}

int Transport::create(const ferry_kv_t *options, size_t n_options, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err) {
    Config cfg;
    int rc = parse_config(options, n_options, &cfg, err);
    if (rc != 0) return rc;
    if (is_wildcard(cfg.bind_ip) && (cfg.advertise_ip.empty() || is_wildcard(cfg.advertise_ip)))
        return set_error(err, -EINVAL,
                         "tcp: bind_ip %s is a wildcard: set advertise_ip to the address peers "
                         "should connect to",
                         cfg.bind_ip.c_str());
    std::unique_ptr<Transport> t(new Transport(cfg, host));
    rc = t->start(err);
    if (rc != 0) return rc;
    *out = t.release();
    return 0;
}

int Transport::start(ferry_error_t *err) {
    std::vector<Reactor *> rs;
    for (unsigned i = 0; i < cfg_.io_threads; ++i) {
        reactors_.push_back(std::make_unique<Reactor>(log_, cq_, tick_for(cfg_), i));
        rs.push_back(reactors_.back().get());
    }
    std::string why;
    int rc = resolve_rails(cfg_, &rails_, &why);
    if (rc != 0) return set_error(err, rc, "tcp: %s", why.c_str());
    tally_ = std::make_unique<RailTally>(rails_.empty() ? std::vector<std::string>{cfg_.bind_ip} : rails_);
    if (rails_.size() > 1 && (!cfg_.advertise_ip.empty() || cfg_.advertise_port != 0))
        return set_error(err, -EINVAL,
                         "tcp: advertise_ip and advertise_port name one address, and rails lists %zu: the endpoint "
                         "lists each rail's own address; unset them, or list one rail",
                         rails_.size());
    std::vector<sockaddr_storage> bound;
    for (const std::string &ip : rails_.empty() ? std::vector<std::string>{cfg_.bind_ip} : rails_) {
        listeners_.push_back(std::make_unique<Listener>(server_ctx_, rs));
        rc = listeners_.back()->open(ip, &bound.emplace_back(), &why);
        if (rc != 0) return set_error(err, rc, "tcp: %s", why.c_str());
    }
    // Lines held back are counted and reported by the first listener's timer once their window
    // is over. The listeners outlive the reactors, so the task may run until they stop.
    Reactor *r0 = rs[0];
    Listener *l = listeners_[0].get();
    peer_log_.set_on_hold([r0, l] { r0->post([r0, l] { r0->want_timer(l); }); });
    for (auto &r : reactors_) r->start();
    reactors_[0]->run_sync([&] {
        for (auto &lis : listeners_)
            if (rc == 0) rc = lis->start();
    });
    if (rc != 0) return set_error(err, rc, "tcp: cannot watch the listening socket: %s", errno_string(-rc).c_str());
    if (bound.size() > 1) {
        endpoint_ = encode_rails_endpoint(bound);
        endpoint_name_.clear();
        for (const auto &b : bound) endpoint_name_ += (endpoint_name_.empty() ? "" : ", ") + sockaddr_name(b);
        log_.log(FERRY_LOG_INFO, "listening on %zu rails (%s), %u lanes per peer and rail, %u I/O thread(s)",
                 bound.size(), endpoint_name_.c_str(), cfg_.lanes, cfg_.io_threads);
        return 0;
    }
    sockaddr_storage adv = bound[0];
    if (!cfg_.advertise_ip.empty()) {
        adv = {};
        uint16_t port = bound[0].ss_family == AF_INET6 ? reinterpret_cast<sockaddr_in6 *>(&bound[0])->sin6_port
                                                       : reinterpret_cast<sockaddr_in *>(&bound[0])->sin_port;
        auto *a4 = reinterpret_cast<sockaddr_in *>(&adv);
        auto *a6 = reinterpret_cast<sockaddr_in6 *>(&adv);
        if (inet_pton(AF_INET, cfg_.advertise_ip.c_str(), &a4->sin_addr) == 1) {
            a4->sin_family = AF_INET;
            a4->sin_port = port;
        } else {
            inet_pton(AF_INET6, cfg_.advertise_ip.c_str(), &a6->sin6_addr);
            a6->sin6_family = AF_INET6;
            a6->sin6_port = port;
        }
    }
    if (cfg_.advertise_port != 0) {
        uint16_t port = htons(cfg_.advertise_port);
        if (adv.ss_family == AF_INET6) reinterpret_cast<sockaddr_in6 *>(&adv)->sin6_port = port;
        else reinterpret_cast<sockaddr_in *>(&adv)->sin_port = port;
    }
    endpoint_ = encode_rails_endpoint({adv});
    endpoint_name_ = sockaddr_name(adv);
    log_.log(FERRY_LOG_INFO,
             "listening on %s (advertised as %s), %u lanes per peer, "
             "%u I/O thread(s), slices of %llu bytes",
             sockaddr_name(bound[0]).c_str(), endpoint_name_.c_str(), cfg_.lanes, cfg_.io_threads,
             static_cast<unsigned long long>(cfg_.slice_size));
    return 0;
}

Transport::~Transport() {
    // 1. Peers: fail in-flight ops (-ECANCELED) and close the lanes.
    std::unordered_map<uint64_t, std::shared_ptr<Peer>> peers;
    {
        std::unique_lock lk(peers_mu_);
        peers.swap(peers_);
    }
    for (auto &[id, p] : peers) p->close(-ECANCELED, "peer " + p->endpoint().name + ": transport destroyed");
    peers.clear();
    // 2. Serving: stop accepting, then close served connections (after any accepted
    //    connection still queued to a reactor has been adopted: tasks run in order).
    if (!reactors_.empty())
        reactors_[0]->run_sync([&] {
            for (auto &l : listeners_) l->stop();
        });
    for (auto &r : reactors_) r->run_sync([&r] { r->dispose_all(); });
    // 3. Threads.
    for (auto &r : reactors_) r->stop();
    reactors_.clear();
    listeners_.clear();
    // 4. Staging copies still running for closed connections: their buffers come back (and
    //    their region references drop) when they end.
    stager_.wait_idle();
}

int Transport::export_endpoint(void *buf, size_t *len, ferry_error_t *err) {
    if (*len < endpoint_.size()) {
        *len = endpoint_.size();
        return set_error(err, -ENOSPC, "tcp: endpoint needs %zu bytes", endpoint_.size());
    }
    memcpy(buf, endpoint_.data(), endpoint_.size());
    *len = endpoint_.size();
    return 0;
}

int Transport::register_mem(const ferry_mem_region_t *region, uint64_t *handle, ferry_error_t *err) {
    std::string why;
    int rc = stager_.check_region(*region, &why);
    if (rc != 0) return set_error(err, rc, "%s", why.c_str());
    if (region->addr == 0 || region->length == 0 || region->addr + region->length < region->addr)
        return set_error(err, -EINVAL, "tcp: invalid region [0x%llx, +%llu)",
                         static_cast<unsigned long long>(region->addr),
                         static_cast<unsigned long long>(region->length));
    if ((region->access & ~(FERRY_ACCESS_REMOTE_READ | FERRY_ACCESS_REMOTE_WRITE)) != 0)
        return set_error(err, -EINVAL, "tcp: unknown access bits 0x%x", region->access);
    *handle = regions_.add(region->addr, region->length, region->access, region->kind, region->device_id);
    return 0;
}

int Transport::deregister_mem(uint64_t handle, ferry_error_t *err) {
    if (!regions_.remove(handle))
        return set_error(err, -EINVAL, "tcp: mem handle %llu is not registered",
                         static_cast<unsigned long long>(handle));
    return 0;
}

int Transport::export_mem(uint64_t handle, void *, size_t *len, ferry_error_t *err) {
    if (!regions_.contains(handle))
        return set_error(err, -EINVAL, "tcp: mem handle %llu is not registered",
                         static_cast<unsigned long long>(handle));
    *len = 0;  // peers address registered memory by virtual address: no keys needed
    return 0;
}

int Transport::connect(const void *endpoint, size_t len, uint64_t *out, ferry_error_t *err) {
    std::vector<Endpoint> remote;
    std::string why;
    if (!decode_rails_endpoint(endpoint, len, &remote, &why)) return set_error(err, -EINVAL, "tcp: %s", why.c_str());
    uint64_t id;
    {
        std::unique_lock lk(peers_mu_);
        id = next_peer_++;
    }
    std::vector<Rail> rails;
    for (auto &plan : plan_rails(rails_, remote, cfg_.rails == "auto")) {
        Rail &r = rails.emplace_back();
        r.remote = remote[plan.remote];
        r.source = plan.source;
        r.source_len = plan.source_len;
        r.name = std::move(plan.name);
        r.local = plan.local;
    }
    auto peer = std::make_shared<Peer>(id, std::move(rails), cfg_, log_, regions_, waiters_, cq_, *tally_);
    for (unsigned r = 0; r < peer->rail_count(); ++r)
        for (unsigned i = 0; i < cfg_.lanes; ++i)
            peer->add_lane(*reactors_[next_lane_reactor_++ % reactors_.size()], r);
    int rc = peer->connect_lanes(&why);
    if (rc != 0) {
        peer->close(rc, why);
        return set_error(err, rc, "tcp: %s", why.c_str());
    }
    {
        std::unique_lock lk(peers_mu_);
        peers_.emplace(id, peer);
    }
    log_.log(FERRY_LOG_DEBUG, "connected to peer %s (%u lanes), handle %llu", peer->endpoint().name.c_str(), cfg_.lanes,
             static_cast<unsigned long long>(id));
    *out = id;
    return 0;
}

std::shared_ptr<Peer> Transport::find_peer(uint64_t id) {
    std::shared_lock lk(peers_mu_);
    auto it = peers_.find(id);
    return it == peers_.end() ? nullptr : it->second;
}

int Transport::disconnect(uint64_t id, ferry_error_t *err) {
    std::shared_ptr<Peer> peer;
    {
        std::unique_lock lk(peers_mu_);
        auto it = peers_.find(id);
        if (it == peers_.end())
            return set_error(err, -EINVAL, "tcp: peer %llu is not connected", static_cast<unsigned long long>(id));
        peer = std::move(it->second);
        peers_.erase(it);
    }
    peer->close(-ECANCELED, "peer " + peer->endpoint().name + " disconnected by the host");
    return 0;
}

int Transport::import_mem(uint64_t id, const ferry_mem_region_t *region, const void *, size_t len, uint64_t *remote_mem,
                          ferry_error_t *err) {
    auto peer = find_peer(id);
    if (!peer) return set_error(err, -EINVAL, "tcp: peer %llu is not connected", static_cast<unsigned long long>(id));
    if (len != 0)
        return set_error(err, -EINVAL, "tcp: import_mem got %zu descriptor bytes; tcp regions export none", len);
    // A device region in a peer's descriptor was registered there with staging (its tcp.so
    // refuses device memory otherwise): the peer serves it like host memory.
    if (region->kind != FERRY_MEM_HOST && region->kind != FERRY_MEM_CUDA && region->kind != FERRY_MEM_ROCM)
        return set_error(err, -ENOTSUP, "tcp: remote region of unknown memory kind %u", region->kind);
    if (region->length == 0 || region->addr + region->length < region->addr)
        return set_error(err, -EINVAL, "tcp: invalid remote region [0x%llx, +%llu)",
                         static_cast<unsigned long long>(region->addr),
                         static_cast<unsigned long long>(region->length));
    uint64_t h = next_import_++;
    peer->import_region(h, RemoteRegion{region->addr, region->length, region->access});
    *remote_mem = h;
    return 0;
}

int Transport::release_mem(uint64_t id, uint64_t remote_mem, ferry_error_t *err) {
    auto peer = find_peer(id);
    if (!peer) return set_error(err, -EINVAL, "tcp: peer %llu is not connected", static_cast<unsigned long long>(id));
    if (!peer->release_region(remote_mem))
        return set_error(err, -EINVAL, "tcp: remote_mem %llu was not imported from peer %llu",
                         static_cast<unsigned long long>(remote_mem), static_cast<unsigned long long>(id));
    return 0;
}

int Transport::submit(uint64_t id, const ferry_xfer_op_t *ops, size_t n_ops, ferry_error_t *err) {
    auto peer = find_peer(id);
    if (!peer) return set_error(err, -EINVAL, "tcp: peer %llu is not connected", static_cast<unsigned long long>(id));
    return peer->submit(ops, n_ops, err);
}

// Completions queued by the reactors first; then, while room is left, the responses waiting on
// waiter-mode lanes are parsed here, on the host's thread (lane.hpp).
int Transport::poll(ferry_completion_t *out, size_t max) {
    max = std::min<size_t>(max, INT32_MAX);
    size_t n = cq_.poll(out, max);
    if (n == max || !waiters_.active()) return static_cast<int>(n);
    thread_local std::vector<ferry_completion_t> got;
    waiters_.ready([](Lane *lane) { lane->receive_now(got); });
    const size_t take = std::min(got.size(), max - n);
    if (take > 0) memcpy(out + n, got.data(), take * sizeof(ferry_completion_t));
    if (take < got.size()) {
        got.erase(got.begin(), got.begin() + static_cast<std::ptrdiff_t>(take));
        cq_.push(got);  // the rest waits for the next poll (the completion fd says so)
    }
    got.clear();
    return static_cast<int>(n + take);
}

// Counts from the tally; pauses, queues and throughput from the peers connected now. A rail's
// throughput is the fastest any one peer measured on it: rates of peers that were busy at
// different times do not add up.
int Transport::rail_stats(ferry_rail_stats_t *out, size_t *n, ferry_error_t *err) {
    const auto totals = tally_->totals();
    std::vector<ferry_rail_stats_t> rails;
    rails.reserve(totals.size());
    for (size_t i = 0; i < totals.size(); ++i) rails.push_back(ferry_plugin::rail_entry(tally_->name(i), totals[i]));
    std::vector<std::shared_ptr<Peer>> peers;
    {
        std::shared_lock lk(peers_mu_);
        peers.reserve(peers_.size());
        for (const auto &[id, p] : peers_) peers.push_back(p);
    }
    const auto now = Clock::now();
    for (const auto &p : peers)
        for (const RailNow &r : p->rails_now(now)) {
            ferry_rail_stats_t &e = rails[r.local];
            e.paused_peers += r.paused ? 1 : 0;
            e.queued_bytes += r.queued;
            e.throughput = std::max(e.throughput, r.rate);
        }
    return ferry_plugin::copy_rail_stats(rails, out, n, err, kName);
}

}  // namespace ferry_tcp
