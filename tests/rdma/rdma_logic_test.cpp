// rdma.so's hardware-independent parts, run in CI on machines without an RDMA NIC: the wire
// codecs, registration chunking at max_mr_size, work-request planning and selective
// signalling, NIC choice from a fake sysfs tree, dma-buf capability classification and the GPU
// runtimes missing, option parsing, the control channel over real loopback sockets, and the
// plugin's probe on this host.
#include "control.hpp"
#include "gpu_memory.hpp"
#include "options.hpp"
#include "plan.hpp"
#include "topology.hpp"
#include "verbs.hpp"
#include "wire.hpp"

#include <ferry/plugin.h>
#include <gtest/gtest.h>

#include <dlfcn.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <thread>

namespace ferry_rdma {
namespace {

namespace fs = std::filesystem;
constexpr uint64_t kMiB = 1ull << 20;

bool contains(const std::string &s, const std::string &part) { return s.find(part) != std::string::npos; }

NicAddress nic(const char *name, LinkLayer link, uint16_t lid, uint8_t last_gid_byte) {
    NicAddress n;
    n.name = name;
    n.link = link;
    n.lid = lid;
    n.port = 1;
    n.mtu = 5;
    n.gid_index = 3;
    n.gid[0] = 0xfe;
    n.gid[1] = 0x80;
    n.gid[15] = last_gid_byte;
    return n;
}

// ---------------- wire ----------------

TEST(RdmaWire, EndpointRoundTrip) {
    Endpoint ep;
    ep.token = 0x1122334455667788ull;
    ep.ip[0] = 127, ep.ip[3] = 1;
    ep.port = 18515;
    ep.nics = {nic("mlx5_0", LinkLayer::InfiniBand, 7, 1), nic("mlx5_1", LinkLayer::Ethernet, 0, 2)};
    auto bytes = encode_endpoint(ep);
    Endpoint out;
    std::string why;
    ASSERT_TRUE(decode_endpoint(bytes.data(), bytes.size(), &out, &why)) << why;
    EXPECT_EQ(out.token, ep.token);
    EXPECT_EQ(out.port, 18515);
    EXPECT_EQ(out.ip[0], 127);
    EXPECT_EQ(out.ip[3], 1);
    ASSERT_EQ(out.nics.size(), 2u);
    EXPECT_EQ(out.nics[0].name, "mlx5_0");
    EXPECT_EQ(out.nics[0].lid, 7);
    EXPECT_EQ(out.nics[1].link, LinkLayer::Ethernet);
    EXPECT_EQ(out.nics[1].gid_index, 3);
    EXPECT_EQ(memcmp(out.nics[1].gid, ep.nics[1].gid, 16), 0);
    EXPECT_EQ(gid_string(out.nics[1].gid), "fe80::2");
}

TEST(RdmaWire, EveryTruncationOfAnEndpointIsRejectedWithAReason) {
    Endpoint ep;
    ep.port = 1;
    ep.nics = {nic("mlx5_0", LinkLayer::InfiniBand, 7, 1)};
    auto bytes = encode_endpoint(ep);
    for (size_t n = 0; n < bytes.size(); ++n) {
        Endpoint out;
        std::string why;
        EXPECT_FALSE(decode_endpoint(bytes.data(), n, &out, &why)) << n;
        EXPECT_FALSE(why.empty()) << n;
    }
    bytes.push_back(0);
    std::string why;
    Endpoint out;
    EXPECT_FALSE(decode_endpoint(bytes.data(), bytes.size(), &out, &why));
    EXPECT_TRUE(contains(why, "trailing")) << why;
}

TEST(RdmaWire, EndpointFieldsAreChecked) {
    Endpoint ep;
    ep.port = 1;
    ep.nics = {nic("mlx5_0", LinkLayer::InfiniBand, 7, 1)};
    auto good = encode_endpoint(ep);
    std::string why;
    Endpoint out;
    auto bad = good;
    bad[0] ^= 0xff;
    EXPECT_FALSE(decode_endpoint(bad.data(), bad.size(), &out, &why));
    EXPECT_TRUE(contains(why, "magic")) << why;
    bad = good;
    bad[4] = 9;  // version
    EXPECT_FALSE(decode_endpoint(bad.data(), bad.size(), &out, &why));
    EXPECT_TRUE(contains(why, "version 9")) << why;
    // RoCE needs a GID.
    Endpoint roce = ep;
    roce.nics[0].link = LinkLayer::Ethernet;
    memset(roce.nics[0].gid, 0, 16);
    auto r = encode_endpoint(roce);
    EXPECT_FALSE(decode_endpoint(r.data(), r.size(), &out, &why));
    EXPECT_TRUE(contains(why, "RoCE without a GID")) << why;
    // MTU code out of range.
    Endpoint mtu = ep;
    mtu.nics[0].mtu = 9;
    auto m = encode_endpoint(mtu);
    EXPECT_FALSE(decode_endpoint(m.data(), m.size(), &out, &why));
    EXPECT_TRUE(contains(why, "MTU")) << why;
    Endpoint none = ep;
    none.nics.clear();
    auto z = encode_endpoint(none);
    EXPECT_FALSE(decode_endpoint(z.data(), z.size(), &out, &why));
    EXPECT_TRUE(contains(why, "NIC count 0")) << why;
}

TEST(RdmaWire, MemoryDescriptorRoundTripWithOneKeyPerNic) {
    MemDescriptor m;
    m.nearest_nics = 0b10;
    m.chunks.push_back({0x10000, 4 * kMiB, FERRY_ACCESS_REMOTE_READ, {11, 12}});
    m.chunks.push_back({0x10000 + 4 * kMiB, kMiB, FERRY_ACCESS_REMOTE_READ, {21, 22}});
    auto b = encode_mem(m, 2);
    MemDescriptor out;
    std::string why;
    ASSERT_TRUE(decode_mem(b.data(), b.size(), 2, &out, &why)) << why;
    EXPECT_EQ(out.nearest_nics, 0b10u);
    ASSERT_EQ(out.chunks.size(), 2u);
    EXPECT_EQ(out.chunks[1].addr, 0x10000 + 4 * kMiB);
    EXPECT_EQ(out.chunks[1].rkeys, (std::vector<uint32_t>{21, 22}));
    // The peer's endpoint has 3 NICs but the descriptor carries keys for 2.
    EXPECT_FALSE(decode_mem(b.data(), b.size(), 3, &out, &why));
    EXPECT_TRUE(contains(why, "keys for 2 NICs")) << why;
    for (size_t n = 0; n < b.size(); ++n) EXPECT_FALSE(decode_mem(b.data(), n, 2, &out, &why)) << n;
}

TEST(RdmaWire, MemoryDescriptorRejectsOverlapsUnknownRightsAndForeignNics) {
    std::string why;
    MemDescriptor out;
    MemDescriptor overlap;
    overlap.chunks.push_back({0x10000, 8192, 3, {1}});
    overlap.chunks.push_back({0x11000, 4096, 3, {2}});
    auto b = encode_mem(overlap, 1);
    EXPECT_FALSE(decode_mem(b.data(), b.size(), 1, &out, &why));
    EXPECT_TRUE(contains(why, "overlaps")) << why;
    MemDescriptor rights;
    rights.chunks.push_back({0x10000, 4096, 4, {1}});
    b = encode_mem(rights, 1);
    EXPECT_FALSE(decode_mem(b.data(), b.size(), 1, &out, &why));
    EXPECT_TRUE(contains(why, "access")) << why;
    MemDescriptor mask;
    mask.nearest_nics = 0b100;
    mask.chunks.push_back({0x10000, 4096, 3, {1, 2}});
    b = encode_mem(mask, 2);
    EXPECT_FALSE(decode_mem(b.data(), b.size(), 2, &out, &why));
    EXPECT_TRUE(contains(why, "nearest")) << why;
    MemDescriptor wrap;
    wrap.chunks.push_back({UINT64_MAX - 10, 4096, 3, {1}});
    b = encode_mem(wrap, 1);
    EXPECT_FALSE(decode_mem(b.data(), b.size(), 1, &out, &why));
    // A query reply with gaps, or with nothing registered in the range, is valid.
    MemDescriptor gaps;
    gaps.chunks.push_back({0x10000, 4096, 3, {1}});
    gaps.chunks.push_back({0x20000, 4096, 1, {2}});
    b = encode_mem(gaps, 1);
    EXPECT_TRUE(decode_mem(b.data(), b.size(), 1, &out, &why)) << why;
    b = encode_mem(MemDescriptor{}, 1);
    EXPECT_TRUE(decode_mem(b.data(), b.size(), 1, &out, &why)) << why;
    EXPECT_TRUE(out.chunks.empty());
}

TEST(RdmaWire, ConnectHandshakeBodies) {
    ConnectBody c;
    c.token = 42;
    c.nics = {nic("mlx5_0", LinkLayer::InfiniBand, 1, 1), nic("mlx5_1", LinkLayer::InfiniBand, 2, 2)};
    c.pairs = {{0, 0, 0x123, 0xabcdef}, {1, 3, 0xffffff, 0}};
    auto b = encode_connect(c);
    ConnectBody out;
    std::string why;
    ASSERT_TRUE(decode_connect(b.data(), b.size(), &out, &why)) << why;
    EXPECT_EQ(out.token, 42u);
    ASSERT_EQ(out.pairs.size(), 2u);
    EXPECT_EQ(out.pairs[1].remote_nic, 3);
    EXPECT_EQ(out.pairs[1].qpn, 0xffffffu);
    // A pair naming an initiator NIC it did not list.
    c.pairs[0].local_nic = 2;
    b = encode_connect(c);
    EXPECT_FALSE(decode_connect(b.data(), b.size(), &out, &why));
    EXPECT_TRUE(contains(why, "initiator NIC 2")) << why;
    // QP numbers are 24 bits; 0 is never a valid RC queue pair.
    ConnectAckBody ack;
    ack.pairs = {{0, 0, 0x1000000, 1}};
    b = encode_connect_ack(ack);
    ConnectAckBody aout;
    EXPECT_FALSE(decode_connect_ack(b.data(), b.size(), &aout, &why));
    ack.pairs = {{0, 0, 0, 1}};
    b = encode_connect_ack(ack);
    EXPECT_FALSE(decode_connect_ack(b.data(), b.size(), &aout, &why));
    ack.pairs = {{1, 0, 77, 5}};
    b = encode_connect_ack(ack);
    ASSERT_TRUE(decode_connect_ack(b.data(), b.size(), &aout, &why)) << why;
    EXPECT_EQ(aout.pairs[0].qpn, 77u);
}

TEST(RdmaWire, ControlHeader) {
    CtrlHeader h;
    h.type = static_cast<uint16_t>(CtrlType::Query);
    h.req_id = 9;
    h.status = -ENOENT;
    h.body_len = 16;
    uint8_t b[kCtrlHeaderSize];
    encode_header(h, b);
    CtrlHeader out;
    std::string why;
    ASSERT_TRUE(decode_header(b, &out, &why)) << why;
    EXPECT_EQ(out.status, -ENOENT);
    EXPECT_EQ(out.req_id, 9u);
    h.body_len = kMaxCtrlBody + 1;
    encode_header(h, b);
    EXPECT_FALSE(decode_header(b, &out, &why));
    h.body_len = 0;
    h.type = 99;
    encode_header(h, b);
    EXPECT_FALSE(decode_header(b, &out, &why));
    EXPECT_TRUE(contains(why, "type 99")) << why;
}

// ---------------- planning ----------------

TEST(RdmaPlan, MrLimitIsTheSmallerOfDeviceAndOptionInWholePages) {
    EXPECT_EQ(effective_mr_limit(UINT64_MAX, 0), UINT64_MAX & ~4095ull);
    EXPECT_EQ(effective_mr_limit(1ull << 40, 0), 1ull << 40);
    EXPECT_EQ(effective_mr_limit(1ull << 40, 4 * kMiB), 4 * kMiB);
    EXPECT_EQ(effective_mr_limit(2 * kMiB, 4 * kMiB), 2 * kMiB);  // the option never raises the device's
    EXPECT_EQ(effective_mr_limit((1ull << 32) - 1, 0), (1ull << 32) - 4096);
    EXPECT_EQ(effective_mr_limit(100, 0), 4096u);
}

TEST(RdmaPlan, RegistrationChunksAtMaxMrSize) {
    EXPECT_EQ(plan_mr_chunks(0x1000, 3 * kMiB, 4 * kMiB), (std::vector<Span>{{0x1000, 3 * kMiB}}));
    EXPECT_EQ(plan_mr_chunks(0x1000, 8 * kMiB, 4 * kMiB),
              (std::vector<Span>{{0x1000, 4 * kMiB}, {0x1000 + 4 * kMiB, 4 * kMiB}}));
    auto c = plan_mr_chunks(0x1234, 10 * kMiB + 5, 4 * kMiB);
    ASSERT_EQ(c.size(), 3u);
    EXPECT_EQ(c[2].len, 2 * kMiB + 5);
    uint64_t at = 0x1234;
    for (const auto &s : c) {
        EXPECT_EQ(s.addr, at);
        EXPECT_LE(s.len, 4 * kMiB);
        at += s.len;
    }
    EXPECT_EQ(at, 0x1234 + 10 * kMiB + 5);
    EXPECT_TRUE(plan_mr_chunks(0x1000, 0, 4096).empty());
    EXPECT_EQ(chunk_index(c, 0x1234), 0u);
    EXPECT_EQ(chunk_index(c, 0x1234 + 4 * kMiB), 1u);
    EXPECT_EQ(chunk_index(c, 0x1234 + 4 * kMiB - 1), 0u);
    EXPECT_EQ(chunk_index(c, 0x1233), SIZE_MAX);
    EXPECT_EQ(chunk_index(c, 0x1234 + 10 * kMiB + 5), SIZE_MAX);
}

// Every piece lies in one chunk on each side, pieces tile the op in order.
void expect_tiles(const std::vector<WrPiece> &p, const WrPlanInput &in) {
    uint64_t off = 0;
    for (const auto &w : p) {
        EXPECT_EQ(w.local_addr, in.local_addr + off);
        EXPECT_EQ(w.remote_addr, in.remote_addr + off);
        const Span &l = (*in.local_chunks)[w.local_chunk], &r = (*in.remote_chunks)[w.remote_chunk];
        EXPECT_GE(w.local_addr, l.addr);
        EXPECT_LE(w.local_addr + w.len, l.addr + l.len);
        EXPECT_GE(w.remote_addr, r.addr);
        EXPECT_LE(w.remote_addr + w.len, r.addr + r.len);
        EXPECT_LE(w.len, in.max_wr_size);
        off += w.len;
    }
    EXPECT_EQ(off, in.len);
}

TEST(RdmaPlan, WorkRequestsSplitAtBothSidesRegistrations) {
    auto local = plan_mr_chunks(0x100000, 16 * kMiB, 4 * kMiB);
    auto remote = plan_mr_chunks(0x900000 + 12345, 16 * kMiB, 3 * kMiB);
    WrPlanInput in;
    in.local_addr = 0x100000 + 1000;
    in.remote_addr = 0x900000 + 12345 + 5000;
    in.len = 10 * kMiB;
    in.local_chunks = &local;
    in.remote_chunks = &remote;
    in.local_nics = {0};
    in.remote_nics = {0};
    auto p = plan_work_requests(in);
    expect_tiles(p, in);
    // Cuts at local 4 MiB boundaries (2 inside) and remote 3 MiB boundaries (3 inside).
    EXPECT_EQ(p.size(), 6u);
    in.max_wr_size = kMiB;
    p = plan_work_requests(in);
    expect_tiles(p, in);
    EXPECT_GE(p.size(), 10u);
}

TEST(RdmaPlan, LargeOpsStripeOverTheNearestNicsSmallOnesRotate) {
    auto local = plan_mr_chunks(0x100000, 64 * kMiB, 1ull << 40);
    auto remote = plan_mr_chunks(0x900000, 64 * kMiB, 1ull << 40);
    WrPlanInput in;
    in.local_addr = 0x100000;
    in.remote_addr = 0x900000;
    in.len = 8 * kMiB;
    in.local_chunks = &local;
    in.remote_chunks = &remote;
    in.local_nics = {2, 5};
    in.remote_nics = {1, 3};
    in.stripe_min = kMiB;
    auto p = plan_work_requests(in);
    expect_tiles(p, in);
    ASSERT_EQ(p.size(), 2u);
    EXPECT_EQ(p[0].len, 4 * kMiB);
    EXPECT_EQ(p[0].local_nic, 2);
    EXPECT_EQ(p[0].remote_nic, 1);
    EXPECT_EQ(p[1].local_nic, 5);
    EXPECT_EQ(p[1].remote_nic, 3);
    // Below 2 x stripe_min: one NIC, chosen by the rotation.
    in.len = 2 * kMiB - 1;
    in.rotation = 1;
    p = plan_work_requests(in);
    ASSERT_EQ(p.size(), 1u);
    EXPECT_EQ(p[0].local_nic, 5);
    EXPECT_EQ(p[0].remote_nic, 3);
    // Uneven sizes: stripes are page multiples, the last takes the rest.
    in.len = 5 * kMiB + 3;
    in.local_nics = {0, 1, 2};
    in.rotation = 0;
    p = plan_work_requests(in);
    expect_tiles(p, in);
    ASSERT_EQ(p.size(), 3u);
    EXPECT_EQ(p[0].len % 4096, 0u);
    EXPECT_EQ(p[2].local_nic, 2);
}

TEST(RdmaPlan, SelectiveSignallingEveryIntervalAndAtTheEndOfEachOp) {
    SendWindow w(64, 4);
    std::vector<bool> signalled;
    for (int i = 0; i < 10; ++i) {
        bool s = w.must_signal(i == 9);
        signalled.push_back(s);
        w.post(s);
    }
    EXPECT_EQ(signalled, (std::vector<bool>{false, false, false, true, false, false, false, true, false, true}));
    EXPECT_EQ(w.in_flight(), 10u);
    EXPECT_EQ(w.complete(2), 0u) << "an unsignalled request never completes";
    EXPECT_EQ(w.complete(4), 4u) << "a signalled completion retires everything before it";
    EXPECT_EQ(w.complete(10), 6u);
    EXPECT_EQ(w.in_flight(), 0u);
    EXPECT_EQ(w.complete(10), 0u) << "a stale completion retires nothing";
}

TEST(RdmaPlan, SendWindowNeverFillsWithoutASignal) {
    SendWindow w(4, 1000);  // interval clamped to depth / 2
    int posted = 0;
    while (w.can_post()) {
        w.post(w.must_signal(false));
        ++posted;
    }
    EXPECT_EQ(posted, 4);
    // Something in flight is signalled, so a completion will free the queue.
    EXPECT_EQ(w.complete(2), 2u);
    EXPECT_TRUE(w.can_post());
}

TEST(RdmaPlan, SendWindowErrorsRollbackAndDrain) {
    SendWindow w(16, 8);
    for (int i = 0; i < 6; ++i) w.post(false);
    uint32_t before = 0;
    EXPECT_TRUE(w.fail(3, &before));
    EXPECT_EQ(before, 2u) << "requests before the failed one succeeded";
    EXPECT_EQ(w.drain(), (std::vector<uint64_t>{4, 5, 6})) << "the rest were flushed";
    EXPECT_FALSE(w.fail(5, &before)) << "flush completions after the drain are ignored";
    w.post(false);
    w.post(true);
    w.post(false);
    w.rollback(2);
    EXPECT_EQ(w.in_flight(), 1u);
    EXPECT_EQ(w.post(true), 8u) << "rolled-back sequence numbers are reused";
}

// ---------------- NIC choice from a fake sysfs tree ----------------

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

// ---------------- options, probe words, GID choice ----------------

Config parse(std::vector<std::pair<std::string, std::string>> kv, int *rc, std::string *msg) {
    std::vector<ferry_kv_t> o;
    for (auto &[k, v] : kv) o.push_back({k.c_str(), v.c_str()});
    Config c;
    ferry_error_t e{};
    *rc = parse_config(o.data(), o.size(), &c, &e);
    *msg = e.message;
    return c;
}

TEST(RdmaOptions, ValuesAndRefusals) {
    int rc = 0;
    std::string msg;
    Config c =
        parse({{"devices", "mlx5_0, mlx5_1"}, {"max_mr_size", "2m"}, {"gid_index", "3"}, {"mtu", "4096"}}, &rc, &msg);
    ASSERT_EQ(rc, 0) << msg;
    EXPECT_EQ(c.devices, (std::vector<std::string>{"mlx5_0", "mlx5_1"}));
    EXPECT_EQ(c.max_mr_size, 2 * kMiB);
    EXPECT_EQ(c.gid_index, 3);
    EXPECT_EQ(c.bind_ip, "127.0.0.1") << "never the wildcard by default";
    EXPECT_EQ(c.advertise_ip, "127.0.0.1");
    for (auto [k, v] : std::vector<std::pair<std::string, std::string>>{{"max_mr_size", "5000"},
                                                                        {"mtu", "1500"},
                                                                        {"devices", "mlx5_0,,x"},
                                                                        {"bind_ip", "localhost"},
                                                                        {"max_wr", "1"},
                                                                        {"retry_count", "8"},
                                                                        {"signal_interval", "0"}}) {
        parse({{k, v}}, &rc, &msg);
        EXPECT_EQ(rc, -EINVAL) << k << "=" << v;
        EXPECT_TRUE(contains(msg, "'" + k + "'")) << msg;
    }
    parse({{"no_such", "1"}}, &rc, &msg);
    EXPECT_EQ(rc, -EINVAL);
    EXPECT_TRUE(contains(msg, "no_such") && contains(msg, "known:")) << msg;
    parse({{"bind_ip", "0.0.0.0"}}, &rc, &msg);
    EXPECT_EQ(rc, -EINVAL);
    EXPECT_TRUE(contains(msg, "advertise_ip")) << msg;
}

TEST(RdmaProbeWords, NoDevicesNamesWhatWasChecked) {
    std::string s = describe_no_devices(ENOSYS, false, "/sys");
    EXPECT_TRUE(contains(s, "no RDMA devices")) << s;
    EXPECT_TRUE(contains(s, "ibv_get_device_list")) << s;
    EXPECT_TRUE(contains(s, "/sys/class/infiniband absent")) << s;
    EXPECT_TRUE(contains(s, "kernel has no RDMA support")) << s;
    s = describe_no_devices(0, true, "/sys");
    EXPECT_TRUE(contains(s, "/sys/class/infiniband exists")) << s;
    EXPECT_LT(s.size(), static_cast<size_t>(FERRY_MESSAGE_MAX));
}

TEST(RdmaProbeWords, GidChoicePrefersRoceV2Ipv4Mapped) {
    std::vector<GidEntry> t(4);
    t[0].gid[0] = 0xfe, t[0].gid[1] = 0x80, t[0].gid[15] = 1, t[0].type = "IB/RoCE v1";
    t[1] = t[0], t[1].type = "RoCE v2";
    t[2].gid[10] = 0xff, t[2].gid[11] = 0xff, t[2].gid[12] = 10, t[2].gid[15] = 1, t[2].type = "IB/RoCE v1";
    t[3] = t[2], t[3].type = "RoCE v2";
    EXPECT_EQ(choose_gid_index(t), 3);
    t.pop_back();
    EXPECT_EQ(choose_gid_index(t), 1) << "RoCE v2 before v1";
    std::vector<GidEntry> empty(2);
    EXPECT_EQ(choose_gid_index(empty), -1);
    EXPECT_EQ(mtu_code(4096), 5);
    EXPECT_EQ(mtu_bytes(mtu_code(1024)), 1024u);
    EXPECT_EQ(mtu_code(1500), 0);
}

// ---------------- control channel over real loopback sockets ----------------

TEST(RdmaControl, MessagesRoundTripAndFailuresAreNamed) {
    int lfd = -1;
    uint16_t port = 0;
    std::string why;
    ASSERT_EQ(listen_tcp("127.0.0.1", 0, &lfd, &port, &why), 0) << why;
    uint8_t ip[4] = {127, 0, 0, 1};
    int cfd = -1;
    ASSERT_EQ(connect_tcp(ip, port, 2000, &cfd, &why), 0) << why;
    int sfd = -1;
    for (int i = 0; i < 200 && sfd < 0; ++i) {
        sfd = accept(lfd, nullptr, nullptr);
        if (sfd < 0) usleep(10000);
    }
    ASSERT_GE(sfd, 0);
    CtrlHeader h;
    h.type = static_cast<uint16_t>(CtrlType::Connect);
    h.req_id = 5;
    std::vector<uint8_t> body(100000);
    std::iota(body.begin(), body.end(), 0);
    ASSERT_EQ(send_msg(cfd, h, body, 2000, &why), 0) << why;
    CtrlHeader got;
    std::vector<uint8_t> rbody;
    ASSERT_EQ(recv_msg(sfd, &got, &rbody, 2000, &why), 0) << why;
    EXPECT_EQ(got.req_id, 5u);
    EXPECT_EQ(rbody, body);
    // Nothing sent: the deadline ends the wait.
    EXPECT_EQ(recv_msg(sfd, &got, &rbody, 50, &why), -ETIMEDOUT);
    // Garbage instead of a header.
    std::vector<uint8_t> junk(kCtrlHeaderSize, 0x55);
    ASSERT_EQ(::send(cfd, junk.data(), junk.size(), 0), static_cast<ssize_t>(junk.size()));
    EXPECT_EQ(recv_msg(sfd, &got, &rbody, 2000, &why), -EPROTO);
    EXPECT_TRUE(contains(why, "magic")) << why;
    close(cfd);
    EXPECT_EQ(recv_msg(sfd, &got, &rbody, 2000, &why), -ECONNRESET);
    close(sfd);
    close(lfd);
    // A closed port: refused, naming the address.
    EXPECT_EQ(connect_tcp(ip, port, 2000, &cfd, &why), -ECONNREFUSED);
    EXPECT_TRUE(contains(why, "127.0.0.1:" + std::to_string(port))) << why;
}

// Runs the server side of the authentication on sfd until it finishes or refuses.
int serve_auth(int sfd, const std::string &key, std::string *why) {
    AuthServer auth(&key);
    while (!auth.done()) {
        CtrlHeader h, reply;
        std::vector<uint8_t> body, out;
        if (int rc = recv_msg(sfd, &h, &body, 2000, why); rc != 0) return rc;
        int rc = auth.on_message(h, body, &reply, &out, why);
        std::string ignored;
        send_msg(sfd, reply, out, 2000, &ignored);
        if (rc != 0) return rc;
    }
    return 0;
}

struct AuthResult {
    int client = 0, server = 0;
    std::string client_why, server_why;
};

AuthResult authenticate(const std::string &client_key, const std::string &server_key, bool skip_hello = false) {
    int sv[2];
    EXPECT_EQ(socketpair(AF_UNIX, SOCK_STREAM, 0, sv), 0);
    AuthResult r;
    std::thread server([&] { r.server = serve_auth(sv[1], server_key, &r.server_why); });
    if (skip_hello) {
        CtrlHeader h, got;
        h.type = static_cast<uint16_t>(CtrlType::Query);
        std::vector<uint8_t> body(16), reply;
        send_msg(sv[0], h, body, 2000, &r.client_why);
        r.client = recv_msg(sv[0], &got, &reply, 2000, &r.client_why);
        if (r.client == 0) r.client = got.status;
        r.client_why = std::string(reply.begin(), reply.end());
    } else {
        r.client = auth_client(sv[0], client_key, 2000, &r.client_why);
    }
    close(sv[0]);
    server.join();
    close(sv[1]);
    return r;
}

TEST(RdmaControl, ConnectionsAuthenticateWithTheClusterKey) {
    const std::string key(32, 'k'), other(32, 'o');
    auto ok = authenticate(key, key);
    EXPECT_EQ(ok.client, 0) << ok.client_why;
    EXPECT_EQ(ok.server, 0) << ok.server_why;
    auto none = authenticate("", "");
    EXPECT_EQ(none.client, 0) << none.client_why;
    EXPECT_EQ(none.server, 0) << none.server_why;
    // Different keys: the client finds the server's proof wrong and goes away.
    auto wrong = authenticate(key, other);
    EXPECT_EQ(wrong.client, -EACCES);
    EXPECT_TRUE(contains(wrong.client_why, "does not know this instance's cluster key")) << wrong.client_why;
    EXPECT_NE(wrong.server, 0) << "the server must not accept the connection";
    // One side without a key: refused at hello, both told why.
    auto missing = authenticate("", key);
    EXPECT_EQ(missing.client, -EACCES);
    EXPECT_TRUE(contains(missing.client_why, "has no cluster key but this rdma.so instance has a cluster key"))
        << missing.client_why;
    EXPECT_EQ(missing.server, -EACCES);
    // A request before authenticating is refused.
    auto early = authenticate("", "", true);
    EXPECT_EQ(early.client, -EACCES);
    EXPECT_TRUE(contains(early.client_why, "must authenticate first")) << early.client_why;
    EXPECT_EQ(early.server, -EACCES);
    // The proofs depend on key, role and both nonces.
    uint8_t cn[kNonceSize] = {1}, sn[kNonceSize] = {2};
    auto a = ferry_auth::make_proof(key, kProtocol, Role::kServer, cn, sn);
    auto b = ferry_auth::make_proof(key, kProtocol, Role::kClient, cn, sn);
    EXPECT_NE(memcmp(a.data(), b.data(), kProofSize), 0);
    b = ferry_auth::make_proof(other, kProtocol, Role::kServer, cn, sn);
    EXPECT_NE(memcmp(a.data(), b.data(), kProofSize), 0);
    sn[0] = 3;
    b = ferry_auth::make_proof(key, kProtocol, Role::kServer, cn, sn);
    EXPECT_NE(memcmp(a.data(), b.data(), kProofSize), 0);
}

TEST(RdmaOptions, AuthKeyIsHexAndNeverEchoed) {
    int rc = 0;
    std::string msg;
    Config c = parse({{"auth_key", std::string(64, 'a')}}, &rc, &msg);
    ASSERT_EQ(rc, 0) << msg;
    EXPECT_EQ(c.auth_key.size(), 32u);
    parse({{"auth_key", "secretsecret"}}, &rc, &msg);
    EXPECT_EQ(rc, -EINVAL);
    EXPECT_TRUE(contains(msg, "'auth_key'")) << msg;
    EXPECT_FALSE(contains(msg, "secretsecret")) << msg;
}

// ---------------- the plugin on this host ----------------

TEST(RdmaPlugin, ProbeAndCreateSayWhyNotOnAHostWithoutRdma) {
    void *h = dlopen(FERRY_TEST_RDMA_PLUGIN, RTLD_NOW | RTLD_LOCAL);
    ASSERT_NE(h, nullptr) << dlerror();
    auto *api = static_cast<const ferry_plugin_v1_t *>(dlsym(h, FERRY_PLUGIN_SYMBOL_V1));
    ASSERT_NE(api, nullptr);
    EXPECT_STREQ(api->name, "rdma");
    EXPECT_NE(api->caps & FERRY_CAP_MEM_CUDA, 0u);
    EXPECT_NE(api->caps & FERRY_CAP_MEM_ROCM, 0u);
    EXPECT_NE(api->caps & FERRY_CAP_AUTH_KEY, 0u);
    ferry_probe_result_t r{};
    ASSERT_EQ(api->probe(nullptr, 0, &r), 0);
    DeviceList devices;
    if (devices.size() > 0) {
        // Not this test's subject: the conformance suite runs where devices exist.
        GTEST_SKIP() << "this host has " << devices.size() << " RDMA device(s); probe says: " << r.reason;
    }
    EXPECT_EQ(r.available, 0);
    std::string reason = r.reason;
    EXPECT_TRUE(contains(reason, "no RDMA devices (ibv_get_device_list found none")) << reason;
    EXPECT_TRUE(contains(reason, "/sys/class/infiniband")) << reason;
    ferry_transport_t *t = nullptr;
    ferry_error_t e{};
    EXPECT_EQ(api->create(nullptr, 0, nullptr, &t, &e), -ENODEV);
    EXPECT_EQ(t, nullptr) << "output set only on success";
    EXPECT_TRUE(contains(e.message, "no RDMA devices")) << e.message;
    // A bad option is reported by the probe too, naming the key.
    ferry_kv_t bad[] = {{"max_wr", "zero"}};
    ASSERT_EQ(api->probe(bad, 1, &r), 0);
    EXPECT_EQ(r.available, 0);
    EXPECT_TRUE(contains(r.reason, "max_wr")) << r.reason;
    dlclose(h);
}

}  // namespace
}  // namespace ferry_rdma
