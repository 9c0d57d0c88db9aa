// The ferry_plugin_v1 table for a GPU IPC plugin; FERRY_GPU_PLUGIN_NAME and the runtime
// backend linked in decide whether this is cuda_ipc.so or hip_ipc.so.
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <new>
#include <string>

#include "ferry/plugin.h"
#include "ipc_transport.hpp"
#include "option_table.hpp"

#ifndef FERRY_GPU_PLUGIN_NAME
#error "build with -DFERRY_GPU_PLUGIN_NAME=\"cuda_ipc\" or \"hip_ipc\""
#endif

using ferry_gpu::IpcTransport;

struct ferry_transport {
    IpcTransport impl;
};

namespace {

int fail(ferry_error_t *err, int code, const std::string &message) {
    if (err) snprintf(err->message, sizeof err->message, "%s", message.c_str());
    return code;
}

// No C++ exception crosses the ABI.
template <class Fn>
int guard(ferry_error_t *err, Fn &&fn) {
    try {
        return fn();
    } catch (const std::bad_alloc &) {
        return fail(err, -ENOMEM, "out of memory");
    } catch (const std::exception &e) {
        return fail(err, -EIO, e.what());
    }
}

struct Options {
    size_t streams = 4;
};

constexpr auto kOptions = ferry_plugin::make_options<Options>(
    FERRY_GPU_PLUGIN_NAME,
    ferry_plugin::uint_option<Options>("streams", "4", 1, 64, "copy streams per device; ops are spread over them",
                                       ferry_plugin::store<&Options::streams>));

int probe(const ferry_kv_t *, size_t, ferry_probe_result_t *result) {
    try {
        auto rt = ferry_gpu::make_runtime();
        bool available = false;
        std::string reason;
        rt->probe(available, reason);
        result->available = available ? 1 : 0;
        snprintf(result->reason, sizeof result->reason, "%s", reason.c_str());
        return 0;
    } catch (const std::exception &e) {
        result->available = 0;
        snprintf(result->reason, sizeof result->reason, "probe failed: %s", e.what());
        return 0;
    }
}

int create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, ferry_transport_t **out,
           ferry_error_t *err) {
    return guard(err, [&] {
        Options opts;
        if (int rc = kOptions.parse(options, n, opts, err)) return rc;
        const size_t streams = opts.streams;
        auto rt = ferry_gpu::make_runtime();
        bool available = false;
        std::string reason;
        rt->probe(available, reason);
        if (!available) return fail(err, -ENODEV, reason);
        auto *t = new ferry_transport{IpcTransport(std::move(rt), host, FERRY_GPU_PLUGIN_NAME, streams)};
        if (int rc = t->impl.start(err)) {
            delete t;
            return rc;
        }
        *out = t;
        return 0;
    });
}

void destroy(ferry_transport_t *t) { delete t; }

#define FORWARD(call) return guard(err, [&] { return t->impl.call; })

int export_endpoint(ferry_transport_t *t, void *buf, size_t *len, ferry_error_t *err) {
    FORWARD(export_endpoint(buf, len, err));
}
int register_mem(ferry_transport_t *t, const ferry_mem_region_t *r, uint64_t *h, ferry_error_t *err) {
    FORWARD(register_mem(r, h, err));
}
int deregister_mem(ferry_transport_t *t, uint64_t h, ferry_error_t *err) { FORWARD(deregister_mem(h, err)); }
int export_mem(ferry_transport_t *t, uint64_t h, void *buf, size_t *len, ferry_error_t *err) {
    FORWARD(export_mem(h, buf, len, err));
}
int connect(ferry_transport_t *t, const void *ep, size_t len, uint64_t *peer, ferry_error_t *err) {
    FORWARD(connect(ep, len, peer, err));
}
int disconnect(ferry_transport_t *t, uint64_t peer, ferry_error_t *err) { FORWARD(disconnect(peer, err)); }
int import_mem(ferry_transport_t *t, uint64_t peer, const ferry_mem_region_t *r, const void *d, size_t len, uint64_t *h,
               ferry_error_t *err) {
    FORWARD(import_mem(peer, r, d, len, h, err));
}
int release_mem(ferry_transport_t *t, uint64_t peer, uint64_t h, ferry_error_t *err) {
    FORWARD(release_mem(peer, h, err));
}
int submit(ferry_transport_t *t, uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err) {
    FORWARD(submit(peer, ops, n, err));
}
int poll(ferry_transport_t *t, ferry_completion_t *out, size_t max, ferry_error_t *err) { FORWARD(poll(out, max)); }
int completion_fd(ferry_transport_t *t, int *fd, ferry_error_t *) {
    *fd = t->impl.completion_fd();
    return 0;
}

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 = {
    FERRY_PLUGIN_ABI_VERSION,
    sizeof(ferry_plugin_v1_t),
    FERRY_GPU_PLUGIN_NAME,
    FERRY_GPU_PLUGIN_VERSION,
    FERRY_GPU_PLUGIN_CAPS | FERRY_CAP_INTRA_NODE,
    probe,
    create,
    destroy,
    export_endpoint,
    register_mem,
    deregister_mem,
    export_mem,
    connect,
    disconnect,
    import_mem,
    release_mem,
    submit,
    poll,
    completion_fd,
    kOptions.descs(),
    kOptions.size(),
    sizeof(ferry_option_desc_t),
};
