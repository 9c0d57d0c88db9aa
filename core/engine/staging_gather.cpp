// Small staged GPU ops share pinned slices. A KV cache moves many blocks of 16 KiB-1 MiB; staged
// one slice each, every block costs a whole slice of the pinned bound, a GPU copy call, an
// event and a wire submit. Instead, the small ops of one submit to one (transport, peer) are
// packed into slices (StagedPack):
//   WRITE: one gather (GPU -> the slice's parts) -> one wire submit of the parts -> each op ends
//   READ:  one wire submit into the slice's parts -> one scatter (parts -> GPU) -> each op ends
// The gather and scatter are one copy_local call on a GPU transport that offers it (cuda_ipc.so
// and hip_ipc.so: one copy-kernel launch), else the staging runtime's copies behind one event.
// Each op still ends on its own: an op whose wire transfer failed is never scattered, so no
// byte of it lands after it was reported.
#include <algorithm>
#include <cerrno>
#include <map>
#include <tuple>

#include "engine/engine_impl.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

// Parts start on this boundary, so the copy kernel moves them with aligned 16-byte loads.
constexpr uint64_t kPartAlign = 256;

uint64_t align_up(uint64_t v) { return (v + kPartAlign - 1) & ~(kPartAlign - 1); }

// An op of a pack that never got its part of a slice ends with the pack's failure.
void end_unstarted(Engine::Impl &im, const std::shared_ptr<StagedOp> &op, int code, const std::string &why) {
    {
        std::lock_guard lock(op->mutex);
        if (op->code == 0) {
            op->code = code;
            op->message = why;
        }
        --op->in_flight;
    }
    im.stage_start(op);  // nothing in flight: it completes
}

// The wire transfer of each part of a lent pack: user_data is the part's slice (bit 0 set).
std::vector<ferry_xfer_op_t> wire_ops(const StagedPack &p, uint32_t opcode) {
    std::vector<ferry_xfer_op_t> x(p.slices.size());
    for (size_t i = 0; i < x.size(); ++i) {
        const StagedOp &op = *p.ops[i];
        x[i] = {opcode,        0,         reinterpret_cast<uintptr_t>(p.slices[i]->buf), p.handle, op.remote_addr,
                op.remote_mem, op.length, reinterpret_cast<uintptr_t>(p.slices[i]) | 1};
    }
    return x;
}

}  // namespace

void Engine::Impl::stage_post(std::vector<std::shared_ptr<StagedOp>> &ops) {
    const uint64_t max_op = settings.gather_max_op_bytes();
    const uint64_t slice = staging->slice_bytes();
    std::vector<std::shared_ptr<StagedOp>> alone;
    std::map<std::tuple<size_t, uint64_t, uint32_t, int, bool>, std::vector<std::shared_ptr<StagedOp>>> groups;
    for (auto &op : ops) {
        if (max_op == 0 || op->length > max_op) alone.push_back(op);
        else groups[{op->transport, op->peer, op->kind, op->device, op->read}].push_back(op);
    }
    std::vector<std::shared_ptr<StagedPack>> packs;
    for (auto &[key, members] : groups) {
        if (members.size() < 2) {
            alone.push_back(members.front());
            continue;
        }
        std::shared_ptr<StagedPack> pack;
        uint64_t used = 0;
        for (auto &op : members) {
            if (!pack || align_up(used) + op->length > slice) {
                pack = packs.emplace_back(std::make_shared<StagedPack>());
                std::tie(pack->transport, pack->peer, pack->kind, pack->device, pack->read) = key;
                used = 0;
            }
            {
                // The op's one slice is its part of the pack's: stage_start never lends it one.
                std::lock_guard lock(op->mutex);
                op->next = op->length;
                op->in_flight = 1;
            }
            used = align_up(used);
            pack->ops.push_back(op);
            pack->offsets.push_back(used);
            used += op->length;
        }
    }
    for (auto &op : alone) stage_start(op);
    for (auto &pack : packs) pack_start(pack);
}

