// Mooncake's flags in Ferry's terms: its protocol names (Ferry's transport for each, or why
// there is none), its NIC flags (--device_name, --nic_priority_matrix) as rdma.devices, its
// --metadata_server forms, and its GPU builds' --use_vram default.
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "bench_options_detail.hpp"

namespace bench {
namespace {

// Mooncake's protocol names: Ferry's transport for each, or why there is none.
struct ProtocolMap {
    const char *mooncake;
    const char *ferry;  // nullptr: none
    const char *note;
};
const ProtocolMap kProtocols[] = {
    {"nvlink_intra", "cuda_ipc",
     "Mooncake's nvlink_intra is cuda_ipc in Ferry (CUDA IPC between processes of one host)"},
    {"nvlink", "cuda_ipc",
     "Mooncake's nvlink (multi-node NVLink fabric memory) is cuda_ipc in Ferry: GPUs of one host "
     "only, Ferry has no MNNVL transport"},
    {"hip", "hip_ipc", "Mooncake's hip is hip_ipc in Ferry (HIP IPC between processes of one host)"},
    {"io_uring", "file", "Mooncake's io_uring file transport is file.so in Ferry (--segment_id=file:/path)"},
    {"gds", "gds", "gds is gds.so in Ferry: GPU memory to and from files (--segment_id=file:/path --use_vram)"},
    {"barex", nullptr, "Ferry has no barex transport; --protocol=rdma drives the same NICs through rdma.so"},
    {"musa", nullptr, "Ferry has no Moore Threads MUSA transport"},
    {"sunrise_link", nullptr, "Ferry has no Sunrise Link transport"},
    {"ub", nullptr, "Ferry has no Kunpeng UB (URMA) transport"},
    {"ubshmem", nullptr, "Ferry has no UBShmem transport"},
    {"ascend", nullptr, "Ferry has no Huawei Ascend transport"},
    {"cxl", nullptr, "Ferry has no CXL transport"},
    {"nvmeof", nullptr, "Ferry has no NVMe-oF transport"},
    {"tpu", nullptr, "Ferry has no TPU transport"},
    {"mpcomm", nullptr,
     "Ferry has no MPComm transport (Mooncake's is TENT-only, not in its transfer_engine_bench either)"},
};

// The device names inside the matrix's arrays ({"cpu:0": [["mlx5_0"], ["mlx5_1"]], ...}), in
// order, once each; the location keys are outside any array.
std::vector<std::string> matrix_devices(const std::string &json) {
    std::vector<std::string> out;
    int depth = 0;
    for (size_t i = 0; i < json.size(); ++i) {
        char c = json[i];
        if (c == '[') ++depth;
        else if (c == ']') --depth;
        else if (c == '"') {
            std::string s;
            for (++i; i < json.size() && json[i] != '"'; ++i)
                s += json[i] == '\\' && i + 1 < json.size() ? json[++i] : json[i];
            if (depth > 0 && !s.empty() && std::find(out.begin(), out.end(), s) == out.end()) out.push_back(s);
        }
    }
    return out;
}

void resolve_protocol(Options &o, const GivenFlag &given) {
    if (!given("protocol") && (!o.device_name.empty() || !o.nic_priority_matrix.empty()) && !o.auto_discovery) {
        o.protocol = "rdma";
        o.notes.push_back(std::string(o.device_name.empty() ? "--nic_priority_matrix" : "--device_name") +
                          " without --protocol: rdma, Mooncake's default protocol");
    }
    o.transport = o.protocol;
    for (const auto &m : kProtocols)
        if (o.protocol == m.mooncake) {
            if (!m.ferry)
                usage_error(
                    "--protocol=" + o.protocol + ": " + m.note +
                    ". Ferry's transports: tcp, shm, efa, rdma, cuda_ipc, hip_ipc, file, gds (ferry-info lists what loads here)");
            o.transport = m.ferry;
            o.notes.push_back(std::string("--protocol=") + m.mooncake + ": " + m.note);
        }
    if (o.auto_discovery) {
        o.transport.clear();
        if (given("protocol"))
            o.notes.push_back("--auto_discovery: the engine picks each request's transport; --protocol=" + o.protocol +
                              " is not forced (as in Mooncake)");
    }
    if (!o.nic_priority_matrix.empty()) {
        std::ifstream in(o.nic_priority_matrix);
        if (!in) usage_error("--nic_priority_matrix=" + o.nic_priority_matrix + ": cannot read it: " + strerror(errno));
        std::stringstream text;
        text << in.rdbuf();
        std::string list;
        for (auto &d : matrix_devices(text.str())) list += (list.empty() ? "" : ",") + d;
        if (list.empty()) usage_error("--nic_priority_matrix=" + o.nic_priority_matrix + " names no NIC");
        o.rdma_devices = list;
        o.notes.push_back("--nic_priority_matrix: rdma.devices=" + list +
                          "; Ferry does not rank NICs per location, rdma.so places each op by its own topology");
    } else if (!o.device_name.empty()) {
        o.rdma_devices = o.device_name;
    }
    if (!o.rdma_devices.empty() && o.transport != "rdma" && !o.transport.empty())
        o.notes.push_back("--device_name names RDMA NICs; with --protocol=" + o.protocol +
                          " it only applies if rdma.so "
                          "carries a request (as in Mooncake, where only rdma reads it)");
}

void resolve_metadata(Options &o) {
    const std::string &m = o.metadata_server;
    auto scheme = m.find("://");
    std::string name = scheme == std::string::npos ? "" : lower(m.substr(0, scheme));
    if (m == "P2PHANDSHAKE" || m.empty() || name == "etcd" || name == "etcds") {
        o.metadata_url = m;
    } else if (name == "redis" || name == "rediss" || name == "http" || name == "https") {
        o.metadata_url = m;  // Redis, or Mooncake's HTTP metadata server: the engine takes them as they are
    } else if (scheme != std::string::npos) {
        usage_error("--metadata_server=" + m + ": unknown scheme " + name +
                    "://; use P2PHANDSHAKE, etcd://host:2379, redis://host:6379 or http://host:8080/metadata");
    } else {
        o.metadata_url = "etcd://" + m;  // Mooncake reads a bare host:port[,host:port] as etcd
        o.notes.push_back("--metadata_server=" + m + ": etcd at " + m + ", as Mooncake reads it (etcd://" + m + ")");
    }
}

void resolve_gpu(Options &o, const GivenFlag &given) {
    // Mooncake's GPU builds default --use_vram to true, so their command lines give --gpu_id
    // alone; its CPU builds have neither flag. Host memory unless either asks for a GPU.
    if (!given("use_vram") && given("gpu_id")) {
        o.use_vram = true;
        o.notes.push_back(
            "--gpu_id without --use_vram: GPU memory, as Mooncake's GPU builds default --use_vram to true "
            "(--use_vram=false for host memory)");
    }
    if (!o.use_vram && given("gpu_id"))
        o.notes.push_back("--gpu_id applies with --use_vram only; buffers are in host memory");
}

}  // namespace

void resolve_mooncake_flags(Options &o, const GivenFlag &given) {
    resolve_metadata(o);
    resolve_protocol(o, given);
    resolve_gpu(o, given);
}

}  // namespace bench
