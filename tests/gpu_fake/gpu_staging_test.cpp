// GPU staging without a GPU: the real engine and tcp.so against ferry_test_peer children, with
// "device" memory from the strict fake CUDA driver (fake_cuda.cpp: device addresses are
// PROT_NONE, so any direct dereference by the core crashes the test). Covers the initiator's
// async pipeline (READ/WRITE, byte-verified, sub-buffers), the pinned-memory bound under a
// 16-deep batch, copy failures, auto-detected registration, and the ABI 1.1 host staging calls
// exactly as a plugin calls them.
#include <dlfcn.h>
#include <gtest/gtest.h>

#include <atomic>
#include <cinttypes>
#include <condition_variable>
#include <cstring>
#include <thread>

#include "engine/config.hpp"
#include "fault/cutting_proxy.hpp"
#include "ferry/engine.hpp"
#include "ferry/ferry.h"
#include "peer_pattern.hpp"
#include "peer_process.hpp"
#include "staging/stage_service.hpp"

using namespace ferry;
using ferry::test::PeerProcess;

namespace {

// The fake driver, loaded by path as the core loads it ($FERRY_LIBCUDA): one instance per process.
struct FakeCuda {
    FakeCuda() {
        setenv("FERRY_LIBCUDA", FERRY_FAKE_CUDA_LIB, 1);
        lib = dlopen(FERRY_FAKE_CUDA_LIB, RTLD_NOW | RTLD_LOCAL);
        if (!lib) return;
        auto sym = [&](auto &fn, const char *name) {
            fn = reinterpret_cast<std::decay_t<decltype(fn)>>(dlsym(lib, name));
        };
        int (*init)(unsigned);
        int (*retain)(void **, int);
        int (*push)(void *);
        sym(init, "cuInit");
        sym(retain, "cuDevicePrimaryCtxRetain");
        sym(push, "cuCtxPushCurrent_v2");
        sym(alloc_, "cuMemAlloc_v2");
        sym(free_, "cuMemFree_v2");
        sym(htod_, "cuMemcpyHtoD_v2");
        sym(dtoh_, "cuMemcpyDtoH_v2");
        sym(fail_copy, "ferry_fake_cuda_fail_copy");
        sym(copy_delay_us, "ferry_fake_cuda_copy_delay_us");
        void *ctx = nullptr;
        ok = init(0) == 0 && retain(&ctx, 0) == 0 && push(ctx) == 0;  // current on the test thread
    }
    char *alloc(size_t n) {
        uintptr_t p = 0;
        return alloc_(&p, n) == 0 ? reinterpret_cast<char *>(p) : nullptr;
    }
    void free(char *p) { free_(reinterpret_cast<uintptr_t>(p)); }
    void put(char *dev, const void *src, size_t n) { ASSERT_EQ(htod_(reinterpret_cast<uintptr_t>(dev), src, n), 0); }
    std::vector<uint8_t> get(const char *dev, size_t n) {
        std::vector<uint8_t> out(n);
        EXPECT_EQ(dtoh_(out.data(), reinterpret_cast<uintptr_t>(dev), n), 0);
        return out;
    }
    void *lib = nullptr;
    bool ok = false;
    int (*alloc_)(uintptr_t *, size_t) = nullptr;
    int (*free_)(uintptr_t) = nullptr;
    int (*htod_)(uintptr_t, const void *, size_t) = nullptr;
    int (*dtoh_)(void *, uintptr_t, size_t) = nullptr;
    void (*fail_copy)(uint64_t) = nullptr;
    void (*copy_delay_us)(unsigned) = nullptr;
};

FakeCuda &cuda() {
    static FakeCuda c;
    return c;
}

class GpuStagingTest : public ::testing::Test {
protected:
    void SetUp() override {
        ASSERT_TRUE(cuda().ok) << "the fake CUDA driver " << FERRY_FAKE_CUDA_LIB << " did not load: " << dlerror();
    }
    std::unique_ptr<Engine> make(uint64_t slice, uint64_t max) {
        auto e = Engine::create({{"plugins", "tcp"},
                                 {"gpu_staging_slice_bytes", std::to_string(slice)},
                                 {"gpu_staging_max_bytes", std::to_string(max)}});
        EXPECT_TRUE(e) << e.error().message;
        return e ? std::move(*e) : nullptr;
    }
    Result<void> run(Engine &engine, const std::vector<Request> &reqs) {
        auto b = engine.submit(reqs);
        if (!b) return std::unexpected(b.error());
        auto w = engine.wait(*b, std::chrono::seconds(60));
        (void)engine.free_batch(*b);
        return w;
    }
};

std::vector<uint8_t> pattern(uint64_t n) {
    std::vector<uint8_t> v(n);
    for (uint64_t i = 0; i < n; ++i) v[i] = test::peer_pattern(i);
    return v;
}

std::string sum_line(const std::vector<uint8_t> &v) {
    char want[64];
    snprintf(want, sizeof want, "SUM %" PRIx64, test::fnv1a(v.data(), v.size()));
    return want;
}

}  // namespace

