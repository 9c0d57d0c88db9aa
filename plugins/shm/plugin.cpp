// ferry_plugin_v1 table of shm.so; the entry points (plugins/common/plugin_entry.hpp) forward to
// ferry_shm::Transport.
#include "transport.hpp"

#include "option_table.hpp"
#include "plugin_entry.hpp"

extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 =
    ferry_plugin::with_register_mem_fd<ferry_shm::Transport>(ferry_plugin::with_options(
        ferry_plugin::entry_table<ferry_shm::Transport>(
            "1.0.0", FERRY_CAP_MEM_HOST | FERRY_CAP_INTRA_NODE | FERRY_CAP_AUTH_KEY | FERRY_CAP_STAGED_DEVICE),
        ferry_shm::kOptions));
