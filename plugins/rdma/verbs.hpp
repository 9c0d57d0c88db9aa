// libibverbs objects of rdma.so behind RAII owners: a NIC (device context, protection domain,
// completion channel and CQ, its port's address) and RC queue pairs with their
// RESET -> INIT -> RTR -> RTS transitions. The probe's words are built here too.
#pragma once

#include "gpu_memory.hpp"
#include "options.hpp"
#include "topology.hpp"
#include "wire.hpp"

#include <infiniband/verbs.h>

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

namespace ferry_rdma {

// ---- pure helpers (unit-tested) ----

// The probe's reason when ibv_get_device_list found nothing. `list_errno` is errno after the
// call (ENOSYS: the kernel has no RDMA support), `class_dir_exists` whether
// <sysfs>/class/infiniband exists.
std::string describe_no_devices(int list_errno, bool class_dir_exists, const std::string &sysfs_root);

struct GidEntry {
    uint8_t gid[16] = {};
    std::string type;  // sysfs gid_attrs/types/<i>: "IB/RoCE v1" or "RoCE v2"; empty: unknown
};
// Auto GID choice for a RoCE port: a RoCE v2 IPv4-mapped GID (routable, what RCCL/NCCL pick),
// else any RoCE v2 GID, else the first non-zero GID; -1 when the table has none.
int choose_gid_index(const std::vector<GidEntry> &table);

// enum ibv_mtu code (1..5) from bytes (256..4096), 0 for others; and back.
uint8_t mtu_code(unsigned bytes);
unsigned mtu_bytes(uint8_t code);

const char *port_state_name(int state);  // "ACTIVE", "DOWN", ...

// Whether a failed work completion blames the path to the peer (no acknowledgement after the
// transport's retries, the receiver not ready after its retries), so the local NIC is paused
// and new work requests go to the other NICs. Access, length and protection errors are the
// op's own; a flush follows another error.
bool wc_path_error(int status);

// ---- verbs ----

class Nic {
public:
    // Opens `dev`, checks port cfg.ib_port is active, picks the GID, creates the PD, the
    // completion channel and one CQ. nullptr and *why on failure.
    static std::unique_ptr<Nic> open(ibv_device *dev, const Config &cfg, RegDmabufMrFn reg_dmabuf, std::string *why);
    ~Nic();
    Nic(const Nic &) = delete;
    Nic &operator=(const Nic &) = delete;

    const std::string &name() const { return addr.name; }
    ibv_context *ctx = nullptr;
    ibv_pd *pd = nullptr;
    ibv_comp_channel *channel = nullptr;
    ibv_cq *cq = nullptr;
    ibv_device_attr dev_attr{};
    ibv_port_attr port_attr{};
    NicAddress addr;   // what peers need (in the endpoint)
    NicTopology topo;  // PCI path and NUMA node, for memory affinity
    uint64_t max_mr_size = 0;
    uint32_t max_msg_size = 0;
    uint32_t max_qp_wr = 0;
    uint8_t max_rd_atomic = 1;
    DmabufVerdict dmabuf;  // can GPU memory be registered here?

private:
    Nic() = default;
};

// An RC queue pair of one NIC. Created in RESET and moved to INIT at once.
class QueuePair {
public:
    static std::unique_ptr<QueuePair> create(Nic &nic, uint32_t depth, std::string *why);
    ~QueuePair();
    QueuePair(const QueuePair &) = delete;
    QueuePair &operator=(const QueuePair &) = delete;

    uint32_t qpn() const { return qp_->qp_num; }
    uint32_t psn() const { return psn_; }
    ibv_qp *get() const { return qp_; }
    uint32_t depth() const { return depth_; }
    // INIT -> RTR -> RTS towards `remote` (its NIC address, queue pair number and start PSN).
    int connect(const NicAddress &remote, uint32_t remote_qpn, uint32_t remote_psn, const Config &cfg,
                std::string *why);
    // Stops the hardware using it (-> ERR; outstanding work requests are flushed).
    void to_error();

private:
    QueuePair() = default;
    Nic *nic_ = nullptr;
    ibv_qp *qp_ = nullptr;
    uint32_t psn_ = 0;
    uint32_t depth_ = 0;
};

// Every device ibv_get_device_list returns, closed on destruction.
class DeviceList {
public:
    DeviceList();
    ~DeviceList();
    DeviceList(const DeviceList &) = delete;
    DeviceList &operator=(const DeviceList &) = delete;
    int size() const { return n_; }
    ibv_device *operator[](int i) const { return list_[i]; }
    int list_errno() const { return errno_; }

private:
    ibv_device **list_ = nullptr;
    int n_ = 0;
    int errno_ = 0;
};

// Opens the NICs cfg selects (cfg.devices, or every device with an active port). Empty and
// *why (naming what was checked) when none is usable.
std::vector<std::unique_ptr<Nic>> open_nics(const Config &cfg, RegDmabufMrFn reg_dmabuf, std::string *why);

// One line per NIC for probe/ferry-info: "mlx5_0 port 1 ACTIVE InfiniBand 4096 MTU, dma-buf: ...".
std::string describe_nics(const std::vector<std::unique_ptr<Nic>> &nics);

}  // namespace ferry_rdma