TEST_F(GpuStagingTest, PipelinedReadAndWriteBetweenFakeGpuAndAHostPeerMoveEveryByte) {
    constexpr uint64_t kSize = 8 << 20;
    PeerProcess peer({"--size", std::to_string(kSize)});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make(256 << 10, 1 << 20);  // 32 slices per op, 4 in the bound: a real pipeline
    ASSERT_TRUE(engine);
    char *dev = cuda().alloc(kSize);
    ASSERT_NE(dev, nullptr);
    ASSERT_TRUE(engine->register_memory(dev, kSize, {MemoryKind::Cuda, 0}));
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;

    auto r = run(*engine, {{Opcode::Read, dev, *seg, peer.base, kSize, ""}});
    ASSERT_TRUE(r) << r.error().message;
    auto got = cuda().get(dev, kSize);
    auto want = pattern(kSize);
    ASSERT_TRUE(got == want) << "READ landed every byte in (fake) GPU memory";

    // Sub-buffers of awkward sizes and offsets, several in one batch.
    std::vector<uint8_t> src(kSize);
    for (uint64_t i = 0; i < kSize; ++i) src[i] = static_cast<uint8_t>(i * 29 + 5);
    cuda().put(dev, src.data(), kSize);
    struct Piece {
        uint64_t off, len;
    };
    std::vector<Piece> pieces = {{0, 1}, {1, 4095}, {5000, (1 << 20) + 3}, {3 << 20, 4 << 20}, {kSize - 7, 7}};
    std::vector<Request> writes;
    for (auto p : pieces) {
        writes.push_back({Opcode::Write, dev + p.off, *seg, peer.base + p.off, p.len, ""});
        memcpy(want.data() + p.off, src.data() + p.off, p.len);
    }
    r = run(*engine, writes);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(peer.command("sum"), sum_line(want)) << "the peer holds exactly what was written";

    auto st = engine->staging_stats();
    EXPECT_EQ(st.lent_bytes, 0u) << "every pinned slice was given back";
    EXPECT_LE(st.peak_lent_bytes, st.max_bytes);
    EXPECT_GE(st.copies, 32u + 24u) << "one copy per slice";
    ASSERT_TRUE(engine->unregister_memory(dev));
    cuda().free(dev);
}

TEST_F(GpuStagingTest, ADeepBatchOfLargeOpsStaysWithinThePinnedBound) {
    constexpr uint64_t kPeer = 8 << 20, kOp = 4 << 20, kOps = 16;
    PeerProcess peer({"--size", std::to_string(kPeer)});
    ASSERT_TRUE(peer.ok) << peer.error;
    constexpr uint64_t kBound = 2 << 20;
    auto engine = make(256 << 10, kBound);
    ASSERT_TRUE(engine);
    char *dev = cuda().alloc(kOp * kOps);
    ASSERT_NE(dev, nullptr);
    ASSERT_TRUE(engine->register_memory(dev, kOp * kOps, {MemoryKind::Cuda, 0}));
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;

    std::vector<Request> reads;
    for (uint64_t k = 0; k < kOps; ++k)
        reads.push_back({Opcode::Read, dev + k * kOp, *seg, peer.base + (k % 2) * kOp, kOp, ""});
    auto r = run(*engine, reads);
    ASSERT_TRUE(r) << r.error().message;
    auto got = cuda().get(dev, kOp * kOps);
    auto want = pattern(kPeer);
    for (uint64_t k = 0; k < kOps; ++k)
        ASSERT_EQ(0, memcmp(got.data() + k * kOp, want.data() + (k % 2) * kOp, kOp)) << "op " << k;

    std::vector<Request> writes;
    for (uint64_t k = 0; k < kOps; ++k)
        writes.push_back({Opcode::Write, dev + k * kOp, *seg, peer.base + (k % 2) * kOp, kOp, ""});
    r = run(*engine, writes);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(peer.command("sum"), sum_line(want)) << "the same bytes went back";

    auto st = engine->staging_stats();
    EXPECT_EQ(st.max_bytes, kBound);
    EXPECT_LE(st.peak_lent_bytes, kBound) << "pinned memory lent at once stayed within gpu_staging_max_bytes";
    EXPECT_EQ(st.peak_lent_bytes, kBound) << "and the batch used all of it";
    EXPECT_GT(st.acquire_refused, 0u) << "ops waited for slices instead of exceeding the bound";
    EXPECT_EQ(st.lent_bytes, 0u);
    std::printf("16 x 4 MiB READ + WRITE: peak pinned %" PRIu64 " of %" PRIu64 " bytes, %" PRIu64 " waits, %" PRIu64
                " copies\n",
                st.peak_lent_bytes, st.max_bytes, st.acquire_refused, st.copies);
    cuda().free(dev);
}

