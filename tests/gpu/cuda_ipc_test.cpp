// cuda_ipc.so and GPU staging on a real NVIDIA GPU, between this process and child processes.
// Without a usable CUDA device every test here is skipped and says why.
#include <gtest/gtest.h>

#include <cinttypes>
#include <cstring>
#include <sstream>

#include "cuda_util.hpp"
#include "ferry/engine.hpp"
#include "peer_pattern.hpp"
#include "peer_process.hpp"

using namespace ferry;
using ferry::test::PeerProcess;

namespace {

class CudaTest : public test::CudaEngineTest {
protected:
};

struct GpuPeer {
    explicit GpuPeer(uint64_t size, int device = 0)
        : proc({std::to_string(size), std::to_string(device)}, FERRY_GPU_TEST_PEER_BIN) {
        std::istringstream s(proc.ready_line);
        std::string word, a0, a1;
        s >> word >> segment >> a0 >> a1 >> size_;
        ok = word == "READY";
        if (ok) {
            r0 = std::stoull(a0, nullptr, 16);
            r1 = std::stoull(a1, nullptr, 16);
        }
    }
    PeerProcess proc;
    bool ok = false;
    std::string segment;
    uint64_t r0 = 0, r1 = 0, size_ = 0;
};

}  // namespace

TEST_F(CudaTest, IpcReadAndWriteSubBuffersAcrossProcesses) {
    const uint64_t size = 8 << 20, gap = 4096;
    GpuPeer peer(size);
    ASSERT_TRUE(peer.ok) << peer.proc.ready_line;
    auto engine = Engine::create({{"plugins", "cuda_ipc,tcp"}});
    ASSERT_TRUE(engine) << engine.error().message;
    // Local: one allocation, two sub-buffers registered separately.
    uint8_t *dev = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&dev), 2 * size + 3 * gap));
    uint8_t *a = dev + gap, *b = dev + 2 * gap + size;
    for (uint8_t *r : {a, b})
        ASSERT_TRUE((*engine)->register_memory(r, size, {MemoryKind::Cuda, 0, kRemoteRead | kRemoteWrite}));
    auto seg = (*engine)->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;

    std::string transport;
    auto r = run(**engine, {{Opcode::Read, a, *seg, peer.r0, size, ""}, {Opcode::Read, b, *seg, peer.r1, size, ""}},
                 &transport);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(transport, "cuda_ipc");
    std::vector<uint8_t> host(size);
    CUDA_OR_DIE(cudaMemcpy(host.data(), a, size, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < size; ++i) ASSERT_EQ(host[i], test::peer_pattern(gap + i)) << "region 0 byte " << i;
    CUDA_OR_DIE(cudaMemcpy(host.data(), b, size, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < size; ++i)
        ASSERT_EQ(host[i], test::peer_pattern(2 * gap + size + i)) << "region 1 byte " << i;

    // WRITE awkward pieces into the peer's second region; its checksum must match.
    std::vector<uint8_t> expected(2 * size);
    for (uint64_t i = 0; i < size; ++i) {
        expected[i] = test::peer_pattern(gap + i);
        expected[size + i] = test::peer_pattern(2 * gap + size + i);
    }
    std::vector<uint8_t> fresh(size);
    for (uint64_t i = 0; i < size; ++i) fresh[i] = static_cast<uint8_t>(i * 29 + 1);
    CUDA_OR_DIE(cudaMemcpy(a, fresh.data(), size, cudaMemcpyHostToDevice));
    struct Piece {
        uint64_t off, len;
    };
    std::vector<Request> writes;
    for (Piece p : std::vector<Piece>{{1, 1}, {4095, 65537}, {size - 3, 3}, {1 << 20, 3 << 20}}) {
        writes.push_back({Opcode::Write, a + p.off, *seg, peer.r1 + p.off, p.len, ""});
        memcpy(expected.data() + size + p.off, fresh.data() + p.off, p.len);
    }
    r = run(**engine, writes);
    ASSERT_TRUE(r) << r.error().message;
    char want[64];
    snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(expected.data(), expected.size()));
    EXPECT_EQ(peer.proc.command("sum"), want);

    // Outside the peer's region (the gap between its sub-buffers) is refused.
    // Not in the cached descriptor: re-read off the submit path, so the op fails, not submit.
    auto b2 = (*engine)->submit(std::vector<Request>{{Opcode::Read, a, *seg, peer.r0 + size, 16, ""}});
    Result<void> w2 = b2 ? (*engine)->wait(*b2, std::chrono::seconds(10)) : Result<void>(std::unexpected(b2.error()));
    ASSERT_FALSE(w2);
    EXPECT_EQ(w2.error().code, -EFAULT);
    cudaFree(dev);
}

