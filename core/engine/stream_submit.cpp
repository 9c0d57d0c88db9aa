// Batches ordered on a CUDA stream (Engine::submit_on_stream; Mooncake's transfer_*_on_cuda):
// the batch is checked at the call, and a host function enqueued on the caller's stream
// (cuLaunchHostFunc) releases it once the work queued before it is done. CUDA forbids CUDA calls
// inside a host function, and posting a batch may make them (staged copies, cuda_ipc), so the
// host function only hands its call to the engine's stream worker thread and blocks until the
// worker has posted the batch and seen every op end; the stream's later work waits meanwhile.
//
// Lifetimes: each host function holds its StreamCall, and each call the StreamHub, so a host
// function that runs after the engine is gone finds its call cancelled in the hub and returns
// without touching the engine. Teardown cancels what no stream reached or the worker did not
// post yet, stops the worker, and releases the posted calls' host functions only once the
// transports are down, so no byte of theirs moves after their streams went on.
#include <algorithm>
#include <cerrno>

#include "engine/engine_impl.hpp"
#include "util/log.hpp"

namespace ferry {
namespace {

using State = StreamCall::State;

// The host function: runs on the CUDA driver's thread, so it calls nothing of CUDA.
void stream_reached(void *user) {
    std::unique_ptr<std::shared_ptr<StreamCall>> held(static_cast<std::shared_ptr<StreamCall> *>(user));
    StreamCall &call = **held;
    StreamHub &hub = *call.hub;
    std::unique_lock lock(hub.mutex);
    if (call.state != State::Enqueued) return;  // cancelled: the engine is gone or going
    call.state = State::Reached;
    hub.queue.push_back(*held);
    hub.arrivals.fetch_add(1);
    hub.cv.notify_all();
    // The engine is alive: teardown cancels every call (above) under this mutex before it goes.
    hub.engine->wake_progress();
    hub.cv.wait(lock, [&] { return call.state == State::Ended || call.state == State::Cancelled; });
}

void forget(StreamHub &hub, const StreamCall &call) {
    auto it = std::find_if(hub.live.begin(), hub.live.end(), [&](const auto &c) { return c.get() == &call; });
    if (it != hub.live.end()) hub.live.erase(it);
}

}  // namespace

Result<BatchId> Engine::Impl::submit_on_stream(std::span<const Request> requests, void *stream, bool detach) {
    std::string why;
    GpuStager *cuda = stager(FERRY_MEM_CUDA, why);
    if (!cuda)
        return fail(-ENODEV, cat("submit_on_stream needs the CUDA driver (libcuda.so.1) to order the batch on a CUDA "
                                 "stream, and it did not load: ",
                                 why, "; on a host without one, use submit"));
    auto batch = prepare_batch(requests);
    if (!batch) return std::unexpected(batch.error());
    BatchId id = (*batch)->id;
    auto call = std::make_shared<StreamCall>();
    call->hub = stream_hub;
    call->batch = *batch;
    call->requests.assign(requests.begin(), requests.end());
    call->detached = detach;
    StreamHub &hub = *stream_hub;
    {
        std::lock_guard lock(hub.mutex);
        hub.engine = this;
        hub.live.push_back(call);
        if (!stream_worker.joinable()) stream_worker = std::thread([this] { stream_loop(); });
    }
    // The host function's own hold on the call, dropped when it returns. No lock is held across
    // the launch: a driver may run the host function before cuLaunchHostFunc returns.
    auto *held = new std::shared_ptr<StreamCall>(call);
    if (auto r = cuda->launch_host_func(stream, &stream_reached, held); !r) {
        delete held;
        {
            std::lock_guard lock(hub.mutex);
            call->state = State::Cancelled;
            call->batch.reset();
            forget(hub, *call);
        }
        {
            std::lock_guard lock(batches_mutex);
            batches.erase(id);
        }
        return fail(r.error().code, cat("submit_on_stream: ", r.error().message, "; nothing was enqueued"));
    }
    return id;
}

void Engine::Impl::stream_loop() {
    StreamHub &hub = *stream_hub;
    std::vector<std::shared_ptr<StreamCall>> posted;  // driven until their batches end
    for (;;) {
        std::deque<std::shared_ptr<StreamCall>> reached;
        uint64_t seen = 0;
        {
            std::unique_lock lock(hub.mutex);
            if (posted.empty()) hub.cv.wait(lock, [&] { return hub.stopped.load() || !hub.queue.empty(); });
            // Stopping: what is posted stays blocked on its stream until release_stream_calls.
            if (hub.stopped.load()) return;
            reached.swap(hub.queue);
            for (auto &c : reached) c->state = State::Posted;
            seen = hub.arrivals.load();
        }
        for (auto &c : reached) {
            start_batch(*c->batch, c->requests);
            posted.push_back(std::move(c));
        }

        auto ended = [](const std::shared_ptr<StreamCall> &c) {
            return c->batch->remaining.load(std::memory_order_acquire) == 0;
        };
        auto done = std::stable_partition(posted.begin(), posted.end(), [&](const auto &c) { return !ended(c); });
        for (auto it = done; it != posted.end(); ++it) {
            StreamCall &c = **it;
            if (auto outcome = batch_failures(*c.batch); !outcome)
                FERRY_WARN("batch ", c.batch->id,
                           " (ordered on a CUDA stream) failed; the stream goes on: ", outcome.error().message);
            if (c.detached) {
                std::lock_guard lock(batches_mutex);
                batches.erase(c.batch->id);
            }
            std::lock_guard lock(hub.mutex);
            c.state = State::Ended;
            c.batch.reset();
            forget(hub, c);
            hub.cv.notify_all();
        }
        posted.erase(done, posted.end());
        if (posted.empty()) continue;
        // Until a posted batch ends, another call is queued, or the engine stops.
        progress_until(
            [&] {
                return hub.stopped.load() || hub.arrivals.load() != seen ||
                       std::any_of(posted.begin(), posted.end(), ended);
            },
            std::chrono::steady_clock::now() + std::chrono::seconds(1));
    }
}

void Engine::Impl::stop_stream_calls() {
    StreamHub &hub = *stream_hub;
    size_t cancelled = 0;
    {
        std::lock_guard lock(hub.mutex);
        hub.stopped = true;
        hub.engine = nullptr;
        hub.queue.clear();
        for (auto it = hub.live.begin(); it != hub.live.end();) {
            StreamCall &c = **it;
            if (c.state != State::Enqueued && c.state != State::Reached) {
                ++it;
                continue;
            }
            c.state = State::Cancelled;
            c.batch.reset();
            it = hub.live.erase(it);
            ++cancelled;
        }
        hub.cv.notify_all();
    }
    wake_progress();
    if (stream_worker.joinable()) stream_worker.join();
    if (cancelled)
        FERRY_WARN("engine destroyed with ", cancelled,
                   " batch(es) ordered on CUDA streams that were not posted yet: cancelled; their streams go on "
                   "without them");
}

void Engine::Impl::release_stream_calls() {
    StreamHub &hub = *stream_hub;
    std::lock_guard lock(hub.mutex);
    for (auto &c : hub.live) {
        c->state = State::Cancelled;
        c->batch.reset();
    }
    hub.live.clear();
    hub.cv.notify_all();
}

}  // namespace ferry
