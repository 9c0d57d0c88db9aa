// ferry_plugin_v1 table of efa.so; the entry points (plugins/common/plugin_entry.hpp) forward to
// ferry_efa::Transport.
#include "transport.hpp"

#include "option_table.hpp"
#include "plugin_entry.hpp"

extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 = ferry_plugin::with_options(
    ferry_plugin::entry_table<ferry_efa::Transport>(
        "1.0.0",
        // Host memory only: the plugin table is static, and whether the provider registers device
        // memory (FI_HMEM) is only known at run time. The engine stages GPU memory through pinned
        // host buffers for host-only transports; hosts calling the plugin directly can still
        // register CUDA/ROCm memory when the provider reports FI_HMEM (see register_mem); without it
        // device regions are served through the host's staging calls (staged_serve.cpp).
        FERRY_CAP_MEM_HOST | FERRY_CAP_INTRA_NODE | FERRY_CAP_INTER_NODE | FERRY_CAP_STAGED_DEVICE),
    ferry_efa::kOptions);
