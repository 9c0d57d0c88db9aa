#include "util.hpp"

const char *ferry_plugin::plugin_name() { return ferry_rdma::kPluginName; }
