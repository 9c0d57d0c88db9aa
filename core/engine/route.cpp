// Routing one op: the checks that need nothing remote, the choice of transport from what is
// cached about the segment, and building the op for the transport once it is routable. Used by
// submit (submit.cpp) and by the connector (connector.cpp); nothing here touches the network.
#include <cerrno>

#include "engine/engine_impl.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

std::unexpected<Error> op_failure(size_t i, const Request &rq, int code, const std::string &why) {
    return fail(code, cat("submit: op ", i, " (", op_name(rq.opcode), " ", rq.length, " bytes): ", why));
}

}  // namespace

Result<const LocalRow *> Engine::Impl::local_region(const Request &rq, size_t i,
                                                    std::optional<const LocalRow *> found) const {
    auto bad = [&](int code, const std::string &why) { return op_failure(i, rq, code, why); };
    if (rq.opcode != Opcode::Read && rq.opcode != Opcode::Write)
        return bad(-EINVAL, cat("unknown opcode ", static_cast<uint32_t>(rq.opcode)));
    if (rq.length == 0) return bad(-EINVAL, "length is 0");
    uint64_t local = reinterpret_cast<uintptr_t>(rq.local);
    if (local + rq.length < local) return bad(-EINVAL, "local range wraps around");
    if (!rq.transport.empty() && !transport_index(rq.transport))
        return bad(-ENOENT, cat("transport '", rq.transport, "' is not loaded in this engine"));
    if (const LocalRow *r = found ? *found : regions.find(local, rq.length)) return r;
    return bad(-EFAULT, cat("local range [", hex(local), ", ", hex(local + rq.length),
                            ") is not inside one registered region; register the buffer first"));
}

void RemoteSegment::reindex(std::span<const std::string_view> names, std::span<const uint64_t> caps) {
    rows.build(descriptor, names);
    reach_mask = 0;
    std::fill(std::begin(moves_mask), std::end(moves_mask), 0);
    const uint64_t kind_cap[3] = {FERRY_CAP_MEM_HOST, FERRY_CAP_MEM_CUDA, FERRY_CAP_MEM_ROCM};
    for (size_t t = 0; t < names.size() && t < kRowMaskBits; ++t) {
        uint32_t bit = uint32_t{1} << t;
        // Storage transports carry storage segments only, and only they do.
        bool reaches = storage ? (caps[t] & FERRY_CAP_STORAGE) != 0
                               : !(caps[t] & FERRY_CAP_STORAGE) &&
                                     caps[t] & (same_host ? FERRY_CAP_INTRA_NODE : FERRY_CAP_INTER_NODE);
        if (descriptor.endpoint_for(names[t]) && reaches) reach_mask |= bit;
        for (size_t k = 0; k < 3; ++k)
            if (caps[t] & kind_cap[k]) moves_mask[k] |= bit;
    }
    for (const auto &[key, handle] : imported) rows.set_imported(descriptor, key.first, key.second, handle);
}

void Engine::Impl::reindex(RemoteSegment &seg) const {
    std::vector<std::string_view> names;
    std::vector<uint64_t> caps;
    for (const auto &t : transports) {
        names.push_back(t->name());
        caps.push_back(t->caps());
    }
    seg.reindex(names, caps);
}

