// ferry_plugin_v1 table of tcp.so; the entry points (plugins/common/plugin_entry.hpp) forward to
// ferry_tcp::Transport.
#include "transport.hpp"

#include "option_table.hpp"
#include "plugin_entry.hpp"

int ferry_tcp::Transport::probe(const ferry_kv_t *, size_t, ferry_probe_result_t *result) {
    result->available = 1;
    copy_message(result->reason, "TCP sockets: always available (host memory over TCP/IP)");
    return 0;
}

extern "C" FERRY_PLUGIN_EXPORT const ferry_plugin_v1_t ferry_plugin_v1 =
    ferry_plugin::with_rail_stats<ferry_tcp::Transport>(ferry_plugin::with_options(
        ferry_plugin::entry_table<ferry_tcp::Transport>("1.0.0", FERRY_CAP_MEM_HOST | FERRY_CAP_INTRA_NODE |
                                                                     FERRY_CAP_INTER_NODE | FERRY_CAP_AUTH_KEY |
                                                                     FERRY_CAP_STAGED_DEVICE),
        ferry_tcp::kOptions));
