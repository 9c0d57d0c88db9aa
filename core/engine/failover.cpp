// Failover: an op that a transport failed because its path broke (a connection reset or
// refused, a stall, a device gone) is posted again on another path to the same segment, the
// next transport in priority order that reaches the peer and moves that memory, through the
// connector (connector.cpp), which connects and imports for it off the completion path. The
// op keeps its share of the batch meanwhile, so wait() sees it in flight and it is reported
// once, at the end; a transport reports an op failed only once none of its bytes can still
// land, so nothing of a failed attempt lands after the op's final report either.
//
// The path that failed is paused: new ops go to other paths until the pause ends, then the
// next op routed to it probes it (and, when that fails too, is itself failed over and the
// pause doubles). Where every path to a segment is paused, a new op is still routed to one of
// them rather than refused; an op being failed over never is (a dead peer's ops end after one
// attempt per path, not in a retry storm).
#include <cerrno>
#include <cstring>

#include "engine/engine_impl.hpp"
#include "util/log.hpp"

namespace ferry {

bool Engine::Impl::fail_over(OpRecord &op, size_t transport, int code, std::string_view message) {
    // A staged GPU op comes here only once every slice of it has ended (staging.cpp), so none of
    // its bytes can still land: it is posted again whole, staged anew if its next path is too.
    if (op.forced || op.attempts >= settings.max_failover_attempts || !ferry_is_path_error(code) ||
        connector_stopping.load(std::memory_order_relaxed))
        return false;
    if (std::chrono::steady_clock::now() - op.batch->submitted >= settings.failover_deadline) return false;
    auto seg = segment(op.segment);
    if (!seg || seg->storage) return false;
    std::string why = message.empty() ? cat(transports[transport]->name(), ": ", strerror(code < 0 ? -code : code))
                                      : std::string(message);
    {
        std::lock_guard lock(seg->mutex);
        // No other transport reaches the peer: nothing to route around, the op ends here with
        // its own error (and the path is not paused: it is the only one).
        if (seg->closed || (seg->reach_mask & ~(uint32_t{1} << transport)) == 0) return false;
        pause_path(*seg, transport, why);
    }
    if (op.attempts == 0) op.path_code = code < 0 ? code : -code;
    counters[transport]->failovers.fetch_add(1, std::memory_order_relaxed);
    ++op.attempts;
    op.history += cat(op.history.empty() ? "" : "; ", "attempt ", unsigned{op.attempts}, ": ", why);
    op.transport.store(kNoTransport, std::memory_order_relaxed);
    op.staged.reset();
    Request rq;
    rq.opcode = op.opcode;
    rq.local = op.local;
    rq.remote = op.remote;
    rq.length = op.length;
    rq.segment = op.segment;
    std::vector<DeferredOp> again;
    again.push_back({&op, static_cast<size_t>(&op - op.batch->ops.get()), std::move(rq), true});
    defer(seg, std::move(again));
    return true;
}

void Engine::Impl::pause_path(RemoteSegment &seg, size_t t, std::string why) {
    const auto now = std::chrono::steady_clock::now();
    auto &pause = seg.paused[t];
    // The ops that were in flight on a path when it broke fail one after another: one pause.
    if (pause.until > now) return;
    auto &strikes = seg.strikes[t];
    if (strikes.count == 0 || now - strikes.last > settings.path_cooldown_max) strikes.count = 0;
    strikes.last = now;
    ++strikes.count;
    auto length = settings.path_cooldown;
    for (unsigned k = 1; k < strikes.count && length < settings.path_cooldown_max; ++k) length *= 2;
    length = std::min(length, settings.path_cooldown_max);
    pause.until = now + length;
    pause.why = std::move(why);
    counters[t]->pauses.fetch_add(1, std::memory_order_relaxed);
    FERRY_WARN("segment ", seg.name, ": path over ", transports[t]->name(), " paused for ", length.count(),
               " ms (failure ", strikes.count, " in a row): ", pause.why,
               "; its ops move to other paths (max_failover_attempts ", settings.max_failover_attempts, ")");
}

}  // namespace ferry
