// cuda_ipc.so's copy kernel (plugins/gpu_ipc/copy_kernel.cu) on a real NVIDIA GPU, between this
// process and a child process: KV-sized and odd blocks byte-exact under every kernel setting
// (off, one thread block, the default cap, uncapped), small and large ops in one batch, a bad op
// beside good ones, and a peer killed while a batch is in flight. Without a usable CUDA device
// every test is skipped and says why.
#include <gtest/gtest.h>
#include <signal.h>

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

struct GpuPeer {  // tests/gpu/gpu_peer_main.cpp: two regions of `size` in one allocation
    explicit GpuPeer(uint64_t size) : proc({std::to_string(size), "0"}, FERRY_GPU_TEST_PEER_BIN) {
        std::istringstream s(proc.ready_line);
        std::string word, a0, a1;
        s >> word >> segment >> a0 >> a1 >> size_;
        ok = word == "READY";
        if (ok) r0 = std::stoull(a0, nullptr, 16), r1 = std::stoull(a1, nullptr, 16);
    }
    PeerProcess proc;
    bool ok = false;
    std::string segment;
    uint64_t r0 = 0, r1 = 0, size_ = 0;
};
constexpr uint64_t kGap = 4096;  // before region 0 in the peer's allocation

struct Setting {
    const char *name;
    const char *max_op_bytes, *max_blocks;
    const char *table_in_launch = "true";  // false: each launch's table copied before it
};

class CopyKernel : public test::CudaEngineTest, public ::testing::WithParamInterface<Setting> {
protected:
    Result<std::unique_ptr<Engine>> engine() {
        return Engine::create({{"plugins", "cuda_ipc"},
                               {"log_level", "info"},
                               {"cuda_ipc.kernel_max_op_bytes", GetParam().max_op_bytes},
                               {"cuda_ipc.kernel_max_blocks", GetParam().max_blocks},
                               {"cuda_ipc.kernel_table_in_launch", GetParam().table_in_launch}});
    }
    bool kernel_on() const { return strcmp(GetParam().max_op_bytes, "0") != 0; }

    // A peer with two regions of `size`, an engine of this setting with `size` bytes of GPU
    // memory registered, and the peer's segment open.
    struct Session {
        std::unique_ptr<GpuPeer> peer;
        std::unique_ptr<Engine> engine;
        uint8_t *dev = nullptr;
        SegmentId seg = 0;
        ~Session() {
            if (dev) cudaFree(dev);
        }
    };
    void open(uint64_t size, Session &s) {
        s.peer = std::make_unique<GpuPeer>(size);
        ASSERT_TRUE(s.peer->ok) << s.peer->proc.ready_line;
        auto e = engine();
        ASSERT_TRUE(e) << e.error().message;
        s.engine = std::move(*e);
        CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&s.dev), size));
        ASSERT_TRUE(s.engine->register_memory(s.dev, size, {MemoryKind::Cuda, 0, kRemoteRead | kRemoteWrite}));
        auto seg = s.engine->open_segment(s.peer->segment);
        ASSERT_TRUE(seg) << seg.error().message;
        s.seg = *seg;
    }
};

struct Piece {
    uint64_t off, len;  // in the region
};
// Odd lengths and offsets: 1 and 3 bytes, a page plus one, pieces straddling 16-byte lines and
// 64 KiB chunks, source and destination offsets apart by amounts that are not multiples of 16.
std::vector<Piece> odd_pieces() {
    std::vector<Piece> v;
    uint64_t at = 0;
    for (uint64_t len : {1ull, 3ull, 4097ull, 15ull, 17ull, 65535ull, 65537ull, 16384ull, 131073ull})
        for (uint64_t skew : {0ull, 1ull, 7ull, 8ull, 13ull}) {
            v.push_back({at + skew, len});
            at += len + 4096 + skew;
        }
    return v;
}

