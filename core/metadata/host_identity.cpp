#include "metadata/host_identity.hpp"

#include <cstdlib>
#include <fstream>

namespace ferry {
namespace {

std::string first_line(const char *path) {
    std::ifstream in(path);
    std::string line;
    std::getline(in, line);
    return line;
}

}  // namespace

std::string local_host_identity() {
    if (const char *env = std::getenv("FERRY_HOST_ID"); env && *env) return env;
    std::string machine = first_line("/etc/machine-id");
    if (machine.empty()) machine = first_line("/var/lib/dbus/machine-id");
    std::string boot = first_line("/proc/sys/kernel/random/boot_id");
    return (machine.empty() ? "unknown-machine" : machine) + "/" + (boot.empty() ? "unknown-boot" : boot);
}

}  // namespace ferry
