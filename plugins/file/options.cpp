#include "options.hpp"

#include "plugin_util.hpp"

#include <cstring>

namespace ferry_file {

namespace {

using ferry_plugin::OptionValue;
using ferry_plugin::store;

bool store_direct(Config &c, const OptionValue &v) {
    c.direct = std::strcmp(v.text, "off") == 0       ? Direct::Off
               : std::strcmp(v.text, "require") == 0 ? Direct::Require
                                                     : Direct::Auto;
    return true;
}

bool store_power_of_two_stripe(Config &c, const OptionValue &v) {
    if (v.number & (v.number - 1)) return false;  // offsets map to files with shifts and masks
    c.stripe_bytes = v.number;
    return true;
}

}  // namespace

// clang-format off
constexpr ferry_plugin::OptionTable<Config, kOptionCount> kOptions = ferry_plugin::make_options<Config>("file",
    ferry_plugin::uint_option<Config>("queue_depth", "64", 1, 4096,
        "io_uring requests in flight at once (all segments); more wait in the plugin", store<&Config::queue_depth>),
    ferry_plugin::enum_option<Config>("direct", "auto", "auto|off|require",
        "O_DIRECT (no page cache) when the address, offset and length are aligned to the file's direct I/O "
        "alignment: auto uses it when they are and the page cache otherwise, off never, require fails other ops",
        store_direct),
    ferry_plugin::bool_option<Config>("fixed_buffers", "true",
        "register host regions with io_uring as fixed buffers (each GiB pinned at its first use, not on every request)",
        store<&Config::fixed_buffers>),
    ferry_plugin::bool_option<Config>("create", "false",
        "open_segment(\"file:<path>\") creates a missing file (mode 0600) instead of failing",
        store<&Config::create>),
    ferry_plugin::bool_option<Config>("write_through", "false",
        "a WRITE completes only once its bytes are on stable storage (RWF_DSYNC), surviving a power cut",
        store<&Config::write_through>),
    ferry_plugin::size_option<Config>("max_io_bytes", "4m", 4096, 1ull << 30,
        "a larger op is cut into io_uring requests of this size, in flight together", store<&Config::max_io_bytes>),
    ferry_plugin::size_option<Config>("stripe_bytes", "1m", 4096, 1ull << 30,
        "striped segments (file:/a,/b): this many bytes go to each file in turn", store_power_of_two_stripe,
        "a power of two from 4k to 1g"),
    ferry_plugin::duration_option<Config>("op_timeout_ms", "0", 0, 86400000,
        "a request not finished this long is cancelled (-ETIMEDOUT) where the kernel still can; I/O a device holds ends when it answers",
        store<&Config::op_timeout_ms>, "milliseconds from 0 (never) to 86400000"));
// clang-format on

int parse_config(const ferry_kv_t *options, size_t n, Config *out, ferry_error_t *err) {
    Config cfg;
    if (int rc = kOptions.parse(options, n, cfg, err)) return rc;
    *out = cfg;
    return 0;
}

}  // namespace ferry_file
