// The ferry_plugin_v1 table for a GPU IPC plugin, made by the plugin kit (plugins/common/
// plugin_entry.hpp); FERRY_GPU_PLUGIN_NAME and the runtime backend linked in decide whether
// this is cuda_ipc.so or hip_ipc.so.
#include <sched.h>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <string>

#include "ferry/plugin.h"
#include "ipc_transport.hpp"
#include "option_table.hpp"
#include "plugin_entry.hpp"

#ifndef FERRY_GPU_PLUGIN_NAME
#error "build with -DFERRY_GPU_PLUGIN_NAME=\"cuda_ipc\" or \"hip_ipc\""
#endif

namespace ferry_gpu {
namespace {

// Each default here is the table's default below (the table parses what is given, no more).
struct Options {
    size_t streams = 4;
    uint64_t kernel_max_op_bytes = 1 << 20;
    uint64_t kernel_max_blocks = 16;
    bool kernel_table_in_launch = true;
};

constexpr auto kOptions = ferry_plugin::make_options<Options>(
    FERRY_GPU_PLUGIN_NAME,
    ferry_plugin::uint_option<Options>("streams", "4", 1, 64, "copy streams per device; ops are spread over them",
                                       ferry_plugin::store<&Options::streams>),
    ferry_plugin::size_option<Options>(
        "kernel_max_op_bytes", "1m", 0, 1ull << 30,
        "ops of up to this size go to the copy kernel (one launch for a batch's small ops of one device) instead of "
        "one copy-engine launch each; 0: never",
        ferry_plugin::store<&Options::kernel_max_op_bytes>, "0 (never) or a size up to 1g (suffixes k, m, g)"),
    ferry_plugin::uint_option<Options>(
        "kernel_max_blocks", "16", 0, 65535,
        "thread blocks (of 512 threads) per copy kernel launch, which bounds the SMs (CUs) it takes from the "
        "application's own kernels; 0: one per 64 KiB chunk",
        ferry_plugin::store<&Options::kernel_max_blocks>, "0 (one per 64 KiB chunk) or 1 to 65535"),
    ferry_plugin::bool_option<Options>(
        "kernel_table_in_launch", "true",
        "the copy kernel's table of ops travels in its launch's parameters, so no table copy precedes each launch "
        "on the stream (cuda_ipc.so with a CUDA 12.1 or newer driver on a Volta or newer GPU); hip_ipc.so, older "
        "drivers and false copy the table to the device before each launch",
        ferry_plugin::store<&Options::kernel_table_in_launch>));

// The kit's Transport shape around IpcTransport: the ABI's calls are IpcTransport's methods.
class Transport : public IpcTransport {
public:
    static constexpr const char *kName = FERRY_GPU_PLUGIN_NAME;
    using IpcTransport::IpcTransport;

    static int probe(const ferry_kv_t *, size_t, ferry_probe_result_t *result) {
        try {
            auto rt = make_runtime();
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

    static int create(const ferry_kv_t *options, size_t n, const ferry_host_api_t *host, Transport **out,
                      ferry_error_t *err) {
        Options opts;
        if (int rc = kOptions.parse(options, n, opts, err)) return rc;
        const size_t streams = opts.streams;
        auto rt = make_runtime();
        bool available = false;
        std::string reason;
        rt->probe(available, reason);
        if (!available) return fail(err, -ENODEV, reason);
        KernelPolicy kernel{opts.kernel_max_op_bytes, static_cast<uint32_t>(opts.kernel_max_blocks),
                            opts.kernel_table_in_launch};
        auto *t = new Transport(std::move(rt), host, kName, streams, poll_window(), kernel);
        if (int rc = t->start(err)) {
            delete t;
            return rc;
        }
        *out = t;
        return 0;
    }

private:
    // How long the engine's wait keeps polling after a submit instead of sleeping (see
    // IpcTransport): small blocks complete within microseconds of their submit returning, and a
    // sleeping waiter costs two thread wakeups per batch (H200: 0.80-0.90x of raw batches with,
    // 0.95-1.03x without). Only where a spare core exists: never on hosts of fewer than 4 CPUs.
    // FERRY_GPU_IPC_POLL_US sets it (0: never).
    static std::chrono::microseconds poll_window() {
        if (const char *env = getenv("FERRY_GPU_IPC_POLL_US"); env && *env)
            return std::chrono::microseconds(strtoul(env, nullptr, 10));
        cpu_set_t set;
        int cpus = sched_getaffinity(0, sizeof set, &set) == 0 ? CPU_COUNT(&set) : 1;
        return std::chrono::microseconds(cpus >= 4 ? 1000 : 0);
    }
    static int fail(ferry_error_t *err, int code, const std::string &message) {
        return set_error(err, code, "%s: %s", kName, message.c_str());
    }
};

}  // namespace
}  // namespace ferry_gpu

extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 = ferry_plugin::with_options(
    ferry_plugin::with_copy_local<ferry_gpu::Transport>(
        ferry_plugin::with_block_lists<ferry_gpu::Transport>(ferry_plugin::entry_table<ferry_gpu::Transport>(
            FERRY_GPU_PLUGIN_VERSION, FERRY_GPU_PLUGIN_CAPS | FERRY_CAP_INTRA_NODE))),
    ferry_gpu::kOptions);
