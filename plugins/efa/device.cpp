#include "device.hpp"

#include <dirent.h>
#include <unistd.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace ferry_efa {
namespace {

constexpr const char *kClassDir = "/sys/class/infiniband";

bool read_hex(const std::string &path, unsigned long *out) {
    FILE *f = fopen(path.c_str(), "re");
    if (!f) return false;
    char buf[32] = {};
    bool ok = fgets(buf, sizeof buf, f) != nullptr;
    fclose(f);
    if (!ok) return false;
    char *end = nullptr;
    *out = strtoul(buf, &end, 16);
    return end != buf;
}

bool is_efa(const std::string &device_dir) {
    char target[PATH_MAX];
    ssize_t n = readlink((device_dir + "/driver").c_str(), target, sizeof target - 1);
    if (n > 0) {
        target[n] = '\0';
        const char *base = strrchr(target, '/');
        if (strcmp(base ? base + 1 : target, "efa") == 0) return true;
    }
    unsigned long vendor = 0, device = 0;
    return read_hex(device_dir + "/vendor", &vendor) && read_hex(device_dir + "/device", &device) && vendor == 0x1d0f &&
           device >= 0xefa0 && device <= 0xefa3;
}

}  // namespace

bool efa_device_present(std::string *where) {
    *where = kClassDir;
    DIR *d = opendir(kClassDir);
    if (!d) {
        *where += " does not exist (no RDMA devices)";
        return false;
    }
    bool found = false;
    size_t devices = 0;
    while (dirent *e = readdir(d)) {
        if (e->d_name[0] == '.') continue;
        ++devices;
        if (is_efa(std::string(kClassDir) + "/" + e->d_name + "/device")) {
            found = true;
            *where = std::string(kClassDir) + "/" + e->d_name;
            break;
        }
    }
    closedir(d);
    if (!found)
        *where += devices ? " has " + std::to_string(devices) + " RDMA device(s), none bound to the efa driver"
                          : " is empty (no RDMA devices)";
    return found;
}

}  // namespace ferry_efa