Result<Route> Engine::Impl::route(RemoteSegment &seg, const Request &rq, size_t i, const LocalRow &lr,
                                  const RouteAttempts &attempts, std::optional<size_t> row) {
    auto bad = [&](int code, const std::string &why) { return op_failure(i, rq, code, why); };
    Route out;
    const RegionDescriptor *rr = nullptr;
    if (seg.rows.built_for(seg.descriptor)) {
        size_t at = row ? *row : seg.rows.find(seg.descriptor, rq.remote, rq.length);
        if (at != RemoteRows::kNone) {
            if (rq.transport.empty() && attempts.failed.empty() &&
                route_fast(seg, priority, lr, seg.rows[at], rq.opcode, out))
                return out;
            rr = &seg.descriptor.regions[at];
            out.row = &seg.rows[at];
        }
    } else {
        rr = seg.descriptor.find_region(rq.remote, rq.length);
    }
    if (!rr) {
        if (seg.storage)
            return bad(-EINVAL, cat("file offset range [", rq.remote, ", ", rq.remote + rq.length, ") of ", seg.name,
                                    " wraps around or passes the largest file offset ", FERRY_STORAGE_MAX_OFFSET));
        // The peer may have registered this memory after we fetched its descriptor.
        if (attempts.may_refresh) {
            out.need = Route::Need::Refresh;
            return out;
        }
        return bad(-EFAULT, cat("remote range [", hex(rq.remote), ", ", hex(rq.remote + rq.length),
                                ") is not inside one region that segment ", seg.name, " registered"));
    }
    uint32_t need = rq.opcode == Opcode::Read ? kRemoteRead : kRemoteWrite;
    if (!(rr->access & need))
        return bad(-EACCES, cat("segment ", seg.name, " registered [", hex(rr->addr), ", ", hex(rr->end()),
                                ") without remote ", rq.opcode == Opcode::Read ? "read" : "write", " access"));
    out.region = rr;

    // Transport: the forced one, or the first in priority order both sides can use.
    std::string tried;
    auto consider = [&](size_t t, bool &staged) {
        const auto &tr = transports[t];
        std::string why;
        auto broken = seg.unusable.find(t);
        if (broken != seg.unusable.end() && std::chrono::steady_clock::now() < broken->second.first)
            why =
                (seg.storage ? "did not take the file when the segment opened: " : "connecting failed moments ago: ") +
                broken->second.second;
        else if (seg.storage != tr->storage())
            why = seg.storage ? "not a storage transport (file segments need file.so or gds.so)"
                              : "a storage transport carries only file:<path> segments of this engine";
        else if (!seg.descriptor.endpoint_for(tr->name())) why = "the peer has no such transport";
        else if (!seg.storage && !tr->reaches(seg.same_host))
            why = seg.same_host ? "cannot reach the same host" : "reaches only the same host";
        else if (!rr->key_for(tr->name()))
            why = rr->kind == FERRY_MEM_HOST
                      ? "the peer did not register the remote region with it"
                      : cat("the remote region is ", rr->kind == FERRY_MEM_CUDA ? "CUDA" : "ROCm", " memory of device ",
                            rr->device,
                            ", which it cannot serve (load cuda_ipc for same-host GPU peers, or "
                            "register the target's GPU memory with staging enabled: gpu_staging_max_bytes > 0, "
                            "a GPU runtime the target's engine loads, and a transport serving staged device "
                            "memory such as tcp)");
        else if (!lr.handle(t) || !tr->moves(lr.kind)) {
            // GPU memory on a host-only transport goes through pinned slices (staging.cpp);
            // a handle there only serves peers' access to it.
            std::string no_stager;
            if (lr.kind != FERRY_MEM_HOST && tr->moves(FERRY_MEM_HOST) && staging->offers(lr.kind, no_stager))
                staged = true;
            else why = "cannot move the local memory kind" + (no_stager.empty() ? "" : " (" + no_stager + ")");
        }
        if (why.empty()) return true;
        tried += cat(tried.empty() ? "" : "; ", tr->name(), ": ", why);
        return false;
    };
    std::optional<size_t> forced;
    if (!rq.transport.empty()) {
        forced = transport_index(rq.transport);
        if (!forced) return bad(-ENOENT, cat("transport '", rq.transport, "' is not loaded in this engine"));
    }
    auto choose = [&](size_t t, bool staged) -> Result<Route> {
        out.transport = t;
        out.staged = staged;
        if (!seg.peers[t]) {
            out.need = Route::Need::Connect;
            return out;
        }
        out.peer = *seg.peers[t];
        auto imported = seg.imported.find({t, rr->addr});
        if (imported == seg.imported.end()) {
            out.need = Route::Need::Import;
            return out;
        }
        out.remote_mem = imported->second;
        return out;
    };
    std::optional<size_t> staged_choice;
    std::optional<std::pair<size_t, bool>> paused_choice;  // (transport, staged)
    const auto now = std::chrono::steady_clock::now();
    // Pauses that ended go, whichever transport this op takes: route_fast serves the segment
    // again only once none is left.
    std::erase_if(seg.paused, [&](const auto &p) { return now >= p.second.until; });
    // A transport that cannot connect (a kernel forbidding cross-process access, a peer port
    // unreachable) is skipped for the next one, unless the request forced it.
    for (size_t t : forced ? std::span<const size_t>(&*forced, 1) : std::span<const size_t>(priority)) {
        auto failed =
            std::find_if(attempts.failed.begin(), attempts.failed.end(), [&](const auto &f) { return f.first == t; });
        if (failed != attempts.failed.end()) {
            tried += cat(tried.empty() ? "" : "; ", transports[t]->name(), ": ", failed->second);
            continue;
        }
        // Forced: always try it again; but a storage transport that refused the file at
        // open_segment keeps refusing it (nothing reopens it), and says why.
        if (forced && !seg.storage) seg.unusable.erase(t);
        bool staged = false;
        if (!consider(t, staged)) continue;
        // A paused path (failover.cpp) is left for the others until its pause ends; where it is
        // the only one, a new op probes it, an op being failed over does not.
        if (auto p = seg.paused.find(t); p != seg.paused.end() && !forced) {
            if (attempts.failover) {
                auto left = std::chrono::duration_cast<std::chrono::milliseconds>(p->second.until - now).count();
                tried += cat(tried.empty() ? "" : "; ", transports[t]->name(), ": paused for ", left,
                             " more ms after it failed (", p->second.why, ")");
            } else if (!paused_choice) {
                paused_choice = {t, staged};
            }
            continue;
        }
        // A file: GPU memory goes to a storage transport that moves it directly (gds.so) before
        // one it would be staged through (file.so), whatever their order of priority.
        if (staged && seg.storage && !forced) {
            if (!staged_choice) staged_choice = t;
            continue;
        }
        return choose(t, staged);
    }
    if (staged_choice) return choose(*staged_choice, true);
    if (paused_choice) return choose(paused_choice->first, paused_choice->second);
    return bad(-EHOSTUNREACH, cat("no transport can carry it to ", seg.name, " (", tried, ")"));
}

