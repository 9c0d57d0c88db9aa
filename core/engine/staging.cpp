// The initiator's GPU staging pipeline: a GPU op on a transport that moves host memory only is
// cut into slices of gpu_staging_slice_bytes, each moved through a pinned buffer lent by the
// StagingService (stage_service.hpp), several slices of one op in flight at once:
//   WRITE: GPU -> pinned (async copy) -> transport WRITE -> slice done
//   READ:  transport READ -> pinned -> GPU (async copy) -> slice done
// submit only starts this; no GPU copy is waited for on the submit path. When every pinned
// slice is lent out, the op waits in staging_waiters and resumes when one is given back.
#include <cerrno>

#include "engine/engine_impl.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

// Slices of one op in flight at once: enough to overlap the copy of one with the wire
// transfer of the previous, few enough that concurrent ops share the pinned memory.
constexpr unsigned kSlicesPerOp = 4;

}  // namespace

GpuStager *Engine::Impl::stager(uint32_t kind, std::string &why) { return staging->stager(kind, why); }

Result<uint64_t> Engine::Impl::slice_handle(void *buf, size_t transport) {
    std::lock_guard lock(slice_handles_mutex);
    auto key = std::make_pair(buf, transport);
    if (auto it = slice_handles.find(key); it != slice_handles.end()) return it->second;
    ferry_mem_region_t region{reinterpret_cast<uintptr_t>(buf), staging->slice_bytes(), FERRY_MEM_HOST, -1, 0, 0};
    auto h = transports[transport]->register_mem(region);
    if (!h) return std::unexpected(h.error());
    slice_handles.emplace(key, *h);
    return *h;
}

void Engine::Impl::stage_retry_waiters() {
    // First come, first served: the oldest waiter gets the slice given back; one that no longer
    // needs it (it failed meanwhile) passes it on to the next.
    for (;;) {
        StagingWaiter next;
        {
            std::lock_guard lock(staging_waiters_mutex);
            if (staging_waiters.empty()) return;
            next = std::move(staging_waiters.front());
            staging_waiters.pop_front();
        }
        if (auto *op = std::get_if<std::shared_ptr<StagedOp>>(&next)) {
            if (stage_start(*op)) return;
        } else if (pack_start(std::get<1>(next))) {
            return;
        }
    }
}

bool Engine::Impl::stage_start(const std::shared_ptr<StagedOp> &keep) {
    StagedOp &op = *keep;
    std::vector<StagedSlice *> started;
    void *unused = nullptr;
    bool finish = false, waiting = false;
    {
        std::lock_guard lock(op.mutex);
        if (op.finished) return false;
        op.waiting = false;
        while (op.code == 0 && !stopping.load() && op.next < op.length && op.in_flight < kSlicesPerOp) {
            Result<void *> buf = fail(-EAGAIN, "");
            {
                // Acquire and queue atomically against release's retry, so no release is missed.
                std::lock_guard wl(staging_waiters_mutex);
                buf = staging->acquire(op.kind, op.device);
                if (!buf && buf.error().code == -EAGAIN) {
                    op.waiting = true;
                    staging_waiters.push_back(keep);
                    break;
                }
            }
            if (!buf) {
                op.code = buf.error().code;
                op.message = buf.error().message;
                break;
            }
            auto handle = slice_handle(*buf, op.transport);
            if (!handle) {
                op.code = handle.error().code;
                op.message = "staging GPU memory: " + handle.error().message;
                unused = *buf;  // given back below, outside the op's lock
                break;
            }
            uint64_t len = std::min(staging->slice_bytes(), op.length - op.next);
            op.slices.push_back(StagedSlice{keep, *buf, *handle, op.next, len, nullptr});
            started.push_back(&op.slices.back());
            op.next += len;
            ++op.in_flight;
        }
        finish = !op.waiting && !op.finished && op.in_flight == 0 &&
                 (op.code != 0 || op.done == op.length || stopping.load());
        if (finish) op.finished = true;
        waiting = op.waiting;
    }
    if (unused) staging->release(unused);
    if (finish) {
        if (op.code == 0 && op.done != op.length) {  // stopping before every slice moved
            op.code = -ECANCELED;
            op.message = "the engine is shutting down";
        }
        // A broken path: every slice has ended, so the op may be posted again on another one
        // (failover.cpp); else it ends here.
        if (op.code != 0 && fail_over(*op.record, op.transport, op.code, op.message)) return false;
        complete(*op.record, op.code, op.message);
        return false;
    }
    bool took = !started.empty() || waiting;  // the slice given back is used, or all are lent again
    for (StagedSlice *s : started) {
        if (!op.read) {
            auto r = staging->copy(op.kind, op.device, s->buf, op.gpu + s->offset, s->length,
                                   [this, s](int status, const std::string &message) {
                                       if (status == 0) {
                                           // Copied out of the GPU: put it on the wire.
                                           StagedOp &o = *s->op;
                                           {
                                               std::lock_guard lock(o.mutex);
                                               if (o.code != 0 || stopping.load())
                                                   status = o.code ? o.code : -ECANCELED;
                                           }
                                           if (status == 0) {
                                               ferry_xfer_op_t x{FERRY_OP_WRITE,
                                                                 0,
                                                                 reinterpret_cast<uintptr_t>(s->buf),
                                                                 s->handle,
                                                                 o.remote_addr + s->offset,
                                                                 o.remote_mem,
                                                                 s->length,
                                                                 reinterpret_cast<uintptr_t>(s) | 1};
                                               auto r2 = transports[o.transport]->submit(o.peer, std::span(&x, 1));
                                               if (r2) return;
                                               stage_wire_done(*s, r2.error().code, r2.error().message);
                                               return;
                                           }
                                           stage_wire_done(*s, status, "");
                                           return;
                                       }
                                       stage_wire_done(*s, status, "staging GPU memory: " + message);
                                   });
            if (!r) stage_wire_done(*s, r.error().code, "staging GPU memory: " + r.error().message);
        } else {
            ferry_xfer_op_t x{
                FERRY_OP_READ, 0,         reinterpret_cast<uintptr_t>(s->buf), s->handle, op.remote_addr + s->offset,
                op.remote_mem, s->length, reinterpret_cast<uintptr_t>(s) | 1};
            if (auto r = transports[op.transport]->submit(op.peer, std::span(&x, 1)); !r)
                stage_wire_done(*s, r.error().code, r.error().message);
        }
    }
    return took;
}