TEST_F(GpuStagingTest, AFailedGpuCopyFailsItsOpWithTheRuntimesErrorAndReturnsThePinnedMemory) {
    constexpr uint64_t kSize = 2 << 20;
    PeerProcess peer({"--size", std::to_string(kSize)});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make(256 << 10, 1 << 20);
    ASSERT_TRUE(engine);
    char *dev = cuda().alloc(kSize);
    ASSERT_TRUE(engine->register_memory(dev, kSize, {MemoryKind::Cuda, 0}));
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg);
    std::vector<uint8_t> zero(kSize, 0);
    for (Opcode op : {Opcode::Write, Opcode::Read}) {
        cuda().put(dev, zero.data(), kSize);
        cuda().fail_copy(3);  // one slice's copy in the middle of the op
        std::vector<Request> reqs = {{op, dev, *seg, peer.base, kSize, ""}};
        auto b = engine->submit(reqs);
        ASSERT_TRUE(b) << b.error().message;
        auto w = engine->wait(*b, std::chrono::seconds(30));
        ASSERT_FALSE(w) << "the op whose GPU copy failed fails";
        EXPECT_EQ(w.error().code, -EIO);
        EXPECT_NE(w.error().message.find("an illegal memory access was encountered"), std::string::npos)
            << w.error().message;
        EXPECT_NE(w.error().message.find("staging GPU memory"), std::string::npos) << w.error().message;
        (void)engine->free_batch(*b);
        EXPECT_EQ(engine->staging_stats().lent_bytes, 0u) << "the failed op gave its slices back";
        EXPECT_GE(engine->staging_stats().copy_failures, 1u);
    }
    // The engine goes on: the same ops succeed now (slices of the failed WRITE that finished
    // before the failure may have landed, so the peer's bytes are written again first).
    auto want = pattern(kSize);
    cuda().put(dev, want.data(), kSize);
    ASSERT_TRUE(run(*engine, {{Opcode::Write, dev, *seg, peer.base, kSize, ""}}));
    EXPECT_EQ(peer.command("sum"), sum_line(want));
    cuda().put(dev, zero.data(), kSize);
    ASSERT_TRUE(run(*engine, {{Opcode::Read, dev, *seg, peer.base, kSize, ""}}));
    EXPECT_TRUE(cuda().get(dev, kSize) == want);
    cuda().free(dev);
}

