// Small helpers of rdma.so: host logging, ABI error messages, option parsing, the completion
// queue behind poll()/completion_fd. Builds against plugin.h alone.
#pragma once

#include <ferry/plugin.h>

#include "plugin_util.hpp"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <deque>
#include <mutex>
#include <string>
#include <vector>

namespace ferry_rdma {

inline constexpr const char *kPluginName = "rdma";
#define FERRY_RDMA_VERSION "1.0.0"
inline constexpr const char *kPluginVersion = FERRY_RDMA_VERSION;

using Clock = std::chrono::steady_clock;

using ferry_plugin::CompletionQueue;
using ferry_plugin::copy_message;
using ferry_plugin::errno_string;
using ferry_plugin::Logger;
using ferry_plugin::make_completion;
using ferry_plugin::parse_bool;
using ferry_plugin::parse_u64;
using ferry_plugin::set_error;
using ferry_plugin::strprintf;

}  // namespace ferry_rdma