// A slice's wire transfer ended (or, for a WRITE, its copy out of the GPU failed).
void Engine::Impl::stage_wire_done(StagedSlice &s, int code, std::string_view message) {
    StagedOp &op = *s.op;
    if (op.read && s.pack) {  // scattered with the rest of its pack
        pack_wire_done(s, code, message);
        return;
    }
    if (code != 0 || !op.read) {
        stage_slice_over(s, code, message);
        return;
    }
    {
        std::lock_guard lock(op.mutex);
        if (op.code != 0 || stopping.load()) code = op.code ? op.code : -ECANCELED;
    }
    if (code != 0) {  // another slice failed: this one's bytes must not reach the GPU
        stage_slice_over(s, code, "");
        return;
    }
    // Received into pinned memory: copy it to the GPU; the slice ends when that copy does.
    auto r = staging->copy(op.kind, op.device, op.gpu + s.offset, s.buf, s.length,
                           [this, &s](int status, const std::string &why) {
                               stage_slice_over(s, status, status ? "staging GPU memory: " + why : std::string());
                           });
    if (!r) stage_slice_over(s, r.error().code, "staging GPU memory: " + r.error().message);
}

void Engine::Impl::stage_slice_over(StagedSlice &s, int status, std::string_view why) {
    std::shared_ptr<StagedOp> keep = s.op;  // the slice goes away below; the op stays
    std::shared_ptr<StagedPack> pack = s.pack;
    void *buf = s.buf;
    StagedOp &op = *keep;
    {
        std::lock_guard lock(op.mutex);
        if (status != 0 && op.code == 0) {
            op.code = status;
            op.message = why.empty() ? strerror(-status) : std::string(why);
        }
        if (status == 0) op.done += s.length;
        --op.in_flight;
        op.slices.remove_if([&](const StagedSlice &x) { return &x == &s; });
    }
    // Wakes the waiting ops.
    if (!pack) staging->release(buf);
    else if (pack->live.fetch_sub(1) == 1) staging->release(pack->buf);
    stage_start(keep);
}

void Engine::Impl::release_staged_ops() {
    // A slice keeps its op alive (StagedSlice::op) until its completion removes it. A slice
    // still in flight when its transport went away gets no completion any more, so the op and
    // its slice would keep each other alive past the engine: drop what is left of them.
    for (auto &[id, batch] : batches)
        for (size_t i = 0; i < batch->size; ++i)
            if (auto &staged = batch->ops[i].staged) {
                std::lock_guard lock(staged->mutex);
                staged->slices.clear();
            }
}

void Engine::Impl::stop_staging() {
    stopping.store(true);
    {
        std::lock_guard lock(staging_waiters_mutex);
        staging_waiters.clear();
    }
    // on_release stays: plugins may give slices back until they are destroyed; with stopping
    // set, a retried op only finishes.
    staging->stop();  // every started copy reports first
    std::lock_guard lock(slice_handles_mutex);
    for (auto &[key, handle] : slice_handles) (void)transports[key.second]->deregister_mem(handle);
    slice_handles.clear();
}

}  // namespace ferry
