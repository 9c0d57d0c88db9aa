#include "util.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

const char *ferry_plugin::plugin_name() { return ferry_efa::kPluginName; }

namespace ferry_efa {

std::string fi_error_string(int code) {
    return fi_strerror(code < 0 ? -code : code);
}

} // namespace ferry_efa
