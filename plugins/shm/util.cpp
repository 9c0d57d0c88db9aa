#include "util.hpp"

#include <cstdio>

const char *ferry_plugin::plugin_name() { return ferry_shm::kPluginName; }

namespace ferry_shm {

int yama_ptrace_scope() {
    FILE *f = fopen("/proc/sys/kernel/yama/ptrace_scope", "re");
    if (f == nullptr) return -1;
    int v = -1;
    if (fscanf(f, "%d", &v) != 1) v = -1;
    fclose(f);
    return v;
}

}  // namespace ferry_shm
