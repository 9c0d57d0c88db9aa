// The connector: what an op needs from the network before it can be posted (its segment's
// descriptor re-read, a transport connected, a remote region imported) runs here, on a few
// engine threads, never on the submit path. Each segment with deferred ops is served by one
// thread at a time, so a peer whose connect hangs holds up only its own ops; every network
// call runs without the segment's mutex, so submits to that segment never wait on it.
#include <cerrno>

#include "engine/engine_impl.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

// Segments being connected at once; more wait in the queue.
constexpr size_t kMaxConnectors = 8;
// A transport whose connect or import failed is skipped (falling back to the next one) for so
// long before it is tried again.
constexpr std::chrono::seconds kRetryUnusable{1};
// Re-routes of one op (each after a connect, an import or a re-read); more means the peer
// keeps re-registering under us.
constexpr int kMaxSteps = 32;

std::string prefix(const DeferredOp &d) {
    return cat("submit: op ", d.index, " (", op_name(d.request.opcode), " ", d.request.length, " bytes): ");
}

// One pass over a segment's deferred ops re-reads its descriptor at most once, and tries each
// transport's connect at most once: the ops after a failed connect fail with its error (or fall
// back) at once, instead of each waiting out the plugin's connect timeout again (1024 ops to a
// dead peer over a forced transport waited 1024 x 5 s).
struct Round {
    bool refreshed = false;
    std::optional<Error> refresh_error;
    std::vector<std::pair<size_t, std::string>> connect_failed;
};

// What route() asked for, copied out of the segment so the call can run without its mutex.
struct Needed {
    Route::Need need = Route::Need::Nothing;
    size_t transport = 0;
    std::vector<uint8_t> endpoint;  // Connect
    uint64_t peer = 0;              // Import
    ferry_mem_region_t region{};
    std::vector<uint8_t> key;
};

}  // namespace

void Engine::Impl::defer(const std::shared_ptr<RemoteSegment> &seg, std::vector<DeferredOp> ops) {
    bool schedule = false;
    {
        std::lock_guard lock(seg->mutex);
        if (!seg->closed) {
            for (auto &d : ops) seg->deferred.push_back(std::move(d));
            ops.clear();
            schedule = !seg->scheduled;
            seg->scheduled = true;
        }
    }
    for (auto &d : ops)  // close_segment ran between planning and here
        complete(*d.op, -ECANCELED, prefix(d) + "segment " + seg->name + " was closed before the op could be posted");
    if (!schedule) return;
    std::lock_guard lock(connector_mutex);
    connector_queue.push_back(seg);
    if (connector_queue.size() > connector_idle && connector_threads.size() < kMaxConnectors && !connector_stopped)
        connector_threads.emplace_back([this] { connector_loop(); });
    connector_cv.notify_one();
}

void Engine::Impl::connector_loop() {
    std::unique_lock lock(connector_mutex);
    for (;;) {
        ++connector_idle;
        connector_cv.wait(lock, [&] { return connector_stopped || !connector_queue.empty(); });
        --connector_idle;
        if (connector_queue.empty()) return;  // stopped, and nothing left to fail
        auto seg = std::move(connector_queue.front());
        connector_queue.pop_front();
        lock.unlock();
        serve_segment(*seg);
        lock.lock();
    }
}

void Engine::Impl::stop_connector() {
    {
        std::lock_guard lock(connector_mutex);
        connector_stopped = true;
        connector_stopping.store(true);
        connector_cv.notify_all();
    }
    // Threads fail what is queued; one inside a plugin's connect returns by that plugin's
    // connect timeout (the ABI bounds it), then fails its op too.
    for (auto &t : connector_threads) t.join();
    connector_threads.clear();
}

