// Which NIC serves which memory: PCIe and NUMA affinity read from sysfs (a root given as a
// parameter, so tests build a fake tree). Pure file reads, no verbs calls.
//
//   <root>/class/infiniband/<dev>/device    -> symlink to the NIC's PCI function under
//                                              <root>/devices/pci<domain>:<bus>/.../<bdf>
//   <root>/class/infiniband/<dev>/device/numa_node
//   <root>/bus/pci/devices/<bdf>            -> symlink to a PCI function (a GPU's bus id)
//
// GPU memory: the NICs sharing the longest PCI path with the GPU (same switch beats same root
// complex beats elsewhere), ties broken by the GPU's NUMA node. Host memory: the NICs on the
// memory's NUMA node (all NICs when it is unknown or none is there).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ferry_rdma {

struct NicTopology {
    std::string name;
    std::vector<std::string> pci_path;  // e.g. {"pci0000:00", "0000:00:01.0", "0000:01:00.0"}; empty: unknown
    int numa_node = -1;                 // -1: unknown (single-node machines report -1 too)
};

NicTopology read_nic_topology(const std::string &sysfs_root, const std::string &device);

// PCI path and NUMA node of a PCI function given by bus id ("0000:3b:00.0", any case);
// false and *why when sysfs has no such device.
bool read_pci_function(const std::string &sysfs_root, const std::string &bus_id, std::vector<std::string> *path,
                       int *numa_node, std::string *why);

struct MemLocation {
    std::vector<std::string> pci_path;  // GPU memory: the GPU's PCI path; empty for host memory
    int numa_node = -1;                 // host memory: the node holding it; GPU: the GPU's node
};

// Indices of the nearest NICs, best first: all NICs tied for the best affinity (so traffic
// can stripe over them), then nothing else. Never empty when nics is not.
std::vector<uint16_t> nearest_nics(const std::vector<NicTopology> &nics, const MemLocation &where);

// Shared leading components of two PCI paths.
size_t common_pci_prefix(const std::vector<std::string> &a, const std::vector<std::string> &b);

// NUMA node of the page holding addr (get_mempolicy), or -1.
int numa_node_of(const void *addr);

}  // namespace ferry_rdma
