#include "util.hpp"

#include <rdma/fabric.h>
#include <rdma/fi_errno.h>

#include <cstring>

#include "fabric_api.hpp"

const char *ferry_plugin::plugin_name() { return ferry_efa::kPluginName; }

namespace ferry_efa {

std::string fi_error_string(int code) {
    code = code < 0 ? -code : code;
    return fabric::load(nullptr) ? fabric::strerror(code) : std::strerror(code);
}

}  // namespace ferry_efa
