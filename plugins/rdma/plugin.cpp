// ferry_plugin_v1 entry points of rdma.so: argument checks and the C boundary (no exception
// crosses it). The work is done by ferry_rdma::Transport.
#include "transport.hpp"

#include <ferry/plugin.h>

#include <cerrno>
#include <new>
#include <system_error>

using ferry_rdma::set_error;
using ferry_rdma::Transport;

namespace {

Transport *T(ferry_transport_t *t) { return reinterpret_cast<Transport *>(t); }

template <class F> int guard(ferry_error_t *err, const char *what, F &&fn) {
    try {
        return fn();
    } catch (const std::bad_alloc &) {
        return set_error(err, -ENOMEM, "rdma: %s: out of memory", what);
    } catch (const std::system_error &e) {
        int code = e.code().value();
        return set_error(err, code > 0 ? -code : -EIO, "rdma: %s: %s", what, e.what());
    } catch (const std::exception &e) {
        return set_error(err, -EIO, "rdma: %s: %s", what, e.what());
    } catch (...) {
        return set_error(err, -EIO, "rdma: %s: unknown error", what);
    }
}

#define REQUIRE(cond, what)                                                                     \
    do {                                                                                        \
        if (!(cond))                                                                            \
            return set_error(err, -EINVAL, "rdma: %s: %s", what, #cond " is false");             \
    } while (0)

int rdma_probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result) {
    if (result == nullptr)
        return -EINVAL;
    try {
        return Transport::probe(options, n, result);
    } catch (...) {
        return -ENOMEM;
    }
}

int rdma_create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, ferry_transport_t **out,
               ferry_error_t *err) {
    REQUIRE(out != nullptr, "create");
    REQUIRE(options != nullptr || n == 0, "create");
    return guard(err, "create", [&] {
        Transport *t = nullptr;
        int rc = Transport::create(options, n, host, &t, err);
        if (rc == 0)
            *out = reinterpret_cast<ferry_transport_t *>(t);
        return rc;
    });
}

void rdma_destroy(ferry_transport_t *t) {
    try {
        delete T(t);
    } catch (...) {
    }
}

int rdma_export_endpoint(ferry_transport_t *t, void *buf, size_t *len, ferry_error_t *err) {
    REQUIRE(t != nullptr && len != nullptr && (buf != nullptr || *len == 0), "export_endpoint");
    return guard(err, "export_endpoint", [&] { return T(t)->export_endpoint(buf, len, err); });
}

int rdma_register_mem(ferry_transport_t *t, const ferry_mem_region_t *r, uint64_t *handle, ferry_error_t *err) {
    REQUIRE(t != nullptr && r != nullptr && handle != nullptr, "register_mem");
    return guard(err, "register_mem", [&] { return T(t)->register_mem(r, handle, err); });
}

int rdma_deregister_mem(ferry_transport_t *t, uint64_t handle, ferry_error_t *err) {
    REQUIRE(t != nullptr, "deregister_mem");
    return guard(err, "deregister_mem", [&] { return T(t)->deregister_mem(handle, err); });
}

int rdma_export_mem(ferry_transport_t *t, uint64_t handle, void *buf, size_t *len, ferry_error_t *err) {
    REQUIRE(t != nullptr && len != nullptr && (buf != nullptr || *len == 0), "export_mem");
    return guard(err, "export_mem", [&] { return T(t)->export_mem(handle, buf, len, err); });
}

int rdma_connect(ferry_transport_t *t, const void *ep, size_t len, uint64_t *peer, ferry_error_t *err) {
    REQUIRE(t != nullptr && ep != nullptr && peer != nullptr, "connect");
    return guard(err, "connect", [&] { return T(t)->connect(ep, len, peer, err); });
}

int rdma_disconnect(ferry_transport_t *t, uint64_t peer, ferry_error_t *err) {
    REQUIRE(t != nullptr, "disconnect");
    return guard(err, "disconnect", [&] { return T(t)->disconnect(peer, err); });
}

int rdma_import_mem(ferry_transport_t *t, uint64_t peer, const ferry_mem_region_t *r, const void *desc, size_t len,
                   uint64_t *remote_mem, ferry_error_t *err) {
    REQUIRE(t != nullptr && r != nullptr && remote_mem != nullptr, "import_mem");
    REQUIRE(desc != nullptr || len == 0, "import_mem");
    return guard(err, "import_mem", [&] { return T(t)->import_mem(peer, r, desc, len, remote_mem, err); });
}

int rdma_release_mem(ferry_transport_t *t, uint64_t peer, uint64_t remote_mem, ferry_error_t *err) {
    REQUIRE(t != nullptr, "release_mem");
    return guard(err, "release_mem", [&] { return T(t)->release_mem(peer, remote_mem, err); });
}

int rdma_submit(ferry_transport_t *t, uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err) {
    REQUIRE(t != nullptr && (ops != nullptr || n == 0), "submit");
    if (n == 0)
        return 0;
    return guard(err, "submit", [&] { return T(t)->submit(peer, ops, n, err); });
}

int rdma_poll(ferry_transport_t *t, ferry_completion_t *out, size_t max, ferry_error_t *err) {
    REQUIRE(t != nullptr && (out != nullptr || max == 0), "poll");
    return guard(err, "poll", [&] { return T(t)->poll(out, max); });
}

int rdma_completion_fd(ferry_transport_t *t, int *fd, ferry_error_t *err) {
    REQUIRE(t != nullptr && fd != nullptr, "completion_fd");
    *fd = T(t)->completion_fd();
    return 0;
}

} // namespace

extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 = {
    FERRY_PLUGIN_ABI_VERSION,
    sizeof(ferry_plugin_v1_t),
    ferry_rdma::kPluginName,
#ifdef FERRY_RDMA_VARIANT
    FERRY_RDMA_VERSION " (" FERRY_RDMA_VARIANT " package)", // the same code, packaged for a runtime's directory
#else
    ferry_rdma::kPluginVersion,
#endif
    // GPU memory through dma-buf (GPUDirect RDMA): register_mem fails with -ENOTSUP and the
    // reason when the NIC, the kernel or the GPU runtime cannot (docs/RDMA.md).
    // Control connections authenticate with the host's cluster key (option auth_key).
    FERRY_CAP_MEM_HOST | FERRY_CAP_MEM_CUDA | FERRY_CAP_MEM_ROCM | FERRY_CAP_INTRA_NODE | FERRY_CAP_INTER_NODE |
        FERRY_CAP_AUTH_KEY,
    rdma_probe,
    rdma_create,
    rdma_destroy,
    rdma_export_endpoint,
    rdma_register_mem,
    rdma_deregister_mem,
    rdma_export_mem,
    rdma_connect,
    rdma_disconnect,
    rdma_import_mem,
    rdma_release_mem,
    rdma_submit,
    rdma_poll,
    rdma_completion_fd,
};