TEST_P(CopyKernel, KvBlocksAndOddPiecesLandExactly) {
    const uint64_t size = 8 << 20;
    GpuPeer peer(size);
    ASSERT_TRUE(peer.ok) << peer.proc.ready_line;
    testing::internal::CaptureStderr();
    auto e = engine();
    uint8_t *dev = nullptr;
    CUDA_OR_DIE(cudaMalloc(reinterpret_cast<void **>(&dev), size));
    CUDA_OR_DIE(cudaMemset(dev, 0xee, size));
    auto reg = e ? (*e)->register_memory(dev, size, {MemoryKind::Cuda, 0, kRemoteRead | kRemoteWrite})
                 : Result<void>(std::unexpected(e.error()));
    std::string log = testing::internal::GetCapturedStderr();
    ASSERT_TRUE(e) << e.error().message;
    ASSERT_TRUE(reg) << reg.error().message;
    EXPECT_EQ(log.find("copy kernel ready on device 0") != std::string::npos, kernel_on()) << log;
    auto seg = (*e)->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;

    // READ 64 KiB KV blocks, then the odd pieces shifted by 5 bytes on our side.
    std::vector<Request> reads;
    for (uint64_t i = 0; i < 32; ++i)
        reads.push_back({Opcode::Read, dev + i * 65536, *seg, peer.r0 + i * 65536, 65536, ""});
    const uint64_t odd_base = 4 << 20;
    auto pieces = odd_pieces();
    for (auto &p : pieces)
        reads.push_back({Opcode::Read, dev + odd_base + p.off + 5, *seg, peer.r0 + odd_base + p.off, p.len, ""});
    auto r = run(**e, reads);
    ASSERT_TRUE(r) << r.error().message;
    std::vector<uint8_t> host(size), want(size, 0xee);
    for (uint64_t i = 0; i < 32 * 65536; ++i) want[i] = test::peer_pattern(kGap + i);
    for (auto &p : pieces)
        for (uint64_t i = 0; i < p.len; ++i)
            want[odd_base + p.off + 5 + i] = test::peer_pattern(kGap + odd_base + p.off + i);
    CUDA_OR_DIE(cudaMemcpy(host.data(), dev, size, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < size; ++i) ASSERT_EQ(host[i], want[i]) << "READ: byte " << i;

    // WRITE the same shapes into the peer's second region, shifted by 3 bytes there.
    for (uint64_t i = 0; i < size; ++i) host[i] = static_cast<uint8_t>(i * 29 + 1);
    CUDA_OR_DIE(cudaMemcpy(dev, host.data(), size, cudaMemcpyHostToDevice));
    std::vector<uint8_t> expected(2 * size);
    for (uint64_t i = 0; i < size; ++i) {
        expected[i] = test::peer_pattern(kGap + i);
        expected[size + i] = test::peer_pattern(2 * kGap + size + i);
    }
    std::vector<Request> writes;
    for (uint64_t i = 0; i < 32; ++i) {
        writes.push_back({Opcode::Write, dev + i * 65536, *seg, peer.r1 + i * 65536, 65536, ""});
        memcpy(&expected[size + i * 65536], &host[i * 65536], 65536);
    }
    for (auto &p : pieces) {
        writes.push_back({Opcode::Write, dev + odd_base + p.off, *seg, peer.r1 + odd_base + p.off + 3, p.len, ""});
        memcpy(&expected[size + odd_base + p.off + 3], &host[odd_base + p.off], p.len);
    }
    r = run(**e, writes);
    ASSERT_TRUE(r) << r.error().message;
    char want_sum[64];
    snprintf(want_sum, sizeof want_sum, "SUM %" PRIx64, test::fnv1a(expected.data(), expected.size()));
    EXPECT_EQ(peer.proc.command("sum"), want_sum);
    cudaFree(dev);
}

TEST_P(CopyKernel, SmallAndLargeOpsInOneBatchAndABadOpBesideGoodOnes) {
    const uint64_t size = 16 << 20;
    Session s;
    open(size, s);
    if (HasFatalFailure()) return;
    GpuPeer &peer = *s.peer;
    auto *e = &s.engine;
    uint8_t *dev = s.dev;
    auto seg = &s.seg;
    // 128 blocks of 16 KiB and two of 4 MiB, interleaved.
    std::vector<Request> reads;
    for (uint64_t i = 0; i < 128; ++i) {
        reads.push_back({Opcode::Read, dev + i * 16384, *seg, peer.r0 + i * 16384, 16384, ""});
        if (i == 10 || i == 100) {
            uint64_t off = (i == 10 ? 4 : 8) << 20;
            reads.push_back({Opcode::Read, dev + off, *seg, peer.r0 + off, 4 << 20, ""});
        }
    }
    ASSERT_TRUE(run(**e, reads));
    std::vector<uint8_t> host(size);
    CUDA_OR_DIE(cudaMemcpy(host.data(), dev, size, cudaMemcpyDeviceToHost));
    for (uint64_t i = 0; i < 128 * 16384; ++i) ASSERT_EQ(host[i], test::peer_pattern(kGap + i)) << "byte " << i;
    for (uint64_t i = 4 << 20; i < 12 << 20; ++i) ASSERT_EQ(host[i], test::peer_pattern(kGap + i)) << "byte " << i;

    // 64 good READs and one reaching past the peer's region: that one fails, the others land.
    CUDA_OR_DIE(cudaMemset(dev, 0, size));
    std::vector<Request> mixed;
    for (uint64_t i = 0; i < 64; ++i)
        mixed.push_back({Opcode::Read, dev + i * 65536, *seg, peer.r0 + i * 65536, 65536, ""});
    mixed.push_back({Opcode::Read, dev + (12 << 20), *seg, peer.r0 + size - 4096, 8192, ""});
    auto b = (*e)->submit(mixed);
    if (b) {
        auto w = (*e)->wait(*b, std::chrono::seconds(30));
        EXPECT_FALSE(w) << "the batch holds a failed op";
        for (size_t i = 0; i < mixed.size(); ++i) {
            auto st = (*e)->status(*b, i);
            ASSERT_TRUE(st);
            if (i < 64) EXPECT_EQ(st->code, 0) << "op " << i << ": " << st->message;
            else EXPECT_EQ(st->code, -EFAULT) << st->message;
        }
        (void)(*e)->free_batch(*b);
        CUDA_OR_DIE(cudaMemcpy(host.data(), dev, size, cudaMemcpyDeviceToHost));
        for (uint64_t i = 0; i < 64 * 65536; ++i) ASSERT_EQ(host[i], test::peer_pattern(kGap + i)) << "byte " << i;
    } else {
        EXPECT_EQ(b.error().code, -EFAULT) << b.error().message;  // refused whole at submit: nothing moved
    }
}

TEST_P(CopyKernel, APeerKilledWhileBatchesAreInFlightEndsEveryOpOnce) {
    const uint64_t size = 64 << 20;
    Session s;
    open(size, s);
    if (HasFatalFailure()) return;
    GpuPeer &peer = *s.peer;
    auto *e = &s.engine;
    uint8_t *dev = s.dev;
    auto seg = &s.seg;
    std::vector<Request> reqs;
    for (uint64_t i = 0; i < 1024; ++i)
        reqs.push_back({Opcode::Write, dev + i * 65536, *seg, peer.r0 + i * 65536, 65536, ""});
    std::vector<BatchId> batches;
    for (int k = 0; k < 16; ++k) {
        if (k == 8) kill(peer.proc.pid(), SIGKILL);
        auto b = (*e)->submit(reqs);
        if (b) batches.push_back(*b);
    }
    // Every batch ends within its timeout, each op with one final status; the mapping of the
    // dead peer's memory stays valid until released, so copies may well succeed.
    for (auto b : batches) {
        (void)(*e)->wait(b, std::chrono::seconds(30));
        for (size_t i = 0; i < reqs.size(); ++i) {
            auto st = (*e)->status(b, i);
            ASSERT_TRUE(st);
            EXPECT_NE(st->state, OpState::Pending) << "op " << i;
        }
        (void)(*e)->free_batch(b);
    }
    e->reset();  // teardown with the peer gone
}

INSTANTIATE_TEST_SUITE_P(Settings, CopyKernel,
                         ::testing::Values(Setting{"off", "0", "16"}, Setting{"one_block", "1m", "1"},
                                           Setting{"default_cap", "1m", "16"}, Setting{"uncapped", "1m", "0"},
                                           Setting{"table_copied", "1m", "16", "false"},
                                           Setting{"table_copied_uncapped", "1m", "0", "false"}),
                         [](const auto &info) { return std::string(info.param.name); });

}  // namespace