TEST_F(CudaTest, GpuMemoryMovesOverTcpThroughStaging) {
    PeerProcess peer({"--size", "8388608"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = Engine::create({{"plugins", "tcp"}});
    ASSERT_TRUE(engine) << engine.error().message;
    const uint64_t size = peer.size;
    uint8_t *dev = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&dev), size));
    ASSERT_TRUE((*engine)->register_memory(dev, size, {MemoryKind::Cuda, 0, kRemoteRead | kRemoteWrite}));
    auto seg = (*engine)->open_segment(peer.segment);
    ASSERT_TRUE(seg);
    std::string transport;
    std::vector<Request> reads;
    for (uint64_t off = 0; off < size; off += 1 << 20)
        reads.push_back({Opcode::Read, dev + off, *seg, peer.base + off, 1 << 20, ""});
    auto r = run(**engine, reads, &transport);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(transport, "tcp");
    std::vector<uint8_t> host(size);
    CUDA_OR_DIE(cudaMemcpy(host.data(), dev, size, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < size; ++i) ASSERT_EQ(host[i], test::peer_pattern(i)) << "byte " << i;

    for (uint64_t i = 0; i < size; ++i) host[i] = static_cast<uint8_t>(i * 7 + 5);
    CUDA_OR_DIE(cudaMemcpy(dev, host.data(), size, cudaMemcpyHostToDevice));
    r = run(**engine, {{Opcode::Write, dev + 100, *seg, peer.base + 100, size - 200, ""}});
    ASSERT_TRUE(r) << r.error().message;
    std::vector<uint8_t> expected(size);
    for (uint64_t i = 0; i < size; ++i) expected[i] = (i >= 100 && i < size - 100) ? host[i] : test::peer_pattern(i);
    char want[64];
    snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(expected.data(), expected.size()));
    EXPECT_EQ(peer.command("sum"), want);
    cudaFree(dev);
}

TEST_F(CudaTest, IpcAcrossTwoGpusEnablesPeerAccessAndRestoresTheDevice) {
    int count = 0;
    CUDA_OR_DIE(cudaGetDeviceCount(&count));
    if (count < 2) GTEST_SKIP() << "skipped: needs two CUDA devices, this machine has " << count;
    const uint64_t size = 8 << 20, gap = 4096;
    GpuPeer peer(size, 1);  // the target's memory lives on GPU 1
    ASSERT_TRUE(peer.ok) << peer.proc.ready_line;
    CUDA_OR_DIE(cudaSetDevice(0));
    auto engine = Engine::create({{"plugins", "cuda_ipc"}});
    ASSERT_TRUE(engine) << engine.error().message;
    uint8_t *dev = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&dev), size));
    ASSERT_TRUE((*engine)->register_memory(dev, size, {MemoryKind::Cuda, 0, kRemoteRead | kRemoteWrite}));
    auto seg = (*engine)->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    for (int round = 0; round < 2; ++round) {  // the second round reuses the enabled peer access
        auto r = run(**engine, {{Opcode::Read, dev, *seg, peer.r0, size, ""}});
        ASSERT_TRUE(r) << r.error().message;
        int current = -1;
        CUDA_OR_DIE(cudaGetDevice(&current));
        EXPECT_EQ(current, 0) << "the caller's device must be restored";
    }
    std::vector<uint8_t> host(size);
    CUDA_OR_DIE(cudaMemcpy(host.data(), dev, size, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < size; ++i) ASSERT_EQ(host[i], test::peer_pattern(gap + i)) << "byte " << i;
    for (uint64_t i = 0; i < size; ++i) host[i] = static_cast<uint8_t>(i * 3 + 11);
    CUDA_OR_DIE(cudaMemcpy(dev, host.data(), size, cudaMemcpyHostToDevice));
    ASSERT_TRUE(run(**engine, {{Opcode::Write, dev, *seg, peer.r1, size, ""}}));
    std::vector<uint8_t> expected(2 * size);
    for (uint64_t i = 0; i < size; ++i) expected[i] = test::peer_pattern(gap + i);
    memcpy(expected.data() + size, host.data(), size);
    char want[64];
    snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(expected.data(), expected.size()));
    EXPECT_EQ(peer.proc.command("sum"), want);
    cudaFree(dev);
}