// KV-sized ops: 256 small ops of odd lengths at odd offsets share pinned slices, gathered out
// of the GPU (WRITE) and scattered into it (READ) one copy per slice, not per op.
TEST_F(GpuStagingTest, SmallOpsShareSlicesGatheredAndScatteredOneCopyPerSlice) {
    constexpr uint64_t kPeer = 8 << 20, kOps = 256, kStride = kPeer / kOps;
    PeerProcess peer({"--size", std::to_string(kPeer)});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make(1 << 20, 4 << 20);  // ops up to 256 KiB share slices
    ASSERT_TRUE(engine);
    char *dev = cuda().alloc(kPeer);
    ASSERT_NE(dev, nullptr);
    ASSERT_TRUE(engine->register_memory(dev, kPeer, {MemoryKind::Cuda, 0}));
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    ASSERT_TRUE(run(*engine, {{Opcode::Write, dev, *seg, peer.base, 1, ""}})) << "connected";
    const auto before = engine->staging_stats();

    // Op k: GPU bytes at k*kStride + k%13, to the peer at a permuted stride + k%7.
    struct Piece {
        uint64_t gpu, peer, len;
    };
    std::vector<Piece> pieces;
    for (uint64_t k = 0; k < kOps; ++k)
        pieces.push_back({k * kStride + k % 13, ((k * 97) % kOps) * kStride + k % 7, 1 + (k * 7919) % (kStride - 16)});
    std::vector<uint8_t> src(kPeer);
    for (uint64_t i = 0; i < kPeer; ++i) src[i] = static_cast<uint8_t>(i * 31 + 11);
    cuda().put(dev, src.data(), kPeer);
    auto want = pattern(kPeer);
    std::vector<Request> writes, reads;
    for (auto p : pieces) {
        writes.push_back({Opcode::Write, dev + p.gpu, *seg, peer.base + p.peer, p.len, ""});
        reads.push_back({Opcode::Read, dev + p.gpu, *seg, peer.base + p.peer, p.len, ""});
        memcpy(want.data() + p.peer, src.data() + p.gpu, p.len);
    }
    want[0] = src[0];  // the connecting write
    auto r = run(*engine, writes);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_EQ(peer.command("sum"), sum_line(want)) << "every part of every pack landed where its op said";

    std::vector<uint8_t> zero(kPeer, 0);
    cuda().put(dev, zero.data(), kPeer);
    r = run(*engine, reads);
    ASSERT_TRUE(r) << r.error().message;
    auto got = cuda().get(dev, kPeer);
    for (uint64_t k = 0; k < kOps; ++k) {
        const auto &p = pieces[k];
        ASSERT_EQ(0, memcmp(got.data() + p.gpu, want.data() + p.peer, p.len)) << "READ op " << k;
        if (k + 1 < kOps)  // nothing between the parts was written
            ASSERT_EQ(got[p.gpu + p.len], 0) << "after op " << k;
    }

    auto st = engine->staging_stats();
    uint64_t bytes = 0;
    for (auto p : pieces) bytes += p.len;
    EXPECT_EQ(st.gathered_ops - before.gathered_ops, 2 * kOps) << "every op went through a shared slice";
    EXPECT_LE(st.gathers - before.gathers, 2 * (bytes / (1 << 20) + 2)) << "one gather or scatter per full slice";
    EXPECT_GE(st.gathers - before.gathers, 2 * (bytes / (1 << 20)));
    EXPECT_EQ(st.lent_bytes, 0u) << "every pack gave its slice back";
    EXPECT_LE(st.peak_lent_bytes, st.max_bytes);
    cuda().free(dev);
}

// A gather whose GPU copy fails fails the ops of its pack, and only once nothing of them can
// land; ops of other packs of the batch still arrive, and the slices all come back.
TEST_F(GpuStagingTest, AFailedGatherFailsItsPacksOpsAndOnlyThose) {
    constexpr uint64_t kPeer = 4 << 20, kOp = 64 << 10, kOps = kPeer / kOp;
    PeerProcess peer({"--size", std::to_string(kPeer)});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make(1 << 20, 4 << 20);  // 16 ops of 64 KiB per slice: 4 packs
    ASSERT_TRUE(engine);
    char *dev = cuda().alloc(kPeer);
    ASSERT_TRUE(engine->register_memory(dev, kPeer, {MemoryKind::Cuda, 0}));
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg);
    ASSERT_TRUE(run(*engine, {{Opcode::Read, dev, *seg, peer.base, 1, ""}})) << "connected";
    std::vector<uint8_t> src(kPeer);
    for (uint64_t i = 0; i < kPeer; ++i) src[i] = static_cast<uint8_t>(i * 13 + 1);
    cuda().put(dev, src.data(), kPeer);
    std::vector<Request> writes;
    for (uint64_t k = 0; k < kOps; ++k)
        writes.push_back({Opcode::Write, dev + k * kOp, *seg, peer.base + k * kOp, kOp, ""});
    cuda().fail_copy(20);  // a copy of the second pack's gather
    auto b = engine->submit(writes);
    ASSERT_TRUE(b) << b.error().message;
    auto w = engine->wait(*b, std::chrono::seconds(30));
    ASSERT_FALSE(w);
    EXPECT_NE(w.error().message.find("staging GPU memory"), std::string::npos) << w.error().message;
    size_t failed = 0;
    std::vector<bool> op_failed(kOps);
    for (uint64_t k = 0; k < kOps; ++k) {
        auto s = engine->status(*b, k);
        ASSERT_TRUE(s);
        op_failed[k] = s->state == OpState::Failed;
        failed += op_failed[k];
    }
    (void)engine->free_batch(*b);
    EXPECT_EQ(failed, 16u) << "exactly the ops of the failed pack";
    auto want = pattern(kPeer);
    for (uint64_t k = 0; k < kOps; ++k)
        if (!op_failed[k]) memcpy(want.data() + k * kOp, src.data() + k * kOp, kOp);
    EXPECT_EQ(peer.command("sum"), sum_line(want)) << "the other packs' ops landed; the failed ones wrote nothing";
    EXPECT_EQ(engine->staging_stats().lent_bytes, 0u);
    cuda().free(dev);
}

