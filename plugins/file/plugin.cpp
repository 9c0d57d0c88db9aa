// ferry_plugin_v1 table of file.so; the entry points (plugins/common/plugin_entry.hpp) forward to
// ferry_file::Transport. A storage plugin: host memory to and from files, for file:<path>
// segments of this engine only (FERRY_CAP_STORAGE, plugin.h).
#include "transport.hpp"

#include "option_table.hpp"
#include "plugin_entry.hpp"

extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 = ferry_plugin::with_options(
    ferry_plugin::entry_table<ferry_file::Transport>("1.0.0", FERRY_CAP_MEM_HOST | FERRY_CAP_STORAGE),
    ferry_file::kOptions);
