// The FERRY backend's NIXL parameters: the few it handles itself, and Ferry's engine
// configuration (every other key, passed to ferry_engine_create as it is).
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include "nixl_types.h"

namespace ferry_nixl {

enum class VramKind { Auto, Cuda, Rocm };

struct BackendParams {
    // Ferry engine keys/values (docs/OPTIONS.md), empty values left out so Ferry's
    // defaults apply.
    std::vector<std::pair<std::string, std::string>> ferry_config;
    std::string config_file;              // Ferry YAML file; ferry_config overrides it
    VramKind vram_kind = VramKind::Auto;  // which GPU runtime NIXL's VRAM_SEG means
    uint32_t remote_access = 3;           // FERRY_REMOTE_READ | FERRY_REMOTE_WRITE
    int64_t release_timeout_ms = 10000;   // how long releaseReqH waits for ops in flight
    double est_bandwidth_mbps = 0;        // estimateXferCost before a transfer was measured (0: none)
};

// Keys getPluginParams lists only to say why a NIXL setting does not apply; accepted and
// ignored when a host passes them back.
constexpr const char *kNoteProgressThread = "note.progress_thread";
constexpr const char *kNoteSyncMode = "note.sync_mode";

// Defaults shown by nixlAgent::getPluginParams("FERRY").
nixl_b_params_t default_backend_params();

// `values`: the layered configuration (config_sources.hpp), empty values left out; `origin`
// names where each came from, for the error message. On failure returns nullopt and sets
// `error` to a message naming the key, where it came from and what to do.
std::optional<BackendParams> parse_backend_params(const std::map<std::string, std::string> &values,
                                                  const std::map<std::string, std::string> &origin, std::string &error);

}  // namespace ferry_nixl