// Failover of staged ops: tcp.so to the peer goes through a relay that resets it mid-batch;
// the staged ops it broke (large ones a slice at a time, small ones packed) are posted again
// over shm.so once each had ended, and every byte lands; READs bring them back.
TEST_F(GpuStagingTest, StagedOpsCutMidBatchFailOverToShmWithEveryByte) {
    constexpr uint64_t kBig = 1 << 20, kBigOps = 24, kSmall = 16 << 10, kSmallOps = 64;
    constexpr uint64_t kSize = kBig * kBigOps + kSmall * kSmallOps;
    const uint16_t tcp_port = ferry_fault::free_port();
    ferry_fault::CuttingProxy proxy(tcp_port, 6 << 20, ferry_fault::CuttingProxy::Cut::Reset);
    PeerProcess peer({"--size", std::to_string(kSize), "--managed", "--option", "plugins=tcp,shm", "--option",
                      "tcp.port=" + std::to_string(tcp_port), "--option",
                      "tcp.advertise_port=" + std::to_string(proxy.port())});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto e = Engine::create({{"plugins", "tcp,shm"},
                             {"protocols", "tcp,shm"},
                             {"path_cooldown_ms", "300"},
                             {"gpu_staging_slice_bytes", "262144"},
                             {"gpu_staging_max_bytes", "4194304"}});
    if (!e && e.error().message.find("shm") != std::string::npos) GTEST_SKIP() << "SKIPPED: " << e.error().message;
    ASSERT_TRUE(e) << e.error().message;
    auto &engine = *e;
    char *dev = cuda().alloc(kSize);
    ASSERT_NE(dev, nullptr);
    ASSERT_TRUE(engine->register_memory(dev, kSize, {MemoryKind::Cuda, 0}));
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg) << seg.error().message;
    std::vector<uint8_t> src(kSize);
    for (uint64_t i = 0; i < kSize; ++i) src[i] = static_cast<uint8_t>(i * 7 + i / 4093);
    cuda().put(dev, src.data(), kSize);
    std::vector<Request> writes, reads;
    for (uint64_t k = 0; k < kBigOps; ++k) {
        writes.push_back({Opcode::Write, dev + k * kBig, *seg, peer.base + k * kBig, kBig, ""});
        reads.push_back({Opcode::Read, dev + k * kBig, *seg, peer.base + k * kBig, kBig, ""});
    }
    for (uint64_t k = 0; k < kSmallOps; ++k) {
        uint64_t at = kBig * kBigOps + k * kSmall;
        writes.push_back({Opcode::Write, dev + at, *seg, peer.base + at, kSmall, ""});
        reads.push_back({Opcode::Read, dev + at, *seg, peer.base + at, kSmall, ""});
    }
    auto r = run(*engine, writes);
    ASSERT_TRUE(r) << "the staged ops the cut broke were posted again: " << r.error().message;
    EXPECT_TRUE(proxy.cut_done()) << "the relay cut tcp.so under the batch";
    EXPECT_EQ(peer.command("sum"), sum_line(src)) << "every byte of every op landed";
    auto s = engine->stats();
    uint64_t failovers = 0, shm_done = 0, done = 0;
    for (const auto &t : s.transports) {
        if (t.transport == "tcp") failovers = t.failovers;
        if (t.transport == "shm") shm_done = t.write.done;
        done += t.write.done;
    }
    EXPECT_GT(failovers, 0u) << "staged ops moved off the cut path";
    EXPECT_GE(shm_done, failovers) << "and completed over shm.so";
    EXPECT_EQ(done, kBigOps + kSmallOps) << "each op completed exactly once";

    std::vector<uint8_t> zero(kSize, 0);
    cuda().put(dev, zero.data(), kSize);
    r = run(*engine, reads);
    ASSERT_TRUE(r) << r.error().message;
    EXPECT_TRUE(cuda().get(dev, kSize) == src) << "READ brought every byte back";
    EXPECT_EQ(engine->staging_stats().lent_bytes, 0u);
    std::printf("%" PRIu64 " staged ops failed over from tcp to shm\n", failovers);
    ASSERT_TRUE(engine->unregister_memory(dev));
    cuda().free(dev);
}