bool Engine::Impl::pack_start(const std::shared_ptr<StagedPack> &keep) {
    StagedPack &p = *keep;
    Result<void *> buf = fail(-ECANCELED, "the engine is shutting down");
    if (!stopping.load()) {
        // Acquire and queue atomically against release's retry, so no release is missed.
        std::lock_guard wl(staging_waiters_mutex);
        buf = staging->acquire(p.kind, p.device);
        if (!buf && buf.error().code == -EAGAIN) {
            staging_waiters.push_back(keep);
            return true;
        }
    }
    Result<uint64_t> handle = buf ? slice_handle(*buf, p.transport) : std::unexpected(buf.error());
    if (!handle) {
        if (buf) staging->release(*buf);
        const std::string why = buf ? "staging GPU memory: " + handle.error().message : handle.error().message;
        for (auto &op : p.ops) end_unstarted(*this, op, handle.error().code, why);
        return false;
    }
    p.buf = *buf;
    p.handle = *handle;
    const size_t n = p.ops.size();
    p.live.store(n);
    p.slices.resize(n);
    for (size_t i = 0; i < n; ++i) {
        StagedOp &op = *p.ops[i];
        std::lock_guard lock(op.mutex);
        op.slices.push_back(
            StagedSlice{p.ops[i], static_cast<char *>(p.buf) + p.offsets[i], p.handle, 0, op.length, keep});
        p.slices[i] = &op.slices.back();
    }
    if (!p.read) {
        std::vector<ferry_local_copy_t> copies(n);
        for (size_t i = 0; i < n; ++i)
            copies[i] = {reinterpret_cast<uintptr_t>(p.slices[i]->buf), reinterpret_cast<uintptr_t>(p.ops[i]->gpu),
                         p.ops[i]->length};
        p.copied = [this, keep](int status, std::string message) { pack_gathered(keep, status, message); };
        pack_copy(keep, std::move(copies));
        return true;
    }
    {
        std::lock_guard lock(p.mutex);
        p.wire_left = n;
    }
    auto x = wire_ops(p, FERRY_OP_READ);
    if (auto r = transports[p.transport]->submit(p.peer, x); !r)
        for (StagedSlice *s : p.slices) stage_wire_done(*s, r.error().code, r.error().message);
    return true;
}

void Engine::Impl::pack_gathered(const std::shared_ptr<StagedPack> &keep, int status, const std::string &message) {
    StagedPack &p = *keep;
    std::string why = status ? "staging GPU memory: " + message : std::string();
    if (status == 0 && stopping.load()) {
        status = -ECANCELED;
        why = "the engine is shutting down";
    }
    if (status == 0) {
        // Copied out of the GPU: every part goes on the wire in one submit.
        auto x = wire_ops(p, FERRY_OP_WRITE);
        auto r = transports[p.transport]->submit(p.peer, x);
        if (r) return;
        status = r.error().code;
        why = r.error().message;
    }
    for (StagedSlice *s : p.slices) stage_wire_done(*s, status, why);
}

void Engine::Impl::pack_wire_done(StagedSlice &slice, int code, std::string_view message) {
    std::shared_ptr<StagedPack> keep = slice.pack;  // the slice may go away below
    StagedPack &p = *keep;
    if (code == 0) {
        StagedOp &op = *slice.op;
        std::lock_guard lock(op.mutex);
        if (op.code != 0 || stopping.load()) code = op.code ? op.code : -ECANCELED;
    }
    std::vector<StagedSlice *> landed;
    bool last = false;
    {
        std::lock_guard lock(p.mutex);
        if (code == 0) p.landed.push_back(&slice);
        last = --p.wire_left == 0;
        if (last) landed.swap(p.landed);
    }
    if (code != 0) stage_slice_over(slice, code, message);  // its bytes never reach the GPU
    if (!last || landed.empty()) return;
    std::vector<ferry_local_copy_t> copies(landed.size());
    for (size_t i = 0; i < landed.size(); ++i)
        copies[i] = {reinterpret_cast<uintptr_t>(landed[i]->op->gpu), reinterpret_cast<uintptr_t>(landed[i]->buf),
                     landed[i]->length};
    p.copied = [this, landed](int status, std::string why) {
        for (StagedSlice *s : landed)
            stage_slice_over(*s, status, status ? "staging GPU memory: " + why : std::string());
    };
    pack_copy(keep, std::move(copies));
}

std::optional<size_t> Engine::Impl::gather_transport_for(uint32_t kind) {
    std::lock_guard lock(gather_mutex);
    if (auto it = gather_transport.find(kind); it != gather_transport.end()) return it->second;
    std::optional<size_t> found;
    for (size_t t = 0; t < transports.size() && !found; ++t)
        if (transports[t]->has_copy_local() && transports[t]->moves(kind)) found = t;
    gather_transport[kind] = found;
    return found;
}

void Engine::Impl::pack_copied(StagedPack &pack, int status, const std::string &message) {
    // Moved out first: the function holds the pack, which holds the function.
    auto copied = std::move(pack.copied);
    pack.copied = nullptr;
    copied(status, message);
}

void Engine::Impl::pack_copy(const std::shared_ptr<StagedPack> &keep, std::vector<ferry_local_copy_t> copies) {
    StagedPack &p = *keep;
    if (auto g = gather_transport_for(p.kind)) {
        auto r = transports[*g]->copy_local(p.device, copies, reinterpret_cast<uintptr_t>(&p) | 2);
        if (r) {
            staging->count_gather(copies.size(), true);
            return;  // pack_copied runs when its completion is drained
        }
        // Nothing of it started (copy_local is all-or-nothing): the staging runtime copies
        // this pack, and every later one.
        FERRY_WARN("GPU staging: ", r.error().message,
                   "; packs of small GPU ops are copied one runtime call each from now on");
        std::lock_guard lock(gather_mutex);
        gather_transport[p.kind] = std::nullopt;
    }
    staging->count_gather(copies.size(), false);
    auto r = staging->copy(p.kind, p.device, copies,
                           [keep](int status, const std::string &message) { pack_copied(*keep, status, message); });
    if (!r) pack_copied(p, r.error().code, r.error().message);
}

}  // namespace ferry
