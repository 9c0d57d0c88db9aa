// Batches: planning requests onto transports, progress, completion and waiting.
#include <poll.h>
#include <sys/eventfd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "engine_impl.hpp"
#include "log.hpp"

namespace ferry {
namespace {

// An op's user_data points at its OpRecord, so no table lookup per completion; the batch
// stays alive until free_batch, which refuses while ops are in flight.
constexpr size_t kMaxBatchOps = 1u << 24;
constexpr size_t kPollChunk = 64;
constexpr std::chrono::seconds kRetryUnusable{1};

const char *op_name(Opcode op) { return op == Opcode::Read ? "READ" : "WRITE"; }

// wait()'s error for a finished batch: how many ops failed and the first few, bounded.
constexpr size_t kFailuresShown = 3;
constexpr size_t kFailureMessageMax = 240;

Result<void> failures(const Batch &batch) {
    size_t failed = 0;
    int code = 0;
    std::string shown;
    for (size_t i = 0; i < batch.size; ++i) {
        const auto &op = batch.ops[i];
        if (op.state.load(std::memory_order_acquire) != static_cast<uint32_t>(OpState::Failed)) continue;
        if (++failed == 1) code = op.code;
        if (failed > kFailuresShown) continue;
        std::string why =
            op.message.size() > kFailureMessageMax ? op.message.substr(0, kFailureMessageMax) + "..." : op.message;
        shown +=
            cat(failed == 1 ? "" : "; ", "op ", i, " failed (", op_name(op.opcode), " ", op.length, " bytes): ", why);
    }
    if (failed == 0) return {};
    std::string message = batch.size == 1 ? shown : cat(failed, " of ", batch.size, " ops failed: ", shown);
    if (failed > kFailuresShown)
        message += cat("; and ", failed - kFailuresShown, " more (status() gives each op's error)");
    if (batch.notification) message += "; the batch's notification was not sent";
    return fail(code, std::move(message));
}

std::string still_pending(const Batch &batch, std::chrono::milliseconds timeout) {
    size_t pending = 0;
    for (size_t i = 0; i < batch.size; ++i)
        if (batch.ops[i].state.load(std::memory_order_acquire) == static_cast<uint32_t>(OpState::Pending)) ++pending;
    if (pending == 0 && batch.notification)
        return cat("wait: every op of batch ", batch.id, " finished but its notification to segment ",
                   batch.notification->segment->name, " is still being delivered after ", timeout.count(),
                   " ms; the batch stays valid");
    return cat("wait: batch ", batch.id, " still has ", pending, " of ", batch.size, " ops in flight after ",
               timeout.count(), " ms; the batch stays valid");
}

struct Group {
    size_t transport;
    uint64_t peer;
    std::vector<ferry_xfer_op_t> ops;
};

}  // namespace

std::shared_ptr<Batch> Engine::Impl::find_batch(BatchId id) {
    std::lock_guard lock(batches_mutex);
    auto it = batches.find(id);
    return it == batches.end() ? nullptr : it->second;
}

Result<BatchId> Engine::Impl::submit(std::span<const Request> requests,
                                     std::unique_ptr<PendingNotification> notification) {
    if (requests.empty()) return fail(-EINVAL, "submit: the batch is empty");
    if (requests.size() >= kMaxBatchOps)
        return fail(-E2BIG, cat("submit: ", requests.size(), " ops in one batch; split it below ", kMaxBatchOps));
    auto batch = std::make_shared<Batch>();
    batch->id = next_batch.fetch_add(1);
    batch->size = requests.size();
    batch->ops = std::make_unique<OpRecord[]>(requests.size());
    // Set before any op can complete: the notification holds a share of `remaining`.
    batch->notification = std::move(notification);
    batch->remaining.store(requests.size() + (batch->notification ? 1 : 0), std::memory_order_relaxed);
    for (size_t i = 0; i < requests.size(); ++i) {
        batch->ops[i].opcode = requests[i].opcode;
        batch->ops[i].length = requests[i].length;
    }

    std::vector<Group> groups;
    std::vector<std::shared_ptr<StagedOp>> staged_ops;  // started once the batch is registered
    // A refused batch has taken nothing yet: staged ops start only after planning.
    auto abandon = [&](std::unexpected<Error> e) { return e; };
    {
        std::shared_lock regions_lock(regions_mutex);
        std::shared_ptr<RemoteSegment> seg;
        std::unique_lock<std::mutex> seg_lock;
        std::vector<SegmentId> refreshed;

        for (size_t i = 0; i < requests.size(); ++i) {
            const Request &rq = requests[i];
            auto bad = [&](int code, const std::string &why) {
                return abandon(
                    fail(code, cat("submit: op ", i, " (", op_name(rq.opcode), " ", rq.length, " bytes): ", why)));
            };
            if (rq.opcode != Opcode::Read && rq.opcode != Opcode::Write)
                return bad(-EINVAL, cat("unknown opcode ", static_cast<uint32_t>(rq.opcode)));
            if (rq.length == 0) return bad(-EINVAL, "length is 0");
            uint64_t local = reinterpret_cast<uintptr_t>(rq.local);
            if (local + rq.length < local) return bad(-EINVAL, "local range wraps around");

            auto it = regions.upper_bound(local);
            const LocalRegion *lr = nullptr;
            if (it != regions.begin()) {
                auto &cand = std::prev(it)->second;
                if (local >= cand.addr && local + rq.length <= cand.end()) lr = &cand;
            }
            if (!lr)
                return bad(-EFAULT, cat("local range [", hex(local), ", ", hex(local + rq.length),
                                        ") is not inside one registered region; register the buffer first"));

            if (!seg || seg->id != rq.segment) {
                if (seg_lock.owns_lock()) seg_lock.unlock();
                seg = segment(rq.segment);
                if (!seg) return bad(-ENOENT, cat("segment id ", rq.segment, " is not open; call open_segment first"));
                seg_lock = std::unique_lock(seg->mutex);
                if (seg->stale.exchange(false) &&
                    std::find(refreshed.begin(), refreshed.end(), seg->id) == refreshed.end()) {
                    refreshed.push_back(seg->id);
                    if (auto r = refresh_segment(*seg); !r) return bad(r.error().code, r.error().message);
                }
            }
            const RegionDescriptor *rr = seg->descriptor.find_region(rq.remote, rq.length);
            if (!rr && std::find(refreshed.begin(), refreshed.end(), seg->id) == refreshed.end()) {
                // The peer may have registered this memory after we fetched its descriptor.
                refreshed.push_back(seg->id);
                if (auto r = refresh_segment(*seg); !r) return bad(r.error().code, r.error().message);
                rr = seg->descriptor.find_region(rq.remote, rq.length);
            }
            if (!rr)
                return bad(-EFAULT, cat("remote range [", hex(rq.remote), ", ", hex(rq.remote + rq.length),
                                        ") is not inside one region that segment ", seg->name, " registered"));
            uint32_t need = rq.opcode == Opcode::Read ? kRemoteRead : kRemoteWrite;
            if (!(rr->access & need))
                return bad(-EACCES, cat("segment ", seg->name, " registered [", hex(rr->addr), ", ", hex(rr->end()),
                                        ") without remote ", rq.opcode == Opcode::Read ? "read" : "write", " access"));

            // Transport: the forced one, or the first in priority order both sides can use.
            std::optional<size_t> chosen;
            bool staged = false;
            std::string tried;
            auto consider = [&](size_t t) {
                const auto &tr = transports[t];
                std::string why;
                bool stage = false;
                auto broken = seg->unusable.find(t);
                if (broken != seg->unusable.end() && std::chrono::steady_clock::now() < broken->second.first)
                    why = "connecting failed moments ago: " + broken->second.second;
                else if (!seg->descriptor.endpoint_for(tr->name())) why = "the peer has no such transport";
                else if (!tr->reaches(seg->same_host))
                    why = seg->same_host ? "cannot reach the same host" : "reaches only the same host";
                else if (!rr->key_for(tr->name()))
                    why = rr->kind == FERRY_MEM_HOST
                              ? "the peer did not register the remote region with it"
                              : cat("the remote region is ", rr->kind == FERRY_MEM_CUDA ? "CUDA" : "ROCm",
                                    " memory of device ", rr->device,
                                    ", which it cannot serve (load cuda_ipc for same-host GPU peers, or "
                                    "register the target's GPU memory with staging enabled: gpu_staging_max_bytes > 0, "
                                    "a GPU runtime the target's engine loads, and a transport serving staged device "
                                    "memory such as tcp)");
                else if (!lr->handles[t] || !tr->moves(lr->kind)) {
                    // GPU memory on a host-only transport goes through pinned slices (staging.cpp);
                    // a handle there only serves peers' access to it.
                    std::string no_stager;
                    if (lr->kind != FERRY_MEM_HOST && tr->moves(FERRY_MEM_HOST) && staging->offers(lr->kind, no_stager))
                        stage = true;
                    else why = "cannot move the local memory kind" + (no_stager.empty() ? "" : " (" + no_stager + ")");
                }
                if (why.empty()) {
                    staged = stage;
                    return true;
                }
                tried += cat(tried.empty() ? "" : "; ", tr->name(), ": ", why);
                return false;
            };
            // A transport that cannot connect (a kernel forbidding cross-process access, a peer
            // port unreachable) is skipped for the next one, unless the request forced it.
            std::optional<uint64_t> remote_mem;
            auto usable = [&](size_t t) {
                if (!consider(t)) return false;
                auto m = import_for(*seg, t, *rr);
                if (m) {
                    remote_mem = *m;
                    return true;
                }
                FERRY_WARN("segment ", seg->name, ": ", m.error().message, "; trying the next transport");
                seg->unusable[t] = {std::chrono::steady_clock::now() + kRetryUnusable, m.error().message};
                tried += cat(tried.empty() ? "" : "; ", transports[t]->name(), ": ", m.error().message);
                return false;
            };
            if (!rq.transport.empty()) {
                auto t = transport_index(rq.transport);
                if (!t) return bad(-ENOENT, cat("transport '", rq.transport, "' is not loaded in this engine"));
                seg->unusable.erase(*t);  // forced: always try it again
                if (usable(*t)) chosen = *t;
            } else {
                for (size_t t : priority)
                    if (usable(t)) {
                        chosen = t;
                        break;
                    }
            }
            if (!chosen) return bad(-EHOSTUNREACH, cat("no transport can carry it to ", seg->name, " (", tried, ")"));
            uint64_t peer = *seg->peers[*chosen];

            auto &op = batch->ops[i];
            op.batch = batch.get();
            op.transport = static_cast<uint16_t>(*chosen);
            ferry_xfer_op_t x{};
            x.opcode = rq.opcode == Opcode::Read ? FERRY_OP_READ : FERRY_OP_WRITE;
            x.local_addr = local;
            if (staged) {
                auto st = std::make_shared<StagedOp>();
                st->record = &op;
                st->transport = *chosen;
                st->peer = peer;
                st->remote_addr = rq.remote;
                st->remote_mem = *remote_mem;
                st->kind = lr->kind;
                st->device = lr->device;
                st->gpu = static_cast<char *>(rq.local);
                st->length = rq.length;
                st->read = rq.opcode == Opcode::Read;
                op.staged = st;
                staged_ops.push_back(std::move(st));
                continue;
            }
            x.local_mem = *lr->handles[*chosen];
            x.remote_addr = rq.remote;
            x.remote_mem = *remote_mem;
            x.length = rq.length;
            x.user_data = reinterpret_cast<uintptr_t>(&op);
            auto g = std::find_if(groups.begin(), groups.end(),
                                  [&](const Group &gr) { return gr.transport == *chosen && gr.peer == peer; });
            if (g == groups.end()) {
                groups.push_back({*chosen, peer, {}});
                g = std::prev(groups.end());
            }
            g->ops.push_back(x);
        }
    }

    {
        std::lock_guard lock(batches_mutex);
        batches[batch->id] = batch;
    }
    for (auto &g : groups) {
        if (auto r = transports[g.transport]->submit(g.peer, g.ops); !r) {
            // Other groups may already be moving, so these ops fail one by one instead.
            FERRY_ERROR("batch ", batch->id, ": ", r.error().message);
            for (auto &x : g.ops)
                complete(*reinterpret_cast<OpRecord *>(x.user_data), r.error().code, r.error().message);
        }
    }
    for (auto &st : staged_ops) stage_start(st);  // GPU copies are started here, never waited for
    return batch->id;
}

void Engine::Impl::complete(OpRecord &op, int code, std::string_view message_in) {
    std::string message(message_in);
    if (op.state.load(std::memory_order_relaxed) != static_cast<uint32_t>(OpState::Pending)) {
        FERRY_ERROR("transport ", transports[op.transport]->name(), " completed an op twice; ignored");
        return;
    }
    if (code != 0) {
        op.code = code < 0 ? code : -code;
        // kWaitPending means "the wait timed out" to wait()'s callers; an op never reports it.
        if (op.code == kWaitPending) op.code = -EIO;
        op.message = message.empty() ? strerror(-op.code) : message;
    }
    op.state.store(static_cast<uint32_t>(code == 0 ? OpState::Done : OpState::Failed), std::memory_order_release);
    release_share(*op.batch);
}

void Engine::Impl::release_share(Batch &batch) {
    size_t before = batch.remaining.fetch_sub(1, std::memory_order_acq_rel);
    // Only the notification's share left: every op's state is visible here (acq_rel).
    if (before == 2 && batch.notification) {
        batch_ops_finished(batch);
        return;
    }
    if (before == 1) {
        std::lock_guard lock(progress_mutex);
        if (progress_driver) {
            uint64_t one = 1;
            [[maybe_unused]] auto n = ::write(wake_fd.get(), &one, sizeof one);
        }
        progress_cv.notify_all();
    }
}

size_t Engine::Impl::drain(size_t t) {
    std::unique_lock lock(*poll_mutexes[t], std::try_to_lock);
    if (!lock.owns_lock()) return 0;
    ferry_completion_t out[kPollChunk];
    size_t total = 0;
    for (;;) {
        auto n = transports[t]->poll(out);
        if (!n) {
            FERRY_ERROR(n.error().message);
            return total;
        }
        for (size_t i = 0; i < *n; ++i) {
            out[i].message[sizeof out[i].message - 1] = '\0';
            if (out[i].user_data & 1) {  // one slice of a staged GPU op (staging.cpp)
                auto &slice = *reinterpret_cast<StagedSlice *>(out[i].user_data & ~uint64_t{1});
                stage_wire_done(slice, out[i].status,
                                out[i].status ? cat(transports[t]->name(), ": ", out[i].message) : std::string());
                continue;
            }
            auto &op = *reinterpret_cast<OpRecord *>(out[i].user_data);
            if (out[i].status == 0) complete(op, 0, {});
            else complete(op, out[i].status, cat(transports[t]->name(), ": ", out[i].message));
        }
        total += *n;
        if (*n < kPollChunk) return total;
    }
}

void Engine::Impl::progress(int timeout_ms) {
    if (timeout_ms != 0) {
        std::vector<pollfd> fds;
        bool every_transport_has_fd = true;
        for (auto &t : transports) {
            if (t->completion_fd() >= 0) fds.push_back({t->completion_fd(), POLLIN, 0});
            else every_transport_has_fd = false;
        }
        fds.push_back({wake_fd.get(), POLLIN, 0});
        // Transports without a completion fd are polled every millisecond instead.
        int wait_ms = every_transport_has_fd ? timeout_ms : std::min(timeout_ms, 1);
        if (::poll(fds.data(), fds.size(), wait_ms) > 0 && (fds.back().revents & POLLIN)) {
            uint64_t v;
            [[maybe_unused]] auto n = ::read(wake_fd.get(), &v, sizeof v);
        }
    }
    for (size_t t = 0; t < transports.size(); ++t) drain(t);
}

Result<void> Engine::Impl::wait(BatchId id, std::chrono::milliseconds timeout) {
    auto batch = find_batch(id);
    if (!batch) return fail(-ENOENT, cat("wait: batch ", id, " does not exist (never submitted or already freed)"));
    auto start = std::chrono::steady_clock::now();
    auto deadline = timeout.count() < 0 ? std::chrono::steady_clock::time_point::max() : start + timeout;
    std::unique_lock lock(progress_mutex);
    while (batch->remaining.load(std::memory_order_acquire) > 0) {
        auto now = std::chrono::steady_clock::now();
        if (now >= deadline) return fail(kWaitPending, still_pending(*batch, timeout));
        auto slice = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
        int slice_ms = static_cast<int>(std::clamp<int64_t>(slice, 1, 100));
        if (!progress_driver) {
            progress_driver = true;
            lock.unlock();
            progress(slice_ms);
            lock.lock();
            progress_driver = false;
            progress_cv.notify_all();
        } else {
            progress_cv.wait_for(lock, std::chrono::milliseconds(slice_ms));
        }
    }
    lock.unlock();
    if (auto failed = failures(*batch); !failed) return failed;
    if (auto &n = batch->notification; n && n->code != 0)
        return fail(n->code,
                    cat("wait: all ", batch->size, " ops of batch ", id, " succeeded, but its notification to segment ",
                        n->segment->name, " was not delivered: ", n->error));
    return {};
}

}  // namespace ferry
