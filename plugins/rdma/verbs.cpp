#include "verbs.hpp"

#include <sys/random.h>
#include <sys/stat.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>

namespace ferry_rdma {

namespace {

std::string err_text(int e) {
    char buf[128];
    return strerror_r(e, buf, sizeof buf);
}

std::string read_line(const std::string &path) {
    std::ifstream in(path);
    std::string s;
    std::getline(in, s);
    return s;
}

uint32_t random_psn() {
    uint32_t v = 0;
    if (getrandom(&v, sizeof v, 0) != static_cast<ssize_t>(sizeof v))
        v = static_cast<uint32_t>(reinterpret_cast<uintptr_t>(&v));
    return v & 0xffffff;
}

}  // namespace

std::string describe_no_devices(int list_errno, bool class_dir_exists, const std::string &sysfs_root) {
    std::string where = sysfs_root + "/class/infiniband";
    std::string s = "no RDMA devices (ibv_get_device_list found none";
    if (list_errno == ENOSYS) s += ": the kernel has no RDMA support (ENOSYS)";
    else if (list_errno != 0) s += ": " + err_text(list_errno);
    s += class_dir_exists ? "; " + where + " exists but lists no usable device" : "; " + where + " absent";
    s += "): rdma.so needs an RDMA NIC (InfiniBand, RoCE, iWARP) and its kernel driver";
    if (!class_dir_exists) s += ", e.g. modprobe mlx5_ib";
    return s;
}

int choose_gid_index(const std::vector<GidEntry> &table) {
    auto nonzero = [](const uint8_t *g) { return std::any_of(g, g + 16, [](uint8_t b) { return b != 0; }); };
    auto v4mapped = [](const uint8_t *g) {
        return std::all_of(g, g + 10, [](uint8_t b) { return b == 0; }) && g[10] == 0xff && g[11] == 0xff;
    };
    int v2 = -1, any = -1;
    for (size_t i = 0; i < table.size(); ++i) {
        const auto &e = table[i];
        if (!nonzero(e.gid)) continue;
        if (e.type == "RoCE v2") {
            if (v4mapped(e.gid)) return static_cast<int>(i);
            if (v2 < 0) v2 = static_cast<int>(i);
        }
        if (any < 0) any = static_cast<int>(i);
    }
    return v2 >= 0 ? v2 : any;
}

uint8_t mtu_code(unsigned bytes) {
    switch (bytes) {
        case 256: return IBV_MTU_256;
        case 512: return IBV_MTU_512;
        case 1024: return IBV_MTU_1024;
        case 2048: return IBV_MTU_2048;
        case 4096: return IBV_MTU_4096;
        default: return 0;
    }
}

unsigned mtu_bytes(uint8_t code) { return code >= 1 && code <= 5 ? 128u << code : 0; }

const char *port_state_name(int state) {
    switch (state) {
        case IBV_PORT_DOWN: return "DOWN";
        case IBV_PORT_INIT: return "INIT";
        case IBV_PORT_ARMED: return "ARMED";
        case IBV_PORT_ACTIVE: return "ACTIVE";
        case IBV_PORT_ACTIVE_DEFER: return "ACTIVE_DEFER";
        default: return "NOP";
    }
}

bool wc_path_error(int status) { return status == IBV_WC_RETRY_EXC_ERR || status == IBV_WC_RNR_RETRY_EXC_ERR; }

DeviceList::DeviceList() {
    errno = 0;
    list_ = ibv_get_device_list(&n_);
    errno_ = errno;
    if (list_ == nullptr) n_ = 0;
}

DeviceList::~DeviceList() {
    if (list_ != nullptr) ibv_free_device_list(list_);
}

std::unique_ptr<Nic> Nic::open(ibv_device *dev, const Config &cfg, RegDmabufMrFn reg_dmabuf, std::string *why) {
    std::unique_ptr<Nic> nic(new Nic());
    std::string name = ibv_get_device_name(dev);
    nic->addr.name = name;
    nic->ctx = ibv_open_device(dev);
    if (nic->ctx == nullptr) {
        *why = name + ": ibv_open_device: " + err_text(errno);
        return nullptr;
    }
    if (int rc = ibv_query_device(nic->ctx, &nic->dev_attr); rc != 0) {
        *why = name + ": ibv_query_device: " + err_text(rc);
        return nullptr;
    }
    if (cfg.ib_port > nic->dev_attr.phys_port_cnt) {
        *why = name + " has " + std::to_string(nic->dev_attr.phys_port_cnt) + " port(s), option ib_port is " +
               std::to_string(cfg.ib_port);
        return nullptr;
    }
    if (int rc = ibv_query_port(nic->ctx, static_cast<uint8_t>(cfg.ib_port), &nic->port_attr); rc != 0) {
        *why = name + ": ibv_query_port " + std::to_string(cfg.ib_port) + ": " + err_text(rc);
        return nullptr;
    }
    const ibv_port_attr &pa = nic->port_attr;
    if (pa.state != IBV_PORT_ACTIVE) {
        *why = name + " port " + std::to_string(cfg.ib_port) + " is " + port_state_name(pa.state) +
               " (needs ACTIVE: check the cable, the switch and, for InfiniBand, the subnet manager)";
        return nullptr;
    }
    nic->addr.port = static_cast<uint8_t>(cfg.ib_port);
    nic->addr.lid = pa.lid;
    nic->addr.mtu = static_cast<uint8_t>(pa.active_mtu);
    nic->addr.link = pa.link_layer == IBV_LINK_LAYER_ETHERNET ? LinkLayer::Ethernet : LinkLayer::InfiniBand;
    // GID: the option, else the auto choice for RoCE; InfiniBand routes by LID, GID 0 rides along.
    int gid_index = cfg.gid_index;
    std::string port_dir = cfg.sysfs_root + "/class/infiniband/" + name + "/ports/" + std::to_string(cfg.ib_port);
    if (gid_index < 0) {
        if (nic->addr.link == LinkLayer::Ethernet) {
            std::vector<GidEntry> table(static_cast<size_t>(std::max(pa.gid_tbl_len, 0)));
            for (size_t i = 0; i < table.size(); ++i) {
                ibv_gid g{};
                if (ibv_query_gid(nic->ctx, static_cast<uint8_t>(cfg.ib_port), static_cast<int>(i), &g) == 0)
                    memcpy(table[i].gid, g.raw, 16);
                table[i].type = read_line(port_dir + "/gid_attrs/types/" + std::to_string(i));
            }
            gid_index = choose_gid_index(table);
            if (gid_index < 0) {
                *why = name + " is RoCE but its GID table has no usable entry (no IP address on its netdev?)";
                return nullptr;
            }
        } else {
            gid_index = 0;
        }
    }
    if (gid_index >= pa.gid_tbl_len && pa.gid_tbl_len > 0) {
        *why = name + ": gid_index " + std::to_string(gid_index) + " is beyond its GID table (" +
               std::to_string(pa.gid_tbl_len) + " entries)";
        return nullptr;
    }
    ibv_gid gid{};
    if (int rc = ibv_query_gid(nic->ctx, static_cast<uint8_t>(cfg.ib_port), gid_index, &gid); rc != 0) {
        *why = name + ": ibv_query_gid " + std::to_string(gid_index) + ": " + err_text(rc);
        return nullptr;
    }
    memcpy(nic->addr.gid, gid.raw, 16);
    nic->addr.gid_index = static_cast<uint8_t>(gid_index);
    if (nic->addr.link == LinkLayer::Ethernet && !nic->addr.has_gid()) {
        *why = name + ": GID " + std::to_string(gid_index) + " is empty; RoCE needs an IP address on the port's netdev";
        return nullptr;
    }
    if (nic->addr.link == LinkLayer::InfiniBand && pa.lid == 0) {
        *why = name + " is InfiniBand without a LID (no subnet manager?)";
        return nullptr;
    }
    nic->max_mr_size = nic->dev_attr.max_mr_size;
    nic->max_msg_size = pa.max_msg_sz;
    nic->max_qp_wr = static_cast<uint32_t>(std::max(nic->dev_attr.max_qp_wr, 2));
    nic->max_rd_atomic = static_cast<uint8_t>(std::clamp(nic->dev_attr.max_qp_rd_atom, 1, 16));
    nic->topo = read_nic_topology(cfg.sysfs_root, name);

    nic->pd = ibv_alloc_pd(nic->ctx);
    if (nic->pd == nullptr) {
        *why = name + ": ibv_alloc_pd: " + err_text(errno);
        return nullptr;
    }
    nic->channel = ibv_create_comp_channel(nic->ctx);
    if (nic->channel == nullptr) {
        *why = name + ": ibv_create_comp_channel: " + err_text(errno);
        return nullptr;
    }
    int cqe = std::min(nic->dev_attr.max_cqe, 65536);
    nic->cq = ibv_create_cq(nic->ctx, cqe, nullptr, nic->channel, 0);
    if (nic->cq == nullptr) {
        *why = name + ": ibv_create_cq(" + std::to_string(cqe) + "): " + err_text(errno);
        return nullptr;
    }
    // dma-buf capability, the RCCL/NCCL way: a registration of fd -1 fails with EBADF exactly when
    // the driver would take a real one.
    if (reg_dmabuf == nullptr) {
        nic->dmabuf = classify_dmabuf_probe(false, 0, name);
    } else {
        errno = 0;
        ibv_mr *mr = reg_dmabuf(nic->pd, 0, 0, 0, -1, 0);
        int e = errno;
        if (mr != nullptr) ibv_dereg_mr(mr);
        nic->dmabuf = classify_dmabuf_probe(true, mr != nullptr ? 0 : e, name);
    }
    return nic;
}

Nic::~Nic() {
    if (cq != nullptr) ibv_destroy_cq(cq);
    if (channel != nullptr) ibv_destroy_comp_channel(channel);
    if (pd != nullptr) ibv_dealloc_pd(pd);
    if (ctx != nullptr) ibv_close_device(ctx);
}

std::unique_ptr<QueuePair> QueuePair::create(Nic &nic, uint32_t depth, std::string *why) {
    std::unique_ptr<QueuePair> q(new QueuePair());
    q->nic_ = &nic;
    q->depth_ = std::min(depth, nic.max_qp_wr);
    ibv_qp_init_attr init{};
    init.send_cq = nic.cq;
    init.recv_cq = nic.cq;
    init.qp_type = IBV_QPT_RC;
    init.sq_sig_all = 0;  // selective signalling
    init.cap.max_send_wr = q->depth_;
    init.cap.max_recv_wr = 1;
    init.cap.max_send_sge = 1;
    init.cap.max_recv_sge = 1;
    q->qp_ = ibv_create_qp(nic.pd, &init);
    if (q->qp_ == nullptr) {
        *why = nic.name() + ": ibv_create_qp(RC, " + std::to_string(q->depth_) + " send WRs): " + err_text(errno);
        return nullptr;
    }
    q->depth_ = std::min(q->depth_, init.cap.max_send_wr);
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_INIT;
    a.pkey_index = 0;
    a.port_num = nic.addr.port;
    a.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_WRITE;
    if (int rc = ibv_modify_qp(q->qp_, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
        rc != 0) {
        *why = nic.name() + ": queue pair to INIT: " + err_text(rc);
        return nullptr;
    }
    q->psn_ = random_psn();
    return q;
}

QueuePair::~QueuePair() {
    if (qp_ != nullptr) ibv_destroy_qp(qp_);
}

int QueuePair::connect(const NicAddress &remote, uint32_t remote_qpn, uint32_t remote_psn, const Config &cfg,
                       std::string *why) {
    const NicAddress &local = nic_->addr;
    if (local.link != remote.link) {
        *why = local.name + " is " + (local.link == LinkLayer::Ethernet ? "RoCE" : "InfiniBand") + " but the peer's " +
               remote.name + " is not";
        return -EPROTO;
    }
    uint8_t mtu = std::min(local.mtu, remote.mtu);
    if (cfg.mtu != 0) mtu = std::min(mtu, mtu_code(cfg.mtu));
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_RTR;
    a.path_mtu = static_cast<ibv_mtu>(mtu);
    a.dest_qp_num = remote_qpn;
    a.rq_psn = remote_psn;
    a.max_dest_rd_atomic = nic_->max_rd_atomic;
    a.min_rnr_timer = 12;
    a.ah_attr.port_num = local.port;
    a.ah_attr.sl = static_cast<uint8_t>(cfg.service_level);
    a.ah_attr.dlid = remote.lid;
    // RoCE always routes by GID; InfiniBand by LID unless the peer is in another subnet.
    bool global = local.link == LinkLayer::Ethernet ||
                  (remote.has_gid() && memcmp(remote.gid, local.gid, 8) != 0);  // subnet prefix differs
    if (global) {
        a.ah_attr.is_global = 1;
        memcpy(a.ah_attr.grh.dgid.raw, remote.gid, 16);
        a.ah_attr.grh.sgid_index = local.gid_index;
        a.ah_attr.grh.hop_limit = 64;
        a.ah_attr.grh.traffic_class = static_cast<uint8_t>(cfg.traffic_class);
    }
    int mask = IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
               IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER;
    if (int rc = ibv_modify_qp(qp_, &a, mask); rc != 0) {
        *why = local.name + " -> " + remote.name + " (qpn " + std::to_string(remote_qpn) + ", " +
               (global ? "gid " + gid_string(remote.gid) : "lid " + std::to_string(remote.lid)) +
               "): queue pair to RTR: " + err_text(rc) +
               (rc == EINVAL && global ? " (wrong gid_index or unroutable GID?)" : "");
        return -rc;
    }
    ibv_qp_attr s{};
    s.qp_state = IBV_QPS_RTS;
    s.timeout = static_cast<uint8_t>(cfg.retry_timeout);
    s.retry_cnt = static_cast<uint8_t>(cfg.retry_count);
    s.rnr_retry = 7;
    s.sq_psn = psn_;
    s.max_rd_atomic = nic_->max_rd_atomic;
    if (int rc = ibv_modify_qp(qp_, &s,
                               IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
                                   IBV_QP_MAX_QP_RD_ATOMIC);
        rc != 0) {
        *why = local.name + " -> " + remote.name + ": queue pair to RTS: " + err_text(rc);
        return -rc;
    }
    return 0;
}

void QueuePair::to_error() {
    ibv_qp_attr a{};
    a.qp_state = IBV_QPS_ERR;
    ibv_modify_qp(qp_, &a, IBV_QP_STATE);
}

std::vector<std::unique_ptr<Nic>> open_nics(const Config &cfg, RegDmabufMrFn reg_dmabuf, std::string *why) {
    std::vector<std::unique_ptr<Nic>> nics;
    DeviceList list;
    if (list.size() == 0) {
        struct stat st {};
        bool exists = stat((cfg.sysfs_root + "/class/infiniband").c_str(), &st) == 0;
        *why = describe_no_devices(list.list_errno(), exists, cfg.sysfs_root);
        return nics;
    }
    std::string skipped;
    std::vector<std::string> wanted = cfg.devices;
    for (int i = 0; i < list.size(); ++i) {
        std::string name = ibv_get_device_name(list[i]);
        auto it = std::find(wanted.begin(), wanted.end(), name);
        if (!cfg.devices.empty() && it == wanted.end()) continue;
        std::string w;
        auto nic = Nic::open(list[i], cfg, reg_dmabuf, &w);
        if (nic == nullptr) {
            if (!cfg.devices.empty()) {  // asked for by name: its failure is the answer
                *why = w;
                return {};
            }
            skipped += (skipped.empty() ? "" : "; ") + w;
            continue;
        }
        if (it != wanted.end()) wanted.erase(it);
        if (nics.size() == kMaxNics) break;
        nics.push_back(std::move(nic));
    }
    if (!cfg.devices.empty() && !wanted.empty()) {
        std::string have;
        for (int i = 0; i < list.size(); ++i) have += std::string(i ? ", " : "") + ibv_get_device_name(list[i]);
        *why = "RDMA device " + wanted.front() + " (option devices) not found; this host has: " + have;
        return {};
    }
    if (nics.empty()) *why = std::to_string(list.size()) + " RDMA device(s), none usable: " + skipped;
    return nics;
}

std::string describe_nics(const std::vector<std::unique_ptr<Nic>> &nics) {
    std::string s;
    for (const auto &n : nics) {
        if (!s.empty()) s += "; ";
        s += n->name() + " port " + std::to_string(n->addr.port) + " " +
             (n->addr.link == LinkLayer::Ethernet ? "RoCE" : "InfiniBand") + " " +
             std::to_string(mtu_bytes(n->addr.mtu)) + " MTU, numa " + std::to_string(n->topo.numa_node) + ", dma-buf " +
             (n->dmabuf.support == DmabufSupport::Supported ? "yes" : "no");
    }
    return s;
}

}  // namespace ferry_rdma