// Before: submit ran each staged WRITE's GPU copy synchronously (cuMemcpy) and so took at least
// as long as the copy. Now submit only starts it.
TEST_F(GpuStagingTest, SubmitReturnsWithoutWaitingForAGpuCopy) {
    PeerProcess peer({"--size", "1048576"});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto engine = make(256 << 10, 1 << 20);
    ASSERT_TRUE(engine);
    char *dev = cuda().alloc(1 << 20);
    ASSERT_TRUE(engine->register_memory(dev, 1 << 20, {MemoryKind::Cuda, 0}));
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg);
    ASSERT_TRUE(run(*engine, {{Opcode::Write, dev, *seg, peer.base, 4096, ""}})) << "connected and slices pinned";
    cuda().copy_delay_us(1500000);  // every GPU copy takes 1.5 s
    auto t0 = std::chrono::steady_clock::now();
    std::vector<Request> reqs = {{Opcode::Write, dev, *seg, peer.base, 256 << 10, ""}};
    auto b = engine->submit(reqs);
    double submit_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ASSERT_TRUE(b) << b.error().message;
    auto w = engine->wait(*b, std::chrono::seconds(60));
    double total_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    cuda().copy_delay_us(0);
    ASSERT_TRUE(w) << w.error().message;
    (void)engine->free_batch(*b);
    EXPECT_LT(submit_s, 0.75) << "submit waited for the GPU copy";
    EXPECT_GE(total_s, 1.5) << "the op completed only after its copy";
    std::printf("submit %.3f s, op done after %.3f s (copy 1.5 s)\n", submit_s, total_s);
    cuda().free(dev);
}

TEST_F(GpuStagingTest, BarePointersAreRegisteredAsTheMemoryTheyAre) {
    auto engine = make(256 << 10, 1 << 20);
    ASSERT_TRUE(engine);
    constexpr uint64_t kSize = 1 << 20;
    char *dev = cuda().alloc(kSize);
    std::vector<uint8_t> host(kSize);
    ASSERT_TRUE(engine->register_memory(dev, kSize, {MemoryKind::Auto}));
    ASSERT_TRUE(engine->register_memory(host.data(), kSize, {MemoryKind::Auto}));
    auto wrong = engine->register_memory(dev + kSize / 2, 4096, {MemoryKind::Auto, 3});
    ASSERT_FALSE(wrong);
    EXPECT_NE(wrong.error().message.find("not of device 3"), std::string::npos) << wrong.error().message;

    PeerProcess peer({"--size", std::to_string(kSize)});
    ASSERT_TRUE(peer.ok) << peer.error;
    auto seg = engine->open_segment(peer.segment);
    ASSERT_TRUE(seg);
    // Both move; only the device one needed the fake runtime's copies.
    uint64_t copies = engine->staging_stats().copies;
    ASSERT_TRUE(run(*engine, {{Opcode::Read, host.data(), *seg, peer.base, kSize, ""}}));
    EXPECT_EQ(engine->staging_stats().copies, copies) << "host memory was registered as host";
    ASSERT_TRUE(run(*engine, {{Opcode::Read, dev, *seg, peer.base, kSize, ""}}));
    EXPECT_GT(engine->staging_stats().copies, copies) << "device memory was registered as CUDA memory and staged";
    EXPECT_TRUE(cuda().get(dev, kSize) == pattern(kSize));
    ASSERT_TRUE(engine->unregister_memory(dev));
    cuda().free(dev);
}

