// The ferry_plugin_v1 entry points of a C++ transport plugin (the plugin kit's entry half;
// plugin_util.hpp is the rest): argument checks and the C boundary (no exception crosses it),
// forwarding to a Transport class with the ABI's operations as methods. Transport provides
//   static constexpr const char *kName;   // "tcp": the table's name and every message's prefix
//   static int probe(options, n, result); static int create(options, n, host, Transport **, err);
//   and the instance methods below (export_endpoint ... poll, completion_fd).
// A plugin exports its table with
//   extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 =
//       ferry_plugin::entry_table<Transport>("1.0.0", caps);
#pragma once

#include <ferry/plugin.h>

#include <cerrno>
#include <new>
#include <system_error>

#include "plugin_util.hpp"

namespace ferry_plugin {

template <class Transport>
struct Entry {
    static Transport *T(ferry_transport_t *t) { return reinterpret_cast<Transport *>(t); }
    static constexpr const char *kName = Transport::kName;

    // Runs fn; an exception becomes a code and a message naming the plugin and the call. A
    // std::system_error carries an errno only in the generic and system categories; any other
    // category's value means nothing as an errno, so it is -EIO.
    template <class F>
    static int guard(ferry_error_t *err, const char *what, F &&fn) {
        try {
            return fn();
        } catch (const std::bad_alloc &) {
            return set_error(err, -ENOMEM, "%s: %s: out of memory", kName, what);
        } catch (const std::system_error &e) {
            const auto &cat = e.code().category();
            int code = cat == std::generic_category() || cat == std::system_category() ? e.code().value() : EIO;
            return set_error(err, code > 0 ? -code : -EIO, "%s: %s: %s", kName, what, e.what());
        } catch (const std::exception &e) {
            return set_error(err, -EIO, "%s: %s: %s", kName, what, e.what());
        } catch (...) {
            return set_error(err, -EIO, "%s: %s: unknown error", kName, what);
        }
    }

    // A NULL or inconsistent argument: -EINVAL naming the call and the failed condition.
    static int invalid(ferry_error_t *err, const char *what, const char *condition) {
        return set_error(err, -EINVAL, "%s: %s: %s is false", kName, what, condition);
    }
#define FERRY_ENTRY_REQUIRE(cond, what)                \
    do {                                               \
        if (!(cond)) return invalid(err, what, #cond); \
    } while (0)

    static int probe(const ferry_kv_t *options, size_t n, ferry_probe_result_t *result) {
        if (result == nullptr) return -EINVAL;
        try {
            return Transport::probe(options, n, result);
        } catch (...) {
            return -ENOMEM;
        }
    }

    static int create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, ferry_transport_t **out,
                      ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(out != nullptr, "create");
        FERRY_ENTRY_REQUIRE(options != nullptr || n == 0, "create");
        return guard(err, "create", [&] {
            Transport *t = nullptr;
            int rc = Transport::create(options, n, host, &t, err);
            if (rc == 0) *out = reinterpret_cast<ferry_transport_t *>(t);
            return rc;
        });
    }

    static void destroy(ferry_transport_t *t) {
        try {
            delete T(t);
        } catch (...) {
            // Destructors do not throw; nothing sensible is left to do here.
        }
    }

    static int export_endpoint(ferry_transport_t *t, void *buf, size_t *len, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && len != nullptr && (buf != nullptr || *len == 0), "export_endpoint");
        return guard(err, "export_endpoint", [&] { return T(t)->export_endpoint(buf, len, err); });
    }

