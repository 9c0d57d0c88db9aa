#include "topology.hpp"

#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <climits>
#include <cstdlib>
#include <fstream>

namespace ferry_rdma {

namespace {

std::string real(const std::string &path) {
    char buf[PATH_MAX];
    return realpath(path.c_str(), buf) != nullptr ? std::string(buf) : std::string();
}

int read_int(const std::string &path, int fallback) {
    std::ifstream in(path);
    long v = 0;
    if (in >> v) return static_cast<int>(v);
    return fallback;
}

// Components below <root>/devices of the resolved link, or empty.
std::vector<std::string> pci_components(const std::string &root, const std::string &link) {
    std::string target = real(link), devices = real(root + "/devices");
    std::vector<std::string> out;
    if (target.empty() || devices.empty() || target.compare(0, devices.size() + 1, devices + "/") != 0) return out;
    std::string rest = target.substr(devices.size() + 1);
    size_t start = 0;
    while (start < rest.size()) {
        size_t end = rest.find('/', start);
        if (end == std::string::npos) end = rest.size();
        if (end > start) out.push_back(rest.substr(start, end - start));
        start = end + 1;
    }
    return out;
}

}  // namespace

NicTopology read_nic_topology(const std::string &root, const std::string &device) {
    NicTopology t;
    t.name = device;
    std::string dev = root + "/class/infiniband/" + device + "/device";
    t.pci_path = pci_components(root, dev);
    t.numa_node = read_int(dev + "/numa_node", -1);
    return t;
}

bool read_pci_function(const std::string &root, const std::string &bus_id, std::vector<std::string> *path,
                       int *numa_node, std::string *why) {
    std::string id = bus_id;
    for (char &c : id) c = static_cast<char>(tolower(static_cast<unsigned char>(c)));
    std::string link = root + "/bus/pci/devices/" + id;
    auto comps = pci_components(root, link);
    if (comps.empty()) {
        if (why) *why = "no PCI device " + id + " under " + root + "/bus/pci/devices";
        return false;
    }
    *path = std::move(comps);
    *numa_node = read_int(link + "/numa_node", -1);
    return true;
}

size_t common_pci_prefix(const std::vector<std::string> &a, const std::vector<std::string> &b) {
    size_t n = 0;
    while (n < a.size() && n < b.size() && a[n] == b[n]) ++n;
    return n;
}

std::vector<uint16_t> nearest_nics(const std::vector<NicTopology> &nics, const MemLocation &where) {
    // Score: PCI prefix first (GPU memory only), then NUMA match (unknown nodes match anything).
    std::vector<std::pair<size_t, int>> score(nics.size());
    for (size_t i = 0; i < nics.size(); ++i) {
        size_t pci = where.pci_path.empty() ? 0 : common_pci_prefix(nics[i].pci_path, where.pci_path);
        bool numa = where.numa_node < 0 || nics[i].numa_node < 0 || nics[i].numa_node == where.numa_node;
        score[i] = {pci, numa ? 1 : 0};
    }
    std::pair<size_t, int> best{0, -1};
    for (const auto &s : score) best = std::max(best, s);
    std::vector<uint16_t> out;
    for (size_t i = 0; i < nics.size(); ++i)
        if (score[i] == best) out.push_back(static_cast<uint16_t>(i));
    return out;
}

int numa_node_of(const void *addr) {
    int node = -1;
    // MPOL_F_NODE | MPOL_F_ADDR: the node of the page at addr.
    long rc = syscall(SYS_get_mempolicy, &node, nullptr, 0, const_cast<void *>(addr), 1 | 2);
    return rc == 0 ? node : -1;
}

}  // namespace ferry_rdma