TEST_F(GpuStagingTest, TheCApiDetectsMemoryKindAndReportsStagingStats) {
    const char *keys[] = {"plugins", "gpu_staging_max_bytes"};
    const char *values[] = {"tcp", "8388608"};
    ferry_engine_t *e = nullptr;
    ASSERT_EQ(ferry_engine_create(keys, values, 2, &e), 0) << ferry_last_error();
    constexpr uint64_t kSize = 1 << 20;
    char *dev = cuda().alloc(kSize);
    std::vector<uint8_t> host(kSize);
    EXPECT_EQ(ferry_register(e, dev, kSize, FERRY_MEMORY_AUTO, -1, FERRY_REMOTE_READ | FERRY_REMOTE_WRITE), 0)
        << ferry_last_error();
    EXPECT_EQ(ferry_register(e, host.data(), kSize, FERRY_MEMORY_AUTO, -1, FERRY_REMOTE_READ), 0) << ferry_last_error();
    ferry_staging_stats_t st{};
    ASSERT_EQ(ferry_staging_stats(e, &st), 0);
    EXPECT_EQ(st.max_bytes, 8u << 20);
    EXPECT_EQ(st.slice_bytes, 4u << 20) << "the default slice";
    EXPECT_EQ(st.lent_bytes, 0u);
    ferry_engine_destroy(e);
    cuda().free(dev);
}

TEST(GpuStagingConfig, BadStagingKeysAreRefusedWithTheirFix) {
    auto bad = [](Config c) {
        auto s = parse_engine_settings(c);
        return s ? std::string() : s.error().message;
    };
    EXPECT_NE(bad({{"gpu_staging_slice_bytes", "3000000"}}).find("power of two"), std::string::npos);
    EXPECT_NE(bad({{"gpu_staging_slice_bytes", "1024"}}).find("from 4096"), std::string::npos);
    EXPECT_NE(bad({{"gpu_staging_max_bytes", "lots"}}).find("gpu_staging_max_bytes"), std::string::npos);
    EXPECT_NE(bad({{"gpu_staging_max_bytes", "1048576"}, {"gpu_staging_slice_bytes", "4194304"}}).find("larger than"),
              std::string::npos);
    auto ok = parse_engine_settings({{"gpu_staging_max_bytes", "0"}});
    ASSERT_TRUE(ok);
    EXPECT_EQ(ok->gpu_staging_max_bytes, 0u);
    auto d = parse_engine_settings({});
    ASSERT_TRUE(d);
    EXPECT_EQ(d->gpu_staging_max_bytes, 64u << 20);
    EXPECT_EQ(d->gpu_staging_slice_bytes, 4u << 20);
    EXPECT_EQ(d->gather_max_op_bytes(), 1u << 20);
    auto small = parse_engine_settings({{"gpu_staging_slice_bytes", "65536"}});
    ASSERT_TRUE(small);
    EXPECT_EQ(small->gather_max_op_bytes(), 16u << 10) << "unset, it follows a smaller slice";
    EXPECT_NE(bad({{"gpu_staging_gather_max_op_bytes", "3000000"}}).find("more than half of gpu_staging_slice_bytes"),
              std::string::npos);
    EXPECT_NE(bad({{"gpu_staging_gather_max_op_bytes", "many"}}).find("gpu_staging_gather_max_op_bytes"),
              std::string::npos);
}