void Engine::Impl::serve_segment(RemoteSegment &seg) {
    for (;;) {
        std::deque<DeferredOp> ops;
        {
            std::lock_guard lock(seg.mutex);
            if (seg.deferred.empty()) {
                seg.scheduled = false;
                return;
            }
            ops.swap(seg.deferred);
        }
        Round round;
        if (seg.stale.exchange(false)) {
            round.refreshed = true;
            if (auto r = refresh_segment(seg); !r) {
                for (auto &d : ops) complete(*d.op, r.error().code, prefix(d) + r.error().message);
                continue;
            }
        }
        Posting ready;
        for (auto &d : ops) {
            RouteAttempts attempts;
            attempts.failed = round.connect_failed;
            attempts.failover = d.failover;
            for (int step = 0;; ++step) {
                if (connector_stopping.load()) {
                    complete(*d.op, -ECANCELED, prefix(d) + "the engine was destroyed before the op could be posted");
                    break;
                }
                if (step == kMaxSteps) {
                    complete(*d.op, -EAGAIN,
                             prefix(d) + "segment " + seg.name + " kept changing while it was being connected; retry");
                    break;
                }
                Needed n;
                {
                    std::shared_lock regions_lock(regions_mutex);
                    auto lr = local_region(d.request, d.index);  // it may have been unregistered since
                    if (!lr) {
                        complete(*d.op, lr.error().code, lr.error().message);
                        break;
                    }
                    std::lock_guard seg_lock(seg.mutex);
                    if (seg.closed) {
                        complete(*d.op, -ECANCELED,
                                 prefix(d) + "segment " + seg.name + " was closed before the op could be posted");
                        break;
                    }
                    attempts.may_refresh = !round.refreshed || round.refresh_error.has_value();
                    auto r = route(seg, d.request, d.index, **lr, attempts);
                    if (!r) {
                        complete(*d.op, r.error().code, r.error().message);
                        break;
                    }
                    n.need = r->need;
                    n.transport = r->transport;
                    if (r->need == Route::Need::Nothing) {
                        add_ready(ready, *d.op, d.request, **lr, *r);
                        break;
                    }
                    if (r->need == Route::Need::Connect) {
                        n.endpoint = seg.descriptor.endpoint_for(transports[r->transport]->name())->endpoint;
                    } else if (r->need == Route::Need::Import) {
                        n.peer = r->peer;
                        n.region = to_abi(*r->region);
                        if (const auto *k = r->region->key_for(transports[r->transport]->name())) n.key = k->key;
                    }
                }
                // The network, with no lock held.
                if (n.need == Route::Need::Refresh) {
                    if (round.refresh_error) {
                        complete(*d.op, round.refresh_error->code, prefix(d) + round.refresh_error->message);
                        break;
                    }
                    round.refreshed = true;
                    if (auto r = refresh_segment(seg); !r) round.refresh_error = r.error();
                    continue;
                }
                auto &tr = *transports[n.transport];
                auto got =
                    n.need == Route::Need::Connect ? tr.connect(n.endpoint) : tr.import_mem(n.peer, n.region, n.key);
                std::optional<uint64_t> stray;  // a connection or import nobody may use any more
                {
                    std::lock_guard seg_lock(seg.mutex);
                    if (!got) {
                        std::string why = n.need == Route::Need::Connect
                                              ? cat("segment ", seg.name, ": ", got.error().message)
                                              : got.error().message;
                        FERRY_WARN("segment ", seg.name, ": ", why, "; trying the next transport");
                        seg.unusable[n.transport] = {std::chrono::steady_clock::now() + kRetryUnusable, why};
                        if (n.need == Route::Need::Connect) round.connect_failed.emplace_back(n.transport, why);
                        attempts.failed.emplace_back(n.transport, std::move(why));
                        continue;
                    }
                    if (n.need == Route::Need::Connect) {
                        // A re-read may have moved the peer, close_segment may have run.
                        const auto *ep = seg.descriptor.endpoint_for(tr.name());
                        if (seg.closed || seg.peers[n.transport] || !ep || ep->endpoint != n.endpoint) stray = *got;
                        else seg.peers[n.transport] = *got;
                    } else if (!seg.adopt_import(n.transport, n.region.addr, n.peer, *got)) {
                        stray = *got;
                    }
                }
                if (stray) {
                    if (n.need == Route::Need::Connect) (void)tr.disconnect(*stray);
                    else (void)tr.release_mem(n.peer, *stray);
                }
            }
        }
        post(ready);
    }
}

}  // namespace ferry