void Engine::Impl::add_ready(Posting &posting, OpRecord &op, const Request &rq, const LocalRow &lr, const Route &r) {
    op.transport.store(static_cast<uint16_t>(r.transport), std::memory_order_relaxed);
    if (r.staged) {
        auto st = std::make_shared<StagedOp>();
        st->record = &op;
        st->transport = r.transport;
        st->peer = r.peer;
        st->remote_addr = rq.remote;
        st->remote_mem = r.remote_mem;
        st->kind = lr.kind;
        st->device = lr.region->device;
        st->gpu = static_cast<char *>(rq.local);
        st->length = rq.length;
        st->read = rq.opcode == Opcode::Read;
        op.staged = st;
        posting.staged.push_back(std::move(st));
        return;
    }
    // The op is written in place: built on the stack and copied, its narrow fields' stores
    // stall the wide loads of the copy (store forwarding), a cost per op of every batch.
    auto &groups = posting.groups;
    if (posting.expected) --posting.expected;
    if (posting.last >= groups.size() || groups[posting.last].transport != r.transport ||
        groups[posting.last].peer != r.peer) {
        auto g = std::find_if(groups.begin(), groups.end(), [&](const Posting::Group &gr) {
            return gr.transport == r.transport && gr.peer == r.peer;
        });
        if (g == groups.end()) {
            groups.push_back({r.transport, r.peer, {}});
            g = std::prev(groups.end());
            g->ops.reserve(posting.expected + 1);
        }
        posting.last = static_cast<size_t>(g - groups.begin());
    }
    ferry_xfer_op_t &x = groups[posting.last].ops.emplace_back();
    x.opcode = rq.opcode == Opcode::Read ? FERRY_OP_READ : FERRY_OP_WRITE;
    x.reserved = 0;
    x.local_addr = reinterpret_cast<uintptr_t>(rq.local);
    x.local_mem = *lr.handle(r.transport);
    x.remote_addr = rq.remote;
    x.remote_mem = r.remote_mem;
    x.length = rq.length;
    x.user_data = reinterpret_cast<uintptr_t>(&op);
}

void Engine::Impl::post(Posting &posting) {
    for (auto &g : posting.groups) {
        if (auto r = transports[g.transport]->submit(g.peer, g.ops); !r) {
            // Other groups may already be moving, so these ops fail (or fail over, where the
            // path broke) one by one instead.
            auto &first = *reinterpret_cast<OpRecord *>(g.ops.front().user_data);
            FERRY_ERROR("batch ", first.batch->id, ": ", r.error().message);
            std::string why = cat(transports[g.transport]->name(), ": ", r.error().message);
            for (auto &x : g.ops) {
                auto &op = *reinterpret_cast<OpRecord *>(x.user_data);
                if (!fail_over(op, g.transport, r.error().code, why)) complete(op, r.error().code, r.error().message);
            }
        }
    }
    if (!posting.staged.empty()) stage_post(posting.staged);  // GPU copies are started here, never waited for
}

}  // namespace ferry
