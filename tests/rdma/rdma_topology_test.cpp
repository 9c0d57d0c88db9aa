// rdma.so's NIC choice from a fake sysfs tree (PCI paths, NUMA nodes), dma-buf capability
// classification and the GPU runtimes missing.
#include "gpu_memory.hpp"
#include "rdma_test_util.hpp"
#include "topology.hpp"
#include "verbs.hpp"

#include <ferry/plugin.h>
#include <gtest/gtest.h>

#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>

namespace ferry_rdma {
namespace {

using namespace ferry_rdma::test;

namespace fs = std::filesystem;

class FakeSysfs : public ::testing::Test {
protected:
    void SetUp() override {
        char tmpl[] = "/tmp/ferry-rdma-sysfs-XXXXXX";
        ASSERT_NE(mkdtemp(tmpl), nullptr);
        root = tmpl;
        // Socket 0: switch 0000:00:01.0 holds mlx5_0 and GPU 0000:02:00.0; mlx5_2 sits on
        // another root port of the same root complex. Socket 1: mlx5_1 and GPU 0000:82:00.0.
        pci("pci0000:00/0000:00:01.0/0000:01:00.0", 0);
        pci("pci0000:00/0000:00:01.0/0000:02:00.0", 0);
        pci("pci0000:00/0000:00:02.0/0000:03:00.0", 0);
        pci("pci0000:80/0000:80:01.0/0000:81:00.0", 1);
        pci("pci0000:80/0000:80:01.0/0000:82:00.0", 1);
        nic_dev("mlx5_0", "pci0000:00/0000:00:01.0/0000:01:00.0");
        nic_dev("mlx5_2", "pci0000:00/0000:00:02.0/0000:03:00.0");
        nic_dev("mlx5_1", "pci0000:80/0000:80:01.0/0000:81:00.0");
        for (const char *f : {"0000:01:00.0", "0000:02:00.0", "0000:03:00.0", "0000:81:00.0", "0000:82:00.0"}) {
            fs::create_directories(root + "/bus/pci/devices");
            std::string path = f[5] == '8' ? "pci0000:80/0000:80:01.0/"
                                           : (f[6] == '3' ? "pci0000:00/0000:00:02.0/" : "pci0000:00/0000:00:01.0/");
            fs::create_symlink("../../../devices/" + path + f, root + "/bus/pci/devices/" + f);
        }
    }
    void TearDown() override { fs::remove_all(root); }
    void pci(const std::string &path, int node) {
        fs::create_directories(root + "/devices/" + path);
        std::ofstream(root + "/devices/" + path + "/numa_node") << node << "\n";
    }
    void nic_dev(const std::string &name, const std::string &path) {
        fs::create_directories(root + "/class/infiniband/" + name);
        fs::create_symlink("../../../devices/" + path, root + "/class/infiniband/" + name + "/device");
    }
    std::vector<NicTopology> nics() {
        return {read_nic_topology(root, "mlx5_0"), read_nic_topology(root, "mlx5_1"),
                read_nic_topology(root, "mlx5_2")};
    }
    MemLocation gpu(const std::string &bus) {
        MemLocation m;
        std::string why;
        EXPECT_TRUE(read_pci_function(root, bus, &m.pci_path, &m.numa_node, &why)) << why;
        return m;
    }
    std::string root;
};

TEST_F(FakeSysfs, ReadsPciPathAndNumaNode) {
    auto t = read_nic_topology(root, "mlx5_1");
    EXPECT_EQ(t.pci_path, (std::vector<std::string>{"pci0000:80", "0000:80:01.0", "0000:81:00.0"}));
    EXPECT_EQ(t.numa_node, 1);
    auto missing = read_nic_topology(root, "mlx5_9");
    EXPECT_TRUE(missing.pci_path.empty());
    EXPECT_EQ(missing.numa_node, -1);
    std::vector<std::string> path;
    int node = 0;
    std::string why;
    EXPECT_TRUE(read_pci_function(root, "0000:82:00.0", &path, &node, &why)) << why;
    EXPECT_EQ(node, 1);
    EXPECT_TRUE(read_pci_function(root, "0000:02:00.0", &path, &node, &why)) << "bus ids are matched in lower case";
    EXPECT_FALSE(read_pci_function(root, "0000:c1:00.0", &path, &node, &why));
    EXPECT_TRUE(contains(why, "0000:c1:00.0")) << why;
}

TEST_F(FakeSysfs, GpuMemoryGoesToTheNicBehindTheSameSwitch) {
    auto n = nics();
    EXPECT_EQ(nearest_nics(n, gpu("0000:02:00.0")), (std::vector<uint16_t>{0})) << "mlx5_0 shares the switch";
    EXPECT_EQ(nearest_nics(n, gpu("0000:82:00.0")), (std::vector<uint16_t>{1}));
    // Upper-case bus ids (as cuDeviceGetPCIBusId prints them) find the same device.
    EXPECT_EQ(nearest_nics(n, gpu("0000:02:00.0")), nearest_nics(n, gpu("0000:02:00.0")));
}

TEST_F(FakeSysfs, HostMemoryGoesToTheNicsOfItsNumaNode) {
    auto n = nics();
    MemLocation node0, node1, unknown;
    node0.numa_node = 0;
    node1.numa_node = 1;
    EXPECT_EQ(nearest_nics(n, node0), (std::vector<uint16_t>{0, 2})) << "two NICs on node 0: striped over both";
    EXPECT_EQ(nearest_nics(n, node1), (std::vector<uint16_t>{1}));
    EXPECT_EQ(nearest_nics(n, unknown), (std::vector<uint16_t>{0, 1, 2}));
    MemLocation node7;
    node7.numa_node = 7;
    EXPECT_EQ(nearest_nics(n, node7), (std::vector<uint16_t>{0, 1, 2})) << "no NIC on the node: all";
}

TEST_F(FakeSysfs, GpuWithoutSysfsEntryFallsBackToNuma) {
    auto n = nics();
    MemLocation m;
    m.numa_node = 1;  // what the runtime said; sysfs did not know the bus id
    EXPECT_EQ(nearest_nics(n, m), (std::vector<uint16_t>{1}));
}

TEST(RdmaTopology, NumaNodeOfThisProcessesMemory) {
    std::vector<char> buf(4096, 1);
    int node = numa_node_of(buf.data());
    // Every Linux host has node 0; a kernel without NUMA answers -1.
    EXPECT_GE(node, -1);
    if (fs::exists("/sys/devices/system/node/node0")) {
        EXPECT_GE(node, 0);
    }
}

// ---------------- dma-buf capability and GPU runtimes ----------------

TEST(RdmaDmabuf, CapabilityFromTheFdMinusOneProbe) {
    auto v = classify_dmabuf_probe(true, EBADF, "mlx5_0");
    EXPECT_EQ(v.support, DmabufSupport::Supported);
    EXPECT_TRUE(contains(v.why, "mlx5_0")) << v.why;
    for (int e : {EOPNOTSUPP, EPROTONOSUPPORT, ENOSYS}) {
        v = classify_dmabuf_probe(true, e, "rxe0");
        EXPECT_EQ(v.support, DmabufSupport::Unsupported) << e;
        EXPECT_TRUE(contains(v.why, "rxe0")) << v.why;
    }
    v = classify_dmabuf_probe(true, EINVAL, "mlx5_0");
    EXPECT_EQ(v.support, DmabufSupport::Unknown);
    EXPECT_TRUE(contains(v.why, "expected EBADF")) << v.why;
    v = classify_dmabuf_probe(false, 0, "mlx5_0");
    EXPECT_EQ(v.support, DmabufSupport::Unsupported);
    EXPECT_TRUE(contains(v.why, "IBVERBS_1.12")) << v.why;
}

TEST(RdmaDmabuf, RegDmabufMrResolvedAtItsSymbolVersion) {
    std::string why;
    // Debian 12's rdma-core 44 has it; the plugin would still load without it.
    EXPECT_NE(resolve_reg_dmabuf_mr(&why), nullptr) << why;
}

TEST(RdmaDmabuf, CudaRuntimeMissingIsReportedByName) {
    auto rt = make_cuda_runtime("/nonexistent/ferry-test/libcuda.so.1");
    std::string why;
    EXPECT_FALSE(rt->available(&why));
    EXPECT_TRUE(contains(why, "unavailable: CUDA driver not found")) << why;
    EXPECT_TRUE(contains(why, "/nonexistent/ferry-test/libcuda.so.1")) << why;
    DmabufExport e;
    std::string reg;
    EXPECT_EQ(rt->export_dmabuf(0x10000, 4096, 0, &e, &reg), -ENOTSUP);
    EXPECT_EQ(reg, why);
    EXPECT_EQ(e.fd, -1) << "nothing written on failure";
}

TEST(RdmaDmabuf, RocmRuntimeMissingIsReportedByName) {
    auto rt = make_rocm_runtime("/nonexistent/ferry-test/libhsa-runtime64.so.1");
    std::string why;
    EXPECT_FALSE(rt->available(&why));
    EXPECT_TRUE(contains(why, "unavailable: ROCm runtime not found")) << why;
    DmabufExport e;
    std::string reg;
    EXPECT_EQ(rt->export_dmabuf(0x10000, 4096, 0, &e, &reg), -ENOTSUP);
    EXPECT_TRUE(contains(reg, "ROCm runtime not found")) << reg;
}

TEST(RdmaDmabuf, ALibraryWithoutTheDriverApiIsNamed) {
    // libibverbs is a real library without cuInit: the check must say so, not crash.
    auto rt = make_cuda_runtime("libibverbs.so.1");
    std::string why;
    EXPECT_FALSE(rt->available(&why));
    EXPECT_TRUE(contains(why, "lacks the CUDA driver API")) << why;
}

TEST(RdmaDmabuf, MappingFailureNamesNicMemoryAndCause) {
    for (int e : {EFAULT, EINVAL}) {
        std::string m = describe_dmabuf_reg_failure(e, "mlx5_3", FERRY_MEM_CUDA, 2, 0x7f0000000000, 1 << 20);
        EXPECT_TRUE(contains(m, "mlx5_3")) << m;
        EXPECT_TRUE(contains(m, "CUDA memory of device 2 at 0x7f0000000000")) << m;
        EXPECT_TRUE(contains(m, "could not map the GPU pages")) << m;
        EXPECT_TRUE(contains(m, "peer-to-peer")) << m;
    }
    std::string m = describe_dmabuf_reg_failure(EOPNOTSUPP, "rxe0", FERRY_MEM_ROCM, 0, 0x1000, 4096);
    EXPECT_TRUE(contains(m, "ROCm")) << m;
    EXPECT_TRUE(contains(m, "no dma-buf registration")) << m;
}

}  // namespace
}  // namespace ferry_rdma
