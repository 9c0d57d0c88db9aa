// ferry_plugin_v1 table of rdma.so; the entry points (plugins/common/plugin_entry.hpp) forward to
// ferry_rdma::Transport.
#include "transport.hpp"

#include "option_table.hpp"
#include "plugin_entry.hpp"

#define FERRY_RDMA_VERSION "1.0.0"

extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 =
    ferry_plugin::with_rail_stats<ferry_rdma::Transport>(ferry_plugin::with_options(
        ferry_plugin::entry_table<ferry_rdma::Transport>(
#ifdef FERRY_RDMA_VARIANT
            FERRY_RDMA_VERSION " (" FERRY_RDMA_VARIANT
                               " package)",  // the same code, packaged for a runtime's directory
#else
            FERRY_RDMA_VERSION,
#endif
            // GPU memory through dma-buf (GPUDirect RDMA): register_mem fails with -ENOTSUP and the
            // reason when the NIC, the kernel or the GPU runtime cannot (docs/RDMA.md).
            // Control connections authenticate with the host's cluster key (option auth_key).
            FERRY_CAP_MEM_HOST | FERRY_CAP_MEM_CUDA | FERRY_CAP_MEM_ROCM | FERRY_CAP_INTRA_NODE | FERRY_CAP_INTER_NODE |
                FERRY_CAP_AUTH_KEY),
        ferry_rdma::kOptions));
