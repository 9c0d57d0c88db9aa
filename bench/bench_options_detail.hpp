// What the files of transfer_engine_bench's command line share: bench_options.cpp reads the
// flags, bench_mooncake_flags.cpp gives Mooncake's flags their meaning in Ferry's terms.
#pragma once

#include <functional>
#include <string>

#include "bench_options.hpp"

namespace bench {

// Prints the error and exits 1.
[[noreturn]] void usage_error(const std::string &what);
std::string lower(std::string s);

// Whether the command line gave a flag (by its name, without dashes).
using GivenFlag = std::function<bool(const std::string &)>;

// After the flags are read: --metadata_server, the protocol and NIC flags (--protocol,
// --device_name, --nic_priority_matrix, --auto_discovery) and the GPU flags (--use_vram,
// --gpu_id) as Mooncake reads them, in Ferry's terms; a note for each that means something else
// here, a usage error for what Ferry cannot do.
void resolve_mooncake_flags(Options &o, const GivenFlag &given);

}  // namespace bench
