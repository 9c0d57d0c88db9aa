// Batches: progress, completion and waiting (submit.cpp plans and posts them).
#include <poll.h>
#include <sys/eventfd.h>

#include <cerrno>
#include <cinttypes>
#include <cstdio>
#include <cstring>

#include "engine/engine_impl.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

// An op's user_data points at its OpRecord, so no table lookup per completion; the batch
// stays alive until free_batch, which refuses while ops are in flight.
constexpr size_t kPollChunk = 64;

// wait()'s error for a finished batch: how many ops failed and the first few, bounded.
constexpr size_t kFailuresShown = 3;
constexpr size_t kFailureMessageMax = 240;
// The first failure gives the code and usually the reason (a connect's error, found off the
// submit path, names the transport, the peer and the fix), so it is cut only much later.
constexpr size_t kFirstFailureMessageMax = 1024;

// The engine whose progress this thread drives (progress_until), if any: a batch it finishes itself
// needs no wake-up through wake_fd (that write would only make its next poll() return at once).
thread_local const void *driving_engine = nullptr;

}  // namespace

Result<void> batch_failures(const Batch &batch) {
    size_t failed = 0;
    int code = 0;
    std::string shown;
    for (size_t i = 0; i < batch.size; ++i) {
        const auto &op = batch.ops[i];
        if (op.state.load(std::memory_order_acquire) != static_cast<uint32_t>(OpState::Failed)) continue;
        if (++failed == 1) code = op.code;
        if (failed > kFailuresShown) continue;
        size_t max = failed == 1 ? kFirstFailureMessageMax : kFailureMessageMax;
        std::string why = op.message.size() > max ? op.message.substr(0, max) + "..." : op.message;
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

namespace {

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

}  // namespace

std::shared_ptr<Batch> Engine::Impl::find_batch(BatchId id) {
    std::lock_guard lock(batches_mutex);
    auto it = batches.find(id);
    return it == batches.end() ? nullptr : it->second;
}

void Engine::Impl::complete(OpRecord &op, int code, std::string_view message) {
    if (!finish(op, code, message)) return;
    counters_of(op.transport.load(std::memory_order_relaxed))
        .of(op.opcode)
        .record(1, code != 0, code != 0 ? 0 : op.length, std::chrono::steady_clock::now() - op.batch->submitted);
    release_share(*op.batch);
}

bool Engine::Impl::finish(OpRecord &op, int code, std::string_view message) {
    if (op.state.load(std::memory_order_relaxed) != static_cast<uint32_t>(OpState::Pending)) {
        auto t = op.transport.load(std::memory_order_relaxed);
        FERRY_ERROR("transport ", t == kNoTransport ? "(none)" : transports[t]->name(),
                    " completed an op twice; ignored");
        return false;
    }
    if (code != 0) {
        op.code = code < 0 ? code : -code;
        // kWaitPending means "the wait timed out" to wait()'s callers; an op never reports it.
        if (op.code == kWaitPending) op.code = -EIO;
        op.message = message.empty() ? std::string(strerror(-op.code)) : std::string(message);
        // Failed over before: the error names every attempt (failover.cpp); when no other path
        // took the op (it failed before being posted again) its code is the path's failure.
        if (!op.history.empty()) {
            op.message = cat(op.history, "; last attempt: ", op.message);
            if (op.transport.load(std::memory_order_relaxed) == kNoTransport) op.code = op.path_code;
        }
    }
    op.state.store(static_cast<uint32_t>(code == 0 ? OpState::Done : OpState::Failed), std::memory_order_release);
    return true;
}

void Engine::Impl::release_share(Batch &batch, size_t n) {
    size_t after = batch.remaining.fetch_sub(n, std::memory_order_acq_rel) - n;
    // Only the notification's share left: every op's state is visible here (acq_rel).
    if (after == 1 && batch.notification) {
        batch_ops_finished(batch);
        return;
    }
    if (after == 0) wake_progress();
}

void Engine::Impl::wake_progress() {
    std::lock_guard lock(progress_mutex);
    if (progress_driver && driving_engine != this) {
        uint64_t one = 1;
        [[maybe_unused]] auto n = ::write(wake_fd.get(), &one, sizeof one);
    }
    progress_cv.notify_all();
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
        if (*n == 0) return total;  // the common case of a progress loop: no clock read
        // The ops of one batch that finished in a row release their shares at once, and are
        // counted at once (transfer_stats.hpp): a few atomic updates per run instead of per op.
        Batch *run_batch = nullptr;
        size_t run = 0;
        uint64_t ended[2] = {}, failed[2] = {}, moved[2] = {};  // by opcode
        const auto now = std::chrono::steady_clock::now();
        auto release_run = [&] {
            if (!run) return;
            for (int k = 0; k < 2; ++k)
                if (ended[k]) counters[t]->by_op[k].record(ended[k], failed[k], moved[k], now - run_batch->submitted);
            ended[0] = ended[1] = failed[0] = failed[1] = moved[0] = moved[1] = 0;
            release_share(*run_batch, run);
            run = 0;
        };
        for (size_t i = 0; i < *n; ++i) {
            out[i].message[sizeof out[i].message - 1] = '\0';
            if (out[i].user_data & 2) {  // a pack's gather or scatter (staging_gather.cpp)
                pack_copied(*reinterpret_cast<StagedPack *>(out[i].user_data & ~uint64_t{3}), out[i].status,
                            out[i].status ? cat(transports[t]->name(), ": ", out[i].message) : std::string());
                continue;
            }
            if (out[i].user_data & 1) {  // one slice of a staged GPU op (staging.cpp)
                auto &slice = *reinterpret_cast<StagedSlice *>(out[i].user_data & ~uint64_t{1});
                stage_wire_done(slice, out[i].status,
                                out[i].status ? cat(transports[t]->name(), ": ", out[i].message) : std::string());
                continue;
            }
            auto &op = *reinterpret_cast<OpRecord *>(out[i].user_data);
            if (op.batch != run_batch) release_run(), run_batch = op.batch;
            // A broken path: the op may be posted again on another one (failover.cpp).
            if (out[i].status != 0 && fail_over(op, t, out[i].status, cat(transports[t]->name(), ": ", out[i].message)))
                continue;
            bool finished = out[i].status == 0
                                ? finish(op, 0, {})
                                : finish(op, out[i].status, cat(transports[t]->name(), ": ", out[i].message));
            if (!finished) continue;
            ++run;
            const int k = op.opcode == Opcode::Read ? 0 : 1;
            const uint64_t ops = run_batch->pairs ? run_batch->pairs : 1;  // a block transfer counts its pairs
            ended[k] += ops;
            if (out[i].status == 0) moved[k] += op.length;
            else failed[k] += ops;
        }
        release_run();
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
    if (!progress_until([&] { return batch->remaining.load(std::memory_order_acquire) == 0; }, deadline))
        return fail(kWaitPending, still_pending(*batch, timeout));
    if (auto failed = batch_failures(*batch); !failed) return failed;
    if (auto &n = batch->notification; n && n->code != 0)
        return fail(n->code,
                    cat("wait: all ", batch->size, " ops of batch ", id, " succeeded, but its notification to segment ",
                        n->segment->name, " was not delivered: ", n->error));
    return {};
}

bool Engine::Impl::progress_until(const std::function<bool()> &done, std::chrono::steady_clock::time_point deadline) {
    std::unique_lock lock(progress_mutex);
    while (!done()) {
        auto now = std::chrono::steady_clock::now();
        if (now >= deadline) return false;
        auto slice = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - now).count();
        int slice_ms = static_cast<int>(std::clamp<int64_t>(slice, 1, 100));
        if (!progress_driver) {
            progress_driver = true;
            lock.unlock();
            driving_engine = this;
            progress(slice_ms);
            driving_engine = nullptr;
            lock.lock();
            progress_driver = false;
            progress_cv.notify_all();
        } else {
            progress_cv.wait_for(lock, std::chrono::milliseconds(slice_ms));
        }
    }
    return true;
}

}  // namespace ferry
