// ferry_plugin_v1 entry points of shm.so: argument checks and the C boundary (no exception
// crosses it). The work is done by ferry_shm::Transport.
#include "transport.hpp"

#include <ferry/plugin.h>

#include <cerrno>
#include <new>
#include <system_error>

using ferry_shm::set_error;
using ferry_shm::Transport;

namespace {

Transport *T(ferry_transport_t *t) { return reinterpret_cast<Transport *>(t); }

template <class F> int guard(ferry_error_t *err, const char *what, F &&fn) {
    try {
        return fn();
    } catch (const std::bad_alloc &) {
        return set_error(err, -ENOMEM, "shm: %s: out of memory", what);
    } catch (const std::system_error &e) {
        int code = e.code().value();
        return set_error(err, code > 0 ? -code : -EIO, "shm: %s: %s", what, e.what());
    } catch (const std::exception &e) {
        return set_error(err, -EIO, "shm: %s: %s", what, e.what());
    } catch (...) {
        return set_error(err, -EIO, "shm: %s: unknown error", what);
    }
}

#define REQUIRE(cond, what)                                                                     \
    do {                                                                                        \
        if (!(cond))                                                                            \
            return set_error(err, -EINVAL, "shm: %s: %s", what, #cond " is false");             \
    } while (0)

int shm_probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result) {
    if (result == nullptr)
        return -EINVAL;
    try {
        return Transport::probe(options, n, result);
    } catch (...) {
        return -ENOMEM;
    }
}

int shm_create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, ferry_transport_t **out,
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

void shm_destroy(ferry_transport_t *t) {
    try {
        delete T(t);
    } catch (...) {
    }
}

int shm_export_endpoint(ferry_transport_t *t, void *buf, size_t *len, ferry_error_t *err) {
    REQUIRE(t != nullptr && len != nullptr && (buf != nullptr || *len == 0), "export_endpoint");
    return guard(err, "export_endpoint", [&] { return T(t)->export_endpoint(buf, len, err); });
}

int shm_register_mem(ferry_transport_t *t, const ferry_mem_region_t *r, uint64_t *handle, ferry_error_t *err) {
    REQUIRE(t != nullptr && r != nullptr && handle != nullptr, "register_mem");
    return guard(err, "register_mem", [&] { return T(t)->register_mem(r, handle, err); });
}

int shm_deregister_mem(ferry_transport_t *t, uint64_t handle, ferry_error_t *err) {
    REQUIRE(t != nullptr, "deregister_mem");
    return guard(err, "deregister_mem", [&] { return T(t)->deregister_mem(handle, err); });
}

int shm_export_mem(ferry_transport_t *t, uint64_t handle, void *buf, size_t *len, ferry_error_t *err) {
    REQUIRE(t != nullptr && len != nullptr, "export_mem");
    (void)handle;
    (void)buf;
    *len = 0; // the serving side checks addresses against its own table: no keys
    return 0;
}

int shm_connect(ferry_transport_t *t, const void *ep, size_t len, uint64_t *peer, ferry_error_t *err) {
    REQUIRE(t != nullptr && ep != nullptr && peer != nullptr, "connect");
    return guard(err, "connect", [&] { return T(t)->connect(ep, len, peer, err); });
}

int shm_disconnect(ferry_transport_t *t, uint64_t peer, ferry_error_t *err) {
    REQUIRE(t != nullptr, "disconnect");
    return guard(err, "disconnect", [&] { return T(t)->disconnect(peer, err); });
}

int shm_import_mem(ferry_transport_t *t, uint64_t peer, const ferry_mem_region_t *r, const void *desc, size_t len,
                   uint64_t *remote_mem, ferry_error_t *err) {
    REQUIRE(t != nullptr && r != nullptr && remote_mem != nullptr, "import_mem");
    (void)desc;
    (void)len;
    return guard(err, "import_mem", [&] { return T(t)->import_mem(peer, r, remote_mem, err); });
}

int shm_release_mem(ferry_transport_t *t, uint64_t peer, uint64_t remote_mem, ferry_error_t *err) {
    REQUIRE(t != nullptr, "release_mem");
    return guard(err, "release_mem", [&] { return T(t)->release_mem(peer, remote_mem, err); });
}

int shm_submit(ferry_transport_t *t, uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err) {
    REQUIRE(t != nullptr && (ops != nullptr || n == 0), "submit");
    if (n == 0)
        return 0;
    return guard(err, "submit", [&] { return T(t)->submit(peer, ops, n, err); });
}

int shm_poll(ferry_transport_t *t, ferry_completion_t *out, size_t max, ferry_error_t *err) {
    REQUIRE(t != nullptr && (out != nullptr || max == 0), "poll");
    return guard(err, "poll", [&] { return T(t)->poll(out, max); });
}

int shm_completion_fd(ferry_transport_t *t, int *fd, ferry_error_t *err) {
    REQUIRE(t != nullptr && fd != nullptr, "completion_fd");
    *fd = T(t)->completion_fd();
    return 0;
}

} // namespace

extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 = {
    FERRY_PLUGIN_ABI_VERSION,
    sizeof(ferry_plugin_v1_t),
    ferry_shm::kPluginName,
    ferry_shm::kPluginVersion,
    FERRY_CAP_MEM_HOST | FERRY_CAP_INTRA_NODE | FERRY_CAP_AUTH_KEY,
    shm_probe,
    shm_create,
    shm_destroy,
    shm_export_endpoint,
    shm_register_mem,
    shm_deregister_mem,
    shm_export_mem,
    shm_connect,
    shm_disconnect,
    shm_import_mem,
    shm_release_mem,
    shm_submit,
    shm_poll,
    shm_completion_fd,
};
