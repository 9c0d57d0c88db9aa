// ferry_plugin_v1 entry points of tcp.so: argument checks and the C boundary (no exception
// crosses it). The work is done by ferry_tcp::Transport.
#include "transport.hpp"
#include "util.hpp"

#include <ferry/plugin.h>

#include <cerrno>
#include <new>
#include <system_error>

using ferry_tcp::set_error;
using ferry_tcp::Transport;

namespace {

Transport *T(ferry_transport_t *t) { return reinterpret_cast<Transport *>(t); }

// Runs fn, turning exceptions into error codes with a message.
template <class F>
int guard(ferry_error_t *err, const char *what, F &&fn) {
    try {
        return fn();
    } catch (const std::bad_alloc &) {
        return set_error(err, -ENOMEM, "tcp: %s: out of memory", what);
    } catch (const std::system_error &e) {
        int code = e.code().category() == std::generic_category() || e.code().category() == std::system_category()
                       ? e.code().value()
                       : EIO;
        return set_error(err, code > 0 ? -code : -EIO, "tcp: %s: %s", what, e.what());
    } catch (const std::exception &e) {
        return set_error(err, -EIO, "tcp: %s: %s", what, e.what());
    } catch (...) {
        return set_error(err, -EIO, "tcp: %s: unknown error", what);
    }
}

#define REQUIRE(cond, what)                                                                  \
    do {                                                                                     \
        if (!(cond)) return set_error(err, -EINVAL, "tcp: %s: %s", what, #cond " is false"); \
    } while (0)

int tcp_probe(const ferry_kv_t *, size_t, ferry_probe_result_t *result) {
    if (result == nullptr) return -EINVAL;
    result->available = 1;
    ferry_tcp::copy_message(result->reason, "TCP sockets: always available (host memory over TCP/IP)");
    return 0;
}

int tcp_create(const ferry_kv_t *options, size_t n_options, const ferry_host_api_t *host, ferry_transport_t **out,
               ferry_error_t *err) {
    REQUIRE(out != nullptr, "create");
    return guard(err, "create", [&] {
        Transport *t = nullptr;
        int rc = Transport::create(options, n_options, host, &t, err);
        if (rc == 0) *out = reinterpret_cast<ferry_transport_t *>(t);
        return rc;
    });
}

void tcp_destroy(ferry_transport_t *t) {
    if (t == nullptr) return;
    try {
        delete T(t);
    } catch (...) {
        // Destructors do not throw; nothing sensible is left to do here.
    }
}

int tcp_export_endpoint(ferry_transport_t *t, void *buf, size_t *len, ferry_error_t *err) {
    REQUIRE(t != nullptr && len != nullptr, "export_endpoint");
    REQUIRE(buf != nullptr || *len == 0, "export_endpoint");
    return guard(err, "export_endpoint", [&] { return T(t)->export_endpoint(buf, len, err); });
}

int tcp_register_mem(ferry_transport_t *t, const ferry_mem_region_t *region, uint64_t *handle, ferry_error_t *err) {
    REQUIRE(t != nullptr && region != nullptr && handle != nullptr, "register_mem");
    return guard(err, "register_mem", [&] { return T(t)->register_mem(region, handle, err); });
}

int tcp_deregister_mem(ferry_transport_t *t, uint64_t handle, ferry_error_t *err) {
    REQUIRE(t != nullptr, "deregister_mem");
    return guard(err, "deregister_mem", [&] { return T(t)->deregister_mem(handle, err); });
}

int tcp_export_mem(ferry_transport_t *t, uint64_t handle, void *buf, size_t *len, ferry_error_t *err) {
    REQUIRE(t != nullptr && len != nullptr, "export_mem");
    return guard(err, "export_mem", [&] { return T(t)->export_mem(handle, buf, len, err); });
}

int tcp_connect(ferry_transport_t *t, const void *endpoint, size_t len, uint64_t *peer, ferry_error_t *err) {
    REQUIRE(t != nullptr && endpoint != nullptr && peer != nullptr, "connect");
    return guard(err, "connect", [&] { return T(t)->connect(endpoint, len, peer, err); });
}

int tcp_disconnect(ferry_transport_t *t, uint64_t peer, ferry_error_t *err) {
    REQUIRE(t != nullptr, "disconnect");
    return guard(err, "disconnect", [&] { return T(t)->disconnect(peer, err); });
}

int tcp_import_mem(ferry_transport_t *t, uint64_t peer, const ferry_mem_region_t *region, const void *desc, size_t len,
                   uint64_t *remote_mem, ferry_error_t *err) {
    REQUIRE(t != nullptr && region != nullptr && remote_mem != nullptr, "import_mem");
    REQUIRE(desc != nullptr || len == 0, "import_mem");
    return guard(err, "import_mem", [&] { return T(t)->import_mem(peer, region, desc, len, remote_mem, err); });
}

int tcp_release_mem(ferry_transport_t *t, uint64_t peer, uint64_t remote_mem, ferry_error_t *err) {
    REQUIRE(t != nullptr, "release_mem");
    return guard(err, "release_mem", [&] { return T(t)->release_mem(peer, remote_mem, err); });
}

int tcp_submit(ferry_transport_t *t, uint64_t peer, const ferry_xfer_op_t *ops, size_t n_ops, ferry_error_t *err) {
    REQUIRE(t != nullptr, "submit");
    REQUIRE(ops != nullptr || n_ops == 0, "submit");
    if (n_ops == 0) return 0;
    return guard(err, "submit", [&] { return T(t)->submit(peer, ops, n_ops, err); });
}

int tcp_poll(ferry_transport_t *t, ferry_completion_t *out, size_t max, ferry_error_t *err) {
    REQUIRE(t != nullptr, "poll");
    REQUIRE(out != nullptr || max == 0, "poll");
    return guard(err, "poll", [&] { return T(t)->poll(out, max); });
}

int tcp_completion_fd(ferry_transport_t *t, int *fd, ferry_error_t *err) {
    REQUIRE(t != nullptr && fd != nullptr, "completion_fd");
    *fd = T(t)->completion_fd();
    return 0;
}

}  // namespace

extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 = {
    .abi_version = FERRY_PLUGIN_ABI_VERSION,
    .struct_size = sizeof(ferry_plugin_v1_t),
    .name = ferry_tcp::kPluginName,
    .version = ferry_tcp::kPluginVersion,
    .caps =
        FERRY_CAP_MEM_HOST | FERRY_CAP_INTRA_NODE | FERRY_CAP_INTER_NODE | FERRY_CAP_AUTH_KEY | FERRY_CAP_STAGED_DEVICE,
    .probe = tcp_probe,
    .create = tcp_create,
    .destroy = tcp_destroy,
    .export_endpoint = tcp_export_endpoint,
    .register_mem = tcp_register_mem,
    .deregister_mem = tcp_deregister_mem,
    .export_mem = tcp_export_mem,
    .connect = tcp_connect,
    .disconnect = tcp_disconnect,
    .import_mem = tcp_import_mem,
    .release_mem = tcp_release_mem,
    .submit = tcp_submit,
    .poll = tcp_poll,
    .completion_fd = tcp_completion_fd,
    .options = ferry_tcp::kOptions.descs(),
    .n_options = ferry_tcp::kOptions.size(),
    .option_desc_size = sizeof(ferry_option_desc_t),
};
