// file.so options ("file.<key>" on the host side; the host strips the prefix).
#pragma once

#include <ferry/plugin.h>

#include "option_table.hpp"

#include <cstddef>
#include <cstdint>

namespace ferry_file {

enum class Direct { Auto, Off, Require };

struct Config {
    unsigned queue_depth = 64;           // io_uring requests in flight at once, all segments
    Direct direct = Direct::Auto;        // O_DIRECT when address, offset and length are aligned
    bool fixed_buffers = true;           // register host regions with io_uring (no per-I/O page pinning)
    bool create = false;                 // open_segment creates a missing file (mode 0600)
    bool write_through = false;          // each WRITE completes only once on stable storage (RWF_DSYNC)
    uint64_t max_io_bytes = 4ull << 20;  // a larger op is cut into requests of this size
    uint64_t stripe_bytes = 1ull << 20;  // striped segments (file:/a,/b): bytes per file in turn
    unsigned op_timeout_ms = 0;          // a request unfinished this long fails with -ETIMEDOUT; 0: never
};

// Every option: parser, messages and what `ferry-info --options file` prints (options.cpp).
inline constexpr size_t kOptionCount = 8;
extern const ferry_plugin::OptionTable<Config, kOptionCount> kOptions;

int parse_config(const ferry_kv_t *options, size_t n_options, Config *cfg, ferry_error_t *err);

}  // namespace ferry_file