    static int register_mem(ferry_transport_t *t, const ferry_mem_region_t *r, uint64_t *handle, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && r != nullptr && handle != nullptr, "register_mem");
        return guard(err, "register_mem", [&] { return T(t)->register_mem(r, handle, err); });
    }

    static int deregister_mem(ferry_transport_t *t, uint64_t handle, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr, "deregister_mem");
        return guard(err, "deregister_mem", [&] { return T(t)->deregister_mem(handle, err); });
    }

    static int export_mem(ferry_transport_t *t, uint64_t handle, void *buf, size_t *len, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && len != nullptr && (buf != nullptr || *len == 0), "export_mem");
        return guard(err, "export_mem", [&] { return T(t)->export_mem(handle, buf, len, err); });
    }

    static int connect(ferry_transport_t *t, const void *ep, size_t len, uint64_t *peer, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && ep != nullptr && peer != nullptr, "connect");
        return guard(err, "connect", [&] { return T(t)->connect(ep, len, peer, err); });
    }

    static int disconnect(ferry_transport_t *t, uint64_t peer, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr, "disconnect");
        return guard(err, "disconnect", [&] { return T(t)->disconnect(peer, err); });
    }

    static int import_mem(ferry_transport_t *t, uint64_t peer, const ferry_mem_region_t *r, const void *desc,
                          size_t len, uint64_t *remote_mem, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && r != nullptr && remote_mem != nullptr, "import_mem");
        FERRY_ENTRY_REQUIRE(desc != nullptr || len == 0, "import_mem");
        return guard(err, "import_mem", [&] { return T(t)->import_mem(peer, r, desc, len, remote_mem, err); });
    }

    static int release_mem(ferry_transport_t *t, uint64_t peer, uint64_t remote_mem, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr, "release_mem");
        return guard(err, "release_mem", [&] { return T(t)->release_mem(peer, remote_mem, err); });
    }

    static int submit(ferry_transport_t *t, uint64_t peer, const ferry_xfer_op_t *ops, size_t n, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && (ops != nullptr || n == 0), "submit");
        if (n == 0) return 0;
        return guard(err, "submit", [&] { return T(t)->submit(peer, ops, n, err); });
    }

    static int poll(ferry_transport_t *t, ferry_completion_t *out, size_t max, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && (out != nullptr || max == 0), "poll");
        return guard(err, "poll", [&] { return T(t)->poll(out, max); });
    }

    static int completion_fd(ferry_transport_t *t, int *fd, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && fd != nullptr, "completion_fd");
        *fd = T(t)->completion_fd();
        return 0;
    }
    // ABI 1.3: only for a Transport with register_mem_fd (with_register_mem_fd below).
    static int register_mem_fd(ferry_transport_t *t, const ferry_mem_region_t *r, int fd, uint64_t fd_offset,
                               uint64_t *handle, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && r != nullptr && handle != nullptr && fd >= 0, "register_mem_fd");
        return guard(err, "register_mem_fd", [&] { return T(t)->register_mem_fd(r, fd, fd_offset, handle, err); });
    }
    // ABI 1.5: only for a Transport with block lists (with_block_lists below).
    static int create_block_list(ferry_transport_t *t, uint32_t side, uint64_t peer, const ferry_block_t *blocks,
                                 size_t n, uint64_t *list, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && list != nullptr && blocks != nullptr && n > 0, "create_block_list");
        FERRY_ENTRY_REQUIRE(side == FERRY_BLOCKS_LOCAL || side == FERRY_BLOCKS_REMOTE, "create_block_list");
        return guard(err, "create_block_list",
                     [&] { return T(t)->create_block_list(side, peer, blocks, n, list, err); });
    }
    static int destroy_block_list(ferry_transport_t *t, uint64_t list, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr, "destroy_block_list");
        return guard(err, "destroy_block_list", [&] { return T(t)->destroy_block_list(list, err); });
    }
    static int submit_blocks(ferry_transport_t *t, uint64_t peer, uint32_t opcode, uint64_t local_list,
                             const uint32_t *local_index, uint64_t remote_list, const uint32_t *remote_index, size_t n,
                             uint64_t user_data, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && local_index != nullptr && remote_index != nullptr && n > 0,
                            "submit_blocks");
        FERRY_ENTRY_REQUIRE(opcode == FERRY_OP_READ || opcode == FERRY_OP_WRITE, "submit_blocks");
        return guard(err, "submit_blocks", [&] {
            return T(t)->submit_blocks(peer, opcode, local_list, local_index, remote_list, remote_index, n, user_data,
                                       err);
        });
    }
    // ABI 1.5: only for a Transport with rail_stats (with_rail_stats below).
    static int rail_stats(ferry_transport_t *t, ferry_rail_stats_t *out, size_t *n, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && n != nullptr && (out != nullptr || *n == 0), "rail_stats");
        return guard(err, "rail_stats", [&] { return T(t)->rail_stats(out, n, err); });
    }
    // ABI 1.6: only for a Transport with copy_local (with_copy_local below).
    static int copy_local(ferry_transport_t *t, int32_t device, const ferry_local_copy_t *copies, size_t n,
                          uint64_t user_data, ferry_error_t *err) {
        FERRY_ENTRY_REQUIRE(t != nullptr && copies != nullptr && n > 0 && device >= 0, "copy_local");
        return guard(err, "copy_local", [&] { return T(t)->copy_local(device, copies, n, user_data, err); });
    }
#undef FERRY_ENTRY_REQUIRE
};

template <class Transport>
constexpr ferry_plugin_v1_t entry_table(const char *version, uint64_t caps) {
    using E = Entry<Transport>;
    return ferry_plugin_v1_t{
        FERRY_PLUGIN_ABI_VERSION,
        sizeof(ferry_plugin_v1_t),
        Transport::kName,
        version,
        caps,
        E::probe,
        E::create,
        E::destroy,
        E::export_endpoint,
        E::register_mem,
        E::deregister_mem,
        E::export_mem,
        E::connect,
        E::disconnect,
        E::import_mem,
        E::release_mem,
        E::submit,
        E::poll,
        E::completion_fd,
        nullptr,  // options, n_options, option_desc_size: with_options() (option_table.hpp) sets them
        0,
        0,
        nullptr,  // register_mem_fd: with_register_mem_fd() sets it
        nullptr,  // create_block_list, destroy_block_list, submit_blocks: with_block_lists() sets them
        nullptr,
        nullptr,
        nullptr,  // rail_stats: with_rail_stats() sets it
        nullptr,  // copy_local: with_copy_local() sets it
    };
}

// The entry table with register_mem_fd (ABI 1.3) forwarded to Transport::register_mem_fd.
template <class Transport>
constexpr ferry_plugin_v1_t with_register_mem_fd(ferry_plugin_v1_t t) {
    t.register_mem_fd = Entry<Transport>::register_mem_fd;
    return t;
}

// The entry table with block lists (ABI 1.5) forwarded to Transport's methods of those names.
template <class Transport>
constexpr ferry_plugin_v1_t with_block_lists(ferry_plugin_v1_t t) {
    t.create_block_list = Entry<Transport>::create_block_list;
    t.destroy_block_list = Entry<Transport>::destroy_block_list;
    t.submit_blocks = Entry<Transport>::submit_blocks;
    return t;
}

// The entry table with rail_stats (ABI 1.5) forwarded to Transport::rail_stats(out, n, err).
template <class Transport>
constexpr ferry_plugin_v1_t with_rail_stats(ferry_plugin_v1_t t) {
    t.rail_stats = Entry<Transport>::rail_stats;
    return t;
}

// The entry table with copy_local (ABI 1.6) forwarded to Transport::copy_local.
template <class Transport>
constexpr ferry_plugin_v1_t with_copy_local(ferry_plugin_v1_t t) {
    t.copy_local = Entry<Transport>::copy_local;
    return t;
}

}  // namespace ferry_plugin
