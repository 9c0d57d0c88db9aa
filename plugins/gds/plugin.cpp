// ferry_plugin_v1 table of gds.so; the entry points (plugins/common/plugin_entry.hpp) forward to
// ferry_gds::Transport. A storage plugin: CUDA memory to and from files through cuFile, for
// file:<path> segments of this engine only (FERRY_CAP_STORAGE, plugin.h).
#include "transport.hpp"

#include "option_table.hpp"
#include "plugin_entry.hpp"

extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 = ferry_plugin::with_options(
    ferry_plugin::entry_table<ferry_gds::Transport>(FERRY_GDS_PLUGIN_VERSION, FERRY_CAP_MEM_CUDA | FERRY_CAP_STORAGE),
    ferry_gds::kOptions);
