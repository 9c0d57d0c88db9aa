// The fake CUDA driver (fake_cuda.cpp): streams (each with its worker thread), host functions in
// stream order, and events.
#include "fake_cuda_state.hpp"

using namespace fake_cuda;

FAKE_API CUresult cuStreamCreate(void **stream, unsigned) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!have_context()) return kInvalidContext;
    auto *s = new Stream;
    s->worker = std::thread([s] { s->run(); });
    *stream = s;
    return kSuccess;
}

FAKE_API CUresult cuStreamSynchronize(void *stream) {
    REFUSED_IN_HOST_FN();
    auto *s = stream_of(stream);
    if (!s) return kSuccess;
    std::unique_lock lock(s->m);
    s->cv.wait(lock, [&] { return s->tasks.empty(); });
    int e = s->pending_error;
    s->pending_error = kSuccess;
    return e;
}

FAKE_API CUresult cuStreamDestroy_v2(void *stream) {
    REFUSED_IN_HOST_FN();
    auto *s = static_cast<Stream *>(stream);
    if (!s) return kInvalidHandle;
    {
        std::lock_guard lock(s->m);
        s->stop = true;
    }
    s->cv.notify_all();
    s->worker.join();
    delete s;
    return kSuccess;
}

FAKE_API CUresult cuStreamGetCtx(void *stream, void **ctx) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!stream_of(stream)) {  // the default streams belong to the current context
        if (!have_context()) return kInvalidContext;
        *ctx = t_contexts.back();
        return kSuccess;
    }
    *ctx = kContext;
    return kSuccess;
}

// In stream order, on the stream's worker; the default streams run it here and now.
FAKE_API CUresult cuLaunchHostFunc(void *stream, HostFn fn, void *user) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!fn) return kInvalidValue;
    Stream *s = stream_of(stream);
    if (!s) {
        if (!have_context()) return kInvalidContext;
        g.host_fns.fetch_add(1);
        run_host_fn(fn, user);
        return kSuccess;
    }
    g.host_fns.fetch_add(1);
    Task t;
    t.host_fn = fn;
    t.user = user;
    std::lock_guard lock(s->m);
    s->tasks.push_back(t);
    s->cv.notify_all();
    return kSuccess;
}

FAKE_API CUresult cuEventCreate(void **event, unsigned) {
    REFUSED_IN_HOST_FN();
    if (!g.initialised) return kNotInitialized;
    if (!have_context()) return kInvalidContext;
    *event = new Event;
    return kSuccess;
}

FAKE_API CUresult cuEventRecord(void *event, void *stream) {
    REFUSED_IN_HOST_FN();
    auto *e = static_cast<Event *>(event);
    auto *s = stream_of(stream);
    if (!e || !s) return kInvalidHandle;
    if (!have_context()) return kInvalidContext;
    Task t;
    t.event = e;
    e->refs.fetch_add(1);  // the queued record's hold
    {
        std::lock_guard el(e->m);
        t.generation = ++e->recorded;
    }
    std::lock_guard lock(s->m);
    s->tasks.push_back(t);
    s->cv.notify_all();
    return kSuccess;
}

FAKE_API CUresult cuEventQuery(void *event) {
    REFUSED_IN_HOST_FN();
    auto *e = static_cast<Event *>(event);
    std::lock_guard lock(e->m);
    if (e->completed < e->recorded) return kNotReady;
    return e->status;
}

FAKE_API CUresult cuEventSynchronize(void *event) {
    REFUSED_IN_HOST_FN();
    auto *e = static_cast<Event *>(event);
    if (!e) return kInvalidHandle;
    std::unique_lock lock(e->m);
    e->cv.wait(lock, [&] { return e->completed >= e->recorded; });
    return e->status;
}

FAKE_API CUresult cuEventDestroy_v2(void *event) {
    REFUSED_IN_HOST_FN();
    if (!event) return kInvalidHandle;
    event_unref(static_cast<Event *>(event));  // a pending record still holds it
    return kSuccess;
}
