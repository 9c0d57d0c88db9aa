// Batches ordered on a CUDA stream (Engine::submit_on_stream, stream_submit.cpp): what the
// engine shares with the host functions it enqueued on callers' streams.
#pragma once

#include <atomic>
#include <condition_variable>
#include <deque>
#include <memory>
#include <mutex>
#include <vector>

#include "ferry/engine.hpp"

namespace ferry {

struct Batch;
struct StreamCall;

// Shared by the engine and every StreamCall, so it outlives the engine while a stream still holds
// a host function that has not run: that host function then finds its call cancelled here and
// returns without touching the engine.
struct StreamHub {
    std::mutex mutex;                               // guards everything below but `stopped`'s reads
    std::condition_variable cv;                     // a call's state changed, a call was queued, or stop
    Engine::Impl *engine = nullptr;                 // null once the engine is being destroyed
    std::atomic<bool> stopped{false};               // written under mutex; read by the worker without it
    std::atomic<uint64_t> arrivals{0};              // calls queued so far, so the worker notices new ones
    std::deque<std::shared_ptr<StreamCall>> queue;  // reached by their stream, not yet posted
    std::vector<std::shared_ptr<StreamCall>> live;  // not yet ended: cancelled at teardown
};

struct StreamCall {
    // Enqueued: on the stream, its host function not run yet. Reached: the host function runs
    // and waits (queued for the worker). Posted: the worker posted the batch and drives it.
    // Ended: every op ended. Cancelled: the engine is being destroyed. The host function returns
    // on Ended and Cancelled; a host function that starts on a call not Enqueued returns at once.
    enum class State { Enqueued, Reached, Posted, Ended, Cancelled };
    std::shared_ptr<StreamHub> hub;
    std::shared_ptr<Batch> batch;  // dropped when it ends or is cancelled
    std::vector<Request> requests;
    bool detached = false;          // StreamBatch::Detach: freed once it ended
    State state = State::Enqueued;  // guarded by hub->mutex
};

}  // namespace ferry