// Block tables over cuda_ipc: the first transfer between two tables goes as ops (and prepares
// the path), the next ones whole (one copy kernel launch); both land exactly, in the order the
// indices say, at odd lengths and addresses too.
TEST_F(CudaTest, IpcBlockTablesMoveBlocksByIndexExactly) {
    const uint64_t size = 8 << 20, gap = 4096, block = 16 << 10, n = 256;
    GpuPeer peer(size);
    ASSERT_TRUE(peer.ok) << peer.proc.ready_line;
    auto engine = Engine::create({{"plugins", "cuda_ipc"}});
    ASSERT_TRUE(engine) << engine.error().message;
    uint8_t *dev = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&dev), size));
    ASSERT_TRUE((*engine)->register_memory(dev, size, {MemoryKind::Cuda, 0, kRemoteRead | kRemoteWrite}));
    auto seg = (*engine)->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<uint64_t> la, ra;
    for (uint64_t i = 0; i < n; ++i) la.push_back(reinterpret_cast<uintptr_t>(dev) + i * block);
    for (uint64_t i = 0; i < n; ++i) ra.push_back(peer.r0 + i * block);
    const uint64_t len[] = {block};
    auto lt = (*engine)->create_block_table(kLocalMemory, la, len);
    auto rt = (*engine)->create_block_table(*seg, ra, len);
    ASSERT_TRUE(lt && rt) << (lt ? rt.error().message : lt.error().message);
    std::vector<uint32_t> li(n), ri(n);
    for (uint32_t i = 0; i < n; ++i) li[i] = i, ri[i] = static_cast<uint32_t>(i * 7 % n);
    std::vector<uint8_t> host(n * block);
    for (int round = 0; round < 3; ++round) {  // as ops, then whole, twice
        CUDA_OR_DIE(cudaMemset(dev, 0, n * block));
        auto b = (*engine)->submit_blocks(Opcode::Read, *lt, li, *rt, ri);
        ASSERT_TRUE(b) << b.error().message;
        auto w = (*engine)->wait(*b, std::chrono::seconds(30));
        ASSERT_TRUE(w) << "round " << round << ": " << w.error().message;
        auto st = (*engine)->status(*b, n - 1);
        ASSERT_TRUE(st);
        EXPECT_EQ(st->transport, "cuda_ipc");
        ASSERT_TRUE((*engine)->free_batch(*b));
        CUDA_OR_DIE(cudaMemcpy(host.data(), dev, host.size(), cudaMemcpyDeviceToHost));
        for (uint64_t i = 0; i < n; ++i)
            for (uint64_t j = 0; j < block; j += 1021)
                ASSERT_EQ(host[i * block + j], test::peer_pattern(gap + ri[i] * block + j))
                    << "round " << round << " pair " << i << " byte " << j;
    }
    // WRITE blocks of odd lengths at odd offsets into the peer's second region.
    std::vector<uint8_t> fresh(size);
    for (uint64_t i = 0; i < size; ++i) fresh[i] = static_cast<uint8_t>(i * 29 + 3);
    CUDA_OR_DIE(cudaMemcpy(dev, fresh.data(), size, cudaMemcpyHostToDevice));
    std::vector<uint8_t> expected(2 * size);
    for (uint64_t i = 0; i < size; ++i) {
        expected[i] = test::peer_pattern(gap + i);
        expected[size + i] = test::peer_pattern(2 * gap + size + i);
    }
    const uint64_t lens[] = {1, 3, 4097, 17, 65537, 16, 15, 300001};
    std::vector<uint64_t> wla, wra, wlen;
    uint64_t at = 0;
    for (int rep = 0; rep < 4; ++rep)
        for (uint64_t l : lens) {
            uint64_t lo = at + (wla.size() * 5) % 16, ro = at + (wla.size() * 3 + 1) % 16;
            wla.push_back(reinterpret_cast<uintptr_t>(dev) + lo);
            wra.push_back(peer.r1 + ro);
            wlen.push_back(l);
            memcpy(expected.data() + size + ro, fresh.data() + lo, l);
            at += l + 64;
        }
    ASSERT_LT(at, size);
    auto wlt = (*engine)->create_block_table(kLocalMemory, wla, wlen);
    auto wrt = (*engine)->create_block_table(*seg, wra, wlen);
    ASSERT_TRUE(wlt && wrt);
    std::vector<uint32_t> wi(wla.size());
    for (uint32_t i = 0; i < wi.size(); ++i) wi[i] = i;
    for (int round = 0; round < 2; ++round) {
        auto b = (*engine)->submit_blocks(Opcode::Write, *wlt, wi, *wrt, wi);
        ASSERT_TRUE(b) << b.error().message;
        ASSERT_TRUE((*engine)->wait(*b, std::chrono::seconds(30)));
        (void)(*engine)->free_batch(*b);
        char want[64];
        snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(expected.data(), expected.size()));
        EXPECT_EQ(peer.proc.command("sum"), want) << "round " << round;
    }
    // Refused whole: an index past the table, and pairs of unequal length.
    std::vector<uint32_t> bad = {0, static_cast<uint32_t>(n)};
    auto r = (*engine)->submit_blocks(Opcode::Read, *lt, std::vector<uint32_t>{0, 1}, *rt, bad);
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -EINVAL);
    EXPECT_NE(r.error().message.find("past the table"), std::string::npos) << r.error().message;
    r = (*engine)->submit_blocks(Opcode::Write, *wlt, std::vector<uint32_t>{0}, *wrt, std::vector<uint32_t>{1});
    ASSERT_FALSE(r);
    EXPECT_EQ(r.error().code, -EINVAL);
    for (auto t : {*lt, *rt, *wlt, *wrt}) EXPECT_TRUE((*engine)->destroy_block_table(t));
    cudaFree(dev);
}