// The ABI 1.1 host table as a plugin sees it: bounded slices, copies whose done runs later on
// another thread, in start order, with the runtime's error text.
TEST_F(GpuStagingTest, TheHostStagingCallsKeepTheirContract) {
    StagingService svc(1 << 20, 256 << 10);
    ferry_host_api_t host{};
    host.struct_size = sizeof host;
    svc.fill_host_api(host);
    ASSERT_NE(host.stage_copy, nullptr) << "offered: a CUDA runtime (the fake) loads";
    EXPECT_EQ(host.stage_slice_bytes, 256u << 10);

    void *bufs[5] = {};
    ferry_error_t err{};
    for (int i = 0; i < 4; ++i)
        ASSERT_EQ(host.stage_acquire(host.ctx, FERRY_MEM_CUDA, 0, 256 << 10, &bufs[i], &err), 0) << err.message;
    EXPECT_EQ(host.stage_acquire(host.ctx, FERRY_MEM_CUDA, 0, 4096, &bufs[4], &err), -EAGAIN) << "the bound";
    EXPECT_NE(std::string(err.message).find("gpu_staging_max_bytes"), std::string::npos) << err.message;
    EXPECT_EQ(host.stage_acquire(host.ctx, FERRY_MEM_CUDA, 0, (256 << 10) + 1, &bufs[4], &err), -EINVAL);
    EXPECT_EQ(svc.stats().peak_lent_bytes, 1u << 20);

    constexpr uint64_t kSlice = 256 << 10;
    char *dev = cuda().alloc(4 * kSlice);
    std::vector<uint8_t> src(4 * kSlice);
    for (size_t i = 0; i < src.size(); ++i) src[i] = static_cast<uint8_t>(i * 7 + 1);
    cuda().put(dev, src.data(), src.size());

    struct Calls {
        std::mutex m;
        std::condition_variable cv;
        std::vector<int> order, status;
        std::vector<std::string> messages;
        std::thread::id caller, done_thread;
    } calls;
    calls.caller = std::this_thread::get_id();
    struct Arg {
        Calls *c;
        int index;
    } args[4];
    auto done = [](void *a, int status, const char *message) {
        auto *arg = static_cast<Arg *>(a);
        std::lock_guard lock(arg->c->m);
        arg->c->order.push_back(arg->index);
        arg->c->status.push_back(status);
        arg->c->messages.push_back(message ? message : "");
        arg->c->done_thread = std::this_thread::get_id();
        arg->c->cv.notify_all();
    };
    cuda().fail_copy(3);  // the third copy fails
    for (int i = 0; i < 4; ++i) {
        args[i] = {&calls, i};
        ASSERT_EQ(host.stage_copy(host.ctx, FERRY_MEM_CUDA, 0, reinterpret_cast<uintptr_t>(dev) + i * kSlice, bufs[i],
                                  kSlice, 0, done, &args[i], &err),
                  0)
            << err.message;
    }
    {
        std::unique_lock lock(calls.m);
        ASSERT_TRUE(calls.cv.wait_for(lock, std::chrono::seconds(30), [&] { return calls.order.size() == 4; }));
    }
    EXPECT_EQ(calls.order, (std::vector<int>{0, 1, 2, 3})) << "done in start order";
    EXPECT_NE(calls.done_thread, calls.caller) << "done runs on a host thread, not inside stage_copy";
    EXPECT_EQ(calls.status[0], 0);
    EXPECT_EQ(calls.status[2], -EIO);
    EXPECT_NE(calls.messages[2].find("an illegal memory access was encountered"), std::string::npos)
        << calls.messages[2];
    for (int i : {0, 1, 3}) EXPECT_EQ(0, memcmp(bufs[i], src.data() + i * kSlice, kSlice)) << "slice " << i;

    // to_device: pinned -> GPU.
    memset(bufs[0], 0xab, kSlice);
    args[0] = {&calls, 9};
    ASSERT_EQ(host.stage_copy(host.ctx, FERRY_MEM_CUDA, 0, reinterpret_cast<uintptr_t>(dev), bufs[0], kSlice, 1, done,
                              &args[0], &err),
              0);
    {
        std::unique_lock lock(calls.m);
        ASSERT_TRUE(calls.cv.wait_for(lock, std::chrono::seconds(30), [&] { return calls.order.size() == 5; }));
    }
    EXPECT_EQ(cuda().get(dev, kSlice), std::vector<uint8_t>(kSlice, 0xab));
    for (void *b : bufs)
        if (b) host.stage_release(host.ctx, b);
    EXPECT_EQ(svc.stats().lent_bytes, 0u);
    EXPECT_EQ(host.stage_acquire(host.ctx, FERRY_MEM_CUDA, 0, 4096, &bufs[0], &err), 0)
        << "a released slice is lent again";
    host.stage_release(host.ctx, bufs[0]);
    cuda().free(dev);

    StagingService off(0, 256 << 10);
    ferry_host_api_t none{};
    off.fill_host_api(none);
    EXPECT_EQ(none.stage_copy, nullptr) << "gpu_staging_max_bytes 0: no staging offered";
}
