// Small helpers of efa.so: host logging, ABI error messages, option parsing, the completion
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

namespace ferry_efa {

inline constexpr const char *kPluginName = "efa";
inline constexpr const char *kPluginVersion = "1.0.0";

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

// fi_strerror() of a libfabric return code (negative or positive).
std::string fi_error_string(int code);

}  // namespace ferry_efa
