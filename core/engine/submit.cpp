// submit: a batch is checked against what this engine knows (its own regions, its open
// segments, their cached descriptors), its routable ops are posted, and ops whose segment
// needs the network first (a descriptor re-read, a connect, an import) are handed to the
// connector (connector.cpp). It never waits on the network. submit_on_stream
// (stream_submit.cpp) splits it: the checks at the call, the planning and posting once the
// batch's CUDA stream reached it.
#include <algorithm>
#include <cerrno>
#include <unordered_map>

#include "engine/engine_impl.hpp"
#include "util/log.hpp"

namespace ferry {

// The batch's ops that wait for the connector, by segment.
struct Deferrals {
    std::vector<std::pair<std::shared_ptr<RemoteSegment>, std::vector<DeferredOp>>> by_segment;
    std::unordered_map<SegmentId, size_t> index;

    void add(const std::shared_ptr<RemoteSegment> &seg, OpRecord &op, size_t i, const Request &rq) {
        auto [it, fresh] = index.try_emplace(seg->id, by_segment.size());
        if (fresh) by_segment.emplace_back(seg, std::vector<DeferredOp>{});
        by_segment[it->second].second.push_back({&op, i, rq});
    }
};

namespace {

constexpr size_t kMaxBatchOps = 1u << 24;

Result<void> check_size(std::span<const Request> requests) {
    if (requests.empty()) return fail(-EINVAL, "submit: the batch is empty");
    if (requests.size() >= kMaxBatchOps)
        return fail(-E2BIG, cat("submit: ", requests.size(), " ops in one batch; split it below ", kMaxBatchOps));
    return {};
}

std::shared_ptr<Batch> make_batch(BatchId id, std::span<const Request> requests,
                                  std::unique_ptr<PendingNotification> notification) {
    auto batch = std::make_shared<Batch>();
    batch->id = id;
    batch->size = requests.size();
    batch->submitted = std::chrono::steady_clock::now();
    batch->ops = std::make_unique<OpRecord[]>(requests.size());
    // Set before any op can complete: the notification holds a share of `remaining`.
    batch->notification = std::move(notification);
    batch->remaining.store(requests.size() + (batch->notification ? 1 : 0), std::memory_order_relaxed);
    for (size_t i = 0; i < requests.size(); ++i) {
        batch->ops[i].batch = batch.get();
        batch->ops[i].opcode = requests[i].opcode;
        batch->ops[i].length = requests[i].length;
        batch->ops[i].forced = !requests[i].transport.empty();
        batch->ops[i].local = requests[i].local;
        batch->ops[i].remote = requests[i].remote;
        batch->ops[i].segment = requests[i].segment;
    }
    return batch;
}

}  // namespace

Result<BatchId> Engine::Impl::submit(std::span<const Request> requests,
                                     std::unique_ptr<PendingNotification> notification) {
    if (auto r = check_size(requests); !r) return std::unexpected(r.error());
    auto batch = make_batch(next_batch.fetch_add(1), requests, std::move(notification));
    Posting ready;
    Deferrals deferred;
    if (auto r = plan(*batch, requests, ready, deferred); !r) return std::unexpected(r.error());
    {
        std::lock_guard lock(batches_mutex);
        batches[batch->id] = batch;
    }
    post(ready);
    for (auto &[seg, ops] : deferred.by_segment) defer(seg, std::move(ops));
    return batch->id;
}

Result<std::shared_ptr<Batch>> Engine::Impl::prepare_batch(std::span<const Request> requests) {
    if (auto r = check_size(requests); !r) return std::unexpected(r.error());
    auto batch = make_batch(next_batch.fetch_add(1), requests, nullptr);
    batch->on_stream = true;
    {
        Posting ready;
        Deferrals deferred;
        if (auto r = plan(*batch, requests, ready, deferred); !r) return std::unexpected(r.error());
    }
    // Planning left its marks on the ops it routed; the stream's turn plans them afresh.
    for (size_t i = 0; i < batch->size; ++i) {
        batch->ops[i].transport.store(kNoTransport, std::memory_order_relaxed);
        batch->ops[i].staged.reset();
    }
    std::lock_guard lock(batches_mutex);
    batches[batch->id] = batch;
    return batch;
}

void Engine::Impl::start_batch(Batch &batch, std::span<const Request> requests) {
    Posting ready;
    Deferrals deferred;
    if (auto r = plan(batch, requests, ready, deferred); !r) {
        // Refused now (memory unregistered or a segment closed since the call): no op started.
        for (size_t i = 0; i < batch.size; ++i) {
            batch.ops[i].transport.store(kNoTransport, std::memory_order_relaxed);
            batch.ops[i].staged.reset();
        }
        std::string why = cat("refused when its CUDA stream reached the batch: ", r.error().message);
        for (size_t i = 0; i < batch.size; ++i) complete(batch.ops[i], r.error().code, why);
        return;
    }
    post(ready);
    for (auto &[seg, ops] : deferred.by_segment) defer(seg, std::move(ops));
}

// Planning takes nothing: a refused batch started no op and queued none.
Result<void> Engine::Impl::plan(Batch &batch, std::span<const Request> requests, Posting &ready, Deferrals &deferred) {
    ready.expected = requests.size();
    {
        std::shared_lock regions_lock(regions_mutex);
        std::shared_ptr<RemoteSegment> seg;
        std::unique_lock<std::mutex> seg_lock;
        // The previous op's checks and route: KV-cache batches hit the same local and remote
        // regions for many ops in a row, and an op inside both takes them without a lookup. Valid
        // while both locks are held (the route's region and row live in seg).
        const Request *prev = nullptr;  // passed local_region's checks
        const LocalRow *prev_lr = nullptr;
        std::optional<Route> prev_route;  // prev's, when it was ready to post
        // The lookups of a window of up to kMany ops, made together so that their cache misses
        // overlap (region_index.hpp, find_many): the local rows, and the remote rows in
        // `window_seg` (the segment of the window's first op, locked since; null once unlocked).
        // An op near the one before it (same segment, both ranges within a page of its), or
        // inside the regions of the op before the window, is left out: it is most likely in the
        // same regions, which the same-route check then reuses without a lookup; where it is
        // not, it looks its own up. (KV blocks lie tens of KiB apart in one region on each side.)
        constexpr size_t kMany = RegionIndex::kMaxMany;
        constexpr uint64_t kNear = 4096;
        const LocalRow *window_local[kMany];
        size_t window_remote[kMany];
        size_t window_slot[kMany];  // the op's lookup in the two above; kMany: none made
        const RemoteSegment *window_seg = nullptr;
        size_t window = 0, window_end = 0;
        auto switch_segment = [&](SegmentId id) {
            if (seg_lock.owns_lock()) seg_lock.unlock();
            prev_route.reset();
            window_seg = nullptr;
            seg = segment(id);
            if (seg) seg_lock = std::unique_lock(seg->mutex);
        };
        auto near = [](uint64_t a, uint64_t b) { return (a > b ? a - b : b - a) < kNear; };
        for (size_t i = 0; i < requests.size(); ++i) {
            const Request &rq = requests[i];
            uint64_t local = reinterpret_cast<uintptr_t>(rq.local);
            if (i == window_end) {
                window = i;
                window_end = std::min(requests.size(), i + kMany);
                uint64_t locals[kMany], remotes[kMany], lengths[kMany];
                size_t m = 0;
                for (size_t j = window; j < window_end; ++j) {
                    const Request &q = requests[j];
                    uint64_t a = reinterpret_cast<uintptr_t>(q.local);
                    bool in_prev = prev_route && seg && q.segment == seg->id && prev_lr->holds(a, q.length) &&
                                   (prev_route->row ? prev_route->row->holds(q.remote, q.length)
                                                    : prev_route->region->holds(q.remote, q.length));
                    if (in_prev || (j > 0 && q.segment == requests[j - 1].segment &&
                                    near(a, reinterpret_cast<uintptr_t>(requests[j - 1].local)) &&
                                    near(q.remote, requests[j - 1].remote))) {
                        window_slot[j - window] = kMany;
                        continue;
                    }
                    window_slot[j - window] = m;
                    locals[m] = a;
                    remotes[m] = q.remote;
                    lengths[m++] = q.length;
                }
                if (!seg || seg->id != rq.segment) switch_segment(rq.segment);  // a missing one fails below
                if (seg && seg->rows.built_for(seg->descriptor)) {
                    RegionIndex::RemoteProbe probe{&seg->rows, &seg->descriptor, remotes, window_remote};
                    regions.find_many(locals, lengths, m, window_local, &probe);
                    window_seg = seg.get();
                } else {
                    regions.find_many(locals, lengths, m, window_local);
                }
            }
            size_t slot = window_slot[i - window];
            bool like_prev = prev && rq.length != 0 && rq.opcode == prev->opcode && rq.transport == prev->transport;
            const LocalRow *lr = like_prev && prev_lr->holds(local, rq.length) ? prev_lr : nullptr;
            if (!lr) {
                auto found = slot < kMany ? local_region(rq, i, window_local[slot]) : local_region(rq, i);
                if (!found) return std::unexpected(found.error());
                lr = *found;
            }
            if (!seg || seg->id != rq.segment) {
                switch_segment(rq.segment);
                if (!seg)
                    return fail(-ENOENT,
                                cat("submit: op ", i, " (", op_name(rq.opcode), " ", rq.length, " bytes): segment id ",
                                    rq.segment, " is not open; call open_segment first"));
            }
            bool same_route = like_prev && lr == prev_lr && prev_route &&
                              (prev_route->row ? prev_route->row->holds(rq.remote, rq.length)
                                               : prev_route->region->holds(rq.remote, rq.length));
            prev = &rq;
            prev_lr = lr;
            auto &op = batch.ops[i];
            // A descriptor the metadata backend says changed is re-read first: by the connector.
            if (seg->stale.load(std::memory_order_relaxed)) {
                prev_route.reset();
                deferred.add(seg, op, i, rq);
                continue;
            }
            if (same_route) {
                add_ready(ready, op, rq, *lr, *prev_route);
                continue;
            }
            // What the cache already answers (no access, no transport that can carry it) fails
            // here; what only the peer can answer waits for the connector.
            std::optional<size_t> row;
            if (slot < kMany && window_seg == seg.get()) row = window_remote[slot];
            auto r = route(*seg, rq, i, *lr, RouteAttempts{}, row);
            if (!r) return std::unexpected(r.error());
            if (r->need == Route::Need::Nothing) {
                add_ready(ready, op, rq, *lr, *r);
                prev_route = *r;
            } else {
                prev_route.reset();
                deferred.add(seg, op, i, rq);
            }
        }
    }
    return {};
}

}  // namespace ferry
